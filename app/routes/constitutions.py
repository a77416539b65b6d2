"""Constitutions: versioned principles for the AI judge, as JSON API and an editor with history."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError, Invalid
from app.models import Constitution
from app.schemas import ConstitutionIn, ConstitutionOut
from app.services import constitutions, projects, versions
from app.web import render

router = APIRouter()


def _out(c: Constitution, current_id: int | None) -> ConstitutionOut:
    return ConstitutionOut(version=c.version, principles=c.principles, note=c.note, created_at=c.created_at,
                           current=c.id == current_id)


@router.post("/api/projects/{project_id}/constitutions", status_code=201, tags=["constitutions"],
             summary="Save a new constitution version (409 when base_version is not current)")
def create_constitution(project_id: int, body: ConstitutionIn, db: SessionDep, user: CurrentUser) -> ConstitutionOut:
    project = projects.get_visible(db, project_id, user)
    row = constitutions.create_version(db, project, user, principles=[p.model_dump() for p in body.principles],
                                       base_version=body.base_version, note=body.note)
    return _out(row, project.current_constitution_id)


@router.get("/api/projects/{project_id}/constitutions", tags=["constitutions"], summary="Every version, newest first")
def list_constitutions(project_id: int, db: SessionDep, user: CurrentUser) -> list[ConstitutionOut]:
    project = projects.get_visible(db, project_id, user)
    return [_out(c, project.current_constitution_id) for c in constitutions.list_versions(db, project)]


@router.get("/api/projects/{project_id}/constitutions/{version}", tags=["constitutions"], summary="One version")
def get_constitution(project_id: int, version: int, db: SessionDep, user: CurrentUser) -> ConstitutionOut:
    project = projects.get_visible(db, project_id, user)
    return _out(constitutions.get_version(db, project, version), project.current_constitution_id)


# --- pages --------------------------------------------------------------------------------------

def _principles_from_form(form) -> list[dict]:  # type: ignore[no-untyped-def]
    """Fieldsets `p-<i>-<field>`; a principle whose name and comparison are both blank is left out."""
    out = []
    indices = sorted({int(k.split("-")[1]) for k in form if k.startswith("p-") and k.split("-")[1].isdigit()})
    for i in indices:
        item = {f: str(form.get(f"p-{i}-{f}", "")).strip() for f in constitutions.FIELDS}
        if not item["name"] and not item["comparison"]:
            continue
        try:
            item["priority"] = int(item["priority"] or len(out) + 1)
        except ValueError:
            raise Invalid("must be a whole number", field=f"principles[{len(out)}].priority") from None
        out.append(item)
    return out


@router.get("/projects/{project_id}/constitution", include_in_schema=False)
def editor(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    permissions.require(db, user, project, "constitution.edit")
    current = constitutions.current(db, project)
    principles = current.principles if current else constitutions.DEFAULT_PRINCIPLES
    return render(request, "constitution_edit.html", {
        "project": project, "current": current, "principles": principles,
        "base_version": current.version if current else 0, "fields": constitutions.FIELDS})


@router.post("/projects/{project_id}/constitution", include_in_schema=False)
async def save(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    form = await request.form()
    principles: list[dict] = []
    try:
        base = int(str(form.get("base_version") or 0)) or None
        principles = _principles_from_form(form)
        with db.begin_nested():
            row = constitutions.create_version(db, project, user, principles=principles, base_version=base,
                                               note=str(form.get("note", "")))
    except (DomainError, ValueError) as exc:
        error = exc if isinstance(exc, DomainError) else Invalid(str(exc), field="base_version")
        current = constitutions.current(db, project)
        return render(request, "constitution_edit.html", {
            "project": project, "current": current, "principles": principles or [], "error": error,
            "base_version": current.version if error.status_code == 409 and current else form.get("base_version"),
            "conflict_with": current if error.status_code == 409 else None, "fields": constitutions.FIELDS,
            "note": form.get("note", "")}, status_code=error.status_code)
    return RedirectResponse(f"/projects/{project.id}/constitution/history#v{row.version}", status_code=303)


@router.get("/projects/{project_id}/constitution/history", include_in_schema=False)
def history(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    items = constitutions.list_versions(db, project)
    entries = [(v, versions.diff_lines(constitutions.as_lines(items[i + 1] if i + 1 < len(items) else None),
                                       constitutions.as_lines(v))) for i, v in enumerate(items)]
    return render(request, "constitution_history.html", {"project": project, "entries": entries})
