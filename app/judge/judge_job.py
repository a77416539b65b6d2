"""The `judge` job: the AI judge ranks every prompt's completions like an annotator, with soft-labelled pairs.

For each prompt all K(K−1)/2 pairs are compared in both orders; a Bradley–Terry (or Copeland) fit
turns them into tiers; the ranking is stored as a ranking by the judge run, its pairs carry the soft
label p(chosen ≻ rejected) and both raw order probabilities. With `label_steps` the judge also labels every
step of every completion it ranks (p(Yes) to "is step N correct given the problem and the steps before it?"),
stored as the step labels of its ranking. One transaction per prompt, so a stopped or crashed run resumes where
it was and never writes a prompt twice.

A comparison too long for the judge model's context is judged on its answers cut in the middle, or skipped when
even that leaves too little of them (`training.judge`); a prompt with a skipped comparison gets no AI ranking (it
would order two answers the judge never compared) and stays with the humans. The run goes on, and its result counts
and names what it skipped and why, and how many comparisons it judged on cut answers.

When the judge is a local model and the project's runs go to a cluster, so does the judging: the prompts, their
completions (and stored steps) are written under the cluster's shared path, `python -m training.judge_batch` judges
them there (the same chunks, principles and seed: the same verdicts), and the worker writes the rankings from its
verdicts with the code it uses after judging here, so routing, gates and step labels are the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.annotation import rankings, selection, steps
from app.annotation.pairs import expand_tiers
from app.jobs.context import JobContext, JobError, JobStopped, JobWait, job_row, will_retry
from app.judge import endpoints, judging
from app.judge import steps as judge_steps
from app.platform.db import session_scope
from app.projects import constitutions, projects
from app.runs import cluster_job
from training.generation import GenerationError
from training.judge import Judge, JudgeCancelled, JudgeConfig, Skipped, Verdict
from training.judge_batch import ByPrompt, Chunk, StepsByPrompt, chunks, judge_chunk, read_line
from training.judge_prompts import TEMPLATE_VERSION
from training.judge_ranking import rank_from_pairwise
from training.sample_batch import write_whole

SKIPPED_LISTED = 100
"""The result names at most this many skipped comparisons (it counts them all)."""


@dataclass
class Tally:
    """What a judge run did, for its result."""

    written: int = 0
    """Prompts ranked by the judge (one AI ranking each)."""
    low: int = 0
    """Of those, rankings whose confidence was below the project's gate."""
    routed: int = 0
    """Prompts sent to humans first: low confidence, or a verdict that flipped when A and B were swapped."""
    step_labels: int = 0
    """Step labels written (a judge with `label_steps` rates each step of an answer)."""
    steps_unlabelled: int = 0
    """Steps left without a label: too long to ask about in the judge's context."""
    truncated: int = 0
    """Comparisons judged on answers cut to fit the judge's context."""
    skipped_prompts: int = 0
    """Prompts left to humans because a comparison did not fit the judge's context at all."""
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """{prompt_id, completions: [a, b], reason} per comparison left unjudged."""


def run(ctx: JobContext) -> dict[str, Any]:
    run_id = int(ctx.payload["judge_run_id"])
    with session_scope(ctx.session_factory) as db:
        judge_run = job_row(db, judging.find_run, run_id, "judge run")
        constitution = (constitutions.find(db, judge_run.constitution_id)
                        if judge_run.constitution_id is not None else None)
        if constitution is None:
            raise JobError("the judge run's constitution no longer exists")
        work = Work(run_id, judge_run.project_id, constitution.id, list(constitution.principles),
                    dict(judge_run.params))
        judging.set_run_state(db, run_id, "running")
    judge, spec = _judge(ctx, work)
    where = dict(ctx.payload.get("where") or {})
    on_cluster = bool(where.get("cluster")) and judge.backend == "hf"  # `where` names a cluster other than local
    todo, done_before = _prompts_to_judge(ctx, work.project_id, run_id, ctx.payload.get("prompt_ids"))
    total, done = len(todo) + done_before, done_before
    ctx.progress(done, total, f"judging {len(todo)} prompts")
    ctx.log(f"judge {judge.describe()} · constitution v{constitution.version} · templates {TEMPLATE_VERSION}")
    tally = Tally()
    try:
        judged = (_from_cluster(ctx, work, judge, spec, where, todo) if on_cluster
                  else _here(ctx, work, judge, todo))
        for chunk, by_prompt, step_ps in judged:
            _write_chunk(ctx, work, judge.config, chunk, by_prompt, step_ps, tally)
            done += len(chunk)
            ctx.progress(done, total, f"{done}/{total} prompts judged")
    except JudgeCancelled:
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise JobStopped(ctx.stop_reason or "stopped") from None
    except JobStopped:
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise
    except JobWait:  # the cluster is at its cap: back to the queue, the attempt not counted
        _set_state(ctx, run_id, "queued")
        raise
    except Exception as exc:  # queued again while the worker retries it, failed when it will not
        _set_state(ctx, run_id, "queued" if will_retry(exc, ctx.attempts, ctx.max_attempts) else "failed")
        raise
    finally:
        judge.generator.close()
    _set_state(ctx, run_id, "succeeded")
    return _summary(run_id, work.params, total, tally) | ({"cluster": where["cluster"]} if on_cluster else {})


