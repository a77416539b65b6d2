"""Inter-annotator agreement and annotator quality: pure metrics over tier rankings, and the project report.

A ranking is a list of tiers of completion ids, best tier first; ids in one tier are tied, and ids left
out of every tier (a partial ranking) are unranked. Metrics compare two rankings only on the items both
ranked. Only human rankings count toward annotator figures: AI judges and imports are not annotators.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import combinations
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.errors import Invalid
from app.models import Project, Prompt, Ranking, Rubric, User
from app.services.pairs import expand_tiers

Tiers = Sequence[Sequence[int]]

# Who may read the figures (admins always may): not annotators, whose own numbers would change how they rank.


# ---------------------------------------------------------------------------------------------------------
# Pure metrics (no database)
# ---------------------------------------------------------------------------------------------------------


def tier_index(tiers: Tiers) -> dict[int, int]:
    """item → index of its tier (0 = best); unranked items are absent."""
    return {item: i for i, tier in enumerate(tiers) for item in tier}


def mid_ranks(tiers: Tiers) -> dict[int, float]:
    """item → rank 1..n among the ranked items; a tier of t items starting at rank r gets r + (t − 1)/2 each."""
    out: dict[int, float] = {}
    start = 1
    for tier in tiers:
        rank = start + (len(tier) - 1) / 2
        for item in tier:
            out[item] = rank
        start += len(tier)
    return out


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _relations(a: Tiers, b: Tiers) -> list[tuple[int, int]]:
    """For each unordered pair of items ranked by both: (sign of a's order, sign of b's order); 0 = tie."""
    ia, ib = tier_index(a), tier_index(b)
    shared = sorted(ia.keys() & ib.keys())
    return [(_sign(ia[y] - ia[x]), _sign(ib[y] - ib[x])) for x, y in combinations(shared, 2)]


def pairwise_agreement(a: Tiers, b: Tiers) -> float | None:
    """Share of item pairs (ranked by both) on which a and b give the same relation: x ≻ y, y ≻ x, or a tie.

    A tie counts as a relation of its own: both tying a pair agrees, a tie against a strict order disagrees.
    None when fewer than two items are ranked by both.
    """
    rel = _relations(a, b)
    if not rel:
        return None
    return sum(1 for ra, rb in rel if ra == rb) / len(rel)


def kendall_tau_b(a: Tiers, b: Tiers) -> float | None:
    """Kendall's τ_b = (n_c − n_d) / √((n₀ − n₁)(n₀ − n₂)) over items ranked by both; n₁, n₂ = pairs tied in a, b.

    None when fewer than two shared items or when one ranking ties every shared pair (the denominator is 0).
    """
    rel = _relations(a, b)
    n0 = len(rel)
    n_c = sum(1 for ra, rb in rel if ra * rb > 0)
    n_d = sum(1 for ra, rb in rel if ra * rb < 0)
    n1 = sum(1 for ra, _ in rel if ra == 0)
    n2 = sum(1 for _, rb in rel if rb == 0)
    denominator = math.sqrt((n0 - n1) * (n0 - n2))
    return (n_c - n_d) / denominator if denominator else None


def krippendorff_alpha_ordinal(units: Mapping[Hashable, Mapping[Hashable, float]]) -> float | None:
    """Krippendorff's α = 1 − D_o/D_e with the ordinal metric δ²_ck = (Σ_{g=c..k} n_g − (n_c + n_k)/2)².

    `units` maps unit → {coder: value}. Coincidences o_ck = Σ_u (c–k pairs in u)/(m_u − 1) over units with
    m_u ≥ 2 values; n_c = Σ_k o_ck; α = 1 − (n − 1)·Σ o_ck δ²_ck / Σ n_c n_k δ²_ck (Krippendorff 2011).
    None when there is nothing to compare or no variation at all (D_e = 0).
    """
    coincidence: dict[tuple[float, float], float] = defaultdict(float)
    for coded in units.values():
        values = list(coded.values())
        m = len(values)
        if m < 2:
            continue  # a unit coded once has nothing to agree with
        for i, c in enumerate(values):
            for j, k in enumerate(values):
                if i != j:
                    coincidence[(c, k)] += 1 / (m - 1)
    marginals: dict[float, float] = defaultdict(float)
    for (c, _), o in coincidence.items():
        marginals[c] += o
    n = sum(marginals.values())
    if n <= 1:
        return None
    ordered = sorted(marginals)
    cumulative = [0.0]  # cumulative[i] = n_{v0} + … + n_{v(i−1)}, so Σ_{g=c..k} n_g is a difference
    for v in ordered:
        cumulative.append(cumulative[-1] + marginals[v])
    position = {v: i for i, v in enumerate(ordered)}

    def delta2(c: float, k: float) -> float:
        lo, hi = sorted((position[c], position[k]))
        return (cumulative[hi + 1] - cumulative[lo] - (marginals[c] + marginals[k]) / 2) ** 2

    observed = sum(o * delta2(c, k) for (c, k), o in coincidence.items())
    expected = sum(marginals[c] * marginals[k] * delta2(c, k) for c in ordered for k in ordered)
    if expected == 0:
        return None
    return 1 - (n - 1) * observed / expected


def ranking_alpha(rankings: Iterable[tuple[Hashable, Hashable, Tiers]]) -> float | None:
    """Ordinal α over mid-ranks: each ranked completion is a unit, each annotator a coder, its mid-rank the value.

    Input: (unit group, coder, tiers) per ranking, the group being e.g. (prompt, round). A ranking gives one
    value per completion it ranks, so the units are the completions of the prompts (a prompt of K gives K units);
    unranked items of a partial ranking are missing values; ties share the mean of their ranks.
    """
    units: dict[tuple[Hashable, int], dict[Hashable, float]] = defaultdict(dict)
    for group, coder, tiers in rankings:
        for item, rank in mid_ranks(tiers).items():
            units[(group, item)][coder] = rank
    return krippendorff_alpha_ordinal(units)


class PositionBias(NamedTuple):
    rankings: int
    """Rankings with a recorded display order and at least one tier."""
    first_on_top: int
    """How many of them put the item shown first in the top tier."""
    rate: float | None
    """first_on_top / rankings."""
    expected: float | None
    """The rate an annotator blind to position would get: mean of |top tier| / items shown (1/K without ties)."""


def position_bias(rankings: Iterable[tuple[Tiers, Sequence[int]]]) -> PositionBias:
    """Rate at which the first-shown item lands in the top tier, against mean(|T₁| / items shown) expected.

    A tie for first counts as top for every member; the expectation grows with the top tier, so tying
    is not mistaken for bias. Rankings without a display order or without tiers (skips) are left out.
    """
    n = hits = 0
    expected = 0.0
    for tiers, shown in rankings:
        if not shown or not tiers or not tiers[0]:
            continue
        n += 1
        hits += shown[0] in tiers[0]
        expected += len(tiers[0]) / len(shown)
    return PositionBias(n, hits, hits / n if n else None, expected / n if n else None)


class GoldScore(NamedTuple):
    agreed: int
    """Gold pairs the annotator ordered the same way (chosen strictly above rejected)."""
    total: int
    """Gold pairs whose two completions were both shown to the annotator."""


def gold_score(gold_tiers: Tiers, tiers: Tiers, shown: Sequence[int] | None = None) -> GoldScore:
    """Over the pairs of expand_tiers(gold), the share the annotator ordered the same way: agreed / total.

    A tie or an unranked item on a gold pair counts as a miss. Gold pairs with an item the annotator was not
    shown (`shown` = display order; the ranked items when it is empty) do not count at all.
    """
    index = tier_index(tiers)
    visible = set(shown) if shown else set(index)
    agreed = total = 0
    for pair in expand_tiers([list(t) for t in gold_tiers]):
        if pair.chosen not in visible or pair.rejected not in visible:
            continue
        total += 1
        if pair.chosen in index and pair.rejected in index and index[pair.chosen] < index[pair.rejected]:
            agreed += 1
    return GoldScore(agreed, total)


def gold_accuracy(gold_tiers: Tiers, tiers: Tiers, shown: Sequence[int] | None = None) -> float | None:
    """gold_score as a share: agreed / total gold pairs shown; None when no gold pair was shown."""
    score = gold_score(gold_tiers, tiers, shown)
    return score.agreed / score.total if score.total else None


def has_tie(tiers: Tiers) -> bool:
    """True when some tier holds more than one item."""
    return any(len(tier) > 1 for tier in tiers)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------------------------------------
# The project report
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """Something a lead must act on, said for people: what is wrong, why it matters, and what to do."""

    kind: str
    """too_fast | position_bias | low_gold | negative_alpha"""
    title: str
    why: str
    action: str


@dataclass(frozen=True)
class AnnotatorStats:
    user_id: int
    email: str
    name: str
    rankings: int
    """Human rankings submitted, skips included."""
    skipped: int
    skip_share: float | None
    """skipped / rankings."""
    median_seconds: float | None
    """Median seconds spent per ranking that was not a skip (skips are quick and would flatter the figure)."""
    agreement: float | None
    """Mean pairwise agreement with every other annotator's ranking of the same prompt."""
    comparisons: int
    """Ranking pairs behind `agreement`."""
    kendall_tau: float | None
    """Mean Kendall τ_b over the same comparisons (where defined)."""
    tie_share: float | None
    """Share of non-skipped rankings with at least one tier of more than one item."""
    position_rate: float | None
    """Share of rankings whose first-shown item is in the top tier."""
    position_expected: float | None
    """What a position-blind annotator would score: mean |top tier| / items shown (1/K without ties)."""
    gold_seen: int
    """Non-skipped rankings of gold prompts."""
    gold_pairs: int
    gold_agreed: int
    gold_accuracy: float | None
    """gold_agreed / gold_pairs: pooled over every gold pair the annotator was shown."""
    position_rankings: int = 0
    """Rankings behind `position_rate` (those with a display order)."""
    flags: list[Flag] = field(default_factory=list)
    """What a lead should look at for this annotator (app.services.agreement_flags decides)."""


