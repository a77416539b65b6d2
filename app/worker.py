"""The job worker: claims jobs from the database, runs them with a heartbeat, and never runs one twice.

Run several (`preflab worker`) against one Postgres; on SQLite run one. SIGTERM lets the current item
finish, gives the job back to the queue and exits; a SIGKILLed worker's job is taken over by another
worker once its heartbeat is stale.

A failure that cannot change (`app.jobs.context.is_permanent`: bad input, a refusal, a bug) fails the job at once
with its reason; any other crash is retried after a backoff that doubles with each attempt. Beside its main slot,
which runs any kind, a worker keeps a bookkeeping slot (a thread) that claims only short jobs that load no model
(exports, rollups, webhook deliveries), so an export never waits behind a judge run or a training run, and a thread
that folds new rankings into the kept agreement figures every few seconds (app.quality.rollup_job.Sweeper).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.jobs import HANDLERS, handler_for
from app.jobs import queue as jobs
from app.jobs.context import JobContext, JobError, JobRetry, JobStopped, JobWait, is_permanent
from app.models import Job
from app.platform import outbound
from app.platform.db import make_engine, make_session_factory, run_transaction, session_scope
from app.platform.errors import DomainError
from app.platform.observability import (
    configure_logging,
    forget_worker,
    job_id_var,
    record_worker_heartbeat,
    request_id_var,
)
from app.platform.settings import Settings
from app.quality import rollup_job
from app.runs import iteration, training_runs

__all__ = ["JobContext", "JobError", "JobStopped", "Worker", "run_worker"]  # the job names stay importable here

log = logging.getLogger("preflab.worker")

BOOKKEEPING_KINDS = ("export", "project_rollup", "webhook_delivery")
"""Short jobs that load no model: the bookkeeping slot claims only these."""
RETRY_MAX = timedelta(hours=1)
"""The longest backoff before a crashed job's next attempt."""


