"""Request ids, structured logs and worker heartbeats: what an operator needs to follow one request or job.

Every HTTP request gets an id (a sane incoming `X-Request-ID` is kept, otherwise one is generated). It is
returned in the `X-Request-ID` header, shown on error pages, put on every log line written while the request
runs (a context variable read by a logging filter), and stored in the payload of jobs the request enqueues, so
the worker's lines for that job carry it too. Logs are JSON lines with `PREFLAB_LOG_FORMAT=json`.

Workers announce themselves by touching a file per worker under DATA_DIR/workers/ (the directory the app and
the workers already share for exports and job logs): readiness and /metrics read the files' ages, so an idle
worker counts as seen, and no table or migration is needed.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.platform.middleware import HttpMiddleware
from training.shared.files import write_text_atomic

log = logging.getLogger("preflab.request")
REQUEST_ID_HEADER = "X-Request-ID"
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("preflab_request_id", default=None)
job_id_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("preflab_job_id", default=None)

# What we accept from a client or proxy: short, and only characters that are safe in a header, a log line and a
# file name. Anything else is replaced by our own id (never echoed), so a client cannot forge log structure.
_SANE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def current_request_id() -> str | None:
    return request_id_var.get()


def accept_request_id(incoming: str | None) -> str:
    """The incoming id when it is sane, otherwise a fresh one (32 hex digits)."""
    if incoming and _SANE_ID.match(incoming):
        return incoming
    return uuid.uuid4().hex


class RequestIdMiddleware(HttpMiddleware):
    """Gives each request an id (scope state `request_id`, the context variable, the response header) and, with
    `metrics`, counts the request and its latency under its route template once routing has matched it."""

    def __init__(self, app: ASGIApp, *, metrics: Any = None) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        incoming = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        rid = accept_request_id(incoming)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        # Filled by RouteRecorder deep inside: middlewares between us may copy the scope (RetryTransientErrors
        # does, per attempt), but they copy this dict by reference.
        matched: dict[str, Any] = {}
        state[_ROUTE_SLOT] = matched
        token = request_id_var.set(rid)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))  # carries the id
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe_request(scope.get("method", ""), matched.get("route"), status,
                                             time.perf_counter() - started)
            request_id_var.reset(token)


_ROUTE_SLOT = "_preflab_route"


class RouteRecorder:
    """Innermost of our middlewares: after the router ran, hands the matched route to RequestIdMiddleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            slot = scope.get("state", {}).get(_ROUTE_SLOT)
            if slot is not None and scope.get("route") is not None:
                slot["route"] = scope["route"]


class ContextFilter(logging.Filter):
    """Adds `request_id` and `job_id` (or None) to every record, whichever handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        if not hasattr(record, "job_id"):
            record.job_id = job_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, job_id (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "job_id": getattr(record, "job_id", None),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        tags = [f"{k}={getattr(record, k)}" for k in ("request_id", "job_id") if getattr(record, k, None)]
        return f"{line} [{' '.join(tags)}]" if tags else line


_HANDLER_MARK = "_preflab_handler"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at each line (test runners swap it), unless given a stream."""

    def __init__(self) -> None:
        self._own: Any = None
        super().__init__()

    @property
    def stream(self) -> Any:
        return self._own if self._own is not None else sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        self._own = None if value is sys.stderr else value


def configure_logging(fmt: str = "text", level: int | str = logging.INFO) -> logging.Handler:
    """One stderr handler on the root logger (replacing an earlier one of ours), with uvicorn's loggers routed
    through it so that access lines carry the request id too. Safe to call again (tests build many apps)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = _StderrHandler()
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    if root.level == logging.WARNING or root.level == logging.NOTSET:  # untouched by the host (pytest sets its own)
        root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        # uvicorn silences its access logger for --no-access-log (no handler, no propagation). A `--workers` process
        # builds the app after that: it stays silent (a line per request costs CPU under load).
        silenced = name == "uvicorn.access" and not logger.propagate and not logger.handlers
        logger.handlers = [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]
        logger.propagate = not silenced
    return handler


# --- worker heartbeats -------------------------------------------------------------------------------------------

WORKERS_DIR = "workers"
FORGET_AFTER_S = 24 * 3600
"""Heartbeat files older than this are left out of /metrics (a worker that died a day ago is history)."""


def _heartbeat_file(data_dir: Path, worker_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker_id)[:150]
    return Path(data_dir) / WORKERS_DIR / safe


def record_worker_heartbeat(data_dir: Path, worker_id: str) -> None:
    """Mark `worker_id` alive now (the file's mtime is the heartbeat; its text is the worker id)."""
    path = _heartbeat_file(data_dir, worker_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, worker_id)


def forget_worker(data_dir: Path, worker_id: str) -> None:
    """A cleanly stopped worker removes its file, so readiness does not count it as seen."""
    _heartbeat_file(data_dir, worker_id).unlink(missing_ok=True)


def worker_heartbeat_ages(data_dir: Path, *, now: float | None = None) -> dict[str, float]:
    """Seconds since each worker's last heartbeat, by worker id, for files younger than FORGET_AFTER_S."""
    folder = Path(data_dir) / WORKERS_DIR
    now = time.time() if now is None else now
    ages: dict[str, float] = {}
    if not folder.is_dir():
        return ages
    for path in folder.iterdir():
        if path.name.endswith(".tmp"):
            continue
        try:
            age = max(0.0, now - path.stat().st_mtime)
            if age <= FORGET_AFTER_S:
                ages[path.read_text(encoding="utf-8").strip() or path.name] = age
        except OSError:  # removed between listing and reading: that worker just stopped
            continue
    return ages
