"""The `revise` job: the supervised CAI stage — critique a completion under a principle, then revise it.

Each revision is stored as a completion with source "revision", linked to the original, the principle,
the constitution version and the critique, waiting for a lead to accept or reject it. Accepted revisions
become SFT rows in exports. Revisions are never ranked (the queue ignores them).

When the generator is a local model and the project's runs go to a cluster, so does the model work: the completions
and the principle each gets are written under the cluster's shared path, `python -m training.revise_batch` critiques
and revises them there (the same prompts and parameters: the same texts), and the worker stores each revision as it
stores its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.annotation import steps
from app.jobs.context import JobContext, JobError
from app.judge import endpoints, revisions
from app.platform.db import session_scope
from app.projects import constitutions, projects
from app.runs import cluster_job
from training.generation import GenerationError, GenerationParams
from training.revise_batch import revise, revision_params
from training.sample_batch import write_whole

Planned = tuple[int, int, Any, str, dict[str, Any]]
"""(completion id, prompt id, prompt text or messages, completion text, the principle it is revised under)."""
Revised = Iterator[tuple[Planned, str, str]]
"""Each planned completion with its critique and revision."""


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
        params = revision_params(spec)
    except (GenerationError, ValueError) as exc:
        raise JobError(f"generator: {exc}") from None

    seed = int(payload.get("seed", 0))
    todo = [(cid, pid, prompt, text, principles[_pick(cid, seed, len(principles))])
            for cid, pid, prompt, text in _originals(ctx, payload.get("prompt_ids"), int(payload.get("limit") or 20))]
    where = dict(payload.get("where") or {})
    on_cluster = bool(where.get("cluster")) and generator.backend == "hf"  # `where` names a cluster other than local
    total, done, written = len(todo), 0, 0
    try:
        if on_cluster:
            todo = _send(ctx, where, spec, todo)
            total = len(todo)
        ctx.progress(0, total, f"critiquing and revising {total} completions")
        revised = _from_cluster(ctx, todo) if on_cluster else _here(ctx, generator, params, todo)
        for (completion_id, prompt_id, _, _, principle), critique, revision in revised:
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
    return {"revisions": written, "message": f"{written} revisions waiting for review"} | (
        {"cluster": where["cluster"]} if on_cluster else {})


def _here(ctx: JobContext, generator: Any, params: GenerationParams, todo: list[Planned]) -> Revised:
    """Critique and revise on the worker, a completion at a time."""
    for item in todo:
        ctx.check()
        yield item, *revise(generator, item[2], item[3], item[4], params)


# --- on a cluster: the model work is a job of its own there (training.revise_batch), the storing stays here --------

PROMPTS_FILE, SPEC_FILE, OUT_FILE = "completions.jsonl", "spec.json", "revisions.jsonl"


def _send(ctx: JobContext, where: dict[str, Any], spec: dict[str, Any], todo: list[Planned]) -> list[Planned]:
    """Write the completions to revise under the cluster's shared path (once: a cluster job may be reading them
    already), have the cluster revise them (`python -m training.revise_batch`), followed as the train job follows a
    run; the completions it was sent, whose revisions are now in its OUT file."""
    workdir = ctx.settings.data_dir / "revising" / str(ctx.job_id)
    placed = cluster_job.place(ctx, where, workdir)
    if not (workdir / PROMPTS_FILE).exists():
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / SPEC_FILE).write_text(json.dumps({"generator": spec}), encoding="utf-8")
        write_whole(workdir / PROMPTS_FILE, [{"completion_id": cid, "prompt_id": pid, "prompt": prompt, "text": text,
                                              "principle": principle} for cid, pid, prompt, text, principle in todo])
    sent: list[Planned] = [(int(r["completion_id"]), int(r["prompt_id"]), r["prompt"], r["text"], r["principle"])
                           for r in map(json.loads, (workdir / PROMPTS_FILE).read_text(encoding="utf-8").splitlines())]
    if sent:
        cluster_job.hold_slot(ctx, placed)
        cluster_job.carry_out(ctx, placed, module="training.revise_batch", what="revising",
                              reads=(Path(str(spec["model"])).expanduser(),),
                              args=["--spec", str(workdir / SPEC_FILE), "--prompts", str(workdir / PROMPTS_FILE),
                                    "--out", str(workdir / OUT_FILE)])
    return sent


def _from_cluster(ctx: JobContext, sent: list[Planned]) -> Revised:
    """The cluster's critiques and revisions, in the order they were sent; one stored already (by an earlier attempt
    that stored part of them) is not stored twice (`revisions.add_revision`)."""
    if not sent:
        return
    out = ctx.settings.data_dir / "revising" / str(ctx.job_id) / OUT_FILE
    try:
        lines = {int(line["completion_id"]): line for line in map(json.loads, out.read_text(encoding="utf-8")
                                                                  .splitlines())}
    except (OSError, ValueError, KeyError) as exc:
        raise JobError(f"the cluster's job ended without its revisions in {out}: {exc}") from None
    for item in sent:
        ctx.check()
        line = lines[item[0]]
        yield item, str(line["critique"]), str(line["revision"])


def _pick(completion_id: int, seed: int, n: int) -> int:
    """A principle per completion, seeded and independent of batching (like the judge's sampling)."""
    digest = hashlib.sha256(f"{seed}:{completion_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def _originals(ctx: JobContext, prompt_ids: list[int] | None, limit: int) -> list[tuple[int, int, Any, str]]:
    """Non-revision completions of the project without a revision yet, oldest first, at most `limit`."""
    assert ctx.project_id is not None  # a revise job is enqueued for its project
    with ctx.session_factory() as db:
        return revisions.unrevised(db, ctx.project_id, prompt_ids, limit)
