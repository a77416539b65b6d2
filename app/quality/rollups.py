"""Figures over a whole project at campaign scale (the agreement reports, the project page's counts): computed on
each view while a project is small, read from the rollup job's stored result once it is not, and always said how
fresh they are.

A project with up to LIVE_LIMIT human rankings is computed on the view (a few hundred ms at most). Above that a view
reads the `project_rollups` row (a primary-key read of its times, then one scope's report out of its JSON: tens of
KB, whatever the project holds) and, when the row is older than its refresh interval, queues a `project_rollup` job;
a worker streams every ranking once (`agreement.project_reports`, memory bounded by one prompt's rankings and the
arrays of seconds) and replaces the row. The interval is max(REFRESH_S, REFRESH_FACTOR × the last computation's
duration), so a worker spends at most a quarter of a core on one project's figures however often leads reload (and
at nice +10: see app.quality.rollup_job).

The project page's counts (prompts, completions, rankings, pairs) follow the same rule with COUNT_LIVE_LIMIT: exact
on the view below it; above it from the rollup, said to be as of its age (exact on the view, once, before the first
rollup has finished). So do the judge page's human–AI figures, by all of the project's rankings, and the judge API
and the AI-labels gate on the same figures (the API answers "not yet" before the first rollup).

The rollup also keeps each scope's worst-agreeing (prompt, round) groups (DISAGREEMENTS_KEPT) and how many there
are, so the disagreements page of a large project reads their order here and only its page's rankings. Views of
the stored figures are cached per process by the app (app.web.fragments), under ReportView.key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from app.jobs import queue as jobs
from app.models import Job, Project, ProjectRollup, Ranking, User, utcnow
from app.platform.errors import Invalid
from app.projects import projects
from app.quality import agreement, judge_agreement
from app.quality import flags as agreement_flags
from app.quality.report import AgreementReport, AnnotatorStats, Flag, TrendPoint
from app.webhooks import service as webhooks

KIND = "project_rollup"
LIVE_LIMIT = 5_000
"""Human rankings up to which the figures are computed on each view."""
COUNT_LIVE_LIMIT = 5_000
"""Rankings (of any source) up to which the project page counts everything on each view (counting a project's
completions and pairs costs ~150 ms at 15k rankings on a busy 2-core machine, and grows with the project)."""
REFRESH_S = 60.0
"""A stored rollup older than this (or REFRESH_FACTOR × its computation time, if longer) is recomputed."""
REFRESH_FACTOR = 4.0
DISAGREEMENTS_KEPT = 1_000
"""The worst-agreeing (prompt, round) groups per scope the rollup keeps for the disagreements page (~40 KB)."""


@dataclass(frozen=True)
class Freshness:
    """How the figures on the page were computed, and how old they are."""

    method: str
    """live: from every ranking, on this view | rollup: from every ranking, by the rollup job at `as_of`."""
    as_of: datetime | None
    """When the rankings shown were read (None: no rollup has finished yet)."""
    age_seconds: float | None
    rankings: int | None
    """Human rankings the figures cover."""
    compute_seconds: float | None
    """How long the rollup took."""
    refreshing: bool
    """A rollup job is queued or running for this project."""

    def describe(self) -> str:
        if self.method == "live":
            return "Computed from every ranking on this view."
        if self.as_of is None:
            return "Computing the figures from every ranking: a worker is on it (reload in a moment)."
        again = " A newer computation is under way." if self.refreshing else ""
        return (f"Computed from all {self.rankings:,} rankings by the rollup job, as of {_ago(self.age_seconds)} "
                f"(it took {self.compute_seconds:.1f} s).{again}")


def _ago(seconds: float | None) -> str:
    s = int(seconds or 0)
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    return f"{s // 3600} h ago"


@dataclass(frozen=True)
class ReportView:
    """What an agreement view shows: its freshness now, and the report, read only when asked for (a view that has
    the stored rollup's rendering cached never reads or parses the report)."""

    fresh: Freshness
    versions: list[int]
    """The project's rubric versions now (the page's selector)."""
    rubric_version: int | None
    key: tuple[int, str, str] | None
    """(project id, the stored rollup's computed_at, scope): what a rollup's figures are a function of, to cache
    their rendering under; None when the figures are computed on this view (a small project: not cached)."""
    _load: Callable[[], AgreementReport | None]

    def report(self) -> AgreementReport | None:
        """The report (None: a large project's rollup for this scope has not been computed yet)."""
        return self._load()

    def pending(self) -> Freshness:
        """The freshness to show while the report is not there yet (no rollup, or none of this scope)."""
        return Freshness("rollup", None, None, None, None, self.fresh.refreshing)


def report_view(db: Session, project: Project, actor: User, *, rubric_version: int | None = None) -> ReportView:
    """The agreement figures to show now (see ReportView); a rollup is queued when the stored one is due."""
    versions = agreement.rubric_versions(db, project)
    if rubric_version is not None and rubric_version not in versions:
        raise Invalid(f"this project has no rubric version {rubric_version}", field="rubric_version")
    small, stored_row = _size(db, project, LIVE_LIMIT)
    if small is not None:
        report = agreement.project_reports(db, project, versions=versions, only=rubric_version)[rubric_version]
        return ReportView(Freshness("live", utcnow(), 0.0, report.human_rankings, None, False), versions,
                          rubric_version, None, lambda: report)
    row, age, refreshing = _rollup(db, project, actor, stored_row)
    if row is None:
        return ReportView(Freshness("rollup", None, None, None, None, refreshing), versions, rubric_version, None,
                          lambda: None)

    def load() -> AgreementReport | None:
        stored = _stored(db, project, rubric_version)
        return agreement_flags.flagged(report_from_dict(stored)) if stored is not None else None

    return ReportView(Freshness("rollup", row.computed_at, age, row.rankings, row.seconds, refreshing), versions,
                      rubric_version, (project.id, row.computed_at.isoformat(), _scope(rubric_version)), load)


def current_report(db: Session, project: Project, actor: User, *,
                   rubric_version: int | None = None) -> tuple[AgreementReport | None, Freshness]:
    """The report to show now and its freshness; None (with a job queued) when a large project has no rollup yet."""
    view = report_view(db, project, actor, rubric_version=rubric_version)
    report = view.report()
    return (report, view.fresh) if report is not None else (None, view.pending())


def project_counts(db: Session, project: Project, actor: User) -> projects.ProjectCounts:
    """The project page's counts: exact for a small project, the rollup's (with its time) for a large one."""
    small, stored_row = _size(db, project, COUNT_LIVE_LIMIT, source=None)
    if small is not None:
        return projects.counts(db, project)
    row, age, _ = _rollup(db, project, actor, stored_row)
    if row is None or not row.counts:
        return projects.counts(db, project)
    return projects.ProjectCounts(**row.counts, as_of=row.computed_at, age_seconds=age)


def judge_report(db: Session, project: Project, actor: User, *, exact_before_first: bool = True
                 ) -> tuple[judge_agreement.JudgeAgreement | None, Freshness]:
    """The judge's human–AI figures: computed on the view up to LIVE_LIMIT rankings, else the rollup's (the lead's
    switch and the gate's verdict are always current). Before a large project's first rollup has finished they are
    computed on the view (`exact_before_first`: the page, the lead's decision) or None (the API: 503, retry) while
    the rollup is queued."""
    # By all rankings, not the AI ones: the evidence is the humans' rankings and pairs of every judged prompt.
    ai, stored_row = _size(db, project, LIVE_LIMIT, source=None)
    if ai is not None:
        return judge_agreement.judge_agreement(db, project), Freshness("live", utcnow(), 0.0, ai, None, False)
    row, age, refreshing = _rollup(db, project, actor, stored_row)
    stored = db.scalar(select(ProjectRollup.reports["judge"]).where(ProjectRollup.project_id == project.id)) \
        if row is not None else None
    if row is None or stored is None:
        if not exact_before_first:
            return None, Freshness("rollup", None, None, None, None, refreshing)
        return judge_agreement.judge_agreement(db, project), Freshness("live", utcnow(), 0.0, ai, None, refreshing)
    calibration = [judge_agreement.CalibrationBin(**b) for b in stored.get("calibration", [])]
    report = judge_agreement.JudgeAgreement(**(stored | {
        "calibration": calibration, "ai_labels_enabled": judge_agreement.ai_labels_enabled(project),
        "gate_missing": judge_agreement.gate_missing(stored["n_prompts"], stored["pair_agreement"])}))
    return report, Freshness("rollup", row.computed_at, age, row.rankings, row.seconds, refreshing)


def _rollup(db: Session, project: Project, actor: User, row: ProjectRollup | None
            ) -> tuple[ProjectRollup | None, float | None, bool]:
    """(the stored rollup `row`, its age in seconds, whether a newer one is on its way), queueing one when it is
    due."""
    now = utcnow()
    age = (now - row.computed_at).total_seconds() if row is not None else None
    # Views queue a rollup only once one is due, so before that none is on its way: one query less per view.
    due = row is None or (age or 0.0) > max(REFRESH_S, REFRESH_FACTOR * row.seconds)
    refreshing = due and _pending(db, project)
    if due and not refreshing:
        jobs.enqueue(db, KIND, {"requested_at": now.isoformat()}, project=project, actor=actor, max_attempts=1)
        refreshing = True
    return row, age, refreshing


def _size(db: Session, project: Project, limit: int, *, source: str | None = "human"
          ) -> tuple[int | None, ProjectRollup | None]:
    """(the project's rankings of one source (None: any) while they are at most `limit`, else None; the stored
    rollup's times and counts, for _rollup: the reports, hundreds of KB of JSON, stay in the database and a view
    reads its one scope, see _stored). A rollup that covered more than twice the limit answers without counting:
    the count reads up to `limit` + 1 index entries, a millisecond of Postgres on every view of a large project, and
    a project seldom loses half its rankings (if it does, its next rollup has the smaller figure and views count
    again)."""
    row = db.get(ProjectRollup, project.id, options=[defer(ProjectRollup.reports)])
    if row is not None and row.rankings > 2 * limit:
        return None, row
    n = _rankings_up_to(db, project, limit + 1, source=source)
    return (n if n <= limit else None), row


def _rankings_up_to(db: Session, project: Project, limit: int, *, source: str | None = "human") -> int:
    """The project's rankings (of one source), counted no further than `limit` (at most `limit` index entries)."""
    capped = select(Ranking.id).where(Ranking.project_id == project.id)
    if source is not None:
        capped = capped.where(Ranking.source == source)
    return int(db.scalar(select(func.count()).select_from(capped.limit(limit).subquery())) or 0)


def _stored(db: Session, project: Project, rubric_version: int | None) -> dict[str, Any] | None:
    """One scope's stored report, read by its key inside the JSON (the other scopes are not sent or parsed)."""
    return db.scalar(select(ProjectRollup.reports[_scope(rubric_version)])
                     .where(ProjectRollup.project_id == project.id))


def _disagreements_key(rubric_version: int | None) -> str:
    return f"disagreements_{_scope(rubric_version)}"


@dataclass(frozen=True)
class StoredDisagreements:
    """The worst (prompt, round) groups of one scope as the last rollup found them, least agreement first."""

    total: int
    rows: list[tuple[float, int, int]]
    """(agreement, prompt id, round), at most DISAGREEMENTS_KEPT."""


def disagreements(db: Session, project: Project, actor: User, rubric_version: int | None
                  ) -> tuple[StoredDisagreements | None, Freshness] | None:
    """None for a small project (the caller computes them on the view); else the rollup's list of one scope and
    its freshness (None and a queued job before a rollup with that scope has finished)."""
    small, stored_row = _size(db, project, LIVE_LIMIT)
    if small is not None:
        return None
    row, age, refreshing = _rollup(db, project, actor, stored_row)
    stored = db.scalar(select(ProjectRollup.reports[_disagreements_key(rubric_version)])
                       .where(ProjectRollup.project_id == project.id)) if row is not None else None
    if row is None or stored is None:
        # A rollup stored before it kept the disagreements: recompute now (once: not while one is queued).
        if row is not None and not (refreshing or (refreshing := _pending(db, project))):
            jobs.enqueue(db, KIND, {"requested_at": utcnow().isoformat()}, project=project, actor=actor,
                         max_attempts=1)
            refreshing = True
        return None, Freshness("rollup", None, None, None, None, refreshing)
    found = StoredDisagreements(int(stored["total"]), [(float(a), int(p), int(r)) for a, p, r in stored["rows"]])
    return found, Freshness("rollup", row.computed_at, age, row.rankings, row.seconds, refreshing)


def _pending(db: Session, project: Project) -> bool:
    return db.scalar(select(Job.id).where(Job.project_id == project.id, Job.kind == KIND,
                                          Job.state.in_(("queued", "running"))).limit(1)) is not None


def _scope(rubric_version: int | None) -> str:
    return "all" if rubric_version is None else f"v{rubric_version}"


@dataclass(frozen=True)
class Rollup:
    """One computation of a project's figures, to store."""

    reports: dict[str, Any]
    """Every scope's agreement report ("all", "v1", …) as a dict."""
    counts: dict[str, int]
    rankings: int
    computed_at: datetime
    seconds: float


def compute(db: Session, project: Project) -> Rollup:
    """Every scope's agreement report from one streamed pass, the judge's agreement with humans, and the counts."""
    started, t0 = utcnow(), time.perf_counter()
    counts = asdict(projects.counts(db, project))
    for key in ("as_of", "age_seconds"):
        counts.pop(key, None)
    versions = agreement.rubric_versions(db, project)
    worst = {v: agreement.Disagreements(DISAGREEMENTS_KEPT) for v in [None, *versions]}
    reports = agreement.project_reports(db, project, versions=versions, disagreements=worst)
    stored = {_scope(v): asdict(r) for v, r in reports.items()}
    stored |= {_disagreements_key(v): {"total": w.total, "rows": [list(row) for row in w.rows]}
               for v, w in worst.items()}
    stored["judge"] = judge_agreement.judge_agreement(db, project).as_dict()
    return Rollup(stored, counts, reports[None].human_rankings, started, time.perf_counter() - t0)


def latest(db: Session, project_id: int) -> ProjectRollup | None:
    """The project's stored rollup (its reports loaded too), or None before the first one is stored."""
    return db.get(ProjectRollup, project_id)


def store(db: Session, project_id: int, rollup: Rollup) -> None:
    """Replace the project's rollup with a newer one (an older result arriving late is dropped)."""
    row = db.get(ProjectRollup, project_id, with_for_update=True)
    values = {"reports": rollup.reports, "counts": rollup.counts, "rankings": rollup.rankings,
              "seconds": rollup.seconds, "computed_at": rollup.computed_at}
    if row is None:
        db.add(ProjectRollup(project_id=project_id, **values))
        _announce_flags(db, project_id, None, rollup.reports)
    elif row.computed_at < rollup.computed_at:
        before = row.reports
        for key, value in values.items():
            setattr(row, key, value)
        _announce_flags(db, project_id, before, rollup.reports)


def _flagged(reports: dict[str, Any] | None) -> dict[int, tuple[AnnotatorStats, set[str]]]:
    """Annotators the whole-project report flags: user id → (their figures, the flag kinds)."""
    if not reports or "all" not in reports:
        return {}
    report = agreement_flags.flagged(report_from_dict(reports["all"]))
    return {a.user_id: (a, {f.kind for f in a.flags}) for a in report.annotators if a.flags}


def _announce_flags(db: Session, project_id: int, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
    """An `annotator.flagged` webhook event for each flag this rollup raises that the one before did not."""
    old = _flagged(before)
    for user_id, (stats, kinds) in _flagged(after).items():
        new = sorted(kinds - old.get(user_id, (None, set()))[1])
        if new:
            webhooks.fire(db, project_id, "annotator.flagged", {
                "user_id": user_id, "name": stats.name, "flags": new, "rankings": stats.rankings,
                "url": f"/projects/{project_id}/agreement/annotators/{user_id}"})


def report_from_dict(data: dict[str, Any]) -> AgreementReport:
    """An AgreementReport back from `dataclasses.asdict` (as the rollup stores it)."""
    annotators = [AnnotatorStats(**(a | {"flags": [Flag(**f) for f in a.get("flags", [])]}))
                  for a in data.get("annotators", [])]
    return AgreementReport(**(data | {
        "annotators": annotators,
        "flags": [Flag(**f) for f in data.get("flags", [])],
        "trend": [TrendPoint(**p) for p in data.get("trend", [])],
        "by_rubric_version": [TrendPoint(**p) for p in data.get("by_rubric_version", [])],
    }))
