"""The `project_rollup` job: with `{"agreement": "drain"}`, fold the project's waiting agreement changes into its kept
figures, a batch per transaction until none waits; with `{"agreement": "rebuild"}`, compute the kept figures again
from every ranking (app.quality.upkeep); otherwise compute a large project's judge figures and counts from every row
and store them (app.quality.rollups).

The computation runs at a lower CPU priority (nice +10, in a thread of its own: on Linux a thread's niceness is its
own), so a worker on the same host as the app processes yields the core to annotators' requests instead of taking
it from them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.jobs.context import JobContext, job_row
from app.platform.db import run_transaction
from app.projects import projects
from app.quality import rollups, upkeep

NICE = 10
T = TypeVar("T")


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
"""Batches one drain job folds in before it ends (a view queues the next): it never runs for ever under a flood."""


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

    def fold(db: Session) -> upkeep.Drained | None:
        return upkeep.drain(db, job_row(db, projects.find, project_id, "project"))

    def batches() -> None:
        for batch in range(MAX_DRAIN_BATCHES):
            drained = run_transaction(ctx.session_factory, fold, what="agreement drain")
            if drained is None:
                ctx.log("the figures must be rebuilt first: nothing drained")
                return
            done["marks"] += drained.marks
            done["groups"] += drained.groups
            done["extended"] += drained.extended
            ctx.progress(batch + 1, batch + 1, f"{done['marks']} changes folded in, {done['groups']} groups updated")
            if drained.marks < upkeep.DRAIN_BATCH:
                return

    _niced(batches)
    ctx.log(f"{done['marks']} changes folded into the agreement figures ({done['groups']} groups updated; "
            f"{done['extended']} times only new rankings were folded into a group's state)")
    return done


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
