"""The AI judge on steps (process supervision): its step labels, their agreement with humans, and the lead's gate.

A judge run started with `label_steps` asks, for every step of every completion it judges, "is step N correct
given the problem and the steps before it?" and stores p(Yes) (Yes over Yes + No, from the answer tokens'
log-probs) as a step label of its own ranking: `p` the soft label, `label` +1 when p ≥ 0.5 else −1. Those rows
belong to an AI ranking, so they are never human agreement data (`step_agreement` counts human rankings only).

Agreement with humans is measured on the steps people labelled: per step the human majority (ties to the worse
label, as the steps export aggregates); steps whose majority is neutral (0) are left out, since the judge only
answers Yes or No. The same gate as for AI pairs decides whether the lead may let AI step labels into steps
exports: 20 prompts step-labelled by both, and step agreement of 60 % or more.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Project, Ranking, StepLabel, User
from app.platform import audit
from app.platform.errors import Invalid
from app.quality.judge_agreement import GATE_MIN_PROMPTS, gate_shortfall

SETTING = "ai_step_labels_for_training"
"""The project setting that holds the lead's decision on AI step labels (apart from AI pairs': a judge that
ranks answers well may still be a poor judge of single steps, and the other way round)."""

_INSERT = insert(StepLabel.__table__)

Key = tuple[int, int]
"""(completion id, step index)."""


def hard_label(p: float) -> int:
    """The judge's +1 / −1 for a soft label: +1 when p(correct) ≥ 0.5."""
    return 1 if p >= 0.5 else -1


def write(db: Session, ranking_id: int, soft: Mapping[int, Sequence[float]]) -> int:
    """Store an AI ranking's step labels, {completion id: p(correct) per step}; how many. The model's output is
    untrusted: only numbers in [0, 1] are stored, anything else is refused before a row is written."""
    rows = []
    for cid, ps in soft.items():
        for i, p in enumerate(ps):
            if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) or not 0 <= p <= 1:
                raise ValueError(f"step label p for completion {cid} step {i + 1} must be a number in [0, 1], "
                                 f"got {p!r}")
            rows.append({"ranking_id": ranking_id, "completion_id": cid, "step_index": i,
                         "label": hard_label(float(p)), "p": round(float(p), 6)})
    if rows:
        db.execute(_INSERT, rows)
    return len(rows)


def ai_step_labels_enabled(project: Project) -> bool:
    return bool((project.settings or {}).get(SETTING, False))