@dataclass(frozen=True)
class TrendPoint:
    """The project's figures over one stretch of time (or one rubric version)."""

    label: str
    """The bucket's start (UTC, e.g. "2025-03-01 14:00") or "v2" for a rubric version."""
    x: float
    """Position on the chart's x axis: hours/days/weeks since the first ranking, or the version number."""
    rankings: int
    agreement: float | None
    gold_accuracy: float | None
    median_seconds: float | None


@dataclass(frozen=True)
class AgreementReport:
    project_id: int
    rubric_version: int | None
    """The rubric version the figures are filtered to, or None for all versions."""
    rubric_versions: list[int]
    """Every rubric version of the project, oldest first (for the selector)."""
    overlap: int
    total_prompts: int
    prompts_at_overlap: int
    """Prompts with at least `overlap` non-skipped human rankings in the project's current round."""
    human_rankings: int
    skipped: int
    shared_prompts: int
    """Prompts ranked (not skipped) by two or more annotators."""
    comparisons: int
    """Pairs of rankings of the same prompt by two different annotators."""
    mean_agreement: float | None
    mean_kendall_tau: float | None
    krippendorff_alpha: float | None
    gold_prompts: int
    """Prompts marked as gold tasks (whether or not anyone has ranked them yet)."""
    annotators: list[AnnotatorStats] = field(default_factory=list)
    gold_prompts_ranked: int = 0
    """Gold prompts that at least one annotator has ranked (not skipped)."""
    median_seconds: float | None = None
    """The project's median seconds per non-skipped ranking: what "too fast" is measured against."""
    flags: list[Flag] = field(default_factory=list)
    """What a lead should look at for the project as a whole."""
    trend_unit: str = "day"
    """hour | day | week: the width of each point of `trend`."""
    trend: list[TrendPoint] = field(default_factory=list)
    """Agreement, gold accuracy and speed per stretch of time, oldest first."""
    by_rubric_version: list[TrendPoint] = field(default_factory=list)
    """The same figures per rubric version (always every version, whatever `rubric_version` filters)."""


