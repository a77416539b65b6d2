"""Engine, sessions and transaction retries: SQLite serialised by one write lock (WAL, BEGIN IMMEDIATE, busy wait),
Postgres via psycopg 3 with serialization failures and deadlocks retried."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InvalidatePoolError
from sqlalchemy.orm import Mapper, Session, SessionTransaction, make_transient_to_detached, sessionmaker
from sqlalchemy.orm.util import identity_key

from app.platform.direct_sql import CoreConnection
from app.platform.errors import DomainError, NotFound

log = logging.getLogger("preflab.db")
T = TypeVar("T")

SQLITE_LOCK_WAIT_S = 30.0
"""How long a SQLite transaction waits for the single write lock before the request fails with 503."""
SQLITE_BUSY_TIMEOUT_MS = 5000
"""SQLite's own busy wait per attempt at BEGIN IMMEDIATE; the begin hook retries until SQLITE_LOCK_WAIT_S."""
TRANSIENT_SQLSTATES = {"40001": "serialization failure", "40P01": "deadlock"}
RETRY_ATTEMPTS = 5
PING_AFTER_IDLE_S = 2.0
"""A pooled Postgres connection unused for this long is pinged (SELECT 1) before it is handed out, and replaced,
with every other pooled connection, when the ping fails; one in steady use is handed out as it is."""


class DatabaseBusy(DomainError):
    """The database could not take this transaction in time (SQLite write lock held too long, or repeated
    Postgres conflicts); nothing was written and sending the request again is safe."""

    status_code = 503


def _sqlite_busy(exc: BaseException) -> bool:
    text = str(getattr(exc, "orig", exc)).lower()
    return "database is locked" in text or "database is busy" in text


def is_transient(exc: BaseException) -> bool:
    """True for errors that a fresh attempt of the same transaction can succeed past: Postgres serialization
    failures (40001) and deadlocks (40P01), a connection lost during a statement, and SQLite's "database is locked".

    A connection lost during a statement (Postgres restarted, the backend terminated) took its open transaction
    with it, so nothing was saved; one lost during COMMIT (no statement) may have committed, and is not retried.
    """
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES:
        return True
    if exc.connection_invalidated and exc.statement is not None:
        return True
    return _sqlite_busy(exc)


def make_engine(url: str, pool_size: int = 20, *, prepared_statements: bool = True) -> Engine:
    """The engine for `url`. `prepared_statements=False` (PREFLAB_DATABASE_PREPARED_STATEMENTS) stops psycopg from
    preparing statements server-side, which a transaction-pooling PgBouncer cannot follow; SQLite ignores it."""
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # first: the next pragmas may wait
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        # pysqlite's own transaction handling defers BEGIN; take the write lock up front so two writers queue
        # on the busy wait instead of failing with "database is locked" when a reader upgrades to a writer
        # (SQLite does not wait in that case). SQLite has one writer at a time: every transaction queues here.
        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            _begin_immediate(conn)

        @event.listens_for(engine, "connect")
        def _no_pysqlite_autobegin(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        return engine
    # prepare_threshold=None: never prepare; every statement is sent with its parameters (the extended protocol's
    # unnamed statement), which any server connection behind a pooler can run.
    connect_args = {} if prepared_statements else {"prepare_threshold": None}
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, connect_args=connect_args)
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Ping only connections idle for PING_AFTER_IDLE_S, not every checkout (`pool_pre_ping`): under load that
    ping was a round trip per request, two per ranking. A connection lost while in steady use fails its statement
    instead, which invalidates the pool, and `is_transient` has the transaction run again."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            # The pool replaces this connection and every one pooled before now, then checks out again.
            raise InvalidatePoolError(f"pooled connection failed its ping: {exc}") from exc


