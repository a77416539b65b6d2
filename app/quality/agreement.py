"""Inter-annotator agreement and annotator quality: pure metrics over tier rankings, and the project report.

A ranking is a list of tiers of completion ids, best tier first; ids in one tier are tied, and ids left
out of every tier (a partial ranking) are unranked. Metrics compare two rankings only on the items both
ranked. Only human rankings count toward annotator figures: AI judges and imports are not annotators.
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import combinations, groupby
from typing import Any, Literal, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.annotation.pairs import expand_tiers
from app.models import Project, Prompt, Ranking, Rubric, User
from app.platform.errors import Invalid
from app.quality import buckets
from app.quality import flags as agreement_flags
from app.quality.buckets import median_of_tenths, tenth
from app.quality.report import AgreementReport, AnnotatorStats, TrendPoint

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


def krippendorff_alpha_ordinal(units: Mapping[Any, Mapping[Hashable, float]]) -> float | None:
    """Krippendorff's α = 1 − D_o/D_e with the ordinal metric δ²_ck = (Σ_{g=c..k} n_g − (n_c + n_k)/2)².

    `units` maps unit → {coder: value}. Coincidences o_ck = Σ_u (c–k pairs in u)/(m_u − 1) over units with
    m_u ≥ 2 values; n_c = Σ_k o_ck; α = 1 − (n − 1)·Σ o_ck δ²_ck / Σ n_c n_k δ²_ck (Krippendorff 2011).
    None when there is nothing to compare or no variation at all (D_e = 0).
    """
    return alpha_from_coincidences(coincidences(units))


def coincidences(units: Mapping[Any, Mapping[Hashable, float]],
                 into: dict[tuple[float, float], float] | None = None) -> dict[tuple[float, float], float]:
    """The coincidence matrix o_ck of α, added to `into`: a sum over units, so it can be built unit by unit."""
    coincidence: dict[tuple[float, float], float] = defaultdict(float) if into is None else into
    for coded in units.values():
        values = list(coded.values())
        m = len(values)
        if m < 2:
            continue  # a unit coded once has nothing to agree with
        for i, c in enumerate(values):
            for j, k in enumerate(values):
                if i != j:
                    coincidence[(c, k)] += 1 / (m - 1)
    return coincidence


def alpha_from_coincidences(coincidence: Mapping[tuple[float, float], float]) -> float | None:
    """α from a coincidence matrix (see krippendorff_alpha_ordinal)."""
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


def ranking_units(rankings: Iterable[tuple[Hashable, Hashable, Tiers]],
                  ) -> dict[tuple[Hashable, int], dict[Hashable, float]]:
    """α's units for rankings: (unit group, completion) → {coder: mid-rank} (see ranking_alpha)."""
    units: dict[tuple[Hashable, int], dict[Hashable, float]] = defaultdict(dict)
    for group, coder, tiers in rankings:
        for item, rank in mid_ranks(tiers).items():
            units[(group, item)][coder] = rank
    return units


def ranking_alpha(rankings: Iterable[tuple[Hashable, Hashable, Tiers]]) -> float | None:
    """Ordinal α over mid-ranks: each ranked completion is a unit, each annotator a coder, its mid-rank the value.

    Input: (unit group, coder, tiers) per ranking, the group being e.g. (prompt, round). A ranking gives one
    value per completion it ranks, so the units are the completions of the prompts (a prompt of K gives K units);
    unranked items of a partial ranking are missing values; ties share the mean of their ranks.
    """
    return krippendorff_alpha_ordinal(ranking_units(rankings))


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


@dataclass
class _Acc:
    """Per-annotator running figures while the report is built."""

    rankings: int = 0
    skipped: int = 0
    ties: int = 0
    seconds: list[int] = field(default_factory=list)
    """In tenths (buckets.tenth)."""
    agreements: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    comparisons: int = 0
    shown: list[tuple[Tiers, Sequence[int]]] = field(default_factory=list)
    gold_seen: int = 0
    gold_agreed: int = 0
    gold_pairs: int = 0


