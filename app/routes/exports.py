"""Exports: request (a background job), status, streamed download and delete, as JSON API and a history page."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError
from app.models import Export, Rubric
from app.schemas import Strict
from app.services import exports, projects
from app.web import render

router = APIRouter()


class ExportIn(Strict):
    kind: Literal["pairs", "rankings", "prompts", "sft"] = "pairs"
    format: Literal["jsonl", "parquet", "hf"]
    filters: dict[str, Any] = Field(default_factory=dict)
    aggregation: Literal["raw", "aggregated"] = "raw"
    conflicts: Literal["keep", "drop"] = Field(
        "keep", description="Aggregated pairs whose votes disagree: kept with weight = agreement, or dropped")


class ExportAccepted(BaseModel):
    export_id: int
    job_id: int


class ExportOut(BaseModel):
    id: int
    project_id: int
    kind: str
    format: str
    filters: dict[str, Any]
    status: str
    """queued | running | ready | failed | cancelled | deleted"""
    row_count: int
    row_counts: dict[str, int]
    empty: bool
    sha256: str | None
    files: dict[str, str]
    snapshot: str | None = Field(description="The database snapshot the export read (Postgres: pg_current_snapshot())")
    job_id: int | None
    created_by_id: int | None
    created_at: datetime
    deleted_at: datetime | None


def export_out(db: Session, export: Export) -> ExportOut:
    state = exports.status(db, export)
    return ExportOut(id=export.id, project_id=export.project_id, kind=export.kind, format=export.format,
                     filters=dict(export.filters or {}), status=state, row_count=export.row_count,
                     row_counts=dict(export.row_counts or {}), empty=state == "ready" and export.row_count == 0,
                     sha256=export.sha256, files=dict(export.files or {}), snapshot=export.snapshot,
                     job_id=export.job_id,
                     created_by_id=export.created_by_id, created_at=export.created_at, deleted_at=export.deleted_at)


@router.post("/api/projects/{project_id}/exports", status_code=202, tags=["exports"],
             summary="Export pairs, rankings, prompts or SFT rows (a background job)")
def create_export(project_id: int, body: ExportIn, db: SessionDep, user: CurrentUser) -> ExportAccepted:
    project = projects.get_visible(db, project_id, user)
    export = exports.request_export(db, project, user, body.kind, body.format, body.filters, body.aggregation,
                                    body.conflicts)
    assert export.job_id is not None
    return ExportAccepted(export_id=export.id, job_id=export.job_id)


@router.get("/api/projects/{project_id}/exports", tags=["exports"], summary="The project's exports, newest first")
def list_exports(project_id: int, db: SessionDep, user: CurrentUser) -> list[ExportOut]:
    project = projects.get_visible(db, project_id, user)
    return [export_out(db, e) for e in exports.list_for_project(db, project)]


@router.get("/api/exports/{export_id}", tags=["exports"], summary="An export's status, counts and hashes")
def get_export(export_id: int, db: SessionDep, user: CurrentUser) -> ExportOut:
    return export_out(db, exports.get_visible(db, export_id, user))


@router.get("/api/exports/{export_id}/files/{name:path}", tags=["exports"], summary="Download one file (streamed)",
            responses={404: {"description": "No such export or file"}, 410: {"description": "Deleted"}})
def download_file(export_id: int, name: str, db: SessionDep, user: CurrentUser) -> Response:
    export = exports.get_visible(db, export_id, user)
    path = exports.file_path(export, name)
    # FileResponse streams in chunks and writes an RFC 6266 Content-Disposition (filename*=UTF-8'' when needed).
    download = f"preflab-export-{export.id}-{name.replace('/', '-')}"
    media = "application/x-ndjson" if name.endswith(".jsonl") else (
        "text/markdown; charset=utf-8" if name.endswith(".md") else "application/octet-stream")
    return FileResponse(path, media_type=media, filename=download,
                        headers={"X-Content-SHA256": export.files[name], "Cache-Control": "private, max-age=0"})


@router.delete("/api/exports/{export_id}", tags=["exports"],
               summary="Delete an export's files; the row stays as a tombstone with its hashes (leads, admins)")
def delete_export(export_id: int, request: Request, db: SessionDep, user: CurrentUser) -> ExportOut:
    export = exports.get_visible(db, export_id, user)
    return export_out(db, exports.delete(db, export, user, data_dir=request.app.state.settings.data_dir))


# --- pages --------------------------------------------------------------------------------------


def _page_context(db: Session, project, user) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    items = exports.list_for_project(db, project)
    rows = [(e, exports.status(db, e)) for e in items]
    return {"project": project, "rows": rows, "can_export": permissions.may(db, user, project, "export.create"),
            "can_delete": permissions.may(db, user, project, "export.delete"),
            "active": any(s in ("queued", "running") for _, s in rows), "form": {},
            "rubric_versions": list(db.scalars(select(Rubric.version).where(Rubric.project_id == project.id)
                                               .order_by(Rubric.version))),
            "kinds": exports.KINDS, "formats": exports.FORMATS}


@router.get("/projects/{project_id}/exports", include_in_schema=False)
def exports_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "exports.html", _page_context(db, project, user), block="export_table")


@router.post("/projects/{project_id}/exports", include_in_schema=False)
def export_from_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                     kind: Annotated[str, Form()] = "pairs", format: Annotated[str, Form()] = "jsonl",
                     aggregation: Annotated[str, Form()] = "raw", conflicts: Annotated[str, Form()] = "keep",
                     source: Annotated[list[str] | None, Form()] = None, split: Annotated[str, Form()] = "",
                     rubric_versions: Annotated[str, Form(max_length=200)] = "",
                     min_agreement: Annotated[str, Form(max_length=20)] = "",
                     flagged: Annotated[str, Form()] = "include") -> Response:
    project = projects.get_visible(db, project_id, user)
    form = {"kind": kind, "format": format, "aggregation": aggregation, "conflicts": conflicts, "source": source or [],
            "split": split, "rubric_versions": rubric_versions, "min_agreement": min_agreement, "flagged": flagged}
    filters: dict[str, Any] = {"split": split}
    if kind != "prompts":
        filters |= {"source": source or [], "rubric_versions": rubric_versions, "flagged": flagged}
    if kind == "pairs":
        filters["min_agreement"] = min_agreement
    try:
        with db.begin_nested():
            exports.request_export(db, project, user, kind, format, filters,
                                   aggregation if kind == "pairs" else "raw", conflicts)
    except DomainError as exc:
        ctx = _page_context(db, project, user) | {"error": exc, "form": form}
        return render(request, "exports.html", ctx, status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}/exports", status_code=303)


@router.post("/exports/{export_id}/delete", include_in_schema=False)
def delete_from_page(export_id: int, request: Request, db: SessionDep, user: PageUser) -> Response:
    export = exports.get_visible(db, export_id, user)
    exports.delete(db, export, user, data_dir=request.app.state.settings.data_dir)
    return RedirectResponse(f"/projects/{export.project_id}/exports", status_code=303)
