"""The `rollups` job: compute a large project's agreement reports from every ranking and store them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.db import run_transaction
from app.jobs.context import JobContext, job_row
from app.models import Project, ProjectRollup
from app.services import rollups


def run(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.project_id or 0)
    requested = ctx.payload.get("requested_at")
    with ctx.session_factory() as db:
        project = job_row(db, Project, project_id, "project")
        row = db.get(ProjectRollup, project_id)
        if row is not None and requested and row.computed_at >= datetime.fromisoformat(requested):
            ctx.log("a rollup newer than this request is stored already: nothing to do")
            return {"rankings": row.rankings, "skipped": True}
        ctx.progress(0, 1, "reading every ranking")
        # One read-only transaction, the rankings streamed from a server-side cursor; nothing written here.
        rollup = rollups.compute(db, project)

    def save(db: Session) -> None:
        rollups.store(db, project_id, rollup)

    run_transaction(ctx.session_factory, save, what="project rollup")
    ctx.log(f"agreement of {rollup.rankings} rankings computed in {rollup.seconds:.1f} s")
    ctx.progress(1, 1, f"{rollup.rankings} rankings in {rollup.seconds:.1f} s")
    return {"rankings": rollup.rankings, "seconds": round(rollup.seconds, 2)}
