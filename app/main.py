"""The FastAPI application factory: settings, database, middleware, routers and error pages."""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException

from app import __version__
from app.accounts.security import LoginThrottle
from app.imports.formats import ImportRejected
from app.platform import outbound
from app.platform.crypto import Keyring
from app.platform.db import RetryTransientErrors, make_engine, make_session_factory
from app.platform.errors import DomainError, TooManyAttempts
from app.platform.metrics import AppMetrics
from app.platform.migrate import refuse_newer
from app.platform.observability import RequestIdMiddleware, RouteRecorder, configure_logging
from app.platform.settings import Settings, get_settings
from app.web import openapi
from app.web.balance import ConnectionBalance, board_from_environment
from app.web.deps import LoginRequired, csrf_guard
from app.web.fragments import FragmentCache
from app.web.rendering import STATIC_DIR, BodyLimitMiddleware, BrowserIdAndHeadersMiddleware, ConnectionTurnover, render

DESCRIPTION = """preflab: rank sampled completions under a versioned rubric, let a constitutional AI judge
stand in when human labels run out, export immutable pair datasets, and train reward models and policies.

Authenticate scripts with a personal token (`preflab token create EMAIL`) sent as `Authorization: Bearer …`.
Browser sessions must send the CSRF token (`X-CSRF-Token`) on every state-changing request."""


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith(("/api", "/healthz", "/metrics")) or (
        "application/json" in request.headers.get("accept", "") and "text/html" not in request.headers.get("accept", "")
    )


def _unstorable_value(exc: Exception) -> str | None:
    """Why the database refused a value the client sent, or None when `exc` is not that (then it is a bug).

    Request models check types, not the database's limits: SQLite refuses to bind an int beyond 64 bits (a bare
    OverflowError), Postgres refuses to store one beyond a column's width (SQLSTATE 22003) and any text holding NUL.
    """
    if isinstance(exc, OverflowError):
        return "a number is out of range" if "too large to convert to SQLite INTEGER" in str(exc) else None
    if isinstance(exc, DataError):
        if getattr(exc.orig, "sqlstate", None) == "22003":
            return "a number is out of range"
        # NUL in a text column (refused by psycopg) or in JSON (SQLSTATE 22P05, untranslatable character).
        if "NUL (0x00)" in str(exc.orig) or getattr(exc.orig, "sqlstate", None) == "22P05":
            return "text must not contain NUL (0x00) characters"
    return None


def _refuse_newer_schema(engine: Engine) -> None:
    """SchemaTooNew when a newer preflab upgraded the database: never write to a schema this code does not know."""
    try:
        refuse_newer(engine)
    except OperationalError:
        pass  # the database is down at start: /healthz reports it, and requests fail until it is back


def _seal_plain_keys(app: FastAPI) -> None:
    """Encrypt the model-endpoint API keys an older version stored in plain text (app/platform/crypto.py), at every
    start: the upgrade is done the first time the new version starts, with the encryption key only the app has."""
    import logging

    from sqlalchemy.exc import OperationalError, ProgrammingError

    from app.judge import endpoints
    from app.platform.db import session_scope

    log = logging.getLogger("preflab.crypto")
    try:
        with session_scope(app.state.session_factory) as db:
            sealed = endpoints.seal_plain_keys(db, app.state.keyring)
            left = endpoints.plain_key_count(db)
    except (OperationalError, ProgrammingError):  # a schema not migrated yet: `preflab migrate` says so
        log.warning("model-endpoint API keys not checked: the database schema is not current")
        return
    if sealed:
        log.info("encrypted %d model-endpoint API key(s) stored in plain text", sealed)
    if left:
        log.warning("%d model-endpoint API key(s) are stored in plain text: set PREFLAB_ENCRYPTION_KEY and restart "
                    "to encrypt them (SECURITY.md, 'Secrets at rest')", left)


async def internal_error(request: Request, exc: Exception) -> Response:
    """A 500 that names the request id. It runs in Starlette's outermost middleware, past ours: the id comes from
    the request's state and the header is set here (RequestIdMiddleware already logged the traceback under it)."""
    request_id = getattr(request.state, "request_id", "")
    if _wants_json(request):
        response: Response = JSONResponse({"detail": "internal error", "request_id": request_id}, status_code=500)
    else:
        response = render(request, "error.html", {"status": 500, "message": "Something went wrong on our side."},
                          status_code=500)
    response.headers["X-Request-ID"] = request_id
    return response


