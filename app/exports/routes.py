"""Exports: request (a background job), status, streamed download and delete, as JSON API and a history page."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.accounts import permissions
from app.exports import service as exports
from app.jobs import queue as jobs
from app.platform import formats
from app.projects import projects, rubrics
from app.schemas import ExportAccepted, ExportIn, ExportOut
from app.web.deps import CurrentUser, Id, PageUser, SessionDep
from app.web.form_pages import ProjectPage
from app.web.forms import ExportForm

router = APIRouter()


def export_out(db, export) -> ExportOut:
    return ExportOut.from_model(export, exports.status(db, export))


def _request_export(db, project, user, body: ExportIn):
    """The API's and the page's export request: one mapping of the request model onto the service."""
    return exports.request_export(db, project, user, body.kind, body.format, body.filters, body.aggregation,
                                  body.conflicts, body.layout, body.neutral, body.every_step)


@router.post("/api/projects/{project_id}/exports", status_code=202, tags=["exports"],
             summary="Export pairs, rankings, prompts or SFT rows (a background job)")
def create_export(project_id: Id, body: ExportIn, db: SessionDep, user: CurrentUser) -> ExportAccepted:
    project = projects.get_visible(db, project_id, user)
    export = _request_export(db, project, user, body)
    assert export.job_id is not None
    return ExportAccepted(export_id=export.id, job_id=export.job_id)


@router.get("/api/projects/{project_id}/exports", tags=["exports"], summary="The project's exports, newest first")
def list_exports(project_id: Id, db: SessionDep, user: CurrentUser) -> list[ExportOut]:
    project = projects.get_visible(db, project_id, user)
    return [export_out(db, e) for e in exports.list_for_project(db, project)]


@router.get("/api/exports/{export_id}", tags=["exports"], summary="An export's status, counts and hashes")
def get_export(export_id: Id, db: SessionDep, user: CurrentUser) -> ExportOut:
    return export_out(db, exports.get_visible(db, export_id, user))


_FILE = {"schema": {"type": "string", "format": "binary"}}
_SHA256 = {"schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "description": "The file's sha256, as listed"}


@router.get("/api/exports/{export_id}/files/{name:path}", tags=["exports"], summary="Download one file (streamed)",
            response_class=FileResponse,
            # octet-stream first: a generated client decodes the answer by the first media type it knows, and
            # openapi-python-client would build its File from a text/* answer's text (a TypeError; Parquet is no text).
            responses={200: {"description": "The file, with its sha256 in `X-Content-SHA256`",
                             "content": {"application/octet-stream": _FILE, "application/x-ndjson": _FILE,
                                         "text/markdown; charset=utf-8": _FILE},
                             "headers": {"X-Content-SHA256": _SHA256}},
                       404: {"description": "No such export or file"}, 410: {"description": "Deleted"}})
def download_file(export_id: Id, name: str, db: SessionDep, user: CurrentUser) -> Response:
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
def delete_export(export_id: Id, request: Request, db: SessionDep, user: CurrentUser) -> ExportOut:
    export = exports.get_visible(db, export_id, user)
    return export_out(db, exports.delete(db, export, user, data_dir=request.app.state.settings.data_dir))


# --- pages --------------------------------------------------------------------------------------


def _page_context(db, project, user) -> dict[str, Any]:
    rows = [(e, exports.status(db, e)) for e in exports.list_for_project(db, project)]
    failed = [e.job_id for e, state in rows if state == "failed" and e.job_id is not None]
    return {"project": project, "rows": rows, "can_export": permissions.may(db, user, project, "export.create"),
            "failures": jobs.failure_reasons(db, failed),
            "can_delete": permissions.may(db, user, project, "export.delete"),
            "active": any(s in ("queued", "running") for _, s in rows), "form": {},
            "rubric_versions": sorted(r.version for r in rubrics.list_versions(db, project)),
            "kinds": exports.KINDS, "formats": exports.FORMATS, "format_names": formats.EXPORT_FORMAT_NAMES,
            "describe_filters": exports.describe_filters, "describe_snapshot": exports.describe_snapshot}


EXPORTS_PAGE = ProjectPage("exports.html", _page_context, block="export_table")


EXPORTS_PAGE.mount(router, "/projects/{project_id}/exports", form=ExportForm, action=_request_export,
                   redirect="/projects/{project_id}/exports")


@router.post("/exports/{export_id}/delete", include_in_schema=False)
def delete_from_page(export_id: Id, request: Request, db: SessionDep, user: PageUser) -> Response:
    export = exports.get_visible(db, export_id, user)
    exports.delete(db, export, user, data_dir=request.app.state.settings.data_dir)
    return RedirectResponse(f"/projects/{export.project_id}/exports", status_code=303)