def project_report(db: Session, project: Project, *, rubric_version: int | None = None) -> AgreementReport:
    """Agreement, quality and gold figures for the project's human rankings (optionally one rubric version),
    computed now from every ranking: one streamed pass, one (prompt, round) in memory at a time."""
    versions = rubric_versions(db, project)
    if rubric_version is not None and rubric_version not in versions:
        raise Invalid(f"this project has no rubric version {rubric_version}", field="rubric_version")
    return project_reports(db, project, versions=versions, only=rubric_version)[rubric_version]


def rubric_versions(db: Session, project: Project) -> list[int]:
    return list(db.scalars(select(Rubric.version).where(Rubric.project_id == project.id).order_by(Rubric.version)))


@dataclass
class Disagreements:
    """The (prompt, round) groups whose rankings disagree (mean pairwise agreement < 1), least agreement first: how
    many there are, and the first `kept` of them as (agreement, prompt id, round)."""

    kept: int
    total: int = 0
    rows: list[tuple[float, int, int]] = field(default_factory=list)

    def add(self, pairs: Comparisons) -> None:
        """Fold in one (prompt, round)'s comparisons (a group's, as `compare_annotators` made them)."""
        if not pairs.each:
            return
        score = sum(c.agreement for c in pairs.each) / len(pairs.each)
        if score >= 1:
            return
        self.total += 1
        self.rows.append((score, pairs.each[0].prompt_id, pairs.each[0].round))
        if len(self.rows) >= 2 * self.kept:  # sorted and cut now and then: memory bounded by `kept`
            self.finish()

    def finish(self) -> Disagreements:
        self.rows.sort()
        del self.rows[self.kept:]
        return self


def project_reports(db: Session, project: Project, *, versions: list[int] | None = None,
                    only: int | None | Literal["every"] = "every",
                    disagreements: dict[int | None, Disagreements] | None = None,
                    ) -> dict[int | None, AgreementReport]:
    """The report for all versions (key None) and for each rubric version, from one pass over the rankings.

    Each version's own figures are also its point of `by_rubric_version`, so every version is tallied whatever
    `only` asks for; `only` (None = all versions, or one version) skips building the other reports' trends.
    `disagreements`: scope → Disagreements, filled from the same pass (the rollup keeps the worst groups).
    """
    versions = rubric_versions(db, project) if versions is None else versions
    gold = gold_orders(db, project)
    spans = _spans(db, project)
    scopes: dict[int | None, ReportBuilder] = {
        v: ReportBuilder(gold, project.current_round, project.overlap, spans.get(v),
                         trend=only == "every" or only == v)
        for v in [None, *versions]}
    worst = disagreements if disagreements is not None else {}
    for group in _groups(_stream_rankings(db, project)):
        tallied = scopes[None].add(group)
        if None in worst:
            worst[None].add(tallied[1])
        by_version: dict[int, list[Any]] = defaultdict(list)
        for r in group:
            if r.rubric_version is not None:
                by_version[r.rubric_version].append(r)
        for v, rows in by_version.items():
            if v in scopes:  # a prompt ranked under one version only (the usual case) is tallied once for both
                version_tallied = scopes[v].add(rows, tallied if len(rows) == len(group) else None)
                if v in worst:
                    worst[v].add(version_tallied[1])
    for w in worst.values():
        w.finish()
    total_prompts = int(db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)) or 0)
    people = _people(db, {uid for b in scopes.values() for uid in b.people})
    by_rubric_version = [scopes[v].point(f"v{v}", float(v)) for v in versions if scopes[v].rankings]
    wanted = scopes if only == "every" else {only: scopes[only]}
    return {v: agreement_flags.flagged(b.report(project, v, versions, total_prompts, people, by_rubric_version))
            for v, b in wanted.items()}