@dataclass
class _Acc:
    """Per-annotator running figures while the report is built."""

    rankings: int = 0
    skipped: int = 0
    ties: int = 0
    seconds: list[float] = field(default_factory=list)
    agreements: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    comparisons: int = 0
    shown: list[tuple[Tiers, Sequence[int]]] = field(default_factory=list)
    gold_seen: int = 0
    gold_agreed: int = 0
    gold_pairs: int = 0


def project_report(db: Session, project: Project, *, rubric_version: int | None = None) -> AgreementReport:
    """Agreement, quality and gold figures for the project's human rankings (optionally one rubric version)."""
    from app.services import agreement_flags  # it reads this module's types: imported here, not at the top

    versions = list(db.scalars(select(Rubric.version).where(Rubric.project_id == project.id)
                               .order_by(Rubric.version)))
    if rubric_version is not None and rubric_version not in versions:
        raise Invalid(f"this project has no rubric version {rubric_version}", field="rubric_version")
    all_rows = human_rankings(db, project, None)
    rows = all_rows if rubric_version is None else [r for r in all_rows if r.rubric_version == rubric_version]
    gold = gold_orders(db, project)
    total_prompts = int(db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)) or 0)

    tally = tally_rankings(rows, gold, project.current_round)
    pairs = compare_annotators(tally)
    alpha = ranking_alpha((key, r.annotator_id, r.tiers) for key, ranked in tally.by_prompt.items() for r in ranked)
    unit, trend = _trend(rows, tally, pairs)
    report = AgreementReport(
        project_id=project.id, rubric_version=rubric_version, rubric_versions=versions, overlap=project.overlap,
        total_prompts=total_prompts,
        prompts_at_overlap=sum(1 for n in tally.done_current_round.values() if n >= project.overlap),
        human_rankings=len(rows), skipped=tally.skipped, shared_prompts=len(pairs.shared_prompts),
        comparisons=len(pairs.agreements), mean_agreement=_mean(pairs.agreements), mean_kendall_tau=_mean(pairs.taus),
        krippendorff_alpha=alpha, gold_prompts=len(gold), annotators=_annotator_stats(db, tally.acc),
        gold_prompts_ranked=len(tally.gold_prompts_ranked), median_seconds=_median(tally.seconds),
        trend_unit=unit, trend=trend, by_rubric_version=_by_version(all_rows, gold, versions),
    )
    return agreement_flags.flagged(report)


