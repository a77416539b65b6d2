"""The rows behind the agreement page's figures: the prompts annotators disagree on, one annotator's rankings,
and the gold tasks they got wrong, a page at a time. A page reads only the rankings of the prompts it shows (and,
for the disagreements, their order from the kept groups' index), whatever the project holds. Each row shows
completions as letters A, B, C… in completion id order, the same letters for every annotator of a prompt, so two
orders can be compared at a glance."""

from __future__ import annotations

import string
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Completion, Project, Prompt, Ranking, Rubric, User
from app.platform.errors import Invalid, NotFound
from app.quality import agreement, rollups, upkeep

LIMIT = 50
"""Rows shown per page (the worst or newest first, so the ones to act on are on the first page)."""
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


# --- reading a page's rankings ------------------------------------------------------------------------------

def _rankings_query(project: Project, rubric_version: int | None):
    """The project's human rankings (of one rubric version) with what the rows need, as human_rankings reads them."""
    query = (select(Ranking.id, Ranking.prompt_id, Ranking.round, Ranking.annotator_id, Ranking.tiers,
                    Ranking.display_order, Ranking.skipped, Ranking.seconds_spent, Ranking.created_at,
                    Rubric.version.label("rubric_version"))
             .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
             .where(Ranking.project_id == project.id, Ranking.source == "human"))
    return query.where(Rubric.version == rubric_version) if rubric_version is not None else query


def _groups_of(db: Session, project: Project, prompt_ids: set[int], rubric_version: int | None,
               ) -> tuple[agreement.Tally, agreement.Comparisons]:
    """Every human ranking of these prompts (of the scope), tallied and compared as the whole project's would be:
    the comparisons of a (prompt, round) depend only on its own rankings, in id order."""
    rows = list(db.execute(_rankings_query(project, rubric_version).where(Ranking.prompt_id.in_(prompt_ids))
                           .order_by(Ranking.prompt_id, Ranking.round, Ranking.id))) if prompt_ids else []
    tally = agreement.tally_rankings(rows, {}, project.current_round)
    return tally, agreement.compare_annotators(tally)


def _gold_of(db: Session, project: Project, prompt_ids: set[int] | None = None) -> dict[int, Any]:
    """prompt id → gold tiers, for the project's gold prompts (of `prompt_ids` when given)."""
    query = select(Prompt.id, Prompt.gold_tiers).where(Prompt.project_id == project.id, Prompt.gold_tiers.is_not(None))
    if prompt_ids is not None:
        if not prompt_ids:
            return {}
        query = query.where(Prompt.id.in_(prompt_ids))
    return {pid: tiers for pid, tiers in db.execute(query) if tiers}  # JSON null reads back as None too


# --- the prompts annotators disagree on ---------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    """One prompt annotators disagree on, in one round: the prompt and its completions as letters, and each
    annotator's order of them, so the orders can be compared at a glance."""

    letters: Letters
    round: int
    """The annotation round the rankings were made in."""
    agreement: float
    """Mean pairwise agreement over the prompt's comparisons (1 = everyone ordered every pair alike)."""
    rankings: list[tuple[str, str]]
    """(annotator email, their order as letters)."""


@dataclass(frozen=True)
class DisagreementPage:
    items: list[Disagreement]
    total: int
    """Prompts (and rounds) with a disagreement in all."""
    page: int
    next_page: int | None
    listed: int
    """How many of `total` can be paged through (all of them)."""
    offset: int = 0
    """Rows before this page."""
    fresh: rollups.Freshness | None = None
    """How fresh the order is (the kept figures'). `pending`: not there yet (the states are being rebuilt)."""
    pending: bool = False


