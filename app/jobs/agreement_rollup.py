"""The `agreement_rollup` job: compute a large project's agreement reports from every ranking and store them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.db import run_transaction
from app.jobs.context import JobContext, job_row
from app.models import AgreementRollup, Project
from app.services import agreement_rollup


def run(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.project_id or 0)
    requested = ctx.payload.get("requested_at")
    with ctx.session_factory() as db:
        project = job_row(db, Project, project_id, "project")
        row = db.get(AgreementRollup, project_id)
        if row is not None and requested and row.computed_at >= datetime.fromisoformat(requested):
            ctx.log("a rollup newer than this request is stored already: nothing to do")
            return {"rankings": row.rankings, "skipped": True}
        ctx.progress(0, 1, "reading every ranking")
        # One read-only transaction, the rankings streamed from a server-side cursor; nothing written here.
        reports, rankings, computed_at, seconds = agreement_rollup.compute(db, project)

    def save(db: Session) -> None:
        agreement_rollup.store(db, project_id, reports, rankings, computed_at, seconds)

    run_transaction(ctx.session_factory, save, what="agreement rollup")
    ctx.log(f"agreement of {rankings} rankings computed in {seconds:.1f} s")
    ctx.progress(1, 1, f"{rankings} rankings in {seconds:.1f} s")
    return {"rankings": rankings, "seconds": round(seconds, 2)}