def gold_orders(db: Session, project: Project) -> dict[int, Any]:
    """prompt id → its gold tiers, for the project's gold prompts."""
    return {pid: tiers for pid, tiers in db.execute(
        select(Prompt.id, Prompt.gold_tiers).where(Prompt.project_id == project.id, Prompt.gold_tiers.is_not(None))
    ) if tiers}  # JSON null reads back as None too


def human_rankings(db: Session, project: Project, rubric_version: int | None) -> list[Any]:
    """Every human ranking of the project (of one rubric version), in one query; the figures are computed in Python."""
    query = (select(Ranking.id, Ranking.prompt_id, Ranking.round, Ranking.annotator_id, Ranking.tiers,
                    Ranking.display_order, Ranking.skipped, Ranking.seconds_spent, Ranking.created_at,
                    Rubric.version.label("rubric_version"))
             .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
             .where(Ranking.project_id == project.id, Ranking.source == "human")
             .order_by(Ranking.prompt_id, Ranking.round, Ranking.id))
    if rubric_version is not None:
        query = query.where(Rubric.version == rubric_version)
    return list(db.execute(query).all())


class Ranked(NamedTuple):
    """One non-skipped ranking of a (prompt, round), as the comparisons need it."""

    ranking_id: int
    annotator_id: int
    tiers: list[list[int]]
    at: Any
    """When it was made (a datetime)."""


