"""Pages: project list and creation, the project page, rubric editor and history, members, import."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import RedirectResponse, Response

from app import permissions
from app.deps import PageUser, SessionDep
from app.errors import DomainError
from app.models import MEMBER_ROLES
from app.routes.api_projects import read_upload
from app.services import imports, jobs, projects, rubrics
from app.web import render

router = APIRouter(include_in_schema=False)

DEFAULT_RUBRIC = """Rank the responses from best to worst.

- Prefer responses that are **correct** and answer the question that was asked.
- Prefer clear, well-reasoned responses over ones that only state an answer.
- Tie two responses only when you cannot tell them apart on any criterion.
"""


def _criteria(raw: str) -> list[str]:
    return [line.strip(" -\t") for line in raw.splitlines() if line.strip(" -\t")]


@router.get("/projects")
def project_list(request: Request, db: SessionDep, user: PageUser) -> Response:
    items = [(p, projects.counts(db, p)) for p in projects.list_visible(db, user)]
    return render(request, "projects.html", {"items": items, "form": {"rubric": DEFAULT_RUBRIC, "k": 4, "overlap": 1}})


@router.post("/projects")
def create_project(request: Request, db: SessionDep, user: PageUser,
                   name: Annotated[str, Form(max_length=200)] = "",
                   completions_per_prompt: Annotated[int, Form()] = 4, overlap: Annotated[int, Form()] = 1,
                   rubric: Annotated[str, Form(max_length=100_000)] = "",
                   criteria: Annotated[str, Form(max_length=20_000)] = "") -> Response:
    try:
        with db.begin_nested():
            project = projects.create_project(db, user, name=name, completions_per_prompt=completions_per_prompt,
                                              overlap=overlap, rubric_text=rubric, criteria=_criteria(criteria))
    except DomainError as exc:
        items = [(p, projects.counts(db, p)) for p in projects.list_visible(db, user)]
        form = {"name": name, "k": completions_per_prompt, "overlap": overlap, "rubric": rubric, "criteria": criteria}
        return render(request, "projects.html", {"items": items, "error": exc, "form": form},
                      status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}", status_code=303)


def _project_context(db, project, user) -> dict:  # type: ignore[no-untyped-def]
    return {
        "project": project,
        "counts": projects.counts(db, project),
        "rubric": rubrics.current(db, project),
        "members": projects.list_members(db, project),
        "can_manage": permissions.may(db, user, project, "members.manage"),
        "can_import": permissions.may(db, user, project, "data.import"),
        "can_annotate": permissions.may(db, user, project, "annotate"),
        "can_see_agreement": permissions.may(db, user, project, "agreement.see"),
        "member_roles": MEMBER_ROLES,
        "running_jobs": sum(1 for j in jobs.list_for_project(db, project) if j.state in ("queued", "running")),
    }


@router.get("/projects/{project_id}")
def project_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "project.html", _project_context(db, project, user))


@router.post("/projects/{project_id}/members")
def add_member(request: Request, project_id: int, db: SessionDep, user: PageUser,
               email: Annotated[str, Form(max_length=320)] = "",
               role: Annotated[str, Form(max_length=20)] = "") -> Response:
    project = projects.get_visible(db, project_id, user)
    try:
        with db.begin_nested():
            projects.add_member(db, project, user, email=email, role=role)
    except DomainError as exc:
        ctx = _project_context(db, project, user) | {"member_error": exc, "member_email": email}
        return render(request, "project.html", ctx, status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}#members", status_code=303)


@router.post("/projects/{project_id}/members/{user_id}/remove")
def remove_member(project_id: int, user_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    projects.remove_member(db, project, user, user_id)
    return RedirectResponse(f"/projects/{project.id}#members", status_code=303)


@router.get("/projects/{project_id}/rubric")
def rubric_editor(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "rubric.edit")
    current = rubrics.current(db, project)
    return render(request, "rubric_edit.html", {
        "project": project, "rubric": current, "text": current.text if current else "",
        "criteria": "\n".join(current.criteria) if current else "", "base_version": current.version if current else 0,
    })


@router.post("/projects/{project_id}/rubric/preview")
def rubric_preview(request: Request, project_id: int, db: SessionDep, user: PageUser,
                   text: Annotated[str, Form(max_length=100_000)] = "") -> Response:
    projects.get_visible(db, project_id, user)
    return render(request, "_markdown_preview.html", {"text": text})


@router.post("/projects/{project_id}/rubric")
def save_rubric(request: Request, project_id: int, db: SessionDep, user: PageUser,
                text: Annotated[str, Form(max_length=100_000)] = "",
                criteria: Annotated[str, Form(max_length=20_000)] = "",
                base_version: Annotated[int, Form()] = 0, note: Annotated[str, Form(max_length=500)] = "") -> Response:
    project = projects.get_visible(db, project_id, user)
    try:
        with db.begin_nested():
            rubric = rubrics.create_version(db, project, user, text=text, criteria=_criteria(criteria),
                                            base_version=base_version or None, note=note)
    except DomainError as exc:
        current = rubrics.current(db, project)
        return render(request, "rubric_edit.html", {
            "project": project, "rubric": current, "text": text, "criteria": criteria, "note": note,
            "base_version": base_version, "error": exc,
            "conflict_with": current if exc.status_code == 409 else None,
        }, status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}/rubric/history#v{rubric.version}", status_code=303)


@router.get("/projects/{project_id}/rubric/history")
def rubric_history(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    versions = rubrics.list_versions(db, project)  # newest first
    entries = [(v, rubrics.diff(versions[i + 1] if i + 1 < len(versions) else None, v))
               for i, v in enumerate(versions)]
    return render(request, "rubric_history.html", {"project": project, "entries": entries})


@router.get("/projects/{project_id}/import")
def import_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "data.import")
    return render(request, "import.html", {"project": project})


@router.post("/projects/{project_id}/import")
async def import_upload(request: Request, project_id: int, db: SessionDep, user: PageUser,
                        file: Annotated[UploadFile, File()],
                        on_duplicate: Annotated[str, Form()] = "error") -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "data.import")
    settings = request.app.state.settings
    ctx: dict = {"project": project, "filename": file.filename}
    try:
        data = await read_upload(file, settings.max_upload_mb)
        with db.begin_nested():
            result = imports.import_file(db, project, file.filename or "upload", data, actor=user,
                                         max_rows=settings.max_import_rows,
                                         on_duplicate="skip" if on_duplicate == "skip" else "error")
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
