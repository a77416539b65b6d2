"""Durable background jobs: the queue, the context a handler works with, the job pages, and the handler of each kind.

Each handler is `run(ctx: JobContext) -> dict` in its feature's package (`app.exports.job`, `app.runs.train_job`,
…), imported when a job of its kind first arrives, so this module imports nothing of the app. The context and the
job exceptions are in `app.jobs.context`, the queue in `app.jobs.queue`: with `handler_for` and `routes`, what other
packages use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.jobs.context import JobContext

__all__ = ["HANDLERS", "context", "handler_for", "queue", "routes"]

HANDLERS: dict[str, str] = {
    "sample_completions": "app.judge.sample_job:run",
    "judge": "app.judge.judge_job:run",
    "mc_step_labels": "app.judge.monte_carlo_job:run",
    "train": "app.runs.train_job:run",
    "revise": "app.judge.revise_job:run",
    "rm_check": "app.runs.train_job:check_against_humans",
    "export": "app.exports.job:run",
    "project_rollup": "app.quality.rollup_job:run",
    "priorities": "app.annotation.priority_job:run",
    "webhook_delivery": "app.webhooks.delivery_job:run",
}

Handler = Callable[["JobContext"], dict[str, Any]]


def handler_for(kind: str) -> Handler:
    if kind not in HANDLERS:
        raise KeyError(f"no handler for job kind {kind!r}")
    module, _, name = HANDLERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)