@dataclass
class Tally:
    """Per annotator what they did; per (prompt, round) who ranked it how; per prompt the current round's count."""

    acc: dict[int, _Acc] = field(default_factory=lambda: defaultdict(_Acc))
    by_prompt: dict[tuple[int, int], list[Ranked]] = field(default_factory=lambda: defaultdict(list))
    done_current_round: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    skipped: int = 0
    seconds: list[float] = field(default_factory=list)
    gold_prompts_ranked: set[int] = field(default_factory=set)
    gold: dict[int, GoldScore] = field(default_factory=dict)
    """ranking id → its gold score, for rankings of gold prompts."""


def tally_rankings(rows: list[Any], gold: dict[int, Any], current_round: int) -> Tally:
    """One pass over the rankings: skips, time, ties, display orders and gold scores per annotator."""
    tally = Tally()
    for r in rows:
        a = tally.acc[r.annotator_id]
        a.rankings += 1
        if r.skipped or not r.tiers:
            a.skipped += 1
            tally.skipped += 1
            continue
        if r.seconds_spent is not None:
            a.seconds.append(r.seconds_spent)
            tally.seconds.append(r.seconds_spent)
        a.ties += has_tie(r.tiers)
        a.shown.append((r.tiers, r.display_order or []))
        tally.by_prompt[(r.prompt_id, r.round)].append(Ranked(r.id, r.annotator_id, r.tiers, r.created_at))
        if r.round == current_round:
            tally.done_current_round[r.prompt_id] += 1
        if r.prompt_id in gold:
            score = gold_score(gold[r.prompt_id], r.tiers, r.display_order)
            tally.gold[r.id] = score
            tally.gold_prompts_ranked.add(r.prompt_id)
            a.gold_seen += 1
            a.gold_agreed += score.agreed
            a.gold_pairs += score.total
    return tally


class Comparison(NamedTuple):
    prompt_id: int
    round: int
    a: Ranked
    b: Ranked
    agreement: float
    tau: float | None


@dataclass
class Comparisons:
    agreements: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    shared_prompts: set[int] = field(default_factory=set)
    each: list[Comparison] = field(default_factory=list)


def compare_annotators(tally: Tally) -> Comparisons:
    """Every two annotators' rankings of the same prompt and round: pairwise agreement and Kendall's τ-b, for the
    project and (added to `tally.acc`) for each of the two."""
    out = Comparisons()
    for (prompt_id, round_), ranked in tally.by_prompt.items():
        for ra, rb in combinations(ranked, 2):
            if ra.annotator_id == rb.annotator_id:
                continue
            agreement = pairwise_agreement(ra.tiers, rb.tiers)
            if agreement is None:
                continue
            tau = kendall_tau_b(ra.tiers, rb.tiers)
            out.each.append(Comparison(prompt_id, round_, ra, rb, agreement, tau))
            out.shared_prompts.add(prompt_id)
            out.agreements.append(agreement)
            if tau is not None:
                out.taus.append(tau)
            for user in (ra.annotator_id, rb.annotator_id):
                tally.acc[user].agreements.append(agreement)
                tally.acc[user].comparisons += 1
                if tau is not None:
                    tally.acc[user].taus.append(tau)
    return out


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _annotator_stats(db: Session, acc: dict[int, _Acc]) -> list[AnnotatorStats]:
    """Each annotator's figures, by email."""
    people = {u.id: u for u in db.scalars(select(User).where(User.id.in_(list(acc))))} if acc else {}
    annotators = []
    for user_id, a in acc.items():
        bias = position_bias(a.shown)
        ranked = a.rankings - a.skipped
        person = people.get(user_id)
        annotators.append(AnnotatorStats(
            user_id=user_id, email=person.email if person else "", name=person.name if person else "",
            rankings=a.rankings, skipped=a.skipped, skip_share=a.skipped / a.rankings if a.rankings else None,
            median_seconds=_median(a.seconds),
            agreement=_mean(a.agreements), comparisons=a.comparisons, kendall_tau=_mean(a.taus),
            tie_share=a.ties / ranked if ranked else None,
            position_rate=bias.rate, position_expected=bias.expected, position_rankings=bias.rankings,
            gold_seen=a.gold_seen, gold_pairs=a.gold_pairs, gold_agreed=a.gold_agreed,
            gold_accuracy=a.gold_agreed / a.gold_pairs if a.gold_pairs else None,
        ))
    annotators.sort(key=lambda s: s.email)
    return annotators


