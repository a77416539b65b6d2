"""The `export` job: write one Export's files from a database snapshot and record their hashes on the row."""

from __future__ import annotations

import shutil
from typing import Any

from app.db import session_scope
from app.models import Export
from app.services import export_writer, exports


def run(ctx: Any) -> dict[str, Any]:
    from app.worker import JobError

    export_id = int(ctx.payload["export_id"])
    with ctx.session_factory() as db:
        export = db.get(Export, export_id)
        if export is None:
            raise JobError(f"export {export_id} no longer exists")
        if export.deleted_at is not None:
            raise JobError(f"export {export_id} was deleted before it was written")
        spec = exports.spec_of(export)
    engine = ctx.session_factory.kw["bind"]
    out_dir = exports.export_dir(ctx.settings.data_dir, export_id)
    ctx.log(f"export {export_id}: {spec.kind} as {spec.format}, filters {spec.filters}")

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, f"{done}/{total} rows read")
        ctx.check()  # cancelled or shutting down: stop between batches; the writer removes its temp files

    result = export_writer.write_export(engine, spec, out_dir, secret=ctx.settings.resolved_secret(),
                                        progress=progress)
    with session_scope(ctx.session_factory) as db:
        export = db.get(Export, export_id, with_for_update=db.get_bind().dialect.name == "postgresql")
        if export is None or export.deleted_at is not None:
            shutil.rmtree(out_dir, ignore_errors=True)  # deleted while it was being written
            raise JobError(f"export {export_id} was deleted while it was written")
        export.files = result.files
        export.sha256 = result.sha256
        export.row_count = result.row_count
        export.row_counts = result.row_counts
        export.path = str(result.path)
    empty = result.row_count == 0
    ctx.log(f"wrote {result.row_count} rows, sha256 {result.sha256}, snapshot {result.snapshot}")
    return {"export_id": export_id, "rows": result.row_count, "sha256": result.sha256, "snapshot": result.snapshot,
            "empty": empty,
            "message": "empty export: the filters select nothing" if empty else f"{result.row_count} rows exported"}
