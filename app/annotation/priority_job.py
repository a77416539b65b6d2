"""The `priorities` job: score the project's prompts for its queue selection and store each one's priority."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.annotation import selection
from app.jobs.context import JobContext, JobError, job_row
from app.platform.db import run_transaction
from app.platform.errors import DomainError
from app.projects import projects


def run(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.payload["project_id"])
    chosen = str(ctx.payload["selection"])
    run_id = ctx.payload.get("training_run_id")
    ctx.log(f"priorities for project {project_id}: {chosen}" + (f", reward run {run_id}" if run_id else ""))

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, f"{done}/{total} prompts scored")
        ctx.check()

    def work(db: Session) -> dict[str, Any]:
        project = job_row(db, projects.find, project_id, "project")
        try:  # all or nothing: the priorities are written in this one transaction
            return selection.compute(db, project, chosen, int(run_id) if run_id else None, progress)
        except DomainError as exc:
            raise JobError(exc.message) from exc

    result = run_transaction(ctx.session_factory, work, what="priorities")
    ctx.log(f"priorities stored: {result}")
    return result | {"message": f"{result['prompts']} prompts prioritised by {chosen} ({result['measure']})"}