def _begin_immediate(conn: Any) -> None:
    """BEGIN IMMEDIATE, waiting up to SQLITE_LOCK_WAIT_S for the write lock; then a clear 503, not a 500."""
    deadline = time.monotonic() + SQLITE_LOCK_WAIT_S
    delay = 0.01
    while True:
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            return
        except DBAPIError as exc:
            if not _sqlite_busy(exc):
                raise
            if time.monotonic() >= deadline:
                raise DatabaseBusy(
                    f"the database stayed locked by other writers for {SQLITE_LOCK_WAIT_S:.0f} s; nothing was saved, "
                    "send it again. SQLite lets one transaction write at a time: for many concurrent users or "
                    "several workers, run preflab on Postgres") from exc
            # The busy handler gave up early (it does when SQLite sees a lock it cannot wait for): back off.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)


def core(db: Session) -> CoreConnection:
    """The session's connection, in its transaction, for a Core statement on a hot path (one that loads no ORM
    object: columns, counts, inserts). `Session.execute` takes every statement through the ORM's compile and result
    set-up, about two thirds of the CPU a small statement costs, even when it selects plain columns; a statement
    registered with `direct` also skips SQLAlchemy's per-execution work (app/platform/direct_sql.py). What the
    session holds unflushed is flushed first, as its autoflush would before a query."""
    if db.new or db.dirty or db.deleted:
        db.flush()
    # Kept per transaction: `Session.connection()` walks the session's transaction state on every call.
    kept = db.info.get(_CORE)
    transaction = db.get_transaction()
    if transaction is None or kept is None or kept[0] is not transaction:
        conn = CoreConnection(db.connection())  # begins the transaction when none is open
        kept = db.info[_CORE] = (db.get_transaction(), conn)
    return kept[1]


_CORE = "preflab.core"


class RowLoader:
    """Persistent instances of `model` from a Core row that holds all its table's columns (`columns`, in order,
    from `start`), as an ORM query would load them but without that query's set-up: an entity query costs about
    four times a direct statement (app/platform/direct_sql.py). An instance the session holds already is the one
    returned."""

    def __init__(self, model: type) -> None:
        mapper: Mapper[Any] = inspect(model)
        self.model = model
        self.columns = tuple(mapper.local_table.columns)
        self._keys = tuple(mapper.get_property_by_column(column).key for column in self.columns)
        self._pk = [column.primary_key for column in self.columns].index(True)
        self._new = mapper.class_manager.new_instance

    def load(self, db: Session, row: Any, start: int) -> Any:
        """The instance in `row[start:start + len(columns)]`, or None where its primary key is NULL (an outer join
        found none)."""
        values = row[start:start + len(self.columns)]
        if values[self._pk] is None:
            return None
        existing = db.identity_map.get(identity_key(self.model, values[self._pk]))
        if existing is not None:
            return existing
        instance = self._new()
        inspect(instance).dict.update(zip(self._keys, values, strict=True))
        make_transient_to_detached(instance)  # loaded and unmodified, as from a query
        db.add(instance)
        return instance


def get_or_missing(db: Session, model: type[T], key: int, message: str) -> T:
    """The row of `model` with primary key `key`, or NotFound(`message`): for objects every caller of the service may
    see (an admin's clusters, endpoints, users); a project's objects check their project as well."""
    row = db.get(model, key)
    if row is None:
        raise NotFound(message)
    return row


SessionFactory = sessionmaker[Session]
"""What makes a process's sessions (a job handler names it without importing SQLAlchemy's machinery)."""


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=True)


_AFTER_COMMIT = "preflab.after_commit"


def after_commit(db: Session, action: Callable[[], None]) -> None:
    """Run `action` once the session's transaction has committed, and never if it rolls back (or is closed
    without a commit): what lies outside the database (an export's files) goes only when the row says so for good.

    A savepoint rolled back does not take back what was registered inside it; nothing registers inside one today.
    """
    if not db.in_transaction():
        db.begin()  # the action belongs to this transaction, not to whichever comes next
    db.info.setdefault(_AFTER_COMMIT, []).append(action)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for action in session.info.pop(_AFTER_COMMIT, []):
        try:
            action()
        except Exception:  # the commit stands; a cleanup that failed is logged, not turned into an error
            log.exception("after-commit action %r failed", action)


