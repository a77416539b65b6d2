"""Durable background jobs: enqueue in the caller's transaction, claim with SKIP LOCKED, heartbeat, finish once.

States: queued → running → succeeded | failed | cancelled. A running job whose heartbeat is older than
`stale_after` is taken over by the next worker that asks (its lease lapsed: the worker died); attempts
are capped by `max_attempts`, after which the job fails with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Job, Project, User, utcnow
from app.platform import audit
from app.platform.errors import Conflict, Invalid, NotFound
from app.platform.observability import current_request_id
from app.projects import projects

KINDS = ("sample_completions", "judge", "mc_step_labels", "export", "train", "revise", "rm_check", "project_rollup",
         "priorities", "webhook_delivery")
TERMINAL = ("succeeded", "failed", "cancelled")
GivenUp = Callable[[Session, list[int]], None]
"""Told, in the claim's transaction, the ids of jobs that just failed because every attempt died."""
STALE_AFTER = timedelta(seconds=30)
GAVE_UP = "gave up: the worker stopped responding on every attempt"


def enqueue(db: Session, kind: str, payload: dict[str, Any], *, project: Project | None, actor: User | None,
            max_attempts: int = 3) -> Job:
    """A queued job, written in the caller's transaction: it exists only if the request that asked for it commits."""
    if kind not in KINDS:
        raise Invalid(f"unknown job kind; one of {', '.join(KINDS)}", field="kind")
    request_id = current_request_id()
    if request_id and "request_id" not in payload:
        payload = payload | {"request_id": request_id}  # the worker's log lines for this job carry it
    job = Job(kind=kind, payload=payload, project_id=project.id if project else None,
              created_by_id=actor.id if actor else None, max_attempts=max_attempts, state="queued",
              result={"done": 0, "total": 0, "message": "waiting for a worker"})
    db.add(job)
    db.flush()
    audit.record(db, actor, "job.enqueue", project_id=job.project_id, object_type="job", object_id=job.id, kind=kind)
    return job


def claim(db: Session, worker_id: str, *, kinds: tuple[str, ...] | None = None, now: datetime | None = None,
          stale_after: timedelta = STALE_AFTER, on_given_up: GivenUp | None = None) -> Job | None:
    """Take the oldest runnable job (queued, or running with a stale heartbeat) for this worker, or None.

    With nothing to claim, jobs whose every attempt died fail; `on_given_up(db, job_ids)` then tells their features
    in the same transaction (the worker passes the training runs' handler, so this module imports no feature).

    One statement: `UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED) RETURNING`, so concurrent
    workers on Postgres skip each other's rows; on SQLite the transaction already holds the write lock.
    The caller commits right away so the claim is visible.
    """
    now = now or utcnow()
    # A queued retry waits out its backoff (run_after); the state = 'queued' term still leads, so the
    # (state, created_at) index picks the rows and run_after only filters them.
    due = (Job.state == "queued") & or_(Job.run_after.is_(None), Job.run_after <= now)
    runnable = or_(due, (Job.state == "running") & (Job.heartbeat_at < now - stale_after))
    pick = select(Job.id).where(runnable, Job.attempts < Job.max_attempts).order_by(Job.created_at, Job.id).limit(1)
    if kinds:
        pick = pick.where(Job.kind.in_(kinds))
    if db.get_bind().dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    stmt = (update(Job).where(Job.id == pick.scalar_subquery())
            .values(state="running", attempts=Job.attempts + 1, claimed_by=worker_id, heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now))
            .returning(Job))
    job = db.scalars(stmt, execution_options={"synchronize_session": False, "populate_existing": True}).first()
    if job is None:
        given_up = _fail_exhausted(db, now, stale_after)
        if given_up and on_given_up is not None:
            on_given_up(db, given_up)
    return job


def _fail_exhausted(db: Session, now: datetime, stale_after: timedelta) -> list[int]:
    """Jobs whose every attempt died (stale heartbeat, no attempts left) fail with the reason instead of hanging;
    returns their ids."""
    return list(db.scalars(
        update(Job)
        .where(Job.state == "running", Job.heartbeat_at < now - stale_after, Job.attempts >= Job.max_attempts)
        .values(state="failed", finished_at=now,
                error=func.coalesce(Job.error + "\n", "") + GAVE_UP)  # the last crash's reason, then this
        .returning(Job.id), execution_options={"synchronize_session": False}).all())


def heartbeat(db: Session, job_id: int, worker_id: str, *, done: int | None = None, total: int | None = None,
              message: str | None = None) -> str:
    """Renew the lease and record progress; returns the job's state ("cancelled" tells the worker to stop).

    Only the worker that holds the job may write; any other answer ("lost") means someone took it over.
    """
    job = db.get(Job, job_id, with_for_update=db.get_bind().dialect.name == "postgresql")
    if job is None:
        return "lost"
    if job.state != "running":
        return job.state
    if job.claimed_by != worker_id:
        return "lost"
    job.heartbeat_at = utcnow()
    result = dict(job.result or {})
    if done is not None:
        result["done"] = done
    if total is not None:
        result["total"] = total
    if message is not None:
        result["message"] = message[:500]
    job.result = result
    if result.get("total"):
        job.progress = min(1.0, max(0.0, result.get("done", 0) / result["total"]))
    return "running"


