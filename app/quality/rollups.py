"""Figures over a whole project at campaign scale, and how fresh they are.

The agreement figures (the report, its flags, the disagreements' order) are kept up to date as rankings arrive
(app.quality.upkeep): a view reads the kept totals, a few indexed reads whatever the project holds, after folding in
the few changes waiting (or queueing a job that drains many), and says as of when they are. One path for every size.

The project page's counts (prompts, completions, rankings, pairs) and the judge page's human–AI figures still come
from the rollup job above COUNT_LIVE_LIMIT and LIVE_LIMIT rankings: computed on the view below them; above them read
from the `project_rollups` row, which a view refreshes (a `project_rollup` job) once it is older than
max(REFRESH_S, REFRESH_FACTOR × its computation's duration), and said to be as of its age. Views of the kept figures
are cached per process by the app (app.web.fragments), under ReportView.key.
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
from app.models import AgreementState, Job, Project, ProjectRollup, Ranking, User, utcnow
from app.platform.errors import Invalid
from app.projects import projects
from app.quality import agreement, judge_agreement, kept_report, upkeep
from app.quality.report import AgreementReport

KIND = "project_rollup"
LIVE_LIMIT = 5_000
"""Rankings up to which the judge page's human–AI figures are computed on each view."""
COUNT_LIVE_LIMIT = 5_000
"""Rankings (of any source) up to which the project page counts everything on each view (counting a project's
completions and pairs costs ~150 ms at 15k rankings on a busy 2-core machine, and grows with the project)."""
REFRESH_S = 60.0
"""A stored rollup older than this (or REFRESH_FACTOR × its computation time, if longer) is recomputed."""
REFRESH_FACTOR = 4.0


@dataclass(frozen=True)
class Freshness:
    """How the figures on the page were computed, and how old they are."""

    method: str
    """kept: the agreement figures kept as rankings arrive, as of `as_of` | live: from every ranking, on this view
    | rollup: from every ranking, by the rollup job at `as_of`."""
    as_of: datetime | None
    """When the rankings shown were read (None: no rollup has finished yet)."""
    age_seconds: float | None
    rankings: int | None
    """Human rankings the figures cover."""
    compute_seconds: float | None
    """How long the rollup took."""
    refreshing: bool
    """A rollup job (or, for kept figures, a drain or rebuild) is queued or running for this project."""
    waiting: int = 0
    """Kept figures: changes (rankings written or removed, gold orders set) not folded in yet."""

    def describe(self) -> str:
        if self.method == "kept":
            return self._describe_kept()
        if self.method == "live":
            return "Computed from every ranking on this view."
        if self.as_of is None:
            return "Computing the figures from every ranking: a worker is on it (reload in a moment)."
        again = " A newer computation is under way." if self.refreshing else ""
        return (f"Computed from all {self.rankings:,} rankings by the rollup job, as of {_ago(self.age_seconds)} "
                f"(it took {self.compute_seconds:.1f} s).{again}")

    def _describe_kept(self) -> str:
        more = "+" if self.waiting > upkeep.INLINE_MARKS else ""
        if self.as_of is None and self.waiting:
            return (f"Adding the first {self.waiting}{more} changes to the figures: a worker is on it (reload in a "
                    "moment).")
        if self.as_of is None:
            return ("Computing the figures from every ranking, once (this release computes them anew): a worker is "
                    "on it (reload in a moment).")
        waiting = ""
        if self.waiting:
            waiting = f" {self.waiting}{more} newer changes are being added (reload in a moment)."
        return (f"Kept up to date as rankings arrive: {self.rankings or 0:,} rankings, as of "
                f"{_ago(self.age_seconds)}.{waiting}")


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
    """(project id, the kept totals' last drain with the project's overlap and round, scope): what the figures are
    a function of, to cache their rendering under; None while there are none."""
    _load: Callable[[], AgreementReport | None]

    def report(self) -> AgreementReport | None:
        """The report (None: the kept states are being rebuilt)."""
        return self._load()

    def pending(self) -> Freshness:
        """The freshness to show while the report is not there yet (the kept states are being rebuilt)."""
        return Freshness("kept", None, None, None, None, self.fresh.refreshing, self.fresh.waiting)


def report_view(db: Session, project: Project, actor: User, *, rubric_version: int | None = None) -> ReportView:
    """The agreement figures to show now (see ReportView), read from the kept totals after the changes waiting
    are folded in (or a job queued for them)."""
    versions = agreement.rubric_versions(db, project)
    if rubric_version is not None and rubric_version not in versions:
        raise Invalid(f"this project has no rubric version {rubric_version}", field="rubric_version")
    fresh, state = kept_freshness(db, project, actor)
    if state is None or state.as_of is None:
        return ReportView(fresh, versions, rubric_version, None, lambda: None)
    # Everything the report is a function of: the totals (as of their last drain, a time no other drain of any
    # project's states had) and the project's overlap and round.
    key = (project.id, f"{state.as_of.isoformat()}:{state.sequence}:{project.overlap}:{project.current_round}",
           _scope(rubric_version))

    def load() -> AgreementReport | None:
        return kept_report.report(db, project, rubric_version, versions, state)

    return ReportView(fresh, versions, rubric_version, key, load)


def kept_freshness(db: Session, project: Project, actor: User) -> tuple[Freshness, AgreementState | None]:
    """How fresh the kept figures are now (folding in what waits, see upkeep.current), and the state to read; None
    while the states are rebuilt."""
    kept = upkeep.current(db, project, actor)
    state = kept.state
    if state is None or state.as_of is None:
        return Freshness("kept", None, None, None, None, kept.refreshing, kept.waiting), None
    age = max(0.0, (utcnow() - state.as_of).total_seconds())
    return Freshness("kept", state.as_of, age, upkeep.rankings(db, project.id), state.seconds, kept.refreshing,
                     kept.waiting), state


def current_report(db: Session, project: Project, actor: User, *,
                   rubric_version: int | None = None) -> tuple[AgreementReport | None, Freshness]:
    """The report to show now and its freshness; None (with a job queued) while the kept states are rebuilt."""
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


def _pending(db: Session, project: Project) -> bool:
    """A rollup of the counts and judge figures is queued or running (not an agreement drain or rebuild)."""
    return db.scalar(select(Job.id).where(Job.project_id == project.id, Job.kind == KIND,
                                          Job.state.in_(("queued", "running")),
                                          Job.payload["agreement"].as_string().is_(None)).limit(1)) is not None


def _scope(rubric_version: int | None) -> str:
    return "all" if rubric_version is None else f"v{rubric_version}"


@dataclass(frozen=True)
class Rollup:
    """One computation of a project's counts and judge figures, to store."""

    reports: dict[str, Any]
    """"judge": the judge's human–AI figures as a dict."""
    counts: dict[str, int]
    rankings: int
    computed_at: datetime
    seconds: float


def compute(db: Session, project: Project) -> Rollup:
    """The project page's counts and the judge's agreement with humans, from every row."""
    started, t0 = utcnow(), time.perf_counter()
    counts = asdict(projects.counts(db, project))
    for key in ("as_of", "age_seconds"):
        counts.pop(key, None)
    stored = {"judge": judge_agreement.judge_agreement(db, project).as_dict()}
    human = int(db.scalar(select(func.count(Ranking.id)).where(Ranking.project_id == project.id,
                                                              Ranking.source == "human")) or 0)
    return Rollup(stored, counts, human, started, time.perf_counter() - t0)


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
    elif row.computed_at < rollup.computed_at:
        for key, value in values.items():
            setattr(row, key, value)
