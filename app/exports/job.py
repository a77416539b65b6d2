"""The `export` job: write one Export's files from a database snapshot and record their hashes on the row."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.exports import service as exports
from app.exports import writer as export_writer
from app.jobs import queue as jobs
from app.jobs.context import JobContext, JobError, JobStopped, job_row
from app.platform.db import run_transaction


def run(ctx: JobContext) -> dict[str, Any]:
    export_id = int(ctx.payload["export_id"])
    with ctx.session_factory() as db:
        export = job_row(db, exports.find, export_id, "export")
        if export.deleted_at is not None:
            raise JobError(f"export {export_id} was deleted before it was written")
        if export.sha256:  # an earlier attempt published it and died before the job was marked done
            ctx.log(f"export {export_id} was already written by an earlier attempt; nothing to redo")
            return _result(export_id, export.row_count or 0, export.sha256, export.snapshot)
        spec = exports.spec_of(export)
    engine = ctx.session_factory.kw["bind"]
    out_dir = exports.export_dir(ctx.settings.data_dir, export_id)
    ctx.log(f"export {export_id}: {spec.kind} as {spec.format}, filters {spec.filters}")
    if ctx.attempts > 1:
        _remove_leftovers(ctx, out_dir)

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, f"{done}/{total} rows read")
        ctx.check()  # cancelled or shutting down: stop between batches; the writer removes its temp files

    result = export_writer.write_export(engine, spec, out_dir, secret=ctx.settings.resolved_secret(),
                                        progress=progress)

    def publish(db: Session) -> str | None:
        # Only the worker that still holds the job records files: one whose lease lapsed (it was taken over)
        # must not overwrite the row after the new holder wrote the same directory.
        if not jobs.holds(db, ctx.job_id, ctx.worker.worker_id):
            return "lost"
        return exports.record_files(db, export_id, result)

    problem = run_transaction(ctx.session_factory, publish, what=f"recording export {export_id}")
    if problem == "lost":
        ctx.stop_reason = "lost"
        raise JobStopped("lost")
    if problem == "deleted":
        shutil.rmtree(out_dir, ignore_errors=True)  # deleted while it was being written
        raise JobError(f"export {export_id} was deleted while it was written")
    ctx.log(f"wrote {result.row_count} rows, sha256 {result.sha256}, snapshot {result.snapshot}")
    return _result(export_id, result.row_count, result.sha256, result.snapshot)


def _result(export_id: int, rows: int, sha256: str | None, snapshot: str | None) -> dict[str, Any]:
    empty = rows == 0
    return {"export_id": export_id, "rows": rows, "sha256": sha256, "snapshot": snapshot, "empty": empty,
            "message": "empty export: the filters select nothing" if empty else f"{rows} rows exported"}


def _remove_leftovers(ctx: JobContext, out_dir: Path) -> None:
    """A retry after a killed attempt: drop that attempt's temp directory (the writer's `.tmp-<name>-*` beside
    the export), which nothing else would ever remove. The final directory is replaced by the writer's rename."""
    for leftover in out_dir.parent.glob(f".tmp-{out_dir.name}-*"):
        ctx.log(f"removing {leftover.name}, left by an attempt that did not finish")
        shutil.rmtree(leftover, ignore_errors=True)
