"""Which prompts the queue serves first: the project's `selection` setting and the priorities job behind it.

`random` (the default) serves prompts in the order they were imported, as before. `uncertainty` serves first the
prompts whose completions the current reward model is least sure how to order: for every pair of a prompt's task
completions the model's preference probability and its spread across the heads of an ensemble
(`RewardModel.compare`), the prompt's priority the largest spread (a single-head model has no spread: then
1 − |2p − 1|, nearest 0.5 first). `disagreement` serves first the prompts whose human rankings disagree most (the
share of their pair votes that went against the majority of that pair) and gives them more overlap: a prompt that
reached the project's overlap with a share above `disagreement_threshold` wants `disagreement_extra` more rankings
(`prompts.extra_overlap`, bounded by the project's annotators) and is served again first, to annotators who have
not ranked it. A priorities job writes each prompt's `priority` and its `queue_rank` (and resets every extra
overlap); prompts added later have none and are served after the scored ones. A judge run
with `route_low_confidence` sends the prompts it was unsure of (a low-confidence ranking, or a verdict that flipped
when the two answers were swapped) to humans first, under any selection (`route_to_humans`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.annotation import queue
from app.jobs import queue as jobs
from app.models import (
    Assignment,
    Completion,
    Job,
    Pair,
    Project,
    ProjectMember,
    Prompt,
    Ranking,
    TrainingRun,
    User,
    utcnow,
)
from app.platform import audit
from app.platform.errors import Invalid, NotFound

SELECTIONS = ("random", "uncertainty", "disagreement")
DEFAULT = "random"
MEASURED = {
    "random": "the default, and the baseline the others are measured against.",
    "uncertainty": "on HH-RLHF harmless (20 seeds, an 8-head ensemble over a frozen encoder) it reached random "
                   "order's final accuracy with 2.13× fewer labels, 95 % interval 1.12–3.78 (+1.4 accuracy points "
                   "over the curve); a single-head model's fallback, p nearest 0.5, saved nothing measurable "
                   "(1.28, 0.73–2.94). Too uncertain a gain to make it the default.",
    "disagreement": "in a simulation on GSM8K (six annotators of 70–95 % accuracy, overlap 2, 20 seeds) the extra "
                    "rankings it gives contested prompts were worth 5.96× as many given to prompts at random, "
                    "95 % interval 4.64–7.82 (+0.9 points of label accuracy after 64 extra rankings; the saving "
                    "is 3.5 % of all rankings, the overlap included); with overlap 1 it has nothing to compare.",
}
"""What each order was measured to save (docs/benchmarks.md: benchmarks/bench_active.py and bench_disagreement.py),
said beside the queue-order setting so a lead chooses on evidence."""
SCORE_BATCH = 256
"""Prompts scored per reward-model call in the priorities job."""
EXTRA_DEFAULT, EXTRA_MAX = 2, 10
"""`disagreement_extra`: rankings added to a contested prompt beyond the overlap (0 turns extra overlap off)."""
THRESHOLD_DEFAULT = 0.2
"""`disagreement_threshold`: a prompt is contested when more than this share of its pair votes went against the
majority (at most 0.5: the minority of a pair is never more than half; one dissenter of three on every pair: 1/3)."""


def selection_of(project: Project) -> str:
    return str((project.settings or {}).get("selection", DEFAULT))


def extra_of(project: Project) -> int:
    return int((project.settings or {}).get("disagreement_extra", EXTRA_DEFAULT))


def threshold_of(project: Project) -> float:
    return float((project.settings or {}).get("disagreement_threshold", THRESHOLD_DEFAULT))


@dataclass(frozen=True)
class SelectionState:
    """What the project page shows: the active selection and where its priorities came from."""

    selection: str
    computed_at: str | None
    computed_for: str | None
    """The selection the stored priorities were computed for (it may differ from the active one)."""
    training_run_id: int | None
    prompts: int
    measure: str | None
    routed: dict[str, Any]
    """What judge runs sent to humans first: prompts, low_confidence, position_flip, judge_run_id, at (or {})."""
    disagreement_extra: int
    disagreement_threshold: float
    extra_overlap_prompts: int
    """Prompts that want rankings beyond the overlap now (0 unless `disagreement` gave extras this round)."""


def state(project: Project) -> SelectionState:
    stored = (project.settings or {}).get("priorities") or {}
    extras = (project.settings or {}).get("extra_overlap") or {}
    return SelectionState(selection=selection_of(project), computed_at=stored.get("computed_at"),
                          computed_for=stored.get("selection"), training_run_id=stored.get("training_run_id"),
                          prompts=int(stored.get("prompts", 0)), measure=stored.get("measure"),
                          routed=dict((project.settings or {}).get("routed") or {}),
                          disagreement_extra=extra_of(project), disagreement_threshold=threshold_of(project),
                          extra_overlap_prompts=int(extras.get("prompts", 0)) if queue.extra_on(project) else 0)


ROUTE_REASONS = ("low_confidence", "position_flip")


def route_to_humans(db: Session, project: Project, reasons: dict[int, str], *, judge_run_id: int,
                    now: datetime | None = None) -> int:
    """Serve these prompts (id → one of ROUTE_REASONS) to humans before every other: queue ranks below all
    computed ones (which start at 0), newest routing first, under any selection. Counts add up per project."""
    if not reasons:
        return 0
    ids = sorted(reasons)
    lowest = db.scalar(select(func.min(Prompt.queue_rank)).where(Prompt.project_id == project.id,
                                                                  Prompt.queue_rank < 0)) or 0
    start = lowest - len(ids)
    db.execute(update(Prompt), [{"id": pid, "queue_rank": start + i} for i, pid in enumerate(ids)])
    before = dict((project.settings or {}).get("routed") or {})
    counts = {why: int(before.get(why, 0)) + sum(1 for r in reasons.values() if r == why) for why in ROUTE_REASONS}
    project.settings = dict(project.settings or {}) | {"routed": {
        "prompts": int(before.get("prompts", 0)) + len(ids), **counts, "judge_run_id": judge_run_id,
        "at": (now or utcnow()).isoformat(timespec="seconds")}}
    db.flush()
    return len(ids)


def set_selection(db: Session, project: Project, actor: User, selection: str, *, extra: int | None = None,
                  threshold: float | None = None) -> None:
    """The lead switches the queue's order (and, for `disagreement`, how much extra overlap contested prompts get:
    None keeps the current value); without priorities for it yet, the queue keeps serving by id.

    Leaving `disagreement`, or changing either knob, ends the extra overlap given so far (a priorities job gives it
    anew): no prompt keeps being served beyond its overlap on a rule that no longer holds."""
    permissions.require(db, actor, project, "selection.manage")
    if selection not in SELECTIONS:
        raise Invalid(f"must be one of {', '.join(SELECTIONS)}", field="selection")
    extra = extra_of(project) if extra is None else extra
    if isinstance(extra, bool) or not isinstance(extra, int) or not 0 <= extra <= EXTRA_MAX:
        raise Invalid(f"must be a whole number from 0 to {EXTRA_MAX}", field="disagreement_extra")
    threshold = threshold_of(project) if threshold is None else threshold
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold < 0.5:
        raise Invalid("must be at least 0 and below 0.5 (a share of pair votes against the majority)",
                      field="disagreement_threshold")
    threshold = float(threshold)
    if selection != "disagreement" or (extra, threshold) != (extra_of(project), threshold_of(project)):
        clear_extra_overlap(db, project)
    project.settings = dict(project.settings or {}) | {"selection": selection, "disagreement_extra": extra,
                                                       "disagreement_threshold": threshold}
    audit.record(db, actor, "selection.set", project_id=project.id, object_type="project", object_id=project.id,
                 selection=selection, disagreement_extra=extra, disagreement_threshold=threshold)


def clear_extra_overlap(db: Session, project: Project) -> None:
    """Every prompt of the project back to the plain overlap; rankings already given beyond it stay."""
    if not ((project.settings or {}).get("extra_overlap") or {}).get("prompts"):
        return  # nothing given: no write
    db.execute(update(Prompt).where(Prompt.project_id == project.id, Prompt.extra_overlap > 0)
               .values(extra_overlap=0).execution_options(synchronize_session=False))
    project.settings = dict(project.settings or {}) | {"extra_overlap": {}}


def latest_reward_run(db: Session, project: Project) -> TrainingRun | None:
    return db.scalar(select(TrainingRun).where(TrainingRun.project_id == project.id, TrainingRun.kind == "reward",
                                               TrainingRun.state == "succeeded", TrainingRun.model_dir.is_not(None))
                     .order_by(TrainingRun.id.desc()).limit(1))


def request_priorities(db: Session, project: Project, actor: User | None, *,
                       training_run_id: int | None = None, check_permission: bool = True) -> Job:
    """Enqueue the priorities job for the active selection (`uncertainty`: with the given reward run, or the
    project's newest finished one)."""
    if check_permission:
        assert actor is not None  # only the system's own calls skip the check, and they name no actor
        permissions.require(db, actor, project, "selection.manage", doing="compute queue priorities")
    selection = selection_of(project)
    if selection == "random":
        raise Invalid("the project serves prompts in random order: choose uncertainty or disagreement first",
                      field="selection")
    payload: dict[str, Any] = {"project_id": project.id, "selection": selection}
    if selection == "uncertainty":
        run = db.get(TrainingRun, training_run_id) if training_run_id else latest_reward_run(db, project)
        if run is None or run.project_id != project.id:
            raise (NotFound("no such training run") if training_run_id else
                   Invalid("uncertainty needs a finished reward-model run: train one first", field="training_run_id"))
        if run.kind != "reward" or run.state != "succeeded" or not run.model_dir:
            raise Invalid("only a finished reward-model run can score prompts", field="training_run_id")
        payload["training_run_id"] = run.id
    return jobs.enqueue(db, "priorities", payload, project=project, actor=actor)


# ----------------------------------------------------------------------------------------------
# the scores


def disagreement_share(votes: Iterable[Sequence[int]]) -> float:
    """One prompt's disagreement: over its pairs' votes (each pair: the votes for one order, then for the other),
    the share that went against each pair's majority, Σ min ÷ Σ votes (0 when there are none)."""
    against = total = 0
    for pair in votes:
        against, total = against + min(pair), total + sum(pair)
    return against / total if total else 0.0


def disagreement_scores(db: Session, project: Project) -> dict[int, float]:
    """Per prompt with human pairs this round: the share of its pair votes against the majority of each pair."""
    votes: dict[int, dict[tuple[int, int], list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    rows = db.execute(select(Pair.prompt_id, Pair.chosen_id, Pair.rejected_id)
                      .join(Ranking, Pair.ranking_id == Ranking.id)
                      .where(Ranking.project_id == project.id, Ranking.source == "human",
                             Ranking.round == project.current_round))
    for prompt_id, chosen, rejected in rows:
        key = (min(chosen, rejected), max(chosen, rejected))
        votes[prompt_id][key][0 if chosen < rejected else 1] += 1
    return {prompt_id: disagreement_share(pairs.values()) for prompt_id, pairs in votes.items()}


def contested_extras(db: Session, project: Project, scores: dict[int, float]) -> dict[int, int]:
    """Prompt id → its extra overlap: every non-gold prompt that reached the project's overlap this round and whose
    disagreement share is above the threshold gets `disagreement_extra` more rankings, bounded so that overlap +
    extra never asks for more annotators than the project has (members who may annotate)."""
    annotators = int(db.scalar(select(func.count(ProjectMember.id)).where(
        ProjectMember.project_id == project.id,
        ProjectMember.role.in_(sorted(permissions.ACTIONS["annotate"].roles)))) or 0)
    extra = min(extra_of(project), max(0, annotators - project.overlap))
    threshold = threshold_of(project)
    contested = sorted(pid for pid, share in scores.items() if share > threshold)
    if extra == 0 or not contested:
        return {}
    reached = set(db.scalars(
        select(Assignment.prompt_id).join(Prompt, Prompt.id == Assignment.prompt_id)
        .where(Assignment.project_id == project.id, Assignment.round == project.current_round,
               Assignment.state == "submitted", Assignment.prompt_id.in_(contested), Prompt.gold_tiers.is_(None))
        .group_by(Assignment.prompt_id).having(func.count(Assignment.id) >= project.overlap)))
    return {pid: extra for pid in contested if pid in reached}


def task_pairs(db: Session, project: Project, prompt_ids: list[int]) -> list[tuple[int, Any, str, str]]:
    """(prompt id, prompt, first text, second text) for every pair of each prompt's task completions."""
    from app.annotation.queue import task_completion_texts

    prompts = {p.id: p for p in db.scalars(select(Prompt).where(Prompt.id.in_(prompt_ids)))}
    out = []
    for prompt_id in prompt_ids:
        prompt = prompts[prompt_id]
        texts = task_completion_texts(db, prompt_id, project.completions_per_prompt)
        for a, b in combinations(sorted(texts), 2):
            out.append((prompt_id, prompt.messages or prompt.text, texts[a], texts[b]))
    return out


def uncertainty_scores(db: Session, project: Project, model_dir: str,
                       progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[dict[int, float], str]:
    """Per train-split prompt with at least two completions: how unsure the reward model is of its order; and the
    measure used ("spread" across an ensemble's heads, else "margin")."""
    from training.reward_model import RewardModel  # lazy: torch loads only in the worker that scores

    model = RewardModel.load(model_dir)
    measure = "spread" if model.heads > 1 else "margin"
    completions = (select(func.count(Completion.id)).where(Completion.prompt_id == Prompt.id,
                                                           Completion.source != "revision").scalar_subquery())
    prompt_ids = list(db.scalars(select(Prompt.id).where(Prompt.project_id == project.id, Prompt.split == "train",
                                                         Prompt.gold_tiers.is_(None), completions >= 2)
                                 .order_by(Prompt.id)))
    scores: dict[int, float] = {}
    for start in range(0, len(prompt_ids), SCORE_BATCH):
        pairs = task_pairs(db, project, prompt_ids[start:start + SCORE_BATCH])
        pref = model.compare([p for _, p, _, _ in pairs], [a for _, _, a, _ in pairs], [b for _, _, _, b in pairs])
        values = pref.spread if measure == "spread" else 1 - (2 * pref.p - 1).abs()
        for (prompt_id, _, _, _), value in zip(pairs, values.tolist(), strict=True):
            scores[prompt_id] = max(scores.get(prompt_id, 0.0), float(value))
        progress(min(start + SCORE_BATCH, len(prompt_ids)), len(prompt_ids))
    return scores, measure


def store_priorities(db: Session, project: Project, scores: dict[int, float], *, selection: str,
                     training_run_id: int | None = None, measure: str | None = None,
                     now: datetime | None = None, extras: dict[int, int] | None = None) -> int:
    """Write every prompt's priority and queue rank (highest first, ties by id; prompts given extra overlap before
    all others); prompts without a score lose theirs, every extra overlap but `extras` (id → extra) is reset.
    Returns the number of prompts ranked."""
    extras = extras or {}
    project_prompts = Prompt.project_id == project.id
    clear_extra_overlap(db, project)
    # Prompts a judge run routed to humans (rank < 0) keep their place ahead of every computed rank.
    routed = set(db.scalars(select(Prompt.id).where(project_prompts, Prompt.queue_rank < 0)))
    db.execute(update(Prompt).where(project_prompts, or_(Prompt.queue_rank.is_(None), Prompt.queue_rank >= 0))
               .values(priority=None, queue_rank=None).execution_options(synchronize_session=False))
    ordered = sorted(((pid, score) for pid, score in scores.items() if pid not in routed),
                     key=lambda item: (item[0] not in extras, -item[1], item[0]))
    if ordered:
        rows = [{"id": prompt_id, "priority": score, "queue_rank": rank}
                for rank, (prompt_id, score) in enumerate(ordered)]
        db.execute(update(Prompt), rows)  # one executemany of primary-key updates (the ids are this project's)
    if extras:
        db.execute(update(Prompt), [{"id": pid, "extra_overlap": n} for pid, n in sorted(extras.items())])
    at = (now or utcnow()).isoformat(timespec="seconds")
    project.settings = dict(project.settings or {}) | {
        "priorities": {"selection": selection, "computed_at": at, "training_run_id": training_run_id,
                       "prompts": len(ordered), "measure": measure},
        "extra_overlap": {"round": project.current_round, "prompts": len(extras), "at": at} if extras else {}}
    db.flush()
    return len(ordered)


def compute(db: Session, project: Project, selection: str, training_run_id: int | None,
            progress: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """The priorities job's work, in the job's one transaction: score, then store."""
    if selection == "uncertainty":
        run = db.get(TrainingRun, training_run_id) if training_run_id else None
        if run is None or not run.model_dir:
            raise Invalid("the reward-model run is gone", field="training_run_id")
        scores, measure = uncertainty_scores(db, project, run.model_dir, progress)
        extras: dict[int, int] = {}
    elif selection == "disagreement":
        scores, measure = disagreement_scores(db, project), "disagreement"
        extras = contested_extras(db, project, scores)
    else:
        raise Invalid(f"must be one of {', '.join(SELECTIONS[1:])}", field="selection")
    n = store_priorities(db, project, scores, selection=selection, training_run_id=training_run_id, measure=measure,
                         extras=extras)
    return {"prompts": n, "selection": selection, "measure": measure, "training_run_id": training_run_id,
            "top_priority": max(scores.values(), default=None), "extra_overlap_prompts": len(extras)}
