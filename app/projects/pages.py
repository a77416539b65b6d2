"""Pages: project list and creation, the project page, rubric editor and history, members, import."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.accounts import permissions
from app.annotation import selection, steps
from app.imports import service as imports
from app.jobs import queue as jobs
from app.platform.errors import DomainError
from app.projects import projects, rubrics
from app.projects.api import create_from, read_upload
from app.quality import rollups
from app.web import forms
from app.web.deps import Id, PageUser, SessionDep
from app.web.forms import (
    FieldError,
    ImportForm,
    MemberForm,
    PrioritiesForm,
    ProjectForm,
    RubricForm,
    SelectionForm,
    StepOptionsForm,
)
from app.web.rendering import render

router = APIRouter(include_in_schema=False)

DEFAULT_RUBRIC = """Rank the responses from best to worst.

- Prefer responses that are **correct** and answer the question that was asked.
- Prefer clear, well-reasoned responses over ones that only state an answer.
- Tie two responses only when you cannot tell them apart on any criterion.
"""


def _list_context(db, user) -> dict:
    return {"items": [(p, rollups.project_counts(db, p, user)) for p in projects.list_visible(db, user)]}


@router.get("/projects")
def project_list(request: Request, db: SessionDep, user: PageUser) -> Response:
    form = ProjectForm(rubric=DEFAULT_RUBRIC).values()
    return render(request, "projects.html", _list_context(db, user) | {"form": form})


@router.post("/projects")
def create_project(request: Request, db: SessionDep, user: PageUser,
                   form: Annotated[ProjectForm, Form()]) -> Response:
    return forms.submit(request, db, form, lambda body: create_from(db, user, body),
                        redirect=lambda project: f"/projects/{project.id}", template="projects.html",
                        context=lambda _: _list_context(db, user))


def _project_context(db, project, user) -> dict:
    return {
        "project": project,
        "counts": rollups.project_counts(db, project, user),
        "rubric": rubrics.current(db, project),
        "members": projects.list_members(db, project),
        "can_manage": permissions.may(db, user, project, "members.manage"),
        "can_webhooks": permissions.may(db, user, project, "webhooks.manage"),
        "can_import": permissions.may(db, user, project, "data.import"),
        "can_annotate": permissions.may(db, user, project, "annotate"),
        "can_see_agreement": permissions.may(db, user, project, "agreement.see"),
        "can_configure_steps": permissions.may(db, user, project, "steps.configure"),
        "step_options": steps.options(project),
        "member_roles": projects.MEMBER_ROLES,
        "running_jobs": sum(1 for j in jobs.list_for_project(db, project) if j.state in ("queued", "running")),
        "selection": selection.state(project),
        "selections": selection.SELECTIONS,
        "selection_measured": selection.MEASURED,
        "can_select": permissions.may(db, user, project, "selection.manage"),
    }


@router.post("/projects/{project_id}/selection")
def set_selection(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                  form: Annotated[SelectionForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    return forms.submit(request, db, form,
                        lambda body: selection.set_selection(db, project, user, body.selection,
                                                             extra=body.disagreement_extra,
                                                             threshold=body.disagreement_threshold),
                        redirect=f"/projects/{project.id}#selection", template="project.html",
                        context=lambda error: _project_context(db, project, user) | {"selection_error": error})


@router.post("/projects/{project_id}/priorities")
def compute_priorities(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                       form: Annotated[PrioritiesForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    return forms.submit(request, db, form,
                        lambda body: selection.request_priorities(db, project, user,
                                                                  training_run_id=body.training_run_id),
                        redirect=f"/projects/{project.id}/jobs", template="project.html",
                        context=lambda error: _project_context(db, project, user) | {"selection_error": error})


@router.get("/projects/{project_id}")
def project_page(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "project.html", _project_context(db, project, user))


@router.post("/projects/{project_id}/members")
def add_member(request: Request, project_id: Id, db: SessionDep, user: PageUser,
               form: Annotated[MemberForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    return forms.submit(request, db, form,
                        lambda body: projects.add_member(db, project, user, email=body.email, role=body.role),
                        redirect=f"/projects/{project.id}#members", template="project.html",
                        context=lambda error: _project_context(db, project, user)
                        | {"member_error": error, "member_email": form.email})


@router.post("/projects/{project_id}/step-options")
def set_step_options(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                     form: Annotated[StepOptionsForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    return forms.submit(request, db, form,
                        lambda body: steps.set_options(db, project, user, enabled=body.enabled,
                                                       separator=body.separator),
                        redirect=f"/projects/{project.id}#step-labels", template="project.html",
                        context=lambda error: _project_context(db, project, user)
                        | {"steps_error": error, "steps_form": form.values()})


@router.post("/projects/{project_id}/members/{user_id}/remove")
def remove_member(project_id: Id, user_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    projects.remove_member(db, project, user, user_id)
    return RedirectResponse(f"/projects/{project.id}#members", status_code=303)


@router.get("/projects/{project_id}/rubric")
def rubric_editor(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "rubric.edit")
    current = rubrics.current(db, project)
    return render(request, "rubric_edit.html", {
        "project": project, "rubric": current, "text": current.text if current else "",
        "criteria": "\n".join(current.criteria) if current else "", "base_version": current.version if current else 0,
    })


@router.post("/projects/{project_id}/rubric/preview")
def rubric_preview(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                   form: Annotated[RubricForm, Form()]) -> Response:
    # htmx posts the whole editor form; only the text is previewed.
    projects.get_visible(db, project_id, user)
    return render(request, "_markdown_preview.html", {"text": form.text})


@router.post("/projects/{project_id}/rubric")
def save_rubric(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                form: Annotated[RubricForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)

    def again(error: FieldError) -> dict:
        # The user's text stays; on a conflict the current version is shown beside it (and saved on top of).
        current = rubrics.current(db, project)
        conflict = current if error.status_code == 409 else None
        return form.values() | {"project": project, "rubric": current, "conflict_with": conflict,
                                "conflict_diff": rubrics.diff_draft(conflict, form.text, forms.lines(form.criteria))
                                if conflict else []}

    return forms.submit(request, db, form,
                        lambda body: rubrics.create_version(db, project, user, text=body.text, criteria=body.criteria,
                                                            base_version=body.base_version, note=body.note),
                        redirect=lambda rubric: f"/projects/{project.id}/rubric/history#v{rubric.version}",
                        template="rubric_edit.html", context=again)


@router.get("/projects/{project_id}/rubric/history")
def rubric_history(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    versions = rubrics.list_versions(db, project)  # newest first
    entries = [(v, rubrics.diff(versions[i + 1] if i + 1 < len(versions) else None, v))
               for i, v in enumerate(versions)]
    return render(request, "rubric_history.html", {"project": project, "entries": entries})


@router.get("/projects/{project_id}/import")
def import_page(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "data.import")
    return render(request, "import.html", {"project": project, "presets": imports.PRESETS})


@router.post("/projects/{project_id}/import")
async def import_upload(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                        form: Annotated[ImportForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "data.import")
    settings = request.app.state.settings
    file = form.file
    ctx: dict = {"project": project, "filename": file.filename, "presets": imports.PRESETS}
    try:
        data = await read_upload(file, settings.max_upload_mb)
        with db.begin_nested():
            result = imports.import_file(db, project, file.filename or "upload", data, actor=user,
                                         max_rows=settings.max_import_rows, on_duplicate=form.policy,
                                         preset=form.preset_name, strict=form.strict_mode)
    except imports.ImportRejected as exc:
        ctx["errors"] = exc.errors
        ctx["more_errors"] = exc.omitted
        return render(request, "import.html", ctx, status_code=_error_status(request, 422), block="result")
    except DomainError as exc:
        ctx["errors"] = [imports.RowError(line=0, field=exc.field or "file", message=exc.message)]
        return render(request, "import.html", ctx, status_code=_error_status(request, exc.status_code),
                      block="result")
    ctx["result"] = result
    return render(request, "import.html", ctx, status_code=201, block="result")


def _error_status(request: Request, status: int) -> int:
    """htmx swaps only 2xx answers: the error report goes to HTMX as 200, to a plain form POST with its 4xx."""
    return 200 if request.headers.get("hx-request") == "true" else status