@dataclass(frozen=True)
class Work:
    """The judge run the job carries out: its run, project, constitution and the principles and params it keeps."""

    run_id: int
    project_id: int
    constitution_id: int
    principles: list[Any]
    params: dict[str, Any]


def _judge(ctx: JobContext, work: Work) -> tuple[Judge, dict[str, Any]]:
    """The run's judge and its generator's spec, checked (the run failed, JobError, when it cannot judge now)."""
    params = work.params
    try:
        config = JudgeConfig(mode=params.get("mode", "logprob"), principles=params.get("principles", "sample"),
                             seed=int(params.get("seed", 0)), low_confidence=float(params.get("low_confidence", 0.6)))
        generator, spec = endpoints.job_generator(ctx, ctx.payload["generator"], "judge")
        judge = Judge(generator, config)
        judge.generator.check()
    except JobError:  # the model endpoint is gone or its URL is refused now
        _set_state(ctx, work.run_id, "failed")
        raise
    except (GenerationError, ValueError, TypeError) as exc:
        _set_state(ctx, work.run_id, "failed")
        raise JobError(f"judge: {exc}") from None
    return judge, spec


Judged = Iterator[tuple[Chunk, ByPrompt, StepsByPrompt]]
"""Each chunk of prompts with its verdicts and, when the run labels steps, its step labels."""


def _here(ctx: JobContext, work: Work, judge: Judge, todo: list[judging.PromptToJudge]) -> Judged:
    """Judge the prompts on the worker, a chunk a call."""
    for chunk in chunks(todo):
        ctx.check()
        stored = _stored_steps(ctx, work.project_id, chunk) if work.params.get("label_steps") else None
        yield chunk, *judge_chunk(judge, chunk, work.principles, steps=stored, should_stop=ctx.should_stop)


# --- on a cluster: the verdicts are a job of their own there (training.judge_batch), the writing stays here ---------

PROMPTS_FILE, SPEC_FILE, OUT_FILE = "prompts.jsonl", "spec.json", "verdicts.jsonl"


def _from_cluster(ctx: JobContext, work: Work, judge: Judge, spec: dict[str, Any], where: dict[str, Any],
                  todo: list[judging.PromptToJudge]) -> Judged:
    """The verdicts made on the project's cluster (`python -m training.judge_batch`), followed as the train job
    follows a run, chunk by chunk once its job succeeded. The inputs are written once: a worker that dies meanwhile
    leaves the cluster's job going and the next one follows the stored submission; a prompt ranked since (by an
    earlier attempt that wrote part of the verdicts) is passed over."""
    workdir = ctx.settings.data_dir / "judging" / str(ctx.job_id)
    placed = cluster_job.place(ctx, where, workdir)
    if not (workdir / PROMPTS_FILE).exists():  # once: a cluster job may be reading it already
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / SPEC_FILE).write_text(json.dumps({
            "generator": spec, "config": judge.config.to_dict(), "principles": work.principles,
            "label_steps": bool(work.params.get("label_steps"))}), encoding="utf-8")
        write_whole(workdir / PROMPTS_FILE, [
            {"prompt_id": prompt_id, "prompt": prompt, "completions": [[cid, text] for cid, text in completions]}
            | ({"steps": {str(cid): s for cid, s in _stored_steps(ctx, work.project_id, chunk).items()}}
               if work.params.get("label_steps") else {})
            for chunk in chunks(todo) for prompt_id, prompt, completions in chunk])
    if not todo:
        return
    cluster_job.hold_slot(ctx, placed)
    cluster_job.carry_out(ctx, placed, module="training.judge_batch", what="judging",
                          reads=(Path(str(spec["model"])).expanduser(),),
                          args=["--spec", str(workdir / SPEC_FILE), "--prompts", str(workdir / PROMPTS_FILE),
                                "--out", str(workdir / OUT_FILE)])
    try:
        lines = {int(line["prompt_id"]): read_line(line) for line in
                 map(json.loads, (workdir / OUT_FILE).read_text(encoding="utf-8").splitlines())}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JobError(f"the cluster's job ended without its verdicts in {workdir / OUT_FILE}: {exc}") from None
    sent = {int(row["prompt_id"]): row for row in map(
        json.loads, (workdir / PROMPTS_FILE).read_text(encoding="utf-8").splitlines())}
    still = {prompt_id for prompt_id, _, _ in todo}
    judged = [(prompt_id, row["prompt"], [(int(cid), text) for cid, text in row["completions"]])
              for prompt_id, row in sent.items() if prompt_id in still and prompt_id in lines]
    for chunk in chunks(judged):
        ctx.check()
        yield (chunk, {prompt_id: lines[prompt_id][0] for prompt_id, _, _ in chunk},
               {prompt_id: lines[prompt_id][1] for prompt_id, _, _ in chunk if work.params.get("label_steps")})


