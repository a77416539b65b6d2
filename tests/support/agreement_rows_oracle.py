"""The rows behind the agreement figures as app.quality.rows computed them before they were paged:
from every ranking of the project, on each call. Kept as the oracle the paged, bounded reads must equal."""

from __future__ import annotations

import string
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Completion, Project, Prompt, User
from app.platform.errors import Invalid, NotFound
from app.quality import agreement
from app.quality.agreement import gold_orders, human_rankings

LIMIT = 200
"""Rows shown per list: the worst first, so the ones to act on are always on the page."""
EXCERPT = 160


@dataclass(frozen=True)
class Letters:
    """A prompt's text and its completions as letters (A = lowest completion id) with an excerpt of each."""

    prompt_id: int
    prompt: str
    completions: list[tuple[str, str]]
    by_id: dict[int, str]

    def order(self, tiers: list[list[int]] | None) -> str:
        """"B > A = C" (ties joined by =); unranked completions left out; "skipped" for an empty ranking."""
        if not tiers:
            return "skipped"
        return " > ".join(" = ".join(self.by_id.get(c, "?") for c in tier) for tier in tiers)

    def letter(self, completion_id: int | None) -> str:
        return self.by_id.get(completion_id, "?") if completion_id is not None else "—"


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT else text[:EXCERPT - 1] + "…"


def _letters(db: Session, prompt_ids: set[int]) -> dict[int, Letters]:
    if not prompt_ids:
        return {}
    texts = dict(db.execute(select(Prompt.id, Prompt.text).where(Prompt.id.in_(prompt_ids))).all())
    completions: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for pid, cid, text in db.execute(select(Completion.prompt_id, Completion.id, Completion.text)
                                     .where(Completion.prompt_id.in_(prompt_ids)).order_by(Completion.id)):
        completions[pid].append((cid, text))
    out = {}
    for pid in prompt_ids:
        names = _names(len(completions[pid]))
        out[pid] = Letters(pid, _excerpt(texts.get(pid, "")),
                           [(n, _excerpt(t)) for n, (_, t) in zip(names, completions[pid], strict=True)],
                           {cid: n for n, (cid, _) in zip(names, completions[pid], strict=True)})
    return out


def _names(n: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if i < 26 else f"{letters[i // 26 - 1]}{letters[i % 26]}" for i in range(n)]


def _emails(db: Session, user_ids: set[int]) -> dict[int, str]:
    if not user_ids:
        return {}
    return dict(db.execute(select(User.id, User.email).where(User.id.in_(user_ids))).all())


# --- the prompts annotators disagree on ---------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    letters: Letters
    round: int
    agreement: float
    """Mean pairwise agreement over the prompt's comparisons (1 = everyone ordered every pair alike)."""
    rankings: list[tuple[str, str]]
    """(annotator email, their order as letters)."""


def disagreements(db: Session, project: Project, *, rubric_version: int | None = None,
                  limit: int = LIMIT) -> tuple[list[Disagreement], int]:
    """The prompts with a disagreement, least agreement first, and how many there are in all."""
    rows = human_rankings(db, project, rubric_version)
    tally = agreement.tally_rankings(rows, {}, project.current_round)
    pairs = agreement.compare_annotators(tally)
    per_prompt: dict[tuple[int, int], list[float]] = defaultdict(list)
    for c in pairs.each:
        per_prompt[(c.prompt_id, c.round)].append(c.agreement)
    # Equal means in exact arithmetic tie (then by prompt and round), as the kept figures order them: the floats of
    # two such sums, added in another order, may differ in the last bit.
    scored = sorted(((sum(v) / len(v), key) for key, v in per_prompt.items() if sum(v) / len(v) < 1),
                    key=lambda x: (round(x[0], 12), x[1]))
    shown = scored[:limit]
    letters = _letters(db, {key[0] for _, key in shown})
    emails = _emails(db, {r.annotator_id for _, key in shown for r in tally.by_prompt[key]})
    out = []
    for score, (pid, rnd) in shown:
        orders = [(emails.get(r.annotator_id, "?"), letters[pid].order(r.tiers)) for r in tally.by_prompt[(pid, rnd)]]
        out.append(Disagreement(letters[pid], rnd, score, orders))
    return out, len(scored)