class Worker:
    """Claims jobs, runs each with a heartbeat thread beside it, and records how it ended."""

    def __init__(self, settings: Settings, *, worker_id: str | None = None, kinds: tuple[str, ...] | None = None,
                 poll_s: float = 1.0, heartbeat_s: float = 2.0, stale_after_s: float = 30.0,
                 session_factory: sessionmaker[Session] | None = None, announces: bool = True) -> None:
        self.settings = settings
        outbound.refuse_every_host(settings.outbound_hosts == "none")
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.kinds = kinds
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.stale_after = timedelta(seconds=stale_after_s)
        self.session_factory = session_factory or make_session_factory(make_engine(
            settings.database_url, prepared_statements=settings.database_prepared_statements))
        self.retry_base = timedelta(seconds=settings.job_retry_base_s)
        self.terminating = False
        self.announces = announces
        """False for a bookkeeping slot: the process is seen through its main slot's heartbeat file."""
        self._last_seen = 0.0

    def bookkeeping_slot(self, n: int = 1) -> Worker | None:
        """A second worker in this process that claims only the bookkeeping kinds this one may run, with the same
        settings, sessions and timings; None when this worker runs nothing but those kinds already."""
        allowed = self.kinds or tuple(HANDLERS)
        kinds = tuple(k for k in BOOKKEEPING_KINDS if k in allowed)
        if not kinds or set(allowed) <= set(BOOKKEEPING_KINDS):
            return None
        return Worker(self.settings, worker_id=f"{self.worker_id}+bookkeeping{n}", kinds=kinds, poll_s=self.poll_s,
                      heartbeat_s=self.heartbeat_s, stale_after_s=self.stale_after.total_seconds(),
                      session_factory=self.session_factory, announces=False)

    def announce(self, *, every_s: float = 5.0) -> None:
        """Touch this worker's heartbeat file (at most every `every_s`): readiness and /metrics read its age."""
        if not self.announces or time.monotonic() - self._last_seen < every_s:
            return
        try:
            record_worker_heartbeat(self.settings.data_dir, self.worker_id)
            self._last_seen = time.monotonic()
        except OSError:  # a full or read-only disk must not stop the jobs; readiness will say the worker is unseen
            log.warning("worker %s: cannot write its heartbeat file", self.worker_id, exc_info=True)

    def install_signal_handlers(self, slots: list[Worker] | None = None) -> None:
        """SIGTERM and SIGINT stop this worker and its `slots`, each after its current item."""
        def on_term(signum: int, _frame: Any) -> None:
            log.info("worker %s: signal %s, finishing the current item", self.worker_id, signum)
            for w in (self, *(slots or [])):
                w.terminating = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    def run(self, *, max_jobs: int | None = None, exit_when_idle: bool = False) -> int:
        """Claim and run jobs until terminated (or `max_jobs` ran, or the queue is empty with exit_when_idle)."""
        ran = 0
        while not self.terminating and (max_jobs is None or ran < max_jobs):
            self.announce()
            if self.run_one():
                ran += 1
                continue
            if exit_when_idle:
                break
            deadline = time.monotonic() + self.poll_s
            while time.monotonic() < deadline and not self.terminating:
                time.sleep(min(0.1, self.poll_s))
        return ran

    def run_one(self) -> bool:
        """Claim one job and run it to an end state; False when there was nothing to claim."""
        def take(db: Session) -> JobContext | None:
            job = jobs.claim(db, self.worker_id, kinds=self.kinds, stale_after=self.stale_after,
                             on_given_up=training_runs.fail_given_up)
            if job is None:
                return None
            waited = (job.result or {}).get(jobs.WAITING)
            if waited is not None:  # it waited for a slot; whether it waits again, this claim decides
                job.result = {key: value for key, value in job.result.items() if key != jobs.WAITING}
            ctx = JobContext(self, job.id, job.kind, dict(job.payload or {}), job.project_id, job.attempts,
                             job.max_attempts, waited=waited)
            if job.log_path is None:
                job.log_path = str(ctx.log_path)
            return ctx

        # A deadlock or serialization failure on the claim (two workers failing exhausted jobs at once) retries.
        ctx = run_transaction(self.session_factory, take, what="claiming a job")
        if ctx is None:
            return False
        # Every log line while the job runs names it, and the request that started it.
        job_token = job_id_var.set(ctx.job_id)
        request_token = request_id_var.set(ctx.payload.get("request_id"))
        try:
            self._run_claimed(ctx)
        finally:
            request_id_var.reset(request_token)
            job_id_var.reset(job_token)
        return True

    def _run_claimed(self, ctx: JobContext) -> None:
        if ctx.waited is None:  # a job that waits for a slot says so once, and once when it gets it
            ctx.log(f"claimed by {self.worker_id} (attempt {ctx.attempts})")
        log.info("job %s (%s): claimed, attempt %s", ctx.job_id, ctx.kind, ctx.attempts)
        stop_beating = threading.Event()
        beat = threading.Thread(target=self._heartbeat_loop, args=(ctx, stop_beating), daemon=True)
        beat.start()
        outcome: tuple[str, Any]
        try:
            result = handler_for(ctx.kind)(ctx)
            outcome = ("stopped", None) if ctx.should_stop() else ("ok", result or {})
        except JobStopped:
            outcome = ("stopped", None)
        except JobError as exc:
            outcome = ("error", str(exc))
        except JobRetry as exc:  # the handler asks for another attempt after a backoff
            outcome = ("retry", exc)
        except JobWait as exc:  # not yet: back to the queue, the attempt not counted
            outcome = ("wait", exc)
        except Exception as exc:  # log the traceback; fail at once when no attempt can end otherwise, else retry
            ctx.log(traceback.format_exc())
            outcome = ("error" if is_permanent(exc) else "crash", reason(exc))
        finally:
            stop_beating.set()
            beat.join()
        self._settle(ctx, outcome)

    def _settle(self, ctx: JobContext, outcome: tuple[str, Any]) -> None:
        kind, value = outcome
        done, total, message = ctx.take_progress()

        def record(db: Session) -> str | None:
            """The end state in one transaction (run again whole after a deadlock); returns the line to log."""
            jobs.heartbeat(db, ctx.job_id, self.worker_id, done=done, total=total, message=message)
            if kind == "ok":
                if not jobs.succeed(db, ctx.job_id, self.worker_id, value):
                    return "finished, but the job was no longer ours (cancelled or taken over): result dropped"
                self._continue_iteration(db, ctx)
                return "succeeded"
            if kind == "stopped":
                if ctx.stop_reason == "terminating":
                    jobs.requeue(db, ctx.job_id, self.worker_id, "the worker shut down; the job will resume")
                    return "worker shutting down: job given back to the queue"
                return f"stopped: {ctx.stop_reason}"
            if kind == "error":
                jobs.fail(db, ctx.job_id, self.worker_id, value, retry=False)
                return f"failed: {value}"
            if kind == "wait":
                jobs.defer(db, ctx.job_id, self.worker_id, str(value), value.after)
                return str(value) if ctx.waited is None else None
            if kind == "retry":
                jobs.fail(db, ctx.job_id, self.worker_id, str(value), retry=True, retry_after=value.after)
                return f"will retry in {value.after.total_seconds():g}s: {value}"
            wait = self.backoff(ctx.attempts)
            jobs.fail(db, ctx.job_id, self.worker_id, value, retry=True, retry_after=wait)
            if ctx.max_attempts is not None and ctx.attempts >= ctx.max_attempts:
                return f"crashed on its last attempt: {value}"
            return f"crashed (will retry in {wait.total_seconds():g}s): {value}"

        line = run_transaction(self.session_factory, record, what=f"finishing job {ctx.job_id}")
        if line:
            ctx.log(line)
            log.info("job %s (%s): %s", ctx.job_id, ctx.kind, line.splitlines()[0][:500])

    def backoff(self, attempts: int) -> timedelta:
        """How long a crashed job waits before its next attempt: the base, doubled for each attempt made since the
        first, at most RETRY_MAX; meanwhile the worker runs other jobs."""
        return min(RETRY_MAX, self.retry_base * 2 ** max(0, attempts - 1))

    def _continue_iteration(self, db: Session, ctx: JobContext) -> None:
        """A step of an automated RLHF round starts the next one in the same transaction as its own success."""
        job = db.get(Job, ctx.job_id)
        if job is None or not (job.payload or {}).get("iteration"):
            return
        try:
            with db.begin_nested():
                nxt = iteration.advance(db, job, self.settings.data_dir)
        except DomainError as exc:  # the round stops here, and says why; this step's own success stands
            job.result = dict(job.result or {}) | {"iteration_stopped": exc.message}
            ctx.log(f"iteration stopped: {exc.message}")
            return
        if nxt is not None:
            ctx.log(f"iteration: next step is job {nxt.id} ({nxt.kind})")

    def _heartbeat_loop(self, ctx: JobContext, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            self.announce()  # a long job keeps its worker seen
            done, total, message = ctx.take_progress()
            try:
                with session_scope(self.session_factory) as db:
                    state = jobs.heartbeat(db, ctx.job_id, self.worker_id, done=done, total=total, message=message)
            except Exception:  # a database hiccup: try again at the next beat
                log.exception("heartbeat failed for job %s", ctx.job_id)
                continue
            if state in ("cancelled", "lost") and ctx.stop_reason is None:
                ctx.stop_reason = state
                ctx.log(f"stop requested ({state})")


def reason(exc: BaseException) -> str:
    """A failure in the words a page shows: a refusal or bad input by its message, anything else with its type."""
    if isinstance(exc, DomainError):
        return exc.message
    if isinstance(exc, JobError | ValueError) and str(exc):
        return str(exc)
    return f"{exc.__class__.__name__}: {exc}"


def run_worker(settings: Settings, *, kinds: tuple[str, ...] | None = None, poll_s: float = 1.0,
               max_jobs: int | None = None, exit_when_idle: bool = False, heartbeat_s: float = 2.0,
               stale_after_s: float = 30.0, bookkeeping_slots: int = 1) -> int:
    """Run a worker until it is stopped (or idle, with exit_when_idle), with `bookkeeping_slots` threads beside it
    that run only exports, rollups and webhook deliveries, and (where it may run rollups) the agreement sweeper;
    returns how many jobs they ran together."""
    configure_logging(settings.log_format)
    worker = Worker(settings, kinds=kinds, poll_s=poll_s, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)
    slots = [s for s in (worker.bookkeeping_slot(n + 1) for n in range(bookkeeping_slots)) if s is not None]
    worker.install_signal_handlers(slots)
    log.info("worker %s started on %s with %d bookkeeping slot(s)", worker.worker_id,
             Path(settings.data_dir).resolve(), len(slots))
    counts = [0] * len(slots)
    sweeper = None
    if "project_rollup" in (kinds or tuple(HANDLERS)):  # a worker that drains the figures keeps them fresh too
        sweeper = rollup_job.Sweeper(worker.session_factory, settings.agreement_drain_every_s)
        sweeper.start()

    def run_slot(n: int) -> None:
        try:
            counts[n] = slots[n].run(exit_when_idle=exit_when_idle)
        except Exception:  # the main slot goes on and runs these kinds too
            log.exception("worker %s: bookkeeping slot stopped", slots[n].worker_id)

    threads = [threading.Thread(target=run_slot, args=(n,), name=s.worker_id, daemon=True)
               for n, s in enumerate(slots)]
    for thread in threads:
        thread.start()
    try:
        ran = worker.run(max_jobs=max_jobs, exit_when_idle=exit_when_idle)
    finally:
        for slot in slots:  # the main slot is done (stopped, idle or at max_jobs): the others finish their item
            slot.terminating = slot.terminating or not exit_when_idle
        for thread in threads:
            thread.join()
        if sweeper is not None:
            sweeper.stop()
            if exit_when_idle:  # idle means the figures too: what waits is folded in before the worker exits
                try:
                    sweeper.sweep()
                except Exception:  # the jobs ran; the figures are folded in by the next worker or view
                    log.exception("worker %s: the last agreement sweep failed", worker.worker_id)
        forget_worker(settings.data_dir, worker.worker_id)  # stopped on purpose: no longer counts as seen
    ran += sum(counts)
    log.info("worker %s stopped after %d job(s)", worker.worker_id, ran)
    return ran
