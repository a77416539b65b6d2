"""What a job handler works with: its context (payload, sessions, progress, stop checks), the job exceptions, and
which failures are worth another attempt."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from app.jobs import queue as jobs
from app.platform.errors import DomainError
from app.platform.settings import Settings
from training.hold import hold

T = TypeVar("T")


class JobError(Exception):
    """A failure that retrying cannot fix (bad input, missing model): the job fails at once with this message."""


class JobRetry(Exception):
    """A failure worth another attempt later (a webhook receiver answered 500): the job goes back to the queue and
    is not claimed again before `after` has passed; with no attempts left it fails with this message."""

    def __init__(self, message: str, after: timedelta) -> None:
        super().__init__(message)
        self.after = after


class JobWait(Exception):
    """Not yet (a cluster's runs are at its cap): the job goes back to the queue as it was, its attempt not counted,
    says what it waits for, and is not claimed again before `after` has passed."""

    def __init__(self, message: str, after: timedelta) -> None:
        super().__init__(message)
        self.after = after


PERMANENT: tuple[type[BaseException], ...] = (JobError, DomainError, ValueError, TypeError, LookupError,
                                              AttributeError, NotImplementedError)
"""Failures that come out the same on every attempt: bad input or configuration (ValueError and its kin: a
pydantic validation error, a prompt longer than the model's context), a refusal of our own services (DomainError),
a programming error. Anything else (a lost connection, a full disk, a server that answered 503, out of memory)
may pass, so it is retried after a backoff."""


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying `exc` is pointless: the job should fail at once with its reason."""
    return isinstance(exc, PERMANENT)


def will_retry(exc: BaseException, attempts: int, max_attempts: int | None) -> bool:
    """Whether the worker gives the job another attempt after `exc` (a handler keeps its row "queued" then, and
    says it failed only when this is False). `max_attempts` None: unknown, so taken for the last attempt."""
    return not is_permanent(exc) and max_attempts is not None and attempts < max_attempts


class JobStopped(Exception):
    """Raised by `JobContext.check()` when the job must stop (cancelled, shutting down, or taken over)."""


class WorkerState(Protocol):
    """The part of the worker a job sees: who holds the job, with what settings and sessions, and whether it is
    shutting down (the worker itself lives in app/worker.py, which imports this module, not the other way)."""

    worker_id: str
    settings: Settings
    session_factory: sessionmaker[Session]
    terminating: bool


class JobContext:
    """What a handler gets: the job's payload, a session factory, progress and log reporting, and stop checks."""

    def __init__(self, worker: WorkerState, job_id: int, kind: str, payload: dict[str, Any], project_id: int | None,
                 attempts: int, max_attempts: int | None = None, *, waited: str | None = None) -> None:
        self.worker = worker
        self.job_id = job_id
        self.kind = kind
        self.payload = payload
        self.project_id = project_id
        self.attempts = attempts
        self.max_attempts = max_attempts
        """None: unknown, so every crash is taken for the last attempt."""
        self.waited = waited
        """What the job waited for when it was last given back (`JobWait`), or None: the handler says when the
        wait is over, and the worker does not log the same wait again."""
        self.settings = worker.settings
        self.session_factory: sessionmaker[Session] = worker.session_factory
        self.stop_reason: str | None = None
        self._progress: tuple[int | None, int | None, str | None] = (None, None, None)
        self._lock = threading.Lock()
        self.log_path = jobs.log_path(worker.settings.data_dir, job_id)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        # The id of the request that started the job, so an operator can follow one click into the worker.
        request = f" [request {self.payload['request_id']}]" if self.payload.get("request_id") else ""
        with self._lock, self.log_path.open("a", encoding="utf-8") as fh:
            fh.write(f"{stamp}{request} {message}\n")

    def progress(self, done: int, total: int, message: str | None = None) -> None:
        with self._lock:
            self._progress = (done, total, message)
        hold(f"job.{self.kind}.progress.{done}", give_up=self.should_stop)  # crash tests stop a job mid-work here

    def should_stop(self) -> bool:
        if self.worker.terminating and self.stop_reason is None:
            self.stop_reason = "terminating"
        return self.stop_reason is not None

    def check(self) -> None:
        if self.should_stop():
            raise JobStopped(self.stop_reason)

    def take_progress(self) -> tuple[int | None, int | None, str | None]:
        with self._lock:
            return self._progress


def job_row(db: Session, find: Callable[[Session, int], T | None], row_id: int, what: str) -> T:
    """The row a job works on, read by its feature's `find(db, row_id)`, or JobError when it was deleted since the job
    was queued (retrying cannot help)."""
    row = find(db, row_id)
    if row is None:
        raise JobError(f"{what} {row_id} no longer exists")
    return row
