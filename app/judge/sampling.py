"""Asking for completions: validate the generator and the prompts up front, then enqueue a sampling job."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Job, Project, Prompt, TrainingRun, User
from app.platform.errors import Invalid


def request_sampling(db: Session, project: Project, actor: User, *, generator: dict[str, Any], k: int | None,
                     prompt_ids: list[int] | None, seed: int | None, resample_duplicates: int,
                     source: str = "sampled") -> Job:
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
               "resample_duplicates": resample_duplicates, "source": source}
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
                            temperature: float | None = None) -> Job:
    """Sample a finished policy's answers into the project (the completions' source names the run)."""
    generator = policy_generator(run, max_new_tokens=max_new_tokens, temperature=temperature)
    return request_sampling(db, project, actor, generator=generator, k=k, prompt_ids=None, seed=seed,
                            resample_duplicates=0, source=f"policy:{run.id}")