def _install_error_handlers(app: FastAPI) -> None:
    """Every error as the one JSON error body (`app.web.openapi.ERROR_BODY`) for the API, or as the error page."""

    @app.exception_handler(DomainError)
    async def domain_error(request: Request, exc: DomainError) -> Response:
        headers = {}
        if isinstance(exc, TooManyAttempts):
            headers["Retry-After"] = str(int(exc.retry_after) + 1)
        if _wants_json(request):
            return JSONResponse({"detail": exc.detail()}, status_code=exc.status_code, headers=headers)
        return render(request, "error.html", {"status": exc.status_code, "message": exc.message},
                      status_code=exc.status_code)

    @app.exception_handler(ImportRejected)
    async def import_rejected(request: Request, exc: ImportRejected) -> Response:
        return JSONResponse({"detail": exc.detail()}, status_code=422)

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, exc: LoginRequired) -> Response:
        if request.headers.get("hx-request") == "true":
            return Response(status_code=401, headers={"HX-Redirect": f"/login?next={exc.next_url}"})
        return RedirectResponse(f"/login?next={exc.next_url}", status_code=303)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method served at this path, not only the first route's
            headers["Allow"] = ", ".join(openapi.allowed_methods(app, request.scope))
        if _wants_json(request):
            detail = exc.detail if isinstance(exc.detail, list) else [{"message": str(exc.detail)}]
            return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=headers)
        page = render(request, "error.html", {"status": exc.status_code, "message": exc.detail},
                      status_code=exc.status_code)
        page.headers.update(headers)
        return page

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        detail = [{"field": ".".join(str(p) for p in err["loc"] if p != "body"), "message": err["msg"]}
                  for err in exc.errors()]
        if _wants_json(request):
            return JSONResponse({"detail": detail}, status_code=422)
        message = "; ".join(f"{d['field']}: {d['message']}" for d in detail)
        return render(request, "error.html", {"status": 422, "message": message}, status_code=422)

    @app.exception_handler(OverflowError)
    @app.exception_handler(DataError)
    async def unstorable_value(request: Request, exc: Exception) -> Response:
        message = _unstorable_value(exc)
        if message is None:
            raise exc  # any other overflow or data error is a bug: a 500, logged
        if _wants_json(request):
            return JSONResponse({"detail": [{"message": message}]}, status_code=422)
        return render(request, "error.html", {"status": 422, "message": message}, status_code=422)


def _lifespan(threads: int):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The limiter belongs to the server's event loop, so it is sized once that loop runs.
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        # What start-up built (modules, the app, its caches' skeletons) lives as long as the process: out of the
        # collector's reach, a full collection walks only what requests made since (at 1M rankings one project
        # page view in ~26 took 130-170 ms instead of 15-25 while the collector walked all of it).
        gc.collect()
        gc.freeze()
        yield

    return lifespan


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="preflab", version=__version__, description=DESCRIPTION,
                  dependencies=[Depends(csrf_guard)], docs_url=None, redoc_url=None,
                  lifespan=_lifespan(settings.request_threads))
    app.state.settings = settings
    outbound.refuse_every_host(settings.outbound_hosts == "none")
    app.state.secret = settings.resolved_secret()
    app.state.engine = make_engine(settings.database_url, settings.database_pool_size,
                                   prepared_statements=settings.database_prepared_statements)
    app.state.session_factory = make_session_factory(app.state.engine)
    _refuse_newer_schema(app.state.engine)
    app.state.login_throttle = LoginThrottle()
    app.state.fragments = FragmentCache()  # rendered agreement pages, per process (app.web.fragments)
    app.state.keyring = Keyring(settings)
    _seal_plain_keys(app)
    configure_logging(settings.log_format)
    app.state.metrics = AppMetrics(app.state.engine, app.state.session_factory, settings.data_dir)

    app.add_middleware(RouteRecorder)  # innermost: tells RequestIdMiddleware which route template answered
    app.add_middleware(BodyLimitMiddleware, max_bytes=(settings.max_upload_mb + 1) * 1024 * 1024)
    app.add_middleware(BrowserIdAndHeadersMiddleware, secure_cookies=settings.cookies_secure,
                       hsts=settings.env == "production")
    # Outermost of ours, still inside Starlette's error middleware: a request whose transaction Postgres aborted
    # (deadlock victim, serialization failure) runs again before anything was sent.
    app.add_middleware(RetryTransientErrors)
    # Outside the retry: a request run again keeps its id, and is counted once, under its route template.
    app.add_middleware(RequestIdMiddleware, metrics=app.state.metrics)
    app.add_middleware(openapi.VersionPrefix)  # /api/v1/... is routed as /api/...
    if settings.keepalive_requests:
        app.add_middleware(ConnectionTurnover, every=settings.keepalive_requests)
    board = board_from_environment()  # one of `--workers` processes
    if board is not None and not settings.trust_proxy_headers:
        app.add_middleware(ConnectionBalance, board=board)

    from app.accounts import admin_pages as pages_admin
    from app.accounts import api as api_users
    from app.accounts import pages as pages_auth
    from app.annotation import routes as annotate
    from app.exports import routes as exports
    from app.jobs import routes as jobs
    from app.judge import endpoint_routes as endpoints
    from app.judge import routes as judge
    from app.projects import api as api_projects
    from app.projects import constitution_routes as constitutions
    from app.projects import pages as pages_projects
    from app.quality import routes as agreement
    from app.runs import cluster_routes as clusters
    from app.runs import routes as training
    from app.web import health_routes as health
    from app.webhooks import routes as webhooks

    # Routes are matched in order, each one at some CPU cost: the annotation routes, the busiest by far, come first
    # (no other router serves their paths, so the order changes nothing else).
    routers = (
        annotate,
        health,
        api_projects,
        api_users,
        endpoints,
        pages_auth,
        pages_projects,
        pages_admin,
        agreement,
        jobs,
        constitutions,
        judge,
        exports,
        training,
        clusters,
        webhooks,
    )
    for module in routers:
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    _install_error_handlers(app)
    app.add_exception_handler(Exception, internal_error)
    openapi.install(app)
    return app
