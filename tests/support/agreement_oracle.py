"""Today's agreement report, frozen as the oracle the scalable report is checked against: every human ranking of
the project read into memory and the figures computed over the whole list, exactly as `agreement.project_report`
did before it was built group by group (commit c4f0f3f), with the two changes the kept figures brought (formula 1 of
app.models.AGREEMENT_FORMULA): medians of the times rounded to the tenth of a second, and the trend in calendar
buckets. Only tests import this."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import Project, Prompt, Rubric, User
from app.platform.errors import Invalid
from app.quality import flags as agreement_flags
from app.quality.agreement import (
    AgreementReport,
    AnnotatorStats,
    Comparisons,
    Tally,
    TrendPoint,
    _Acc,
    _mean,
    _median,
    compare_annotators,
    gold_orders,
    human_rankings,
    position_bias,
    ranking_alpha,
    tally_rankings,
)


def oracle_report(db: Session, project: Project, *, rubric_version: int | None = None) -> AgreementReport:
    """Agreement, quality and gold figures for the project's human rankings (optionally one rubric version)."""
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
# a quarter by the day, anything longer by the week. Buckets are calendar ones (UTC; weeks start on Monday, and
# 1970-01-05 was one), and the span is measured between the first and the last ranking's hour.
_UNITS = (("hour", 3600, 3 * 86400), ("day", 86400, 120 * 86400), ("week", 7 * 86400, math.inf))
_MONDAY = datetime(1970, 1, 5, tzinfo=UTC)


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
    def hour(at: Any) -> int:
        return int((at - _MONDAY).total_seconds() // 3600)

    span = (hour(max(when.values())) - hour(min(when.values()))) * 3600
    unit, width, _ = next(u for u in _UNITS if span <= u[2])
    origin = _MONDAY if unit == "week" else datetime(1970, 1, 1, tzinfo=UTC)

    def bucket(at: Any) -> int:
        return int((at - origin).total_seconds() // width)

    first = bucket(min(when.values()))

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
    seconds: dict[int, list[int]] = defaultdict(list)
    counts: dict[int, int] = defaultdict(int)
    for r in rows:
        if r.created_at is None:
            continue
        counts[bucket(r.created_at)] += 1
        if r.seconds_spent is not None and not r.skipped and r.tiers:
            seconds[bucket(r.created_at)].append(math.floor(r.seconds_spent * 10 + 0.5))
    fmt = "%Y-%m-%d %H:00" if unit == "hour" else "%Y-%m-%d"
    out = []
    for i in sorted(counts):
        start = origin + timedelta(seconds=i * width)
        g = gold.get(i)
        out.append(TrendPoint(start.strftime(fmt), float(i - first), counts[i], _mean(agree.get(i, [])),
                              g[0] / g[1] if g and g[1] else None, _median(seconds.get(i, []))))
    return unit, out


def _by_version(rows: list[Any], gold: dict[int, Any], versions: list[int]) -> list[TrendPoint]:
    by: dict[int, list[Any]] = defaultdict(list)
    for r in rows:
        if r.rubric_version is not None:
            by[r.rubric_version].append(r)
    return [_figures(f"v{v}", float(v), by[v], gold) for v in versions if by.get(v)]