# --- one annotator's rankings, and their gold misses --------------------------------------------------------


@dataclass(frozen=True)
class RankingRow:
    letters: Letters
    ranking_id: int
    created_at: Any
    rubric_version: int | None
    order: str
    seconds: float | None
    first_shown: str
    first_shown_on_top: bool
    agreement: float | None
    """Mean agreement with the other annotators' rankings of the same prompt and round."""
    gold: str | None = None
    """The gold order as letters, for gold prompts."""
    gold_score: tuple[int, int] | None = None
    """(gold pairs ordered right, gold pairs shown)."""


@dataclass
class AnnotatorRankings:
    email: str
    name: str
    rows: list[RankingRow] = field(default_factory=list)
    total: int = 0
    """Rows matching the view before the limit."""


VIEWS = ("all", "gold-misses")


def annotator_rankings(db: Session, project: Project, annotator_id: int, *, view: str = "all",
                       rubric_version: int | None = None, limit: int = LIMIT) -> AnnotatorRankings:
    """An annotator's human rankings in the project, newest first; `gold-misses`: only gold tasks with a pair
    ordered wrong, fewest right first."""
    if view not in VIEWS:
        raise Invalid(f"must be one of {', '.join(VIEWS)}", field="view")
    person = db.get(User, annotator_id)
    rows = human_rankings(db, project, rubric_version)
    # Anyone with rankings here, or a member: not an arbitrary account (whose email this page would show).
    if person is None or not (any(r.annotator_id == annotator_id for r in rows)
                              or permissions.member_role(db, project, person)):
        raise NotFound("no such annotator in this project")
    gold = gold_orders(db, project)
    tally = agreement.tally_rankings(rows, gold, project.current_round)
    pairs = agreement.compare_annotators(tally)
    theirs = [r for r in rows if r.annotator_id == annotator_id]
    if view == "gold-misses":
        theirs = [r for r in theirs if r.id in tally.gold and tally.gold[r.id].agreed < tally.gold[r.id].total]
        theirs.sort(key=lambda r: (tally.gold[r.id].agreed / tally.gold[r.id].total, -r.id))
    else:
        theirs.sort(key=lambda r: -r.id)
    agreements: dict[int, list[float]] = defaultdict(list)
    for c in pairs.each:
        for mine in (c.a, c.b):
            if mine.annotator_id == annotator_id:
                agreements[mine.ranking_id].append(c.agreement)
    shown = theirs[:limit]
    letters = _letters(db, {r.prompt_id for r in shown})
    out = AnnotatorRankings(person.email, person.name, total=len(theirs))
    for r in shown:
        out.rows.append(_row(r, letters[r.prompt_id], agreements.get(r.id), gold, tally.gold.get(r.id)))
    return out


def _row(r: Any, letters: Letters, agreements: list[float] | None, gold: dict[int, Any],
         score: agreement.GoldScore | None) -> RankingRow:
    shown = r.display_order or []
    first = shown[0] if shown else None
    top = (r.tiers or [[]])[0] if r.tiers else []
    return RankingRow(
        letters=letters, ranking_id=r.id, created_at=r.created_at, rubric_version=r.rubric_version,
        order=letters.order(None if r.skipped else r.tiers), seconds=r.seconds_spent,
        first_shown=letters.letter(first), first_shown_on_top=first is not None and first in top,
        agreement=sum(agreements) / len(agreements) if agreements else None,
        gold=letters.order(gold[r.prompt_id]) if r.prompt_id in gold else None,
        gold_score=(score.agreed, score.total) if score else None)