def _stream_rankings(db: Session, project: Project) -> Iterator[Any]:
    """Every human ranking of the project, ordered by (prompt, round, id), read in batches from a server-side
    cursor where the database has one."""
    query = (select(Ranking.id, Ranking.prompt_id, Ranking.round, Ranking.annotator_id, Ranking.tiers,
                    Ranking.display_order, Ranking.skipped, Ranking.seconds_spent, Ranking.created_at,
                    Rubric.version.label("rubric_version"))
             .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
             .where(Ranking.project_id == project.id, Ranking.source == "human")
             .order_by(Ranking.prompt_id, Ranking.round, Ranking.id)
             .execution_options(yield_per=STREAM_BATCH))
    yield from db.execute(query)


def _groups(rows: Iterable[Any]) -> Iterator[list[Any]]:
    """The rankings of one (prompt, round) at a time (rows come ordered by prompt and round)."""
    for _, group in groupby(rows, key=lambda r: (r.prompt_id, r.round)):
        yield list(group)


def _spans(db: Session, project: Project) -> dict[int | None, tuple[Any, Any]]:
    """(first, last) ranking time for the whole project (key None) and per rubric version: the trend's x axis."""
    query = (select(Rubric.version, func.min(Ranking.created_at), func.max(Ranking.created_at))
             .select_from(Ranking).outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
             .where(Ranking.project_id == project.id, Ranking.source == "human", Ranking.created_at.is_not(None))
             .group_by(Rubric.version))
    out: dict[int | None, tuple[Any, Any]] = {}
    firsts, lasts = [], []
    for version, first, last in db.execute(query):
        first, last = _utc(first), _utc(last)
        firsts.append(first)
        lasts.append(last)
        if version is not None:
            out[version] = (first, last)
    if firsts:
        out[None] = (min(firsts), max(lasts))
    return out


def _utc(at: Any) -> Any:
    """An aggregate over a UTC column comes back as the driver gives it: naive on SQLite, aware on Postgres."""
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def _people(db: Session, ids: set[int]) -> dict[int, User]:
    return {u.id: u for u in db.scalars(select(User).where(User.id.in_(list(ids))))} if ids else {}


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
    seconds: list[int] = field(default_factory=list)
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
            a.seconds.append(tenth(r.seconds_spent))
            tally.seconds.append(tenth(r.seconds_spent))
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


def _median(values: Sequence[int]) -> float | None:
    """The median of seconds kept in tenths, in seconds (buckets.median_of_tenths)."""
    return median_of_tenths(values)


# --- trends -------------------------------------------------------------------------------------------------

# The trend's points are calendar buckets (app.quality.buckets): hours, days or weeks by the span of the rankings.


# --- the report, built one (prompt, round) at a time ----------------------------------------------------------
#
# Every figure of the report is a sum over (prompt, round) groups (counts, sums of agreements, α's coincidences,
# position and gold tallies), or a median over values kept in compact arrays (seconds spent, in tenths). So the
# rankings
# stream past once and only one group's rankings are in memory: a metric added to the report adds a field to
# `_Person` or `ReportBuilder`, a line in `ReportBuilder.add` that folds one group in, and a line in `report`.

STREAM_BATCH = 5_000
"""Rankings read per round trip while streaming."""


