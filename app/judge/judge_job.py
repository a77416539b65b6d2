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
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from sqlalchemy.orm import Session

from app.annotation import rankings, selection, steps
from app.annotation.pairs import expand_tiers
from app.jobs.context import JobContext, JobError, JobStopped, job_row, will_retry
from app.judge import endpoints, judging
from app.judge import steps as judge_steps
from app.platform.db import session_scope
from app.projects import constitutions, projects
from training.generation import GenerationError
from training.judge import Judge, JudgeCancelled, JudgeConfig, Skipped, Verdict
from training.judge_prompts import TEMPLATE_VERSION, format_conversation
from training.judge_ranking import rank_from_pairwise

PROMPTS_PER_CALL = 4
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
        principles = list(constitution.principles)
        params = dict(judge_run.params)
        project_id = judge_run.project_id
        judging.set_run_state(db, run_id, "running")
    try:
        config = JudgeConfig(mode=params.get("mode", "logprob"), principles=params.get("principles", "sample"),
                             seed=int(params.get("seed", 0)), low_confidence=float(params.get("low_confidence", 0.6)))
        judge = Judge(endpoints.job_generator(ctx, ctx.payload["generator"], "judge")[0], config)
        judge.generator.check()
    except JobError:  # the model endpoint is gone or its URL is refused now
        _set_state(ctx, run_id, "failed")
        raise
    except (GenerationError, ValueError, TypeError) as exc:
        _set_state(ctx, run_id, "failed")
        raise JobError(f"judge: {exc}") from None

    todo, done_before = _prompts_to_judge(ctx, project_id, run_id, ctx.payload.get("prompt_ids"))
    total, done = len(todo) + done_before, done_before
    ctx.progress(done, total, f"judging {len(todo)} prompts")
    ctx.log(f"judge {judge.describe()} · constitution v{constitution.version} · templates {TEMPLATE_VERSION}")
    tally = Tally()
    try:
        for start in range(0, len(todo), PROMPTS_PER_CALL):
            ctx.check()
            chunk = todo[start:start + PROMPTS_PER_CALL]
            _judge_chunk(ctx, judge, chunk, principles, tally, run_id=run_id, project_id=project_id,
                         constitution_id=constitution.id, params=params)
            done += len(chunk)
            ctx.progress(done, total, f"{done}/{total} prompts judged")
    except JudgeCancelled:
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise JobStopped(ctx.stop_reason or "stopped") from None
    except JobStopped:
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise
    except Exception as exc:  # queued again while the worker retries it, failed when it will not
        _set_state(ctx, run_id, "queued" if will_retry(exc, ctx.attempts, ctx.max_attempts) else "failed")
        raise
    finally:
        judge.generator.close()
    _set_state(ctx, run_id, "succeeded")
    return _summary(run_id, params, total, tally)


def _judge_chunk(ctx: JobContext, judge: Judge, chunk: list[judging.PromptToJudge], principles: list[Any],
                 tally: Tally, *, run_id: int, project_id: int, constitution_id: int, params: dict[str, Any]) -> None:
    """Judge every pair of the chunk's prompts in one call, then write each prompt's ranking (one transaction)."""
    items, keys = [], []
    for prompt_id, prompt, completions in chunk:
        conversation = format_conversation(prompt)
        for (i, text_i), (j, text_j) in combinations(completions, 2):
            items.append((conversation, text_i, text_j))
            keys.append((prompt_id, i, j))
    verdicts = judge.compare(items, principles, keys=keys, should_stop=ctx.should_stop)
    step_soft = _judge_steps(ctx, judge, project_id, chunk, tally) if params.get("label_steps") else {}
    by_prompt: dict[int, dict[tuple[int, int], Verdict | Skipped]] = {}
    for key, verdict in zip(keys, verdicts, strict=True):
        by_prompt.setdefault(key[0], {})[(key[1], key[2])] = verdict
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
            tiers, scores, confidence = rank_from_pairwise(ids, p, judge.config.ranking)
            reason, ranking_id = _write_ranking(
                db, ctx, judge_run_id=run_id, project_id=project_id, constitution_id=constitution_id,
                prompt_id=prompt_id, ids=ids, tiers=tiers, scores=scores, confidence=confidence, p=p,
                verdicts=pair_verdicts, config=judge.config)
            if ranking_id is not None and prompt_id in step_soft:  # in the ranking's transaction
                tally.step_labels += judge_steps.write(db, ranking_id, step_soft[prompt_id])
            tally.low += reason == "low_confidence"
            if reason is not None and params.get("route_low_confidence"):
                routed_now[prompt_id] = reason
            tally.written += 1
        project_row = projects.find(db, project_id)
        assert project_row is not None
        tally.routed += selection.route_to_humans(db, project_row, routed_now, judge_run_id=run_id)


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


def _judge_steps(ctx: JobContext, judge: Judge, project_id: int, chunk: list[judging.PromptToJudge], tally: Tally
                 ) -> dict[int, dict[int, list[float]]]:
    """Per prompt of the chunk, per completion, the judge's p(step correct) for each of its stored steps (its first
    steps only, when a later question is too long for the judge model's context: the tally counts the rest)."""
    with session_scope(ctx.session_factory) as db:
        project = projects.find(db, project_id)
        assert project is not None
        stored = steps.task_steps(db, project, [cid for _, _, completions in chunk for cid, _ in completions])
    items, owners = [], []
    for prompt_id, prompt, completions in chunk:
        conversation = format_conversation(prompt)
        for cid, _ in completions:
            items.append((conversation, stored.get(cid, [])))
            owners.append((prompt_id, cid))
    out: dict[int, dict[int, list[float]]] = defaultdict(dict)
    for (prompt_id, cid), ps in zip(owners, judge.label_steps(items, should_stop=ctx.should_stop), strict=True):
        out[prompt_id][cid] = ps
        tally.steps_unlabelled += len(stored.get(cid, [])) - len(ps)
    return out


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