# --- trends -------------------------------------------------------------------------------------------------

# (unit, seconds per bucket, span up to which it is used): a campaign of an afternoon is drawn by the hour, one of
# a quarter by the day, anything longer by the week, so a chart has tens of points rather than one or thousands.
_UNITS = (("hour", 3600, 3 * 86400), ("day", 86400, 120 * 86400), ("week", 7 * 86400, math.inf))


def _figures(label: str, x: float, rows: list[Any], gold: dict[int, Any]) -> TrendPoint:
    """Agreement, gold accuracy and median speed of one group of rankings, compared only within the group."""
    tally = tally_rankings(rows, gold, current_round=-1)
    pairs = compare_annotators(tally)
    agreed = sum(s.agreed for s in tally.gold.values())
    total = sum(s.total for s in tally.gold.values())
    return TrendPoint(label, x, len(rows), _mean(pairs.agreements), agreed / total if total else None,
                      _median(tally.seconds))


def _trend(rows: list[Any], tally: Tally, pairs: Comparisons) -> tuple[str, list[TrendPoint]]:
    """The figures per hour, day or week: a comparison counts when its later ranking was made (when the two
    could first be compared), a gold score and a time when the ranking was made."""
    when = {r.id: r.created_at for r in rows if r.created_at is not None}
    if not when:
        return "day", []
    first = min(when.values())
    span = (max(when.values()) - first).total_seconds()
    unit, width, _ = next(u for u in _UNITS if span <= u[2])

    def bucket(at: Any) -> int:
        return int((at - first).total_seconds() // width)

    agree: dict[int, list[float]] = defaultdict(list)
    for c in pairs.each:
        if c.a.at is not None and c.b.at is not None:
            agree[bucket(max(c.a.at, c.b.at))].append(c.agreement)
    gold: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for ranking_id, score in tally.gold.items():
        if ranking_id in when:
            g = gold[bucket(when[ranking_id])]
            g[0] += score.agreed
            g[1] += score.total
    seconds: dict[int, list[float]] = defaultdict(list)
    counts: dict[int, int] = defaultdict(int)
    for r in rows:
        if r.created_at is None:
            continue
        counts[bucket(r.created_at)] += 1
        if r.seconds_spent is not None and not r.skipped and r.tiers:
            seconds[bucket(r.created_at)].append(r.seconds_spent)
    fmt = "%Y-%m-%d %H:00" if unit == "hour" else "%Y-%m-%d"
    out = []
    for i in sorted(counts):
        start = first + timedelta(seconds=i * width)
        g = gold.get(i)
        out.append(TrendPoint(start.strftime(fmt), float(i), counts[i], _mean(agree.get(i, [])),
                              g[0] / g[1] if g and g[1] else None, _median(seconds.get(i, []))))
    return unit, out


def _by_version(rows: list[Any], gold: dict[int, Any], versions: list[int]) -> list[TrendPoint]:
    by: dict[int, list[Any]] = defaultdict(list)
    for r in rows:
        if r.rubric_version is not None:
            by[r.rubric_version].append(r)
    return [_figures(f"v{v}", float(v), by[v], gold) for v in versions if by.get(v)]
