"""JSON API: projects, rubric versions, members and imports."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Query, Request, UploadFile
from sqlalchemy.exc import IntegrityError

from app.accounts import permissions
from app.annotation import selection, steps
from app.imports import service as imports
from app.platform.errors import Conflict, Invalid
from app.platform.formats import ImportPreset
from app.projects import projects, rubrics
from app.schemas import (
    ImportOut,
    JobAccepted,
    MemberIn,
    MemberOut,
    PrioritiesIn,
    ProjectIn,
    ProjectOut,
    RubricOut,
    RubricVersionIn,
    SelectionIn,
    SelectionOut,
    StepOptionsIn,
    StepOptionsOut,
)
from app.web.deps import CurrentUser, Id, SessionDep

router = APIRouter(prefix="/api/projects", tags=["projects"])


def _out(db, project) -> ProjectOut:
    current = rubrics.current(db, project)
    return ProjectOut.from_model(project, current.version if current else None)


@router.post("", status_code=201, summary="Create a project with its first rubric version")
def create_project(body: ProjectIn, db: SessionDep, user: CurrentUser) -> ProjectOut:
    return _out(db, create_from(db, user, body))


def create_from(db, user, body: ProjectIn):
    """The API's and the page's new project: one mapping of the request model onto the service."""
    return projects.create_project(
        db, user, name=body.name, completions_per_prompt=body.completions_per_prompt, overlap=body.overlap,
        rubric_text=body.rubric.text, criteria=body.rubric.criteria, description=body.description,
    )


@router.get("", summary="Projects the caller is a member of (all, for admins)")
def list_projects(db: SessionDep, user: CurrentUser) -> list[ProjectOut]:
    return [_out(db, p) for p in projects.list_visible(db, user)]


@router.get("/{project_id}", summary="One project")
def get_project(project_id: Id, db: SessionDep, user: CurrentUser) -> ProjectOut:
    return _out(db, projects.get_visible(db, project_id, user))


@router.post("/{project_id}/rubrics", status_code=201, summary="Save a new rubric version (409 on a stale base)")
def create_rubric_version(project_id: Id, body: RubricVersionIn, db: SessionDep, user: CurrentUser) -> RubricOut:
    project = projects.get_visible(db, project_id, user)
    rubric = rubrics.create_version(db, project, user, text=body.text, criteria=body.criteria,
                                    base_version=body.base_version, note=body.note)
    return RubricOut.from_model(rubric, project.current_rubric_id)


@router.get("/{project_id}/rubrics", summary="Every rubric version, newest first")
def list_rubric_versions(project_id: Id, db: SessionDep, user: CurrentUser) -> list[RubricOut]:
    project = projects.get_visible(db, project_id, user)
    return [RubricOut.from_model(r, project.current_rubric_id) for r in rubrics.list_versions(db, project)]


@router.get("/{project_id}/rubrics/{version}", summary="One rubric version")
def get_rubric_version(project_id: Id, version: Id, db: SessionDep, user: CurrentUser) -> RubricOut:
    project = projects.get_visible(db, project_id, user)
    return RubricOut.from_model(rubrics.get_version(db, project, version), project.current_rubric_id)


@router.put("/{project_id}/step-options", summary="Turn step labels (process supervision) on or off and set the "
                                                  "step separator (leads)")
def set_step_options(project_id: Id, body: StepOptionsIn, db: SessionDep, user: CurrentUser) -> StepOptionsOut:
    project = projects.get_visible(db, project_id, user)
    options = steps.set_options(db, project, user, enabled=body.enabled, separator=body.separator)
    return StepOptionsOut(enabled=options.enabled, separator=options.separator)


@router.get("/{project_id}/members", summary="Members of a project")
def list_members(project_id: Id, db: SessionDep, user: CurrentUser) -> list[MemberOut]:
    project = projects.get_visible(db, project_id, user)
    return [MemberOut(user_id=m.user_id, email=m.email, name=m.name, role=m.role)
            for m in projects.list_members(db, project)]


@router.post("/{project_id}/members", status_code=201, summary="Add a user to a project (leads and admins)")
def add_member(project_id: Id, body: MemberIn, db: SessionDep, user: CurrentUser) -> MemberOut:
    project = projects.get_visible(db, project_id, user)
    member = projects.add_member(db, project, user, email=body.email, role=body.role)
    return MemberOut(user_id=member.user_id, email=member.user.email, name=member.user.name, role=member.role)


@router.post("/{project_id}/imports", status_code=201,
             summary="Import prompts with completions, or preference pairs (JSONL, CSV or Parquet)",
             responses={422: {"description": "A bad row: `detail` lists line, field and message; nothing written"},
                        413: {"description": "The file is larger than PREFLAB_MAX_UPLOAD_MB"}})
async def import_file(
    request: Request,
    project_id: Id,
    db: SessionDep,
    user: CurrentUser,
    file: Annotated[UploadFile, File(description="JSONL, CSV or Parquet")],
    on_duplicate: Annotated[Literal["error", "skip"], Query(description="What to do with a prompt seen before")]
    = "error",
    preset: Annotated[ImportPreset | None, Query(description="The file's layout; detected from its first row when "
                                                  "not given (the answer names the one used)")] = None,
    strict: Annotated[bool, Query(description="Refuse columns preflab does not know instead of keeping them in "
                                  "each row's metadata")] = False,
) -> ImportOut:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "data.import")
    settings = request.app.state.settings
    data = await read_upload(file, settings.max_upload_mb)
    try:
        with db.begin_nested():
            result = imports.import_file(db, project, file.filename or "upload", data, actor=user,
                                         max_rows=settings.max_import_rows, on_duplicate=on_duplicate,
                                         preset=preset, strict=strict)
    except IntegrityError:
        # Another import added the same prompt between our duplicate check and our insert.
        raise Conflict("another import changed this project at the same moment; upload again", field="file") from None
    return ImportOut(prompts=result.prompts, completions=result.completions, pairs=result.pairs,
                     skipped_duplicates=list(result.skipped_duplicates), rankings=result.rankings,
                     annotators=result.annotators, step_labels=result.step_labels, preset=result.preset,
                     extra_columns=result.extra_columns,
                     note=result.note)


async def read_upload(file: UploadFile, max_mb: int) -> bytes:
    """The upload's bytes, or a 422 naming the field when it is over the limit (read at most limit + 1)."""
    limit = max_mb * 1024 * 1024
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise Invalid(f"the file is larger than the {max_mb} MiB limit (PREFLAB_MAX_UPLOAD_MB)", field="file")
    if not data:
        raise Invalid("the file is empty", field="file")
    return data


@router.get("/{project_id}/selection", summary="The queue's selection and where its priorities came from")
def get_selection(project_id: Id, db: SessionDep, user: CurrentUser) -> SelectionOut:
    project = projects.get_visible(db, project_id, user)
    return SelectionOut(**vars(selection.state(project)))


@router.put("/{project_id}/selection", summary="Choose the queue's order (leads)")
def set_selection(project_id: Id, body: SelectionIn, db: SessionDep, user: CurrentUser) -> SelectionOut:
    project = projects.get_visible(db, project_id, user)
    selection.set_selection(db, project, user, body.selection, extra=body.disagreement_extra,
                            threshold=body.disagreement_threshold)
    return SelectionOut(**vars(selection.state(project)))


@router.post("/{project_id}/priority-jobs", status_code=202,
             summary="Compute the queue's priorities for the active selection now (leads)")
def compute_priorities(project_id: Id, body: PrioritiesIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    project = projects.get_visible(db, project_id, user)
    return JobAccepted(job_id=selection.request_priorities(db, project, user, training_run_id=body.training_run_id).id)
