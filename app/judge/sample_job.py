"""The `sample_completions` job: fill every prompt up to K completions from a generator, batch by batch.

Each batch is written in its own transaction after re-counting, so a job killed at any point and run
again (or resumed by another worker) never writes more than K completions for a prompt and loses nothing.
Empty, whitespace-only and identical completions are resampled or dropped before they are written (`Hygiene`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.jobs.context import JobContext, JobError, JobStopped
from app.judge import endpoints, sampling
from app.platform.db import session_scope
from app.runs import cluster_job
from training.generation import (
    GenerationCancelled,
    GenerationError,
    GenerationParams,
    Sample,
    diversity,
    params_from_spec,
)
from training.sample_batch import BATCH_PROMPTS, resample, write_whole


def run(ctx: JobContext) -> dict[str, Any]:
    payload = ctx.payload
    k = int(payload["k"])
    try:
        generator, spec = endpoints.job_generator(ctx, payload["generator"])
        params = params_from_spec(spec | {"seed": payload.get("seed")})
        generator.check()
    except (GenerationError, ValueError, TypeError) as exc:
        raise JobError(f"generator: {exc}") from None
    where = dict(payload.get("where") or {})
    tally = Tally(k)
    try:
        if where.get("cluster") and generator.backend == "hf":  # `where` names a cluster other than local
            _on_cluster(ctx, tally, generator, spec, params, where)
        else:
            _on_worker(ctx, tally, generator, params)
    finally:
        generator.close()
    return tally.summary(ctx, generator)


def _on_worker(ctx: JobContext, tally: Tally, generator: Any, params: GenerationParams) -> None:
    """Sample here, batch by batch, each batch written as soon as it is drawn."""
    tries = int(ctx.payload.get("resample_duplicates", 0))
    todo = tally.start(ctx, *_prompts_needing(ctx, tally.k, ctx.payload.get("prompt_ids")), generator)
    hygiene = tally.hygiene
    cap_logged = None
    for start in range(0, len(todo), BATCH_PROMPTS):
        ctx.check()
        batch = todo[start:start + BATCH_PROMPTS]
        n = max(need for _, _, need, _ in batch)
        try:  # each sample derives its own stream from the seed (see training.generation)
            samples = generator.generate([p for _, p, _, _ in batch], n, params, should_stop=ctx.should_stop)
        except GenerationCancelled as stopped:
            # Keep what finished before the stop (screened all the same); the rest is sampled on resume.
            kept = [(batch[i][0], hygiene.screen(batch[i][3], outs[: batch[i][2]]))
                    for i, outs in sorted(stopped.completed.items())]
            tally.created += _write(ctx, tally.k, generator, params, kept)
            raise JobStopped(ctx.stop_reason or "stopped") from None
        cap_logged = _log_n_cap(ctx, generator, cap_logged)
        ctx.check()
        per_prompt = []
        for (prompt_id, prompt, need, existing), outs in zip(batch, samples, strict=True):
            chosen, redrawn = resample(generator, prompt, existing, list(outs[:need]), tries, params)
            hygiene.resampled += redrawn
            cap_logged = _log_n_cap(ctx, generator, cap_logged)
            per_prompt.append((prompt_id, hygiene.screen(existing, chosen)))
        tally.written(ctx, _write(ctx, tally.k, generator, params, per_prompt), per_prompt)


@dataclass
class Tally:
    """What the job wrote and saw, batch by batch, for its progress, its log and its result."""

    k: int
    total: int = 0
    done: int = 0
    created: int = 0
    reports: list[dict[str, Any]] = field(default_factory=list)
    hygiene: Hygiene = field(default_factory=lambda: Hygiene())

    def start(self, ctx: JobContext, todo: sampling.Todo, complete: int, generator: Any) -> sampling.Todo:
        self.total, self.done = len(todo) + complete, complete
        ctx.progress(self.done, self.total, f"sampling {len(todo)} prompts with {generator.name}")
        ctx.log(f"{len(todo)} prompts need completions (K={self.k}); generator {generator.describe()}")
        return todo

    def written(self, ctx: JobContext, created: int, per_prompt: list[tuple[int, list[Any]]]) -> None:
        """A batch is in the database: report each prompt's completions as they stand now."""
        self.created += created
        for prompt_id, _ in per_prompt:
            texts = _texts(ctx, prompt_id)
            self.reports.append({"prompt_id": prompt_id, "completions": len(texts)} | diversity(texts))
        self.done += len(per_prompt)
        ctx.progress(self.done, self.total, f"{self.done}/{self.total} prompts")
        ctx.log(f"batch of {len(per_prompt)} prompts written ({self.created} completions so far)")

    def summary(self, ctx: JobContext, generator: Any) -> dict[str, Any]:
        reports, hygiene, created = self.reports, self.hygiene, self.created
        with_dupes = sum(1 for r in reports if r["distinct"] < r["completions"])
        short = sum(1 for r in reports if r["completions"] < self.k)
        if hygiene.resampled or hygiene.dropped:
            ctx.log(hygiene.describe(short))
        summary = {
            "prompts": self.total, "completions_created": created, "generator": generator.describe(),
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
        if ctx.payload.get("where"):
            summary["cluster"] = ctx.payload["where"].get("cluster")
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


def _prompts_needing(ctx: JobContext, k: int, prompt_ids: list[int] | None) -> tuple[sampling.Todo, int]:
    """[(prompt id, text or messages, completions still needed, existing texts)] oldest first, and how many are full;
    with `max_prompts` (a round sized for the machine), only that many of the oldest prompts still short of K."""
    with ctx.session_factory() as db:
        todo, complete = sampling.prompts_needing(db, ctx.project_id, k, prompt_ids, _source(ctx))
    most = ctx.payload.get("max_prompts")
    return (todo[:int(most)] if most else todo), complete


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


# --- on a cluster: the model work is a job of its own there (training.sample_batch), the writing stays here --------

PROMPTS_FILE, SPEC_FILE, OUT_FILE, FULL_FILE = "prompts.jsonl", "spec.json", "completions.jsonl", "full.txt"


def _on_cluster(ctx: JobContext, tally: Tally, generator: Any, spec: dict[str, Any], params: GenerationParams,
                where: dict[str, Any]) -> None:
    """Send the prompts short of K to the project's cluster (`python -m training.sample_batch`), follow that job as
    the train job follows a run, then write what it sampled here, batch by batch under the same recount and
    hygiene as on the worker. A worker that dies meanwhile leaves the cluster's job going; the next one follows the
    stored submission instead of submitting again."""
    workdir = ctx.settings.data_dir / "sampling" / str(ctx.job_id)
    placed = cluster_job.place(ctx, where, workdir)
    if not (workdir / PROMPTS_FILE).exists():  # once: a cluster job may be reading it already
        todo, complete = _prompts_needing(ctx, tally.k, ctx.payload.get("prompt_ids"))
        _write_inputs(workdir, todo, complete, spec | {"seed": params.seed, "resample_duplicates": int(
            ctx.payload.get("resample_duplicates", 0))})
    todo, complete = _read_inputs(workdir)
    if todo:
        cluster_job.hold_slot(ctx, placed)
    tally.start(ctx, todo, complete, generator)
    if not todo:
        return
    cluster_job.carry_out(ctx, placed, module="training.sample_batch", what="sampling", reads=(generator.path,),
                          args=["--spec", str(workdir / SPEC_FILE), "--prompts", str(workdir / PROMPTS_FILE),
                                "--out", str(workdir / OUT_FILE)])
    _ingest(ctx, tally, generator, params, todo, workdir / OUT_FILE)


def _write_inputs(workdir: Path, todo: sampling.Todo, complete: int, spec: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt_id": prompt_id, "prompt": prompt, "need": need, "existing": existing}
            for prompt_id, prompt, need, existing in todo]
    (workdir / SPEC_FILE).write_text(json.dumps(spec), encoding="utf-8")
    (workdir / FULL_FILE).write_text(str(complete), encoding="utf-8")  # prompts already at K: the job's progress
    write_whole(workdir / PROMPTS_FILE, rows)  # last: its presence says the inputs are whole


def _read_inputs(workdir: Path) -> tuple[sampling.Todo, int]:
    rows = [json.loads(line) for line in (workdir / PROMPTS_FILE).read_text(encoding="utf-8").splitlines()]
    complete = int((workdir / FULL_FILE).read_text(encoding="utf-8"))
    return [(int(r["prompt_id"]), r["prompt"], int(r["need"]), list(r["existing"])) for r in rows], complete


def _ingest(ctx: JobContext, tally: Tally, generator: Any, params: GenerationParams, todo: sampling.Todo,
            out: Path) -> None:
    """Write the cluster's samples, `BATCH_PROMPTS` prompts a transaction. Each is screened against the prompt's
    completions as they are now, so ingesting again after a crash adds nothing twice (and K is re-counted)."""
    try:
        lines = {int(line["prompt_id"]): line for line in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    except (OSError, ValueError, KeyError) as exc:
        raise JobError(f"the cluster's job ended without its completions in {out}: {exc}") from None
    wanted = [prompt_id for prompt_id, _, _, _ in todo if prompt_id in lines]
    for start in range(0, len(wanted), BATCH_PROMPTS):
        ctx.check()
        per_prompt = []
        for prompt_id in wanted[start:start + BATCH_PROMPTS]:
            line = lines[prompt_id]
            tally.hygiene.resampled += int(line.get("resampled", 0))
            samples = [Sample(**sample) for sample in line["samples"]]
            per_prompt.append((prompt_id, tally.hygiene.screen(_texts(ctx, prompt_id), samples)))
        tally.written(ctx, _write(ctx, tally.k, generator, params, per_prompt), per_prompt)
