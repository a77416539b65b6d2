"""The `revise` job: the supervised CAI stage — critique a completion under a principle, then revise it.

Each revision is stored as a completion with source "revision", linked to the original, the principle,
the constitution version and the critique, waiting for a lead to accept or reject it. Accepted revisions
become SFT rows in exports. Revisions are never ranked (the queue ignores them).
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select

from app.annotation import steps
from app.jobs.context import JobContext, JobError
from app.judge import endpoints
from app.models import Completion, Constitution, Project, Prompt
from app.platform.db import session_scope
from training.generation import GenerationError, params_from_spec
from training.judge import critique_and_revise
from training.judge_prompts import format_conversation


def run(ctx: JobContext) -> dict[str, Any]:
    payload = ctx.payload
    with session_scope(ctx.session_factory) as db:
        constitution = db.get(Constitution, payload["constitution_id"])
        if constitution is None:
            raise JobError("the constitution no longer exists")
        principles = [p for p in constitution.principles if p.get("critique") and p.get("revision")]
        version = constitution.version
        project = db.get(Project, constitution.project_id)
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
                already = db.scalar(select(Completion.id).where(Completion.prompt_id == prompt_id,
                                                                Completion.source == "revision",
                                                                Completion.meta["original_id"].as_integer()
                                                                == completion_id))
                if already is None:  # a resumed job never revises the same completion twice
                    db.add(Completion(prompt_id=prompt_id, text=revision, source="revision",
                                      generator_name=generator.name, generator_params=generator.describe(params),
                                      seed=params.seed,
                                      steps=steps.split(revision, step_options.separator)
                                      if step_options.enabled else None,
                                      meta={"original_id": completion_id, "principle": principle["name"],
                                            "constitution_version": version, "critique": critique,
                                            "status": "pending", "job_id": ctx.job_id}))
                    written += 1
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
    with ctx.session_factory() as db:
        revised = {int((m or {}).get("original_id", 0)) for m in db.scalars(
            select(Completion.meta).join(Prompt).where(Prompt.project_id == ctx.project_id,
                                                       Completion.source == "revision"))}
        query = (select(Completion.id, Prompt.id, Prompt.messages, Prompt.text, Completion.text).join(Prompt)
                 .where(Prompt.project_id == ctx.project_id, Completion.source != "revision")
                 .order_by(Completion.id))
        if prompt_ids:
            query = query.where(Prompt.id.in_(prompt_ids))
        out = []
        for cid, pid, messages, prompt_text, text in db.execute(query):
            if cid in revised:
                continue
            out.append((cid, pid, messages or prompt_text, text))
            if len(out) >= limit:
                break
        return out
