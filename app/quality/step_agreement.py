"""Agreement on step labels (process supervision): per-step agreement, Krippendorff's α, and the first error.

Units are the steps of a completion; coders are the annotators who labelled it (human rankings only, like every
annotator figure); values are +1, 0, −1, ordinal (wrong < neutral < correct). A labeller who stopped at the first
−1 gave no value for the steps after it: missing values, not disagreement.

Beside them, the labellers compared with each other (`labellers`): humans (their majority per step), the AI judge
and Monte-Carlo estimation, each pair on the steps both labelled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from itertools import combinations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Project, Prompt, Ranking, Rubric, StepLabel, User
from app.quality.agreement import krippendorff_alpha_ordinal

# completion id → annotator id → labels in step order
Labelled = Mapping[int, Mapping[int, list[int]]]


@dataclass(frozen=True)
class StepAgreement:
    labelled_completions: int
    """Completions with at least one human step label."""
    shared_completions: int
    """Completions step-labelled by two or more annotators."""
    compared_steps: int
    """Steps labelled by two or more annotators."""
    step_agreement: float | None
    """Mean over compared steps of the share of annotator pairs giving the step the same label."""
    krippendorff_alpha: float | None
    """Ordinal α over steps (−1 < 0 < +1)."""
    first_error_agreement: float | None
    """Share of annotator pairs on a shared completion that put its first error on the same step (or both on
    none)."""
    gold_completions: int = 0
    """Completions of gold tasks with known step labels."""
    annotators: list[GoldStepScore] = field(default_factory=list)
    """Each annotator's step accuracy on those, for annotators who labelled any of them."""
    labellers: list[LabellerAgreement] = field(default_factory=list)
    """Humans, the AI judge and Monte-Carlo, two by two, on the steps both labelled (pairs with none left out)."""


LABELLERS = ("human", "ai", "mc")
"""The labellers compared, by ranking source: humans, the AI judge, Monte-Carlo estimation."""


@dataclass(frozen=True)
class LabellerAgreement:
    """Two labellers on the same steps: each labeller's label of a step is the majority of its rankings' labels
    (a tie to the worse label, as the steps export aggregates); steps either calls neutral (0) are left out."""

    first: str
    """A ranking source: human, ai or mc."""
    second: str
    completions: int
    """Completions with a step labelled by both."""
    steps: int
    """Steps compared: labelled by both, neither majority neutral."""
    agreement: float | None
    """Share of compared steps given the same label."""
    first_wrong_caught: float | None
    """Of the compared steps `first` calls wrong, the share `second` calls wrong too."""


@dataclass(frozen=True)
class GoldStepScore:
    """One annotator against a gold task's known step labels."""

    user_id: int
    email: str
    gold_completions: int
    """Gold completions the annotator step-labelled."""
    gold_steps: int
    """Steps labelled both by the annotator and in the gold (a step after either's first −1 is not compared)."""
    gold_steps_agreed: int
    gold_step_accuracy: float | None
    """gold_steps_agreed / gold_steps."""
    gold_first_error_agreed: int
    """Gold completions where the annotator put the first −1 on the gold's step (or, as the gold, on none)."""
    gold_first_error_accuracy: float | None
    """gold_first_error_agreed / gold_completions."""


def step_units(labelled: Labelled) -> dict[tuple[int, int], dict[Hashable, int]]:
    """(completion, step) → {annotator: label}."""
    units: dict[tuple[int, int], dict[Hashable, int]] = defaultdict(dict)
    for cid, by_annotator in labelled.items():
        for annotator, labels in by_annotator.items():
            for i, label in enumerate(labels):
                units[(cid, i)][annotator] = label
    return units


def per_step_agreement(units: Mapping[tuple[int, int], Mapping[Hashable, int]]) -> tuple[int, float | None]:
    """(steps compared, mean share of agreeing annotator pairs per step)."""
    shares = []
    for coded in units.values():
        pairs = list(combinations(coded.values(), 2))
        if pairs:
            shares.append(sum(a == b for a, b in pairs) / len(pairs))
    return len(shares), (sum(shares) / len(shares) if shares else None)


def first_error(labels: list[int]) -> int | None:
    return next((i for i, label in enumerate(labels) if label == -1), None)


def first_error_agreement(labelled: Labelled) -> float | None:
    agree = total = 0
    for by_annotator in labelled.values():
        for a, b in combinations([first_error(labels) for labels in by_annotator.values()], 2):
            agree += a == b
            total += 1
    return agree / total if total else None


def summarise(labelled: Labelled) -> StepAgreement:
    units = step_units(labelled)
    compared, share = per_step_agreement(units)
    return StepAgreement(
        labelled_completions=len(labelled),
        shared_completions=sum(1 for by_annotator in labelled.values() if len(by_annotator) >= 2),
        compared_steps=compared, step_agreement=share,
        krippendorff_alpha=krippendorff_alpha_ordinal(
            {unit: {coder: float(v) for coder, v in coded.items()} for unit, coded in units.items()}),
        first_error_agreement=first_error_agreement(labelled))