@dataclass
class JudgeStepAgreement:
    n_prompts: int
    """Prompts with steps labelled by both the judge and humans."""
    n_completions: int
    """Completions with steps labelled by both."""
    n_steps: int
    """Steps compared: labelled by both, the human majority +1 or −1."""
    neutral_steps: int
    """Steps labelled by both whose human majority is neutral (0): left out of the figures."""
    step_agreement: float | None
    """Share of compared steps where the judge's hard label (p ≥ 0.5 → +1, else −1) is the human majority."""
    brier: float | None
    """Mean (p − y)² over compared steps, y = 1 for a human-correct step, 0 for a wrong one (0 is perfect, 0.25
    a constant p = 0.5)."""
    wrong_step_recall: float | None
    """Share of the steps humans call wrong that the judge calls wrong too."""
    mean_p: float | None
    """The judge's mean p(correct) over compared steps, against `human_correct_rate`."""
    human_correct_rate: float | None
    """Share of compared steps whose human majority is +1."""
    ai_step_labels_enabled: bool = False
    gate_missing: list[str] = field(default_factory=list)
    """What the evidence for allowing AI step labels still lacks; empty when the lead may allow them."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def human_majority(votes: Sequence[int]) -> int:
    """The most voted label; a tie goes to the worse one (−1, then 0, then +1), as in the steps export."""
    counts = Counter(votes)
    return max(counts, key=lambda label: (counts[label], -label))


def compare(judge: Mapping[Key, float], humans: Mapping[Key, Sequence[int]],
            prompt_of: Mapping[int, int]) -> tuple[int, int, int, int, list[tuple[float, int]]]:
    """(prompts, completions, neutral steps, steps compared, [(p, human majority ±1)]) over the steps both
    labelled. `judge` holds one p per step (the mean when several judge rankings labelled it)."""
    compared: list[tuple[float, int]] = []
    neutral = 0
    completions: set[int] = set()
    for key, p in judge.items():
        votes = humans.get(key)
        if not votes:
            continue
        completions.add(key[0])
        majority = human_majority(votes)
        if majority == 0:
            neutral += 1
            continue
        compared.append((p, majority))
    return len({prompt_of[c] for c in completions}), len(completions), neutral, len(compared), compared


def figures(compared: Sequence[tuple[float, int]]) -> dict[str, float | None]:
    """Agreement, Brier score, recall of wrong steps and the two rates, from (p, human ±1) per step."""
    if not compared:
        return {"step_agreement": None, "brier": None, "wrong_step_recall": None, "mean_p": None,
                "human_correct_rate": None}
    n = len(compared)
    wrong = [p for p, y in compared if y == -1]
    return {
        "step_agreement": round(sum(hard_label(p) == y for p, y in compared) / n, 4),
        "brier": round(sum((p - (y == 1)) ** 2 for p, y in compared) / n, 4),
        "wrong_step_recall": round(sum(p < 0.5 for p in wrong) / len(wrong), 4) if wrong else None,
        "mean_p": round(sum(p for p, _ in compared) / n, 4),
        "human_correct_rate": round(sum(y == 1 for _, y in compared) / n, 4),
    }


def gate_missing(n_prompts: int, step_agreement: float | None) -> list[str]:
    """What the evidence for allowing AI step labels still lacks, in words (empty: the lead may decide)."""
    return gate_shortfall(
        n_prompts, step_agreement,
        too_few=f"the judge and humans have labelled the steps of {n_prompts} of the {GATE_MIN_PROMPTS} prompts in "
                "common needed to measure step agreement: run the judge with step labels on prompts annotators "
                "have step-labelled",
        unmeasured="no step agreement with humans measured yet", unit="steps", remedy="try a stronger judge model")


def _labels(db: Session, project: Project, judge_run_id: int | None
            ) -> tuple[dict[Key, float], dict[Key, list[int]], dict[int, int]]:
    """The judge's p per step (mean over its rankings), the humans' labels per step on the same completions,
    and each of those completions' prompt."""
    ai = (select(StepLabel.completion_id, StepLabel.step_index, StepLabel.p, Ranking.prompt_id)
          .join(Ranking, StepLabel.ranking_id == Ranking.id)
          .where(Ranking.project_id == project.id, Ranking.source == "ai", StepLabel.p.is_not(None)))
    if judge_run_id is not None:
        ai = ai.where(Ranking.judge_run_id == judge_run_id)
    sums: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
    prompt_of: dict[int, int] = {}
    for cid, index, p, prompt_id in db.execute(ai):
        assert p is not None  # the query keeps labels with a p
        acc = sums[(cid, index)]
        acc[0] += p
        acc[1] += 1
        prompt_of[cid] = prompt_id
    judge = {key: s / n for key, (s, n) in sums.items()}
    humans: dict[Key, list[int]] = defaultdict(list)
    judged = ai.with_only_columns(StepLabel.completion_id).distinct()
    for cid, index, label in db.execute(
            select(StepLabel.completion_id, StepLabel.step_index, StepLabel.label)
            .join(Ranking, StepLabel.ranking_id == Ranking.id)
            .where(Ranking.project_id == project.id, Ranking.source == "human", Ranking.skipped.is_(False),
                   StepLabel.completion_id.in_(judged))):
        humans[(cid, index)].append(label)
    return judge, humans, prompt_of


def judge_step_agreement(db: Session, project: Project, *, judge_run_id: int | None = None) -> JudgeStepAgreement:
    """How the judge's step labels (of one run, or all) compare with the humans' majority on the same steps."""
    judge, humans, prompt_of = _labels(db, project, judge_run_id)
    n_prompts, n_completions, neutral, n_steps, compared = compare(judge, humans, prompt_of)
    numbers = figures(compared)
    return JudgeStepAgreement(n_prompts=n_prompts, n_completions=n_completions, n_steps=n_steps,
                              neutral_steps=neutral, **numbers,
                              ai_step_labels_enabled=ai_step_labels_enabled(project),
                              gate_missing=gate_missing(n_prompts, numbers["step_agreement"]))


def set_ai_step_labels(db: Session, project: Project, actor: User, enabled: bool) -> None:
    """The lead's decision whether the judge's step labels may go into steps exports. Allowing them needs the
    gate's evidence on steps (`gate_missing`); stopping them is always possible."""
    permissions.require(db, actor, project, "labels.decide")
    if enabled and not ai_step_labels_enabled(project):
        report = judge_step_agreement(db, project)
        if report.gate_missing:
            raise Invalid("AI step labels cannot be allowed yet: " + "; ".join(report.gate_missing),
                          field="enabled")
    project.settings = dict(project.settings or {}) | {SETTING: bool(enabled)}
    audit.record(db, actor, "ai_step_labels.set", project_id=project.id, object_type="project",
                 object_id=project.id, enabled=bool(enabled))
