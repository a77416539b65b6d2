"""What every job that sends its heavy work through an execution backend shares: the train job and the sampling,
judge, revision and Monte-Carlo jobs of a local model place themselves on a cluster, wait for a slot under its cap,
submit under a deterministic name (or adopt what an earlier attempt submitted), store the submission beside their
files, copy new log text into the job's log from the stored offset, and cancel the backend's job when theirs is
cancelled.

Like train_job, this module loads the standard library alone at import (the trainer's supervisor imports train_job);
the app's database code is imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runs.backends.base import (
    LOCAL,
    Backend,
    BackendError,
    Cluster,
    Launch,
    Resources,
    Status,
    Submission,
    submission_name,
)

if TYPE_CHECKING:
    from app.jobs.context import JobContext

SUBMISSION_FILE = "submission.json"
"""WORKDIR/submission.json: the backend's id of the current submission and how much of its log was copied."""
LOCAL_POLL_S = 0.5
REMOTE_POLL_S = 2.0
"""How often a cluster is asked for the job's state and new log: one short request each time, no open connection."""
OFFLINE_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""The environment of every command a job launches: offline, unbuffered, and no progress bars (a bar redraws its
line with carriage returns, which a log file keeps as one line per redraw; the jobs write progress lines)."""


def placement(ctx: JobContext, db: Any, where: dict[str, Any]) -> tuple[Cluster, Resources]:
    """The job's cluster as configured now (with its secret), and the resources it asked for, or JobError naming
    what is gone."""
    from app.jobs.context import JobError
    from app.platform.crypto import Keyring
    from app.platform.errors import DomainError
    from app.runs import cluster_config

    name = str(where.get("cluster") or LOCAL)
    try:
        found = cluster_config.available(db, ctx.settings.clusters_file)
        if name not in found:
            raise JobError(f"the run's cluster {name} is no longer configured (admin page, PREFLAB_CLUSTERS_FILE)")
        cluster = cluster_config.with_secret(db, found[name], Keyring(ctx.settings))
    except DomainError as exc:
        raise JobError(exc.message) from None
    try:
        resources = Resources.from_dict(where.get("resources") or {}, base=cluster.resources)
    except (ValueError, TypeError) as exc:
        raise JobError(f"resources: {exc}") from None
    return cluster, resources


SLOT_WAIT_S = 5.0
"""How long a job held back by its cluster's cap waits before a worker looks for a free slot again."""


def wait_for_slot(ctx: JobContext, cluster: Cluster, waiting: str | None) -> None:
    """JobWait (back to the queue, the attempt not counted) while the cluster is full (`waiting` says how full); once
    it has a slot, a job that waited says so in its log."""
    from datetime import timedelta

    from app.jobs.context import JobWait

    if waiting is not None:
        raise JobWait(waiting, timedelta(seconds=SLOT_WAIT_S))
    if ctx.waited is not None:
        ctx.log(f"got a slot on {cluster.name}: claimed by {ctx.worker.worker_id} (attempt {ctx.attempts})")


def backend_for(cluster: Cluster) -> Backend:
    from app.runs.backends import clusters

    return clusters.backend_for(cluster)


def submit(ctx: JobContext, backend: Backend, launch: Launch) -> Submission:
    """Check and submit the launch, or adopt the submission an earlier attempt made under the same name; the
    submission is stored in the launch's directory before anything else can go wrong."""
    from app.jobs.context import JobError

    try:
        backend.check(launch)
        ctx.log(backend.describe(launch))
        found = backend.find(launch) if backend.remote else None
        if found is not None:
            ctx.log(f"{backend.kind} already holds {launch.name} (job {found.id}): following it, not submitting twice")
        submission = found or backend.submit(launch)
    except BackendError as exc:
        raise JobError(str(exc)) from None
    if backend.remote:
        ctx.log(f"submitted to {backend.kind} as job {submission.id}")
        submission.save(launch.workdir / SUBMISSION_FILE)
    return submission


def follow(ctx: JobContext, backend: Backend, submission: Submission, launch: Launch, *,
           poll: Callable[[], Any] = lambda: None, next_launch: Callable[[Launch], Launch] | None = None,
           what: str = "job", resumes: str = "") -> tuple[Status, bool]:
    """Poll the backend until its job ends (or this job must stop): copy new log text, call `poll` (progress), and
    submit a preempted job again as `next_launch(launch)` (`resumes` says from where, in the log). `what` names the
    work in the log. (The status it ended with, whether the job stopped.)"""
    stopped = False
    record = launch.workdir / SUBMISSION_FILE
    while True:
        status = backend.status(submission)
        submission = copy_log(ctx, backend, submission, record, final=status.done)
        if not stopped:
            poll()
        if status.requeue and not stopped:
            ctx.log(f"{status.reason}; submitting again{resumes}")
            launch = next_launch(launch) if next_launch is not None else again(launch)
            submission = submit(ctx, backend, launch)
            continue
        if status.done or (stopped and status.state not in ("queued", "running")):
            return status, stopped
        if ctx.should_stop() and not stopped:
            stopped = True
            if backend.remote and ctx.stop_reason != "cancelled":
                ctx.log(f"leaving {backend.kind} job {submission.id} running ({ctx.stop_reason}): it is followed "
                        "again from its stored submission")
                return status, stopped
            ctx.log(f"stopping the {what} ({ctx.stop_reason})")
            backend.cancel(submission)
            continue
        time.sleep(REMOTE_POLL_S if backend.remote else LOCAL_POLL_S)