def disagreements(db: Session, project: Project, actor: User, *, rubric_version: int | None = None,
                  page: int = 1, limit: int = LIMIT) -> DisagreementPage:
    """The prompts with a disagreement, least agreement first, one page of them, and how many there are in all: the
    order is the kept groups' (an index range read of the page), and only the page's prompts' rankings are read."""
    if rubric_version is not None and rubric_version not in agreement.rubric_versions(db, project):
        raise Invalid(f"this project has no rubric version {rubric_version}", field="rubric_version")
    if page < 1:
        raise Invalid("must be 1 or more", field="page")
    fresh, state = rollups.kept_freshness(db, project, actor)
    if state is None:
        return DisagreementPage([], 0, page, None, 0, 0, fresh, pending=True)
    offset = (page - 1) * limit
    found, total = upkeep.disagreements(db, project.id, rubric_version, offset, limit + 1)
    shown = found[:limit]
    tally, _ = _groups_of(db, project, {p for _, p, _ in shown}, rubric_version)
    letters = _letters(db, {p for _, p, _ in shown})
    emails = _emails(db, {r.annotator_id for _, p, rnd in shown for r in tally.by_prompt[(p, rnd)]})
    out = []
    for score, pid, rnd in shown:
        orders = [(emails.get(r.annotator_id, "?"), letters[pid].order(r.tiers)) for r in tally.by_prompt[(pid, rnd)]]
        out.append(Disagreement(letters[pid], rnd, score, orders))
    more = len(found) > limit
    return DisagreementPage(out, total, page, page + 1 if more else None, total, offset, fresh)


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
    """Rows matching the view, on every page."""
    next_before: int | None = None
    """`all`: the ranking id the next (older) page starts below; None on the last page."""
    next_page: int | None = None
    """`gold-misses`: the next page's number; None on the last page."""


VIEWS = ("all", "gold-misses")


def annotator_rankings(db: Session, project: Project, annotator_id: int, *, view: str = "all",
                       rubric_version: int | None = None, limit: int = LIMIT, before: int | None = None,
                       page: int = 1) -> AnnotatorRankings:
    """An annotator's human rankings in the project, newest first, a page at a time (`before`: older than this
    ranking id); `gold-misses`: only gold tasks with a pair ordered wrong, fewest right first (`page`). Reads their
    page of rankings (or their gold rankings) and the other rankings of those prompts, not the whole project."""
    if view not in VIEWS:
        raise Invalid(f"must be one of {', '.join(VIEWS)}", field="view")
    if page < 1:
        raise Invalid("must be 1 or more", field="page")
    person = db.get(User, annotator_id)
    theirs = _rankings_query(project, rubric_version).where(Ranking.annotator_id == annotator_id)
    # Anyone with rankings here, or a member: not an arbitrary account (whose email this page would show).
    if person is None or not (db.execute(theirs.limit(1)).first() is not None
                              or permissions.member_role(db, project, person)):
        raise NotFound("no such annotator in this project")
    out = AnnotatorRankings(person.email, person.name)
    if view == "gold-misses":
        shown, out.total, out.next_page = _gold_misses(db, project, theirs, page, limit)
    else:
        out.total = int(db.scalar(select(func.count()).select_from(theirs.subquery())) or 0)
        query = theirs.where(Ranking.id < before) if before is not None else theirs
        shown = list(db.execute(query.order_by(Ranking.id.desc()).limit(limit + 1)))
        if len(shown) > limit:
            shown = shown[:limit]
            out.next_before = shown[-1].id
    prompt_ids = {r.prompt_id for r in shown}
    _, pairs = _groups_of(db, project, prompt_ids, rubric_version)
    agreements: dict[int, list[float]] = defaultdict(list)
    for c in pairs.each:
        for mine in (c.a, c.b):
            if mine.annotator_id == annotator_id:
                agreements[mine.ranking_id].append(c.agreement)
    gold = _gold_of(db, project, prompt_ids)
    letters = _letters(db, prompt_ids)
    for r in shown:
        out.rows.append(_row(r, letters[r.prompt_id], agreements.get(r.id), gold, _gold_score(r, gold)))
    return out


def _gold_score(r: Any, gold: dict[int, Any]) -> agreement.GoldScore | None:
    """As tally_rankings scores a ranking of a gold prompt (skips and empty rankings have none)."""
    if r.prompt_id not in gold or r.skipped or not r.tiers:
        return None
    return agreement.gold_score(gold[r.prompt_id], r.tiers, r.display_order)


def _gold_misses(db: Session, project: Project, theirs: Any, page: int, limit: int
                 ) -> tuple[list[Any], int, int | None]:
    """One page of their rankings of gold prompts with a pair wrong, fewest right first; read: their gold rankings."""
    gold_ids = select(Prompt.id).where(Prompt.project_id == project.id, Prompt.gold_tiers.is_not(None))
    rows = list(db.execute(theirs.where(Ranking.prompt_id.in_(gold_ids))))
    gold = _gold_of(db, project, {r.prompt_id for r in rows})
    scored = [(score, r) for r in rows if (score := _gold_score(r, gold)) is not None and score.agreed < score.total]
    scored.sort(key=lambda x: (x[0].agreed / x[0].total, -x[1].id))
    shown = [r for _, r in scored[(page - 1) * limit:page * limit]]
    return shown, len(scored), page + 1 if page * limit < len(scored) else None


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
