"""The `revise` job: the supervised CAI stage — critique a completion under a principle, then revise it.

Each revision is stored as a completion with source "revision", linked to the original, the principle,
the constitution version and the critique, waiting for a lead to accept or reject it. Accepted revisions
become SFT rows in exports. Revisions are never ranked (the queue ignores them).
"""

from __future__ import annotations

import hashlib
from typing import Any

from app.annotation import steps
from app.jobs.context import JobContext, JobError
from app.judge import endpoints, revisions
from app.platform.db import session_scope
from app.projects import constitutions, projects
from training.generation import GenerationError, params_from_spec
from training.judge import critique_and_revise
from training.judge_prompts import format_conversation


def run(ctx: JobContext) -> dict[str, Any]:
    payload = ctx.payload
    with session_scope(ctx.session_factory) as db:
        constitution = constitutions.find(db, payload["constitution_id"])
        if constitution is None:
            raise JobError("the constitution no longer exists")
        principles = [p for p in constitution.principles if p.get("critique") and p.get("revision")]
        version = constitution.version
        project = projects.find(db, constitution.project_id)
        step_options = steps.options(project) if project is not None else steps.StepOptions()
    if not principles:
        raise JobError("no principle of this constitution has both a critique and a revision request")
    try:
        generator, spec = endpoints.job_generator(ctx, payload["generator"])
        generator.check()
        params = params_from_spec({"temperature": 0.0, "max_new_tokens": 256, "seed": 0} | spec)
    except (GenerationError, ValueError) as exc:
        raise JobError(f"generator: {exc}") from None

    todo = _originals(ctx, payload.get("prompt_ids"), int(payload.get("limit") or 20))
    total, done, written = len(todo), 0, 0
    ctx.progress(0, total, f"critiquing and revising {total} completions")
    try:
        for completion_id, prompt_id, prompt, text in todo:
            ctx.check()
            principle = principles[_pick(completion_id, int(payload.get("seed", 0)), len(principles))]
            critique, revision = critique_and_revise(generator, format_conversation(prompt), text, principle,
                                                     params=params)
            with session_scope(ctx.session_factory) as db:
                written += revisions.add_revision(
                    db, original_id=completion_id, prompt_id=prompt_id, text=revision,
                    steps=steps.split(revision, step_options.separator) if step_options.enabled else None,
                    critique=critique, principle=principle["name"], constitution_version=version,
                    generator_name=generator.name, generator_params=generator.describe(params), seed=params.seed,
                    job_id=ctx.job_id)
            done += 1
            ctx.progress(done, total, f"{done}/{total} revised")
    finally:
        generator.close()
    return {"revisions": written, "message": f"{written} revisions waiting for review"}


def _pick(completion_id: int, seed: int, n: int) -> int:
    """A principle per completion, seeded and independent of batching (like the judge's sampling)."""
    digest = hashlib.sha256(f"{seed}:{completion_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def _originals(ctx: JobContext, prompt_ids: list[int] | None, limit: int) -> list[tuple[int, int, Any, str]]:
    """Non-revision completions of the project without a revision yet, oldest first, at most `limit`."""
    assert ctx.project_id is not None  # a revise job is enqueued for its project
    with ctx.session_factory() as db:
        return revisions.unrevised(db, ctx.project_id, prompt_ids, limit)
