"""Job handlers by kind: each is `run(ctx: JobContext) -> dict` in its own module, imported when first needed."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

HANDLERS: dict[str, str] = {
    "sample_completions": "app.jobs.sample_completions:run",
    "judge": "app.jobs.judge:run",
    "train": "app.jobs.train:run",
    "revise": "app.jobs.revise:run",
    "rm_check": "app.jobs.train:check_against_humans",
    "export": "app.jobs.export:run",
}


def handler_for(kind: str) -> Callable[[Any], dict[str, Any]]:
    if kind not in HANDLERS:
        raise KeyError(f"no handler for job kind {kind!r}")
    module, _, name = HANDLERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def runtime_generator(ctx: Any, stored: dict[str, Any], what: str = "generator") -> tuple[Any, dict[str, Any]]:
    """(generator, spec) built now: a model endpoint's URL and key are read (and the URL checked again) when the job
    runs, so neither ever sits in the job's payload; its client checks every address it connects to as well."""
    from app.errors import DomainError
    from app.services import endpoints
    from app.worker import JobError

    with ctx.session_factory() as db:
        try:
            return endpoints.runtime_generator(db, dict(stored), field=what)
        except DomainError as exc:
            raise JobError(f"{what}: {exc.message}") from None