@event.listens_for(Session, "after_transaction_end")
def _forget_after_commit(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost transaction ended without the commit that ran them
        session.info.pop(_AFTER_COMMIT, None)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any exception. For the CLI and the worker."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def run_transaction(factory: sessionmaker[Session], work: Callable[[Session], T], *,
                    attempts: int = RETRY_ATTEMPTS, what: str = "transaction") -> T:
    """`work(session)` in one transaction, run again from the start after a transient error (`is_transient`).

    The database rolled the failed attempt back whole, so a new attempt sees fresh data and decides again;
    `work` must therefore do nothing outside the session that it cannot repeat. After `attempts` the last
    error becomes DatabaseBusy (503 over HTTP).
    """
    for attempt in range(1, attempts + 1):
        try:
            with session_scope(factory) as session:
                return work(session)
        except DBAPIError as exc:
            if not is_transient(exc):
                raise
            if attempt == attempts:
                raise DatabaseBusy(f"{what} kept conflicting with concurrent ones ({_reason(exc)}) after "
                                   f"{attempts} attempts; nothing was saved, try again") from exc
            log.info("%s: %s, attempt %d of %d; retrying", what, _reason(exc), attempt, attempts)
            time.sleep(min(0.5, 0.02 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _reason(exc: BaseException) -> str:
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if code not in TRANSIENT_SQLSTATES and getattr(exc, "connection_invalidated", False):
        return "database connection lost"
    return TRANSIENT_SQLSTATES.get(code or "", "database is locked")


class RetryTransientErrors:
    """ASGI middleware: a request whose transaction hit a transient error (`is_transient`) runs again.

    Safe because the request owns its one transaction (services never commit) and the session commits before
    the response starts: a transient error always arrives before any byte was sent, with nothing saved. The
    body is recorded as the app reads it and replayed to the next attempt.
    """

    def __init__(self, app: Any, attempts: int = RETRY_ATTEMPTS) -> None:
        self.app = app
        self.attempts = attempts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        recorded: list[dict[str, Any]] = []
        started = False

        async def send_watching(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        for attempt in range(1, self.attempts + 1):
            attempt_scope = dict(scope)
            if "state" in scope:
                attempt_scope["state"] = dict(scope["state"])
            try:
                await self.app(attempt_scope, _replaying(recorded, receive), send_watching)
                return
            except Exception as exc:
                # A body too large to keep (an upload) is not replayable: the error goes out as it is.
                if started or attempt == self.attempts or not is_transient(exc) or _too_big(recorded):
                    raise
                log.info("%s %s: %s, attempt %d of %d; running it again", scope.get("method"), scope.get("path"),
                         _reason(exc), attempt, self.attempts)
                await asyncio.sleep(min(0.5, 0.02 * 2 ** attempt) * (0.5 + random.random()))


def _replaying(recorded: list[dict[str, Any]], receive: Callable[[], Awaitable[dict[str, Any]]]) -> Callable[[], Any]:
    """A `receive` that first hands out the messages an earlier attempt read, then reads on (and records)."""
    replay = iter(list(recorded))

    async def receive_recording() -> dict[str, Any]:
        message = next(replay, None)
        if message is not None:
            return message
        message = await receive()
        if not _too_big(recorded):
            recorded.append(message)
        return message

    return receive_recording


REPLAY_MAX_BYTES = 1 << 20
"""Request bodies up to this size are kept for a replay; an import upload is not held in memory twice."""


def _too_big(recorded: list[dict[str, Any]]) -> bool:
    return sum(len(m.get("body", b"")) for m in recorded) > REPLAY_MAX_BYTES
