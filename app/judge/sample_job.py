"""The `sample_completions` job: fill every prompt up to K completions from a generator, batch by batch.

Each batch is written in its own transaction after re-counting, so a job killed at any point and run
again (or resumed by another worker) never writes more than K completions for a prompt and loses nothing.
Empty, whitespace-only and identical completions are resampled or dropped before they are written (`Hygiene`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.jobs.context import JobContext, JobError, JobStopped
from app.judge import endpoints, sampling
from app.platform.db import session_scope
from training.generation import (
    GenerationCancelled,
    GenerationError,
    GenerationParams,
    diversity,
    near_duplicates,
    params_from_spec,
)

BATCH_PROMPTS = 8


def run(ctx: JobContext) -> dict[str, Any]:
    payload = ctx.payload
    k = int(payload["k"])
    tries = int(payload.get("resample_duplicates", 0))
    base_seed = payload.get("seed")
    try:
        generator, spec = endpoints.job_generator(ctx, payload["generator"])
        params = params_from_spec(spec | {"seed": base_seed})
        generator.check()
    except (GenerationError, ValueError, TypeError) as exc:
        raise JobError(f"generator: {exc}") from None

    todo, already_complete = _prompts_needing(ctx, k, payload.get("prompt_ids"))
    total = len(todo) + already_complete
    done = already_complete
    ctx.progress(done, total, f"sampling {len(todo)} prompts with {generator.name}")
    ctx.log(f"{len(todo)} prompts need completions (K={k}); generator {generator.describe()}")
    created = 0
    reports: list[dict[str, Any]] = []
    hygiene = Hygiene()
    cap_logged = None
    try:
        for start in range(0, len(todo), BATCH_PROMPTS):
            ctx.check()
            batch = todo[start:start + BATCH_PROMPTS]
            n = max(need for _, _, need, _ in batch)
            seed = None if base_seed is None else int(base_seed)  # each sample derives its own stream (see generation)
            try:
                samples = generator.generate([p for _, p, _, _ in batch], n,
                                             _with_seed(GenerationParams, params, seed), should_stop=ctx.should_stop)
            except GenerationCancelled as stopped:
                # Keep what finished before the stop (screened all the same); the rest is sampled on resume.
                kept = [(batch[i][0], hygiene.screen(batch[i][3], outs[: batch[i][2]]))
                        for i, outs in sorted(stopped.completed.items())]
                created += _write(ctx, k, generator, params, kept)
                raise JobStopped(ctx.stop_reason or "stopped") from None
            cap_logged = _log_n_cap(ctx, generator, cap_logged)
            ctx.check()
            per_prompt = []
            for (prompt_id, prompt, need, existing), outs in zip(batch, samples, strict=True):
                chosen = _resample(generator, prompt, existing, list(outs[:need]), tries, params, seed, hygiene)
                cap_logged = _log_n_cap(ctx, generator, cap_logged)
                per_prompt.append((prompt_id, hygiene.screen(existing, chosen)))
            created += _write(ctx, k, generator, params, per_prompt)
            for prompt_id, _ in per_prompt:
                texts = _texts(ctx, prompt_id)
                reports.append({"prompt_id": prompt_id, "completions": len(texts)} | diversity(texts))
            done += len(batch)
            ctx.progress(done, total, f"{done}/{total} prompts")
            ctx.log(f"batch of {len(batch)} prompts written ({created} completions so far)")
    finally:
        generator.close()
    with_dupes = sum(1 for r in reports if r["distinct"] < r["completions"])
    short = sum(1 for r in reports if r["completions"] < k)
    if hygiene.resampled or hygiene.dropped:
        ctx.log(hygiene.describe(short))
    summary = {
        "prompts": total, "completions_created": created, "generator": generator.describe(),
        "prompts_with_duplicates": with_dupes,
        "mean_jaccard": round(sum(r["mean_jaccard"] for r in reports) / len(reports), 4) if reports else None,
        "diversity": reports[:500],
        "resampled": hygiene.resampled, "dropped_empty": hygiene.dropped_empty,
        "dropped_identical": hygiene.dropped_identical, "prompts_short_of_k": short,
        "message": f"{created} completions for {len(reports)} prompts" + (
            f"; {with_dupes} prompts still have duplicate answers" if with_dupes else "") + (
            f"; {hygiene.describe(short)}" if hygiene.dropped else ""),
    }
    server_cap = getattr(generator, "n_cap", None)
    if server_cap is not None:
        summary["server_n_cap"] = server_cap
    return summary


def _normal(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Hygiene:
    """What never reaches annotators: empty or whitespace-only completions, and ones identical (whitespace
    aside) to another of the same prompt. They are resampled (`resample_duplicates` tries, which also cover
    near-duplicates), and what is still bad after that is dropped, leaving the prompt short of K until a later
    job tops it up (the queue serves only prompts with K completions)."""

    resampled: int = 0
    dropped_empty: int = 0
    dropped_identical: int = 0

    @property
    def dropped(self) -> int:
        return self.dropped_empty + self.dropped_identical

    @staticmethod
    def bad_slots(existing: list[str], chosen: list[Any]) -> list[int]:
        """Indices into `chosen` to sample again: blank ones, and repeats of an earlier text (near ones too)."""
        texts = existing + [s.text for s in chosen]
        repeats = {i - len(existing) for i in near_duplicates(texts) if i >= len(existing)}
        return sorted(repeats | {i for i, s in enumerate(chosen) if not s.text.strip()})

    def screen(self, existing: list[str], chosen: list[Any]) -> list[Any]:
        """`chosen` without blank completions and without ones identical to an existing or earlier kept text."""
        seen = {_normal(t) for t in existing}
        kept = []
        for sample in chosen:
            text = _normal(sample.text)
            if not text:
                self.dropped_empty += 1
            elif text in seen:
                self.dropped_identical += 1
            else:
                seen.add(text)
                kept.append(sample)
        return kept

    def describe(self, short: int) -> str:
        line = (f"hygiene: {self.resampled} empty or duplicate completions resampled; dropped "
                f"{self.dropped_empty} empty or whitespace-only and {self.dropped_identical} identical")
        if short:
            line += f"; {short} prompts are short of K: run the job again (or raise resample_duplicates) to top them up"
        return line


def _resample(generator: Any, prompt: Any, existing: list[str], chosen: list[Any], tries: int, params: Any,
              seed: int | None, hygiene: Hygiene) -> list[Any]:
    """`chosen` with its blank and repeated samples drawn again, up to `tries` rounds."""
    for attempt in range(tries):
        slots = hygiene.bad_slots(existing, chosen)
        if not slots:
            break
        retry_seed = None if seed is None else seed + 7919 * (attempt + 1)
        again = generator.generate([prompt], len(slots), _with_seed(GenerationParams, params, retry_seed))[0]
        hygiene.resampled += len(slots)
        for slot, sample in zip(slots, again, strict=False):
            chosen[slot] = sample
    return chosen


def _log_n_cap(ctx: JobContext, generator: Any, logged: Any) -> Any:
    """Say so in the job log when the server answered fewer choices than asked (sampling goes on at its cap);
    once per cap found. Returns what was logged."""
    seen = getattr(generator, "n_cap_seen", None)
    if seen is not None and seen != logged:
        asked, got = seen
        ctx.log(f"the server answered {got} choice(s) to a request for n={asked}: it caps or ignores n; "
                f"sampling continues with {'one request per sample' if got == 1 else f'{got} samples per request'} "
                f"(set max_n={got} on the generator to skip this check)")
    return seen


def _with_seed(cls: Any, params: Any, seed: int | None) -> Any:
    return cls(temperature=params.temperature, top_p=params.top_p, max_new_tokens=params.max_new_tokens, seed=seed,
               stop=list(params.stop))


def _prompts_needing(ctx: JobContext, k: int, prompt_ids: list[int] | None) -> tuple[sampling.Todo, int]:
    """[(prompt id, text or messages, completions still needed, existing texts)] oldest first, and how many are full."""
    with ctx.session_factory() as db:
        return sampling.prompts_needing(db, ctx.project_id, k, prompt_ids, _source(ctx))


def _texts(ctx: JobContext, prompt_id: int) -> list[str]:
    with ctx.session_factory() as db:
        return sampling.completion_texts(db, prompt_id)


def _source(ctx: JobContext) -> str:
    return ctx.payload.get("source") or "sampled"


def _write(ctx: JobContext, k: int, generator: Any, params: Any, per_prompt: list[tuple[int, list[Any]]]) -> int:
    """Insert the batch in one transaction, never more than K per prompt (re-counted under the write lock)."""
    described = generator.describe() | {"temperature": params.temperature, "top_p": params.top_p,
                                        "max_new_tokens": params.max_new_tokens, "stop": list(params.stop)}
    with session_scope(ctx.session_factory) as db:
        return sampling.add_samples(db, ctx.project_id, per_prompt, k=k, source=_source(ctx),
                                    generator_name=generator.name, generator_params=described, job_id=ctx.job_id)
