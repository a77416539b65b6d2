"""The agreement report read from a project's kept totals (app.quality.upkeep keeps them): a few indexed reads,
whatever the project holds, and the same figures a recomputation from every ranking gives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import AgreementState, AgreementTotal, Project, User
from app.quality import buckets, partial
from app.quality import flags as agreement_flags
from app.quality.partial import Part
from app.quality.report import AgreementReport, AnnotatorStats, TrendPoint

_TOTALS = AgreementTotal.__table__


@dataclass(frozen=True)
class Totals:
    """One scope's totals as a report reads them."""

    project: Part
    median_seconds: float | None
    annotators: list[tuple[int, Part, float | None]]
    versions: dict[int, tuple[Part, float | None]]
    """Every rubric version's project totals (by_rubric_version)."""
    trend_kind: str | None
    """h | d | w, or None with no ranking in time."""
    trend_first: int
    """The bucket, in `trend_kind`, of the first hour with rankings: x is counted from it."""
    trend: list[tuple[int, Part, float | None]]


def totals(db: Session, project_id: int, version: int | None) -> Totals:
    """What a report of one scope (None: all versions) is made of: three indexed reads (its project and annotator
    totals with every version's project totals, the span of its hours, and the points of its trend)."""
    v = version or 0
    project: Part = {}
    median: float | None = None
    annotators, versions = [], {}
    for r in db.execute(select(_TOTALS.c.version, _TOTALS.c.kind, _TOTALS.c.key, _TOTALS.c.state,
                               _TOTALS.c.median_seconds)
                        .where(_TOTALS.c.project_id == project_id, _TOTALS.c.kind.in_(("p", "a")))
                        .where((_TOTALS.c.version == v) | (_TOTALS.c.kind == "p"))):
        if r.kind == "a":
            annotators.append((r.key, r.state, r.median_seconds))
            continue
        if r.version == v:
            project, median = r.state, r.median_seconds
        if r.version:
            versions[r.version] = (r.state, r.median_seconds)
    first, last = db.execute(select(func.min(_TOTALS.c.key), func.max(_TOTALS.c.key))
                             .where(_TOTALS.c.project_id == project_id, _TOTALS.c.version == v,
                                    _TOTALS.c.kind == "h")).one()
    if first is None:
        return Totals(project, median, annotators, versions, None, 0, [])
    kind, _ = buckets.unit_of(first, last)
    points = [(r.key, r.state, r.median_seconds) for r in db.execute(
        select(_TOTALS.c.key, _TOTALS.c.state, _TOTALS.c.median_seconds)
        .where(_TOTALS.c.project_id == project_id, _TOTALS.c.version == v, _TOTALS.c.kind == kind)
        .order_by(_TOTALS.c.key))]
    return Totals(project, median, annotators, versions, kind, buckets.first_key(kind, first), points)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def annotator_stats(user_id: int, part: Part, median: float | None, person: User | None) -> AnnotatorStats:
    n, skipped, positions = part.get("n", 0), part.get("skipped", 0), part.get("pos_n", 0)
    return AnnotatorStats(
        user_id=user_id, email=person.email if person else "", name=person.name if person else "",
        rankings=n, skipped=skipped, skip_share=_ratio(skipped, n), median_seconds=median,
        agreement=partial.mean(part, "agree", "cmp"), comparisons=part.get("cmp", 0),
        kendall_tau=partial.tau_sum(part) / part["taus"] if part.get("taus") else None,
        tie_share=_ratio(part.get("ties", 0), n - skipped),
        position_rate=_ratio(part.get("pos_hits", 0), positions),
        position_expected=partial.rational_sum(part, "pos_exp") / positions if positions else None,
        position_rankings=positions, gold_seen=part.get("gold_seen", 0), gold_pairs=part.get("gold_pairs", 0),
        gold_agreed=part.get("gold_agreed", 0), gold_accuracy=_ratio(part.get("gold_agreed", 0),
                                                                     part.get("gold_pairs", 0)))


def _point(label: str, x: float, part: Part, median: float | None) -> TrendPoint:
    return TrendPoint(label, x, part.get("n", 0), partial.mean(part, "agree", "cmp"),
                      _ratio(part.get("gold_agreed", 0), part.get("gold_pairs", 0)), median)


def report(db: Session, project: Project, rubric_version: int | None, versions: list[int],
           state: AgreementState | None, *, people: bool = True) -> AgreementReport:
    """The report of one scope (None: all rubric versions) from the kept totals, its flags raised; `people`: with
    the annotators' names and emails (flags need none)."""
    kept = totals(db, project.id, rubric_version)
    ids = [uid for uid, _, _ in kept.annotators]
    accounts = {u.id: u for u in db.scalars(select(User).where(User.id.in_(ids)))} if people and ids else {}
    annotators = sorted((annotator_stats(uid, part, median, accounts.get(uid))
                         for uid, part, median in kept.annotators), key=lambda a: (a.email, a.user_id))
    p = kept.project
    unit = {"h": "hour", "d": "day", "w": "week"}.get(kept.trend_kind or "d", "day")
    trend = [_point(buckets.label(kept.trend_kind, key), float(key - kept.trend_first), part, median)
             for key, part, median in kept.trend] if kept.trend_kind else []
    return agreement_flags.flagged(AgreementReport(
        project_id=project.id, rubric_version=rubric_version, rubric_versions=versions, overlap=project.overlap,
        total_prompts=state.total_prompts if state else 0,
        prompts_at_overlap=partial.prompts_at_overlap(p, project.current_round, project.overlap),
        human_rankings=p.get("n", 0), skipped=p.get("skipped", 0), shared_prompts=p.get("shared", 0),
        comparisons=p.get("cmp", 0), mean_agreement=partial.mean(p, "agree", "cmp"),
        mean_kendall_tau=partial.tau_sum(p) / p["taus"] if p.get("taus") else None,
        krippendorff_alpha=partial.alpha(p), gold_prompts=state.gold_prompts if state else 0,
        annotators=annotators, gold_prompts_ranked=p.get("gold_ranked", 0), median_seconds=kept.median_seconds,
        trend_unit=unit, trend=trend,
        by_rubric_version=[_point(f"v{v}", float(v), part, median)
                           for v, (part, median) in sorted(kept.versions.items()) if part.get("n")]))


def disagreeing(project_part: dict[str, Any]) -> int:
    """Groups whose rankings disagree (mean agreement below 1), from a scope's project totals."""
    return int(project_part.get("disagree", 0))
