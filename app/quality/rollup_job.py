"""The `project_rollup` job: with `{"agreement": "drain"}`, fold the project's waiting agreement changes into its kept
figures, a batch per transaction until none waits; with `{"agreement": "rebuild"}`, compute the kept figures again
from every ranking (app.quality.upkeep); otherwise compute a large project's judge figures and counts from every row
and store them (app.quality.rollups).

Beside the jobs, each worker process runs a Sweeper: every PREFLAB_AGREEMENT_DRAIN_EVERY_S it drains every project
with changes waiting, so the kept figures stay fresh without a view asking for it.

The computation runs at a lower CPU priority (nice +10, in a thread of its own: on Linux a thread's niceness is its
own), so a worker on the same host as the app processes yields the core to annotators' requests instead of taking
it from them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.jobs.context import JobContext, JobError, job_row
from app.platform.db import SessionFactory, run_transaction
from app.projects import projects
from app.quality import rollups, upkeep

NICE = 10
T = TypeVar("T")
log = logging.getLogger("preflab.worker")


def _niced(work: Callable[[], T]) -> T:
    """`work()` in a thread that lowered its own priority first (where the system allows it), waited for."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass  # not Linux, or not permitted: run at the worker's priority
        try:
            out["value"] = work()
        except BaseException as exc:  # re-raised in the worker's thread, as if it had run there
            out["error"] = exc

    thread = threading.Thread(target=run, name="project-rollup")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


MAX_DRAIN_BATCHES = 1_000
"""Batches one drain job folds in before it ends (the sweeper or a view drains the rest): it never runs for ever
under a flood."""


def run(ctx: JobContext) -> dict[str, Any]:
    mode = ctx.payload.get("agreement")
    if mode == "drain":
        return _drain(ctx)
    if mode == "rebuild":
        return _rebuild(ctx)
    return _rollup(ctx)


def _drain(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.project_id or 0)
    done = {"marks": 0, "groups": 0, "extended": 0}

    def progress(batch: int) -> None:
        ctx.progress(batch, batch, f"{done['marks']} changes folded in, {done['groups']} groups updated")

    ended = _niced(lambda: _drain_batches(ctx.session_factory, project_id, done, MAX_DRAIN_BATCHES, progress))
    if ended == "rebuild first":
        ctx.log("the figures must be rebuilt first: nothing drained")
    ctx.log(f"{done['marks']} changes folded into the agreement figures ({done['groups']} groups updated; "
            f"{done['extended']} times only new rankings were folded into a group's state)")
    return done


def _drain_batches(factory: SessionFactory, project_id: int, done: dict[str, int], most: int,
                   progress: Callable[[int], None] | None = None, *, wait: bool = True) -> str:
    """Drain the project batch after batch (one transaction each) until no full batch waits, or `most` batches ran;
    adds what each folded to `done`. How it ended: "drained", "more waiting", "rebuild first", or "busy" (`wait`
    False and another drain holds the project)."""
    for batch in range(most):
        drained = run_transaction(factory, lambda db: _fold(db, project_id, wait), what="agreement drain")
        if isinstance(drained, str):
            return drained
        done["marks"] += drained.marks
        done["groups"] += drained.groups
        done["extended"] += drained.extended
        if progress is not None:
            progress(batch + 1)
        if drained.marks < upkeep.DRAIN_BATCH:
            return "drained"
    return "more waiting"


def _fold(db: Session, project_id: int, wait: bool) -> upkeep.Drained | str:
    project = job_row(db, projects.find, project_id, "project")
    drained = upkeep.drain(db, project, wait=wait)
    if drained is not None:
        return drained
    if upkeep.needs_rebuild(db, project):
        upkeep.ensure_job(db, project, None, "rebuild")  # after an upgrade that changed a formula: once, for all
        return "rebuild first"
    return "busy"


SWEEP_BATCHES = 5
"""Batches the sweeper drains of one project before it goes on to the next (and back on its next pass)."""


class Sweeper:
    """Each worker process's keeper of the agreement figures: every `every_s` it folds the changes waiting in every
    project into the kept figures (app.quality.upkeep), at nice +10 in a thread of its own. The figures are then as
    fresh as the sweep, whether or not anyone looks, and a view reads them and does nothing else. Several workers
    sweep without waiting on one another: a project another drain holds is left to it."""

    def __init__(self, factory: SessionFactory, every_s: float) -> None:
        self.factory = factory
        self.every_s = max(every_s, MIN_SWEEP_S)
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self, stopping: threading.Event | None = None) -> dict[str, int]:
        """One pass over every project with changes waiting (cut short once `stopping` is set); what it folded in."""
        with self.factory() as db:
            marked = upkeep.marked_projects(db)
        done = {"projects": 0, "marks": 0, "groups": 0, "extended": 0}
        for project_id in marked:
            if stopping is not None and stopping.is_set():
                break
            try:
                ended = _drain_batches(self.factory, project_id, done, SWEEP_BATCHES, wait=False)
            except JobError:  # deleted meanwhile: its marks went with it
                continue
            done["projects"] += ended != "busy"
        return done

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agreement-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass  # not Linux, or not permitted: sweep at the worker's priority
        while not self.stopping.wait(self.every_s):
            try:
                self.sweep(self.stopping)
            except Exception:  # a database that is away, a bug: the next pass tries again
                log.exception("agreement sweeper: a pass failed")


MIN_SWEEP_S = 0.5
"""The sweeper's shortest pause between passes (PREFLAB_AGREEMENT_DRAIN_EVERY_S may be 0: views then fold changes in
themselves on every view)."""


def _rebuild(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.project_id or 0)
    ctx.progress(0, 1, "computing the agreement figures from every ranking")

    def rebuild(db: Session) -> upkeep.Drained:
        return upkeep.rebuild(db, job_row(db, projects.find, project_id, "project"))

    done = _niced(lambda: run_transaction(ctx.session_factory, rebuild, what="agreement rebuild"))
    ctx.log(f"agreement figures of {done.groups} groups computed from every ranking in {done.seconds:.1f} s")
    ctx.progress(1, 1, f"{done.groups} groups in {done.seconds:.1f} s")
    return {"groups": done.groups, "seconds": round(done.seconds, 2)}


def _rollup(ctx: JobContext) -> dict[str, Any]:
    project_id = int(ctx.project_id or 0)
    requested = ctx.payload.get("requested_at")
    with ctx.session_factory() as db:
        job_row(db, projects.find, project_id, "project")
        row = rollups.latest(db, project_id)
        if row is not None and requested and row.computed_at >= datetime.fromisoformat(requested):
            ctx.log("a rollup newer than this request is stored already: nothing to do")
            return {"rankings": row.rankings, "skipped": True}
        ctx.progress(0, 1, "reading every ranking")

    def compute() -> rollups.Rollup:
        # One read-only transaction, the rankings streamed from a server-side cursor; nothing written here.
        with ctx.session_factory() as db:
            return rollups.compute(db, job_row(db, projects.find, project_id, "project"))

    rollup = _niced(compute)

    def save(db: Session) -> None:
        rollups.store(db, project_id, rollup)

    run_transaction(ctx.session_factory, save, what="project rollup")
    ctx.log(f"counts and judge figures of {rollup.rankings} human rankings computed in {rollup.seconds:.1f} s")
    ctx.progress(1, 1, f"{rollup.rankings} rankings in {rollup.seconds:.1f} s")
    return {"rankings": rollup.rankings, "seconds": round(rollup.seconds, 2)}