@dataclass
class _Person:
    """One annotator's running figures."""

    rankings: int = 0
    skipped: int = 0
    ties: int = 0
    seconds: array[int] = field(default_factory=lambda: array("q"))
    agreement_sum: float = 0.0
    """Summed pairwise agreement with other annotators' rankings of the same prompt and round; over `comparisons`."""
    comparisons: int = 0
    tau_sum: float = 0.0
    """Summed Kendall τ-b of those comparisons where it is defined; over `taus`."""
    taus: int = 0
    position_n: int = 0
    """Rankings the position-bias figures count: those with a display order and a top tier (skips are left out);
    `position_hits` and `position_expected` are out of these."""
    position_hits: int = 0
    """Rankings whose first-shown completion landed in the top tier."""
    position_expected: float = 0.0
    """How many would by chance: the sum of |top tier| / completions shown."""
    gold_seen: int = 0
    """Rankings of gold prompts (skips left out)."""
    gold_agreed: int = 0
    gold_pairs: int = 0

    def add(self, a: _Acc) -> None:
        """Fold in what one group's tally holds for this annotator."""
        self.rankings += a.rankings
        self.skipped += a.skipped
        self.ties += a.ties
        self.seconds.extend(a.seconds)
        self.agreement_sum += sum(a.agreements)
        self.comparisons += a.comparisons
        self.tau_sum += sum(a.taus)
        self.taus += len(a.taus)
        bias = position_bias(a.shown)
        self.position_n += bias.rankings
        self.position_hits += bias.first_on_top
        self.position_expected += (bias.expected or 0.0) * bias.rankings
        self.gold_seen += a.gold_seen
        self.gold_agreed += a.gold_agreed
        self.gold_pairs += a.gold_pairs

    def stats(self, user_id: int, person: User | None) -> AnnotatorStats:
        ranked = self.rankings - self.skipped
        n = self.position_n
        return AnnotatorStats(
            user_id=user_id, email=person.email if person else "", name=person.name if person else "",
            rankings=self.rankings, skipped=self.skipped,
            skip_share=self.skipped / self.rankings if self.rankings else None,
            median_seconds=_median(self.seconds),
            agreement=self.agreement_sum / self.comparisons if self.comparisons else None,
            comparisons=self.comparisons, kendall_tau=self.tau_sum / self.taus if self.taus else None,
            tie_share=self.ties / ranked if ranked else None,
            position_rate=self.position_hits / n if n else None,
            position_expected=self.position_expected / n if n else None, position_rankings=n,
            gold_seen=self.gold_seen, gold_pairs=self.gold_pairs, gold_agreed=self.gold_agreed,
            gold_accuracy=self.gold_agreed / self.gold_pairs if self.gold_pairs else None,
        )


@dataclass
class _Bucket:
    """One point of the trend while it is summed."""

    rankings: int = 0
    """Rankings made in this period."""
    agreement_sum: float = 0.0
    """Summed agreement of the comparisons whose later ranking was made in this period; the point shows it over
    `comparisons`."""
    comparisons: int = 0
    gold_agreed: int = 0
    """Gold pairs this period's rankings ordered as the gold order does, of `gold_pairs` scored."""
    gold_pairs: int = 0
    seconds: array[int] = field(default_factory=lambda: array("q"))
    """Time spent on each answered (not skipped) ranking, in tenths of a second, for the median."""


