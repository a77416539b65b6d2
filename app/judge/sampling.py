"""Asking for completions: validate the generator and the prompts up front, then enqueue a sampling job; and what
that job reads and writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.annotation import steps
from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Completion, Job, Project, Prompt, TrainingRun, User
from app.platform.errors import Invalid
from app.projects import projects
from training import sample_batch
from training.generation import Sample

Todo = list[tuple[int, Any, int, list[str]]]
"""[(prompt id, its text or chat messages, completions still needed, its completions' texts)]."""


# Prompts a sampling job answers per generation call (and per transaction), on the worker or on a cluster's node.
BATCH_PROMPTS = sample_batch.BATCH_PROMPTS


def request_sampling(db: Session, project: Project, actor: User, *, generator: dict[str, Any], k: int | None,
                     prompt_ids: list[int] | None, seed: int | None, resample_duplicates: int,
                     source: str = "sampled", max_prompts: int | None = None) -> Job:
    """A queued `sample_completions` job, or Invalid naming the field when something can be checked now."""
    permissions.require(db, actor, project, "sampling.start")
    k = k or project.completions_per_prompt
    if k > project.completions_per_prompt:
        raise Invalid(f"must be at most the project's K ({project.completions_per_prompt})", field="k")
    # An openai generator names an admin's model endpoint; the job keeps the id, never a URL or key.
    generator = endpoints.prepare(db, actor, generator)
    if prompt_ids:
        found = set(db.scalars(select(Prompt.id).where(Prompt.project_id == project.id,
                                                       Prompt.id.in_(set(prompt_ids)))))
        missing = sorted(set(prompt_ids) - found)
        if missing:
            raise Invalid(f"not prompts of this project: {', '.join(map(str, missing[:10]))}", field="prompt_ids")
    elif not db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)):
        raise Invalid("the project has no prompts yet; import some first", field="prompt_ids")
    payload = {"generator": generator, "k": k, "prompt_ids": prompt_ids, "seed": seed,
               "resample_duplicates": resample_duplicates, "source": source, "max_prompts": max_prompts}
    cluster = projects.default_cluster(project)
    if cluster is not None and generator.get("backend") == "hf":
        # A local model's sampling is heavy: it goes where the project's runs go. A server's stays on the worker.
        payload["where"] = {"cluster": cluster}
    return jobs.enqueue(db, "sample_completions", payload, project=project, actor=actor)


def policy_generator(run: TrainingRun, *, max_new_tokens: int | None = None,
                     temperature: float | None = None) -> dict[str, Any]:
    """A local generator for a finished policy run that samples the way the policy was trained to answer: its own
    length and temperature (from its resolved config) unless the caller says otherwise."""
    resolved = (run.config or {}).get("resolved", {})
    return {"backend": "hf", "model": run.model_dir,
            "max_new_tokens": max_new_tokens or int(resolved.get("max_new_tokens") or 256),
            "temperature": temperature if temperature is not None else float(resolved.get("temperature", 1.0))}


def request_policy_sampling(db: Session, project: Project, actor: User, run: TrainingRun, *, k: int | None,
                            seed: int | None, max_new_tokens: int | None = None,
                            temperature: float | None = None, max_prompts: int | None = None) -> Job:
    """Sample a finished policy's answers into the project (the completions' source names the run); with
    `max_prompts`, only that many of the prompts still short of K, oldest first."""
    generator = policy_generator(run, max_new_tokens=max_new_tokens, temperature=temperature)
    return request_sampling(db, project, actor, generator=generator, k=k, prompt_ids=None, seed=seed,
                            resample_duplicates=0, source=f"policy:{run.id}", max_prompts=max_prompts)


# --- what the sampling job reads and writes ------------------------------------------------------------------------


def prompts_needing(db: Session, project_id: int | None, k: int, prompt_ids: list[int] | None, source: str
                    ) -> tuple[Todo, int]:
    """The project's prompts short of K completions, oldest first, and how many are full. A policy's round
    (`source` "policy:<run>") counts only that policy's own answers, whatever earlier rounds left there."""
    count_q = select(func.count(Completion.id)).where(Completion.prompt_id == Prompt.id,
                                                      Completion.source != "revision")
    if source.startswith("policy:"):
        count_q = count_q.where(Completion.source == source)
    count = count_q.scalar_subquery()
    query = select(Prompt.id, Prompt.text, Prompt.messages, count).where(Prompt.project_id == project_id)
    if prompt_ids:
        query = query.where(Prompt.id.in_(prompt_ids))
    rows = db.execute(query.order_by(Prompt.id)).all()
    out = []
    complete = 0
    for prompt_id, text, messages, have in rows:
        if have >= k:
            complete += 1
            continue
        out.append((prompt_id, messages or text, k - have, completion_texts(db, prompt_id)))
    return out, complete


def completion_texts(db: Session, prompt_id: int) -> list[str]:
    """The texts of every completion of the prompt, oldest first."""
    return list(db.scalars(select(Completion.text).where(Completion.prompt_id == prompt_id).order_by(Completion.id)))


def add_samples(db: Session, project_id: int | None, per_prompt: Sequence[tuple[int, Sequence[Sample]]], *, k: int,
                source: str, generator_name: str, generator_params: dict[str, Any], job_id: int) -> int:
    """Store the samples as completions of their prompts, never more than K per prompt (of `source`, for a policy's
    round): each prompt is re-counted under its row lock on Postgres, so two writers cannot both fill the last
    places. How many were stored."""
    postgres = db.get_bind().dialect.name == "postgresql"
    project = db.get(Project, project_id) if project_id is not None else None
    created = 0
    for prompt_id, samples in per_prompt:
        lock = select(Prompt.id).where(Prompt.id == prompt_id)
        db.execute(lock.with_for_update() if postgres else lock)
        mine = select(func.count(Completion.id)).where(Completion.prompt_id == prompt_id)
        if source.startswith("policy:"):
            mine = mine.where(Completion.source == source)
        have = db.scalar(mine) or 0
        for sample in samples[: max(0, k - have)]:
            db.add(Completion(prompt_id=prompt_id, text=sample.text, source=source,
                              generator_name=generator_name, generator_params=generator_params, seed=sample.seed,
                              steps=steps.steps_for(project, sample.text) if project else None,
                              meta={"finish_reason": sample.finish_reason,
                                    "completion_tokens": sample.completion_tokens, "job_id": job_id}))
            created += 1
    return created