def _write_chunk(ctx: JobContext, work: Work, config: JudgeConfig, chunk: Chunk, by_prompt: ByPrompt,
                 step_soft: StepsByPrompt, tally: Tally) -> None:
    """Write each judged prompt's ranking (and its step labels) in one transaction, routing those a human should
    see first; the same whether the verdicts were made here or on a cluster."""
    if step_soft:
        stored = _stored_steps(ctx, work.project_id, chunk)
        tally.steps_unlabelled += sum(len(stored.get(cid, [])) - len(ps)
                                      for per_prompt in step_soft.values() for cid, ps in per_prompt.items())
    with session_scope(ctx.session_factory) as db:
        routed_now: dict[int, str] = {}
        for prompt_id, _, completions in chunk:
            pair_verdicts = _judged(prompt_id, by_prompt.get(prompt_id, {}), tally)
            if pair_verdicts is None:
                continue
            ids = [cid for cid, _ in completions]
            p = {}
            for (i, j), v in pair_verdicts.items():
                p[(i, j)], p[(j, i)] = v.p, 1.0 - v.p
            tiers, scores, confidence = rank_from_pairwise(ids, p, config.ranking)
            reason, ranking_id = _write_ranking(
                db, ctx, judge_run_id=work.run_id, project_id=work.project_id, constitution_id=work.constitution_id,
                prompt_id=prompt_id, ids=ids, tiers=tiers, scores=scores, confidence=confidence, p=p,
                verdicts=pair_verdicts, config=config)
            if ranking_id is not None and prompt_id in step_soft:  # in the ranking's transaction
                tally.step_labels += judge_steps.write(db, ranking_id, step_soft[prompt_id])
            tally.low += reason == "low_confidence"
            if reason is not None and work.params.get("route_low_confidence"):
                routed_now[prompt_id] = reason
            tally.written += 1
        project_row = projects.find(db, work.project_id)
        assert project_row is not None
        tally.routed += selection.route_to_humans(db, project_row, routed_now, judge_run_id=work.run_id)


def _judged(prompt_id: int, verdicts: dict[tuple[int, int], Verdict | Skipped], tally: Tally
            ) -> dict[tuple[int, int], Verdict] | None:
    """The prompt's verdicts, or None when a comparison was skipped: then it gets no ranking (one would order two
    answers the judge never compared) and each skipped comparison is named in the tally with its reason."""
    refused = {pair: v.reason for pair, v in verdicts.items() if isinstance(v, Skipped)}
    if refused:
        tally.skipped_prompts += 1
        tally.skipped += [{"prompt_id": prompt_id, "completions": list(pair), "reason": why}
                          for pair, why in refused.items()]
        return None
    judged = {pair: v for pair, v in verdicts.items() if isinstance(v, Verdict)}
    tally.truncated += sum(1 for v in judged.values() if v.truncated)
    return judged