def human_step_labels(db: Session, project: Project, rubric_version: int | None = None
                      ) -> dict[int, dict[int, list[int]]]:
    """Every human step label of the project (of one rubric version), by completion and annotator, in one query."""
    stmt = (select(StepLabel.completion_id, Ranking.annotator_id, StepLabel.label)
            .join(Ranking, StepLabel.ranking_id == Ranking.id)
            .where(Ranking.project_id == project.id, Ranking.source == "human", Ranking.skipped.is_(False))
            .order_by(StepLabel.completion_id, Ranking.annotator_id, StepLabel.step_index))
    if rubric_version is not None:
        stmt = stmt.join(Rubric, Ranking.rubric_id == Rubric.id).where(Rubric.version == rubric_version)
    out: dict[int, dict[int, list[int]]] = defaultdict(dict)
    for cid, annotator_id, label in db.execute(stmt):
        assert annotator_id is not None  # a human ranking names its annotator
        out[cid].setdefault(annotator_id, []).append(label)
    return dict(out)


def gold_step_labels(db: Session, project: Project) -> dict[int, list[int]]:
    """Completion id → its known step labels, over the project's gold tasks."""
    rows = db.scalars(select(Prompt.gold_step_labels).where(Prompt.project_id == project.id,
                                                            Prompt.gold_step_labels.is_not(None)))
    return {int(cid): list(labels) for known in rows for cid, labels in (known or {}).items()}


def gold_scores(labelled: Labelled, gold: Mapping[int, list[int]]) -> dict[int, tuple[int, int, int, int]]:
    """annotator → (gold completions labelled, steps compared, steps agreed, first errors agreed)."""
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for cid, known in gold.items():
        for annotator, labels in labelled.get(cid, {}).items():
            shared = min(len(labels), len(known))
            tally = out[annotator]
            tally[0] += 1
            tally[1] += shared
            tally[2] += sum(a == b for a, b in zip(labels[:shared], known[:shared], strict=True))
            tally[3] += first_error(labels) == first_error(known)
    return {annotator: (c, n, agreed, first) for annotator, (c, n, agreed, first) in out.items()}


def step_majority(labels: list[int]) -> int:
    """The most given label; a tie goes to the worse one (−1, then 0, then +1)."""
    return min(set(labels), key=lambda label: (-labels.count(label), label))


def machine_step_labels(db: Session, project: Project) -> dict[str, dict[tuple[int, int], list[int]]]:
    """The AI judge's and Monte-Carlo's step labels: source → (completion, step) → one label per ranking."""
    out: dict[str, dict[tuple[int, int], list[int]]] = {"ai": defaultdict(list), "mc": defaultdict(list)}
    for cid, index, label, source in db.execute(
            select(StepLabel.completion_id, StepLabel.step_index, StepLabel.label, Ranking.source)
            .join(Ranking, StepLabel.ranking_id == Ranking.id)
            .where(Ranking.project_id == project.id, Ranking.source.in_(("ai", "mc")),
                   Ranking.skipped.is_(False))):
        out[source][(cid, index)].append(label)
    return out


def compare_labellers(by_source: Mapping[str, Mapping[tuple[int, int], list[int]]]) -> list[LabellerAgreement]:
    """Each pair of labellers that share a compared step: agreement on the steps both labelled."""
    majority = {source: {key: step_majority(votes) for key, votes in labels.items()}
                for source, labels in by_source.items()}
    out = []
    for first, second in combinations(LABELLERS, 2):
        a, b = majority.get(first, {}), majority.get(second, {})
        shared = [(a[key], b[key], key[0]) for key in a.keys() & b.keys() if a[key] != 0 and b[key] != 0]
        if not shared:
            continue
        wrong = [y for x, y, _ in shared if x == -1]
        out.append(LabellerAgreement(
            first=first, second=second, completions=len({cid for _, _, cid in shared}), steps=len(shared),
            agreement=sum(x == y for x, y, _ in shared) / len(shared),
            first_wrong_caught=sum(y == -1 for y in wrong) / len(wrong) if wrong else None))
    return out


def report(db: Session, project: Project, rubric_version: int | None = None) -> StepAgreement:
    labelled = human_step_labels(db, project, rubric_version)
    base = summarise(labelled)
    humans = {(cid, i): [labels[i] for labels in by_annotator.values() if i < len(labels)]
              for cid, by_annotator in labelled.items()
              for i in range(max(len(labels) for labels in by_annotator.values()))}
    labellers = compare_labellers({"human": humans} | machine_step_labels(db, project))
    gold = gold_step_labels(db, project)
    scores = gold_scores(labelled, gold)
    emails = dict(db.execute(select(User.id, User.email).where(User.id.in_(sorted(scores)))).all()) if scores else {}
    annotators = [GoldStepScore(user_id=uid, email=emails.get(uid, ""), gold_completions=c, gold_steps=n,
                                gold_steps_agreed=agreed, gold_step_accuracy=agreed / n if n else None,
                                gold_first_error_agreed=first, gold_first_error_accuracy=first / c if c else None)
                  for uid, (c, n, agreed, first) in sorted(scores.items())]
    return replace(base, gold_completions=len(gold), annotators=annotators, labellers=labellers)

