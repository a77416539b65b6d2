"""Prometheus metrics for GET /metrics: request counts and latency counted in this process, and the work state
(queues, leases, rankings, jobs, workers, the connection pool) computed from the database at scrape time.

Each app gets its own registry (tests build many apps in one process). The database families are the same
whichever process answers the scrape. With several server processes (`preflab serve --workers N`), the HTTP
families use prometheus-client's multiprocess mode: `serve` sets PROMETHEUS_MULTIPROC_DIR to a fresh directory
before the processes start, each writes its counts there, and a scrape from any of them sums them all
(docs/operators/monitoring.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, Engine, and_, func, literal_column, select
from sqlalchemy.orm import Session, sessionmaker

from app.models import Assignment, Job, Project, Prompt, Ranking, utcnow
from app.platform.observability import worker_heartbeat_ages

__all__ = ["CONTENT_TYPE_LATEST", "MULTIPROC_ENV", "AppMetrics", "multiprocess_dir", "render"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
JOB_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
EXPIRING_WITHIN = timedelta(minutes=5)
UNMATCHED = "<unmatched>"


def multiprocess_dir() -> str | None:
    """The directory the server processes share their HTTP counts in, when prometheus-client runs in multiprocess
    mode (it decides once, when first imported, from PROMETHEUS_MULTIPROC_DIR); None for one process."""
    path = os.environ.get(MULTIPROC_ENV)
    return path if path and values.ValueClass is not values.MutexValue else None


class AppMetrics:
    """The registry of one app: its HTTP families, and the database collector registered beside them."""

    def __init__(self, engine: Engine, session_factory: sessionmaker[Session], data_dir: Path) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        shared = multiprocess_dir()
        # In multiprocess mode the counts go to files; the scrape reads every process's files instead of this
        # process's objects (registering both would report this process twice).
        own = None if shared else self.registry
        self.requests = Counter("preflab_http_requests", "HTTP requests answered by the server processes",
                                ["method", "route", "status"], registry=own)
        self.latency = Histogram("preflab_http_request_duration_seconds",
                                 "Time to answer an HTTP request, by route template",
                                 ["method", "route"], buckets=LATENCY_BUCKETS, registry=own)
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        if shared:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=shared)  # type: ignore[no-untyped-call]  # untyped upstream
        self.registry.register(DatabaseCollector(engine, session_factory, data_dir))

    def observe_request(self, method: str, route: Any, status: int, seconds: float) -> None:
        # The template (/api/projects/{project_id}), never the raw path: ids would make a series per object.
        template = getattr(route, "path_format", None) or getattr(route, "path", None) or UNMATCHED
        key = (method, template, status)
        series = self._series.get(key)
        if series is None:  # looked up once per (method, route, status): `labels` takes a lock and builds a key
            series = self._series.setdefault(key, (self.requests.labels(method, template, str(status)),
                                                   self.latency.labels(method, template)))
        series[0].inc()
        series[1].observe(seconds)


def render(metrics: AppMetrics) -> bytes:
    return generate_latest(metrics.registry)


def _duration_seconds(dialect: str) -> Any:
    if dialect == "postgresql":
        return func.extract("epoch", Job.finished_at - Job.started_at)
    return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * literal_column("86400.0")


class DatabaseCollector(Collector):
    """Families read from the database on every scrape, each with one aggregate query."""

    def __init__(self, engine: Engine, session_factory: sessionmaker[Session], data_dir: Path) -> None:
        self.engine = engine
        self.session_factory = session_factory
        self.data_dir = Path(data_dir)

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; describing would run the queries at registration

    def collect(self) -> Iterator[Any]:
        started = time.perf_counter()
        yield from self._pool()
        yield from self._workers()
        up = GaugeMetricFamily("preflab_database_up", "1 when the scrape could read the database")
        try:
            with self.session_factory() as db:
                families = [*self._queue(db), *self._rankings(db), *self._jobs(db)]
            up.add_metric([], 1)
        except Exception:  # the database is down: report that, and what needs no database
            families = []
            up.add_metric([], 0)
        yield up
        yield from families
        took = GaugeMetricFamily("preflab_metrics_scrape_seconds", "Time this scrape spent collecting")
        took.add_metric([], time.perf_counter() - started)
        yield took

    def _pool(self) -> Iterator[Any]:
        pool = self.engine.pool
        g = GaugeMetricFamily("preflab_db_pool_connections", "Database connections of this process's pool",
                              labels=["state"])
        for state, method in (("checked_out", "checkedout"), ("idle", "checkedin"), ("overflow", "overflow")):
            value = getattr(pool, method, None)
            if callable(value):
                g.add_metric([state], max(0, value()))
        yield g
        size = getattr(pool, "size", None)
        if callable(size):
            yield GaugeMetricFamily("preflab_db_pool_size", "Connections the pool keeps open", value=size())

    def _workers(self) -> Iterator[Any]:
        ages = worker_heartbeat_ages(self.data_dir)
        g = GaugeMetricFamily("preflab_worker_heartbeat_age_seconds", "Seconds since each worker's last heartbeat",
                              labels=["worker"])
        for worker, age in sorted(ages.items()):
            g.add_metric([worker], age)
        yield g

    def _queue(self, db: Session) -> Iterator[Any]:
        now = utcnow()
        # Open slots: every ordinary prompt takes `overlap` labels per round; gold prompts test everyone and are
        # left out. Slots held by submitted or live leased assignments of the current round are taken. The big
        # aggregates need no join with prompts: assignments on gold prompts (few, found by the partial gold index)
        # are counted apart and subtracted.
        ordinary = dict(db.execute(select(Prompt.project_id, func.count()).where(Prompt.gold_tiers.is_(None))
                                   .group_by(Prompt.project_id)).all())
        live = and_(Assignment.state == "leased", Assignment.leased_until > now)
        expiring = and_(live, Assignment.leased_until <= now + EXPIRING_WITHIN)
        current = and_(Assignment.project_id == Project.id, Assignment.round == Project.current_round)
        taken = Assignment.state == "submitted"
        rows = db.execute(
            select(Project.id, Project.overlap, func.count(Assignment.id).filter(taken),
                   func.count(Assignment.id).filter(live), func.count(Assignment.id).filter(expiring))
            .outerjoin(Assignment, current).group_by(Project.id, Project.overlap)).all()
        on_gold = dict(db.execute(
            select(Assignment.project_id, func.count())
            .join(Prompt, and_(Prompt.id == Assignment.prompt_id, Prompt.gold_tiers.is_not(None)))
            .join(Project, current).where(taken | live).group_by(Assignment.project_id)).all())
        depth = GaugeMetricFamily("preflab_queue_depth", "Label slots left in the current round (prompts × overlap, "
                                  "less submitted and live-leased)", labels=["project"])
        leases = GaugeMetricFamily("preflab_leases_outstanding", "Live leases (assigned, not yet submitted)",
                                   labels=["project"])
        soon = GaugeMetricFamily("preflab_leases_expiring", "Live leases that run out within 5 minutes",
                                 labels=["project"])
        for project_id, overlap, submitted, live_n, expiring_n in rows:
            label = [str(project_id)]
            held = submitted + live_n - on_gold.get(project_id, 0)
            depth.add_metric(label, max(0, ordinary.get(project_id, 0) * overlap - held))
            leases.add_metric(label, live_n)
            soon.add_metric(label, expiring_n)
        yield from (depth, leases, soon)

    def _rankings(self, db: Session) -> Iterator[Any]:
        since = utcnow() - timedelta(minutes=1)
        rows = db.execute(select(Ranking.project_id, Ranking.source, func.count(),
                                 func.count(Ranking.id).filter(Ranking.created_at > since))
                          .group_by(Ranking.project_id, Ranking.source)).all()
        total = CounterMetricFamily("preflab_rankings", "Rankings stored, by project and source",
                                    labels=["project", "source"])
        minute = GaugeMetricFamily("preflab_rankings_last_minute", "Rankings stored in the last 60 seconds",
                                   labels=["project", "source"])
        for project_id, source, count, recent in rows:
            total.add_metric([str(project_id), source], count)
            minute.add_metric([str(project_id), source], recent)
        yield from (total, minute)

    def _jobs(self, db: Session) -> Iterator[Any]:
        by_state = GaugeMetricFamily("preflab_jobs", "Jobs by kind and state", labels=["kind", "state"])
        for kind, state, count in db.execute(select(Job.kind, Job.state, func.count())
                                             .group_by(Job.kind, Job.state)).all():
            by_state.add_metric([kind, state], count)
        yield by_state
        seconds = _duration_seconds(db.get_bind().dialect.name)
        columns: list[ColumnElement[Any]] = [func.count(), func.coalesce(func.sum(seconds), 0.0)]
        columns += [func.count(Job.id).filter(seconds <= bound) for bound in JOB_BUCKETS]
        finished = and_(Job.state.in_(("succeeded", "failed", "cancelled")), Job.started_at.is_not(None),
                        Job.finished_at.is_not(None))
        hist = HistogramMetricFamily("preflab_job_duration_seconds", "Run time of finished jobs (start to end)",
                                     labels=["kind", "state"])
        rows = db.execute(select(Job.kind, Job.state, *columns).where(finished).group_by(Job.kind, Job.state)).all()
        for kind, state, count, total, *cumulative in rows:
            buckets = [(_le(b), n) for b, n in zip(JOB_BUCKETS, cumulative, strict=True)] + [("+Inf", count)]
            hist.add_metric([kind, state], buckets, float(total))
        yield hist


def _le(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)