def _summary(run_id: int, params: dict[str, Any], total: int, tally: Tally) -> dict[str, Any]:
    """The job's result, with its message in words."""
    message = f"judged {tally.written} of {total} prompts ({tally.low} with low confidence)"
    if tally.skipped_prompts:
        message += (f"; {tally.skipped_prompts} prompts left to humans: {len(tally.skipped)} comparisons too long "
                    "for the judge model's context")
    if tally.truncated:
        message += f"; {tally.truncated} comparisons judged on answers cut to fit its context"
    if params.get("label_steps"):
        message += f"; {tally.step_labels} step labels"
        if tally.steps_unlabelled:
            message += f" ({tally.steps_unlabelled} steps too long to ask about)"
    if params.get("route_low_confidence"):
        message += f"; {tally.routed} sent to humans first (low confidence, or a verdict that flipped under A/B swap)"
    return {"judge_run_id": run_id, "prompts": total, "rankings_written": tally.written,
            "low_confidence_rankings": tally.low, "routed_to_humans": tally.routed,
            "step_labels_written": tally.step_labels, "steps_unlabelled": tally.steps_unlabelled,
            "truncated_comparisons": tally.truncated, "skipped_prompts": tally.skipped_prompts,
            "skipped_comparisons": len(tally.skipped), "skipped": tally.skipped[:SKIPPED_LISTED],
            "message": message}


def _stored_steps(ctx: JobContext, project_id: int, chunk: Chunk) -> dict[int, list[str]]:
    """The stored steps of the chunk's completions, {completion id: steps}, for the judge to label."""
    with session_scope(ctx.session_factory) as db:
        project = projects.find(db, project_id)
        assert project is not None
        return steps.task_steps(db, project, [cid for _, _, completions in chunk for cid, _ in completions])


def _set_state(ctx: JobContext, run_id: int, state: str) -> None:
    with session_scope(ctx.session_factory) as db:
        judging.set_run_state(db, run_id, state)


def _prompts_to_judge(ctx: JobContext, project_id: int, run_id: int, prompt_ids: list[int] | None
                      ) -> tuple[list[judging.PromptToJudge], int]:
    """Prompts with ≥ 2 completions this run has not ranked yet (resume), and how many it already has."""
    with ctx.session_factory() as db:
        return judging.prompts_to_judge(db, project_id, run_id, prompt_ids)


def _write_ranking(db: Session, ctx: JobContext, *, judge_run_id: int, project_id: int, constitution_id: int,
                   prompt_id: int, ids: list[int], tiers: list[list[int]], scores: dict[int, float],
                   confidence: float, p: dict[tuple[int, int], float], verdicts: dict[tuple[int, int], Any],
                   config: JudgeConfig) -> tuple[str | None, int | None]:
    """Store the judge's ranking of one prompt, each pair with its soft label and the verdict it came from. Returns
    why a human should see the prompt: "low_confidence" (the ranking's confidence is low), "position_flip" (a
    verdict changed when the two answers were swapped), or None; and the new ranking's id (None: already there)."""
    ranking = rankings.NewRanking(
        {"project_id": project_id, "prompt_id": prompt_id, "round": judging.current_round(db, project_id),
         "source": "ai", "judge_run_id": judge_run_id, "constitution_id": constitution_id, "tiers": tiers,
         "display_order": ids,
         "meta": {"method": config.ranking, "scores": {str(k): round(v, 6) for k, v in scores.items()},
                  "confidence": round(confidence, 6), "job_id": ctx.job_id}},
        {pair: _soft_label(pair, p[pair], verdicts, config) for pair in _ordered_pairs(tiers)},
    )
    ranking_id = rankings.write_ranking(db, ranking)
    if confidence < config.low_confidence:
        return "low_confidence", ranking_id
    if any(getattr(v, "position_flip", False) for v in verdicts.values()):
        return "position_flip", ranking_id
    return None, ranking_id


def _ordered_pairs(tiers: list[list[int]]) -> list[tuple[int, int]]:
    return [(spec.chosen, spec.rejected) for spec in expand_tiers(tiers)]


def _soft_label(pair: tuple[int, int], pair_p: float, verdicts: dict[tuple[int, int], Any],
                config: JudgeConfig) -> rankings.PairLabel:
    """p(chosen ≻ rejected) from the fit, the verdict in the order it was compared, and whether it was unsure."""
    chosen, rejected = pair
    shown = [chosen, rejected] if pair in verdicts else [rejected, chosen]
    verdict = verdicts.get(pair) or verdicts.get((rejected, chosen))
    meta = verdict.to_dict() | {"compared_as": shown} if verdict is not None else {}
    meta.pop("p", None)
    meta["low_confidence"] = max(pair_p, 1 - pair_p) < config.low_confidence
    return rankings.PairLabel(p=pair_p, meta=meta)