def holds(db: Session, job_id: int, worker_id: str) -> bool:
    """Whether this worker still holds the job (locks its row on Postgres): a handler checks it in the transaction
    that publishes its result, so a worker whose job was taken over cannot overwrite the new holder's work."""
    return _owned(db, job_id, worker_id) is not None


def _owned(db: Session, job_id: int, worker_id: str) -> Job | None:
    job = db.get(Job, job_id, with_for_update=db.get_bind().dialect.name == "postgresql")
    if job is None or job.state != "running" or job.claimed_by != worker_id:
        return None  # cancelled, taken over, or already finished: leave it as it is
    return job


def succeed(db: Session, job_id: int, worker_id: str, result: dict[str, Any]) -> bool:
    job = _owned(db, job_id, worker_id)
    if job is None:
        return False
    job.state = "succeeded"
    job.progress = 1.0
    job.finished_at = utcnow()
    job.result = dict(job.result or {}) | result | {"message": result.get("message", "done")}
    job.error = None
    return True


def fail(db: Session, job_id: int, worker_id: str, error: str, *, retry: bool,
         retry_after: timedelta | None = None) -> bool:
    """Record a failure; with retry and attempts left the job goes back to the queue, claimable again once
    `retry_after` has passed (at once without it)."""
    job = _owned(db, job_id, worker_id)
    if job is None:
        return False
    job.error = error[-4000:]
    if retry and job.attempts < job.max_attempts:
        job.state = "queued"
        job.claimed_by = None
        job.run_after = utcnow() + retry_after if retry_after else None
        wait = f" in {retry_after.total_seconds():g}s" if retry_after else ""
        job.result = dict(job.result or {}) | {"message": f"attempt {job.attempts} failed; will retry{wait}"}
    else:
        job.state = "failed"
        job.finished_at = utcnow()
        job.result = dict(job.result or {}) | {"message": "failed"}
    return True


def requeue(db: Session, job_id: int, worker_id: str, message: str) -> bool:
    """Give a job back (the worker is shutting down); its attempt does not count against it."""
    job = _owned(db, job_id, worker_id)
    if job is None:
        return False
    job.state = "queued"
    job.claimed_by = None
    job.attempts = max(0, job.attempts - 1)
    job.result = dict(job.result or {}) | {"message": message}
    return True


WAITING = "waiting"
"""The key of a deferred job's result that says what it waits for, until a worker claims it again."""


def defer(db: Session, job_id: int, worker_id: str, message: str, after: timedelta) -> bool:
    """Give a job back until `after` has passed, its attempt not counted (it waits for a slot, it did not fail)."""
    if not requeue(db, job_id, worker_id, message):
        return False
    job = db.get(Job, job_id)
    assert job is not None
    job.run_after = utcnow() + after
    job.result = dict(job.result or {}) | {WAITING: message}  # the next claim knows it waited, and logs no repeat
    return True


def cancel(db: Session, job: Job, actor: User) -> Job:
    """Queued jobs never start; a running job's worker sees the state at its next heartbeat and stops."""
    if job.state in TERMINAL:
        raise Conflict(f"the job already {job.state}", field="state")
    db.execute(update(Job).where(Job.id == job.id, Job.state.not_in(TERMINAL))
               .values(state="cancelled", finished_at=utcnow()))
    db.refresh(job)
    audit.record(db, actor, "job.cancel", project_id=job.project_id, object_type="job", object_id=job.id)
    return job


def get_visible(db: Session, job_id: int, user: User) -> Job:
    job = db.get(Job, job_id)
    if job is None:
        raise NotFound("no such job")
    if job.project_id is None:
        if user.role != permissions.ADMIN:  # jobs outside any project are the admins'
            raise NotFound("no such job")
        return job
    projects.get_visible(db, job.project_id, user)  # NotFound unless the user may see the project
    return job


def latest(db: Session, project: Project, kind: str) -> Job | None:
    """The project's newest job of this kind, or None (a page shows how the last one it started went)."""
    return db.scalars(select(Job).where(Job.project_id == project.id, Job.kind == kind)
                      .order_by(Job.id.desc()).limit(1)).first()


def failure_reasons(db: Session, job_ids: list[int]) -> dict[int, str]:
    """Why each of these jobs failed, by id (failed jobs only)."""
    if not job_ids:
        return {}
    return {job_id: error or "failed" for job_id, error in
            db.execute(select(Job.id, Job.error).where(Job.id.in_(job_ids), Job.state == "failed"))}


def list_for_project(db: Session, project: Project, limit: int = 50) -> list[Job]:
    return list(db.scalars(select(Job).where(Job.project_id == project.id).order_by(Job.id.desc()).limit(limit)))


def log_path(data_dir: Path, job_id: int) -> Path:
    return data_dir / "jobs" / f"{job_id}.log"


def log_tail(data_dir: Path, job_id: int, lines: int = 40) -> str:
    path = log_path(data_dir, job_id)
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - 64 * 1024))
        text = fh.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])
