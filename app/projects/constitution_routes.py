"""Constitutions: versioned principles for the AI judge, as JSON API and an editor with history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from app.accounts import permissions
from app.projects import constitutions, projects, versions
from app.schemas import ConstitutionIn, ConstitutionOut
from app.web import forms
from app.web.deps import CurrentUser, Id, PageUser, SessionDep
from app.web.forms import ConstitutionForm, FieldError
from app.web.rendering import render

router = APIRouter()
_out = ConstitutionOut.from_model


def _save(db, project, user, body: ConstitutionIn):
    """The API's and the editor's save: one mapping of the request model onto the service."""
    return constitutions.create_version(db, project, user, principles=[p.model_dump() for p in body.principles],
                                        base_version=body.base_version, note=body.note)


@router.post("/api/projects/{project_id}/constitutions", status_code=201, tags=["constitutions"],
             summary="Save a new constitution version (409 when base_version is not current)")
def create_constitution(project_id: Id, body: ConstitutionIn, db: SessionDep, user: CurrentUser) -> ConstitutionOut:
    project = projects.get_visible(db, project_id, user)
    return _out(_save(db, project, user, body), project.current_constitution_id)


@router.get("/api/projects/{project_id}/constitutions", tags=["constitutions"], summary="Every version, newest first")
def list_constitutions(project_id: Id, db: SessionDep, user: CurrentUser) -> list[ConstitutionOut]:
    project = projects.get_visible(db, project_id, user)
    return [_out(c, project.current_constitution_id) for c in constitutions.list_versions(db, project)]


@router.get("/api/projects/{project_id}/constitutions/{version}", tags=["constitutions"], summary="One version")
def get_constitution(project_id: Id, version: Id, db: SessionDep, user: CurrentUser) -> ConstitutionOut:
    project = projects.get_visible(db, project_id, user)
    return _out(constitutions.get_version(db, project, version), project.current_constitution_id)


# --- pages --------------------------------------------------------------------------------------

@router.get("/projects/{project_id}/constitution", include_in_schema=False)
def editor(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "constitution.edit")
    current = constitutions.current(db, project)
    principles = current.principles if current else constitutions.DEFAULT_PRINCIPLES
    return render(request, "constitution_edit.html", {
        "project": project, "current": current, "principles": principles,
        "base_version": current.version if current else 0, "fields": constitutions.FIELDS})


@router.post("/projects/{project_id}/constitution", include_in_schema=False)
def save(request: Request, project_id: Id, db: SessionDep, user: PageUser,
         form: Annotated[ConstitutionForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)

    def again(error: FieldError) -> dict:
        # On a conflict the editor saves on top of the version that is current now; the user's text stays.
        current = constitutions.current(db, project)
        conflict = error.status_code == 409
        return form.values() | {
            "project": project, "current": current, "fields": constitutions.FIELDS,
            "base_version": current.version if conflict and current else form.base_version,
            "conflict_with": current if conflict else None}

    return forms.submit(request, db, form, lambda body: _save(db, project, user, body),
                        redirect=lambda row: f"/projects/{project.id}/constitution/history#v{row.version}",
                        template="constitution_edit.html", context=again)


@router.get("/projects/{project_id}/constitution/history", include_in_schema=False)
def history(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    items = constitutions.list_versions(db, project)
    entries = [(v, versions.diff_lines(constitutions.as_lines(items[i + 1] if i + 1 < len(items) else None),
                                       constitutions.as_lines(v))) for i, v in enumerate(items)]
    return render(request, "constitution_history.html", {
        "project": project, "entries": entries,
        "can_edit": permissions.may(db, user, project, "constitution.edit")})