class ReportBuilder:
    """The figures of one scope (all rubric versions, or one), fed the rankings of one (prompt, round) at a time."""

    def __init__(self, gold: dict[int, Any], current_round: int, overlap: int, span: tuple[Any, Any] | None,
                 *, trend: bool = True) -> None:
        self.gold, self.current_round, self.overlap = gold, current_round, overlap
        self.acc: dict[int, _Person] = defaultdict(_Person)
        self.rankings = self.skipped = self.prompts_at_overlap = self.shared_prompts = 0
        self.comparisons = self.taus = 0
        self.agreement_sum = self.tau_sum = 0.0
        self.gold_agreed = self.gold_pairs = 0
        self.gold_prompts_ranked: set[int] = set()
        self.seconds: array[int] = array("q")
        self.coincidence: dict[tuple[float, float], float] = defaultdict(float)
        self._last_shared: int | None = None
        self.unit, self.kind, self.first = "day", "d", 0
        self.buckets: dict[int, _Bucket] | None = None
        if trend and span is not None:
            first_hour = buckets.hour_of(span[0])
            self.kind, self.unit = buckets.unit_of(first_hour, buckets.hour_of(span[1]))
            self.first = buckets.first_key(self.kind, first_hour)
            self.buckets = defaultdict(_Bucket)

    @property
    def people(self) -> set[int]:
        return set(self.acc)

    def add(self, rows: list[Any], tallied: tuple[Tally, Comparisons] | None = None) -> tuple[Tally, Comparisons]:
        """Fold in every ranking of one (prompt, round) — the same computation as over the whole list; `tallied`:
        these very rows already tallied and compared (for another scope). Returns the tally and comparisons."""
        if tallied is None:
            tally = tally_rankings(rows, self.gold, self.current_round)
            tallied = tally, compare_annotators(tally)
        tally, pairs = tallied
        self.rankings += len(rows)
        self.skipped += tally.skipped
        self.seconds.extend(tally.seconds)
        for user_id, a in tally.acc.items():
            self.acc[user_id].add(a)
        self.prompts_at_overlap += sum(1 for n in tally.done_current_round.values() if n >= self.overlap)
        for prompt_id in pairs.shared_prompts:  # groups come by prompt, then round: a prompt's rounds are adjacent
            if prompt_id != self._last_shared:
                self.shared_prompts += 1
                self._last_shared = prompt_id
        self.comparisons += len(pairs.agreements)
        self.agreement_sum += sum(pairs.agreements)
        self.taus += len(pairs.taus)
        self.tau_sum += sum(pairs.taus)
        self.gold_prompts_ranked |= tally.gold_prompts_ranked
        for score in tally.gold.values():
            self.gold_agreed += score.agreed
            self.gold_pairs += score.total
        coincidences(ranking_units((key, r.annotator_id, r.tiers) for key, ranked in tally.by_prompt.items()
                                   for r in ranked), into=self.coincidence)
        if self.buckets is not None:
            self._add_trend(rows, tally, pairs)
        return tallied

    def _bucket(self, at: Any) -> _Bucket:
        assert self.buckets is not None
        return self.buckets[buckets.key_of(self.kind, _utc(at))]

    def _add_trend(self, rows: list[Any], tally: Tally, pairs: Comparisons) -> None:
        """A comparison counts when its later ranking was made, a gold score and a time when the ranking was."""
        for c in pairs.each:
            if c.a.at is not None and c.b.at is not None:
                b = self._bucket(max(c.a.at, c.b.at))
                b.agreement_sum += c.agreement
                b.comparisons += 1
        for r in rows:
            if r.created_at is None:
                continue
            b = self._bucket(r.created_at)
            b.rankings += 1
            if r.seconds_spent is not None and not r.skipped and r.tiers:
                b.seconds.append(tenth(r.seconds_spent))
            score = tally.gold.get(r.id)
            if score is not None:
                b.gold_agreed += score.agreed
                b.gold_pairs += score.total

    def point(self, label: str, x: float) -> TrendPoint:
        """The scope's figures as one point (of `by_rubric_version`)."""
        return TrendPoint(label, x, self.rankings, self.agreement_sum / self.comparisons if self.comparisons else None,
                          self.gold_agreed / self.gold_pairs if self.gold_pairs else None, _median(self.seconds))

    def trend(self) -> list[TrendPoint]:
        if not self.buckets:
            return []
        out = []
        for i in sorted(i for i, b in self.buckets.items() if b.rankings):
            b = self.buckets[i]
            out.append(TrendPoint(buckets.label(self.kind, i), float(i - self.first), b.rankings,
                                  b.agreement_sum / b.comparisons if b.comparisons else None,
                                  b.gold_agreed / b.gold_pairs if b.gold_pairs else None, _median(b.seconds)))
        return out

    def report(self, project: Project, rubric_version: int | None, versions: list[int], total_prompts: int,
               people: dict[int, User], by_rubric_version: list[TrendPoint]) -> AgreementReport:
        annotators = sorted((p.stats(uid, people.get(uid)) for uid, p in self.acc.items()), key=lambda s: s.email)
        return AgreementReport(
            project_id=project.id, rubric_version=rubric_version, rubric_versions=versions, overlap=project.overlap,
            total_prompts=total_prompts, prompts_at_overlap=self.prompts_at_overlap, human_rankings=self.rankings,
            skipped=self.skipped, shared_prompts=self.shared_prompts, comparisons=self.comparisons,
            mean_agreement=self.agreement_sum / self.comparisons if self.comparisons else None,
            mean_kendall_tau=self.tau_sum / self.taus if self.taus else None,
            krippendorff_alpha=alpha_from_coincidences(self.coincidence), gold_prompts=len(self.gold),
            annotators=annotators, gold_prompts_ranked=len(self.gold_prompts_ranked),
            median_seconds=_median(self.seconds), trend_unit=self.unit, trend=self.trend(),
            by_rubric_version=by_rubric_version,
        )
