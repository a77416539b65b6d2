"""Health for load balancers and orchestrators (liveness, readiness) and Prometheus metrics.

- `/healthz/live`: the process serves requests; nothing else is checked (restart the process when this fails).
- `/healthz/ready`: the database answers, its schema is current, and a worker sent a heartbeat recently; 503
  names each failing check (send no traffic, but do not restart, when this fails).
- `/healthz`: kept as it always was for existing callers: the process and the database.
- `/metrics`: Prometheus text format, for admins (session or token) or clients in PREFLAB_METRICS_ALLOWED_NETWORKS.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import inspect, text

from app.accounts import permissions, users
from app.platform.db import session_scope
from app.platform.metrics import CONTENT_TYPE_LATEST, render
from app.platform.migrate import SchemaStatus, revisions
from app.platform.observability import worker_heartbeat_ages
from app.schemas import Health, Live, Readiness
from app.web.cookies import SESSION_COOKIE
from app.web.deps import bearer_token
from app.web.rendering import client_ip

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Service and database health",
            responses={503: {"model": Health, "description": "The database is unreachable"}})
def healthz(request: Request, response: Response) -> Health:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception:  # any driver error means the database is down for our purposes
        response.status_code = 503
        return Health(status="degraded", database="down")
    return Health(status="ok", database="ok")


@router.get("/healthz/live", summary="Liveness: the process serves requests")
def live() -> Live:
    return Live(status="ok")


# The revisions this code ships never change while it runs; reading them walks every migration file (~0.2 s), too
# slow for a probe that runs every few seconds.
_shipped_revisions = functools.cache(revisions)


def _schema_status(engine: Any) -> Any:
    with engine.connect() as conn:
        # Read directly: alembic's MigrationContext would log two INFO lines on every probe.
        row = conn.execute(text("SELECT version_num FROM alembic_version")).first() if inspect(conn).has_table(
            "alembic_version") else None
    known = _shipped_revisions()
    current = row[0] if row else None
    if current is not None and current not in known:
        return SchemaStatus(current, known[-1], 0, known=False)
    return SchemaStatus(current, known[-1], len(known) - (known.index(current) + 1 if current else 0), known=True)


def _check_schema(request: Request) -> dict[str, dict[str, str]]:
    """The database and migrations checks: reading the schema's revision proves the database answers."""
    try:
        status = _schema_status(request.app.state.engine)
    except Exception as exc:  # unreachable, bad credentials, …: the first line of the driver's message says which
        reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
        return {"database": {"status": "fail", "detail": f"unreachable: {reason}"},
                "migrations": {"status": "unknown", "detail": "the database is unreachable"}}
    current = status.known and status.behind == 0
    return {"database": {"status": "ok", "detail": "reachable"},
            "migrations": {"status": "ok" if current else "fail", "detail": status.describe()}}


def _check_worker(request: Request) -> tuple[str, str]:
    max_age = request.app.state.settings.worker_heartbeat_max_age_s
    if max_age == 0:
        return "ok", "not checked (PREFLAB_WORKER_HEARTBEAT_MAX_AGE_S=0)"
    ages = worker_heartbeat_ages(request.app.state.settings.data_dir)
    if not ages:
        return "fail", "no worker has sent a heartbeat: start `preflab worker`"
    youngest = min(ages.values())
    if youngest > max_age:
        return "fail", f"the last worker heartbeat was {youngest:.0f} s ago (limit {max_age} s)"
    return "ok", f"{sum(a <= max_age for a in ages.values())} worker(s) seen, last {youngest:.1f} s ago"


@router.get("/healthz/ready", summary="Readiness: database reachable, migrations current, a worker seen recently",
            responses={503: {"model": Readiness, "description": "Not ready; `failing` names the checks that failed"}})
def ready(request: Request, response: Response) -> Readiness:
    checks = _check_schema(request)
    worker_state, worker_detail = _check_worker(request)
    checks["worker"] = {"status": worker_state, "detail": worker_detail}
    failing = [name for name, c in checks.items() if c["status"] == "fail"]
    if failing:
        response.status_code = 503
    return Readiness.model_validate({"status": "fail" if failing else "ok", "failing": failing, "checks": checks})


def _may_scrape(request: Request) -> None:
    """From an allowed network anyone may scrape (Prometheus has no session); elsewhere only an admin."""
    address = client_ip(request)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None and any(ip in net for net in request.app.state.settings.metrics_networks):
        return
    token = bearer_token(request)
    with session_scope(request.app.state.session_factory) as db:
        user = (users.user_for_token(db, token) if token is not None
                else users.user_for_session(db, request.cookies.get(SESSION_COOKIE)))
        role = user.role if user is not None else None
    if role is None:
        raise HTTPException(401, "metrics: log in as an admin, send an admin's token, or scrape from a network "
                                 "listed in PREFLAB_METRICS_ALLOWED_NETWORKS", headers={"WWW-Authenticate": "Bearer"})
    if role != permissions.ADMIN:
        raise HTTPException(403, "metrics are for admins, or for clients in PREFLAB_METRICS_ALLOWED_NETWORKS")


@router.get("/metrics", summary="Prometheus metrics (admins, or clients in PREFLAB_METRICS_ALLOWED_NETWORKS)",
            response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}},
                                                401: {"description": "Not an allowed network, and no admin's login"},
                                                403: {"description": "Not an admin"}})
def metrics(request: Request) -> Response:
    _may_scrape(request)
    return Response(render(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
