"""Job handlers by kind: each is `run(ctx: JobContext) -> dict` in its own module, imported when first needed.

This package imports nothing of the app: `python -m app.jobs.train --supervise` (the trainer's supervisor, alive
for a whole training run) loads it, and stays a small process. The context and the job exceptions are in
`app.jobs.context`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.jobs.context import JobContext

HANDLERS: dict[str, str] = {
    "sample_completions": "app.jobs.sample_completions:run",
    "judge": "app.jobs.judge:run",
    "train": "app.jobs.train:run",
    "revise": "app.jobs.revise:run",
    "rm_check": "app.jobs.train:check_against_humans",
    "export": "app.jobs.export:run",
    "project_rollup": "app.jobs.project_rollup:run",
    "priorities": "app.jobs.priorities:run",
    "webhook_delivery": "app.jobs.webhook_delivery:run",
}

Handler = Callable[["JobContext"], dict[str, Any]]


def handler_for(kind: str) -> Handler:
    if kind not in HANDLERS:
        raise KeyError(f"no handler for job kind {kind!r}")
    module, _, name = HANDLERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)