def again(launch: Launch) -> Launch:
    """The same launch as the next attempt: `{prefix}-{job}-{attempt + 1}`."""
    attempt = launch.attempt + 1
    job = launch.name.rsplit("-", 1)[0]
    return dataclasses.replace(launch, attempt=attempt, name=f"{job}-{attempt}")


def copy_log(ctx: JobContext, backend: Backend, submission: Submission, record: Path, *,
             final: bool) -> Submission:
    """New log text from the backend appended to the job's log, and the offset stored with the submission."""
    text, offset = backend.read_log(submission, final=final)
    if not text:
        return submission
    with open(ctx.log_path, "a", encoding="utf-8") as log:
        log.write(text if text.endswith("\n") else text + "\n")
    submission = dataclasses.replace(submission, log_offset=offset)
    submission.save(record)
    return submission


@dataclass(frozen=True)
class Placed:
    """A job's model work placed on a cluster (`place`): where, with what, from which directory, and what an earlier
    attempt of the job submitted there (None: nothing yet)."""

    cluster: Cluster
    resources: Resources
    workdir: Path
    submission: Submission | None


def place(ctx: JobContext, where: dict[str, Any], workdir: Path) -> Placed:
    """The job's cluster and resources as configured now (JobError naming what is gone), and its earlier submission."""
    from app.platform.db import session_scope

    with session_scope(ctx.session_factory) as db:
        cluster, resources = placement(ctx, db, where)
    found = Submission.load(workdir / SUBMISSION_FILE)
    return Placed(cluster, resources, workdir, found if found is not None and found.backend == cluster.kind else None)


def hold_slot(ctx: JobContext, placed: Placed) -> None:
    """Take a slot on the cluster for the job's model work (JobWait while it is full); a job already submitted there
    keeps the one it has."""
    from app.platform.db import session_scope
    from app.runs import cluster_config

    if placed.submission is None:
        with session_scope(ctx.session_factory) as db:
            wait_for_slot(ctx, placed.cluster, cluster_config.take_slot(db, placed.cluster, ctx.job_id))


def carry_out(ctx: JobContext, placed: Placed, *, module: str, args: list[str], reads: tuple[Path, ...],
              what: str) -> None:
    """Run `python -m MODULE ARGS` on the cluster as `{prefix}-{job}-{attempt}` (or follow what an earlier attempt
    submitted) until it ends, its output copied into the job's log. Returns when it succeeded; JobStopped when this
    job must stop (a cancel stops the cluster's job too), JobError with the cluster's reason when it failed."""
    from app.jobs.context import JobError, JobStopped

    attempt = placed.submission.attempt if placed.submission else 1
    launch = Launch(name=submission_name(placed.cluster.job_prefix, ctx.job_id, attempt), attempt=attempt,
                    module=module, args=args, workdir=placed.workdir, log_path=ctx.log_path,
                    resources=placed.resources, reads=reads, env=dict(OFFLINE_ENV))
    backend = backend_for(placed.cluster)
    try:
        submission = placed.submission
        if submission is None:
            submission = submit(ctx, backend, launch)
        else:
            ctx.log(f"following {backend.kind} job {submission.id} again (submitted by an earlier attempt)")
        status, stopped = follow(ctx, backend, submission, launch, what=what)
    finally:
        backend.close()
    if stopped:
        raise JobStopped(ctx.stop_reason or "stopped")
    if status.state == "cancelled":
        raise JobError(status.reason or f"the {what} was cancelled on the cluster")
    if status.state != "succeeded":
        raise JobError(f"{status.reason}: {failure_reason(ctx.log_path)}")


def earlier(backend: Backend, workdir: Path) -> Submission | None:
    """What an earlier attempt submitted to this backend from `workdir`, to follow again (None on `local`)."""
    submission = Submission.load(workdir / SUBMISSION_FILE) if backend.remote else None
    return submission if submission is not None and submission.backend == backend.kind else None


ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)(?::|$)|error: )")


def failure_reason(path: Path) -> str:
    """Why the trainer failed, in one line: the last exception line of its log (`ValueError: …`, `error: …`), else
    its last line; the whole traceback stays in the job's log."""
    lines = [line.strip() for line in tail(path, 200).splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line[:500]
    return lines[-1][:500] if lines else "no output (see the job log)"


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
