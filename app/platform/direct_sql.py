"""Hot-path Core statements sent straight through psycopg: compiled once, then no SQLAlchemy work per execution.

`Connection.execute` spends about 40 % of a small statement's CPU on work that repeats identically each time: the
statement's cache key (a walk of its whole tree), the execution context, the parameters' processing set-up and the
result's metadata. A statement registered with `direct` at module level is compiled once per dialect and its SQL,
default parameters and bind processors are kept; `app.platform.db.core(db)` then sends it through the session's
own psycopg connection, in the session's transaction. Errors go through SQLAlchemy's own handling (the same exception
classes, a lost connection invalidates the pool), so callers and `app.platform.db.is_transient` see what they always
saw.

Anything this does not reproduce runs through SQLAlchemy as before: SQLite, statements with an IN over values given
at execution or with column defaults other than a value or a function, and every statement of an engine that has
execution event listeners (instrumentation such as OpenTelemetry sees every statement with its context).

Reproducing SQLAlchemy's execution from the compiled statement needs its private names (`PRIVATE_SQLALCHEMY`):
pyproject.toml pins SQLAlchemy below its next minor release, and tests/app/test_direct_sql.py names any of them a
release dropped. What that buys (benchmarks/RESULTS.md, measured in-process on Postgres): the direct path
toggled on and off every 50 rankings in one process, median CPU per ranking 13.6 ms on against 15.2 ms off (about
11 % less); sending through a raw cursor with placeholders made once then took `profile_annotation.py`'s CPU per
ranking from 3.50–3.61 to 3.11–3.29 ms (−8 %).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg import RawCursor
from sqlalchemy import ARRAY, Connection, Engine, Integer, String, bindparam, cast
from sqlalchemy.exc import InvalidRequestError, MultipleResultsFound, NoResultFound
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import ResultColumnsEntry, SQLCompiler
from sqlalchemy.sql.dml import UpdateBase, ValuesBase
from sqlalchemy.types import TypeEngine

Params = Mapping[str, Any]
S = TypeVar("S", bound=ClauseElement)

PRIVATE_SQLALCHEMY: tuple[tuple[Any, str], ...] = (
    (SQLCompiler, "_bind_processors"),
    (SQLCompiler, "_process_parameters_for_postcompile"),  # an IN over fixed values, expanded once
    (SQLCompiler, "_result_columns"),
    (ResultColumnsEntry, "keyname"),  # the entries of `_result_columns`
    (ResultColumnsEntry, "type"),
    (SQLCompiler.construct_params, "_check"),  # a keyword parameter: the defaults without the required values
    (TypeEngine, "_cached_result_processor"),
    # Read with a default: were they renamed, rows a statement did not ask for would pass for its RETURNING.
    (UpdateBase, "_returning"),
    (UpdateBase, "_return_defaults"),
    (Connection, "_has_events"),
    (Engine, "_has_events"),
    (Connection, "_handle_dbapi_exception"),  # errors wrapped, and a lost connection handled, as SQLAlchemy does
)
"""The private names of SQLAlchemy this module uses, as (owner, name); for a function, a keyword parameter of it."""


_PLANS: dict[Any, dict[Any, _Plan | None]] = {}
"""Statement → its compiled forms, per dialect (and parameter names, for INSERT/UPDATE): only statements built
once at import are registered, so this never grows with traffic and a statement is never mistaken for another."""


def direct(statement: S) -> S:
    """Register a module-level Core statement of a hot path, to be sent straight through psycopg when run with
    `core(db)`; returns the statement itself (it runs anywhere a statement runs)."""
    _PLANS.setdefault(statement, {})
    return statement


def int_array(name: str) -> Any:
    """A bind parameter `name` for a Postgres int array, bound as the array's text form (`int_array_text`): psycopg
    dumps a list element by element at every execution, in Python; a string is sent as it is."""
    return cast(bindparam(name, type_=String), ARRAY(Integer))


def int_array_text(ids: Iterable[int]) -> str:
    """`{1,2,3}`: the text form of an int array, as `int_array` binds it."""
    return "{" + ",".join(map(str, ids)) + "}"


def _plan(plans: dict[Any, _Plan | None], statement: Any, dialect: Any, params: Params) -> _Plan | None:
    """The compiled statement for this dialect (and, for an INSERT or UPDATE given no values of its own, for these
    parameter names), or None where only SQLAlchemy runs it faithfully."""
    columns = frozenset(params) if isinstance(statement, ValuesBase) else None
    key = (dialect.name, columns)
    if key not in plans:
        plans[key] = _Plan.of(statement, dialect, columns)
    return plans[key]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def _positional(sql: str) -> tuple[bytes, tuple[str, ...]] | None:
    """The pyformat SQL as Postgres takes it (`%(name)s` → `$n`, a name repeated keeps its number, `%%` → `%`) and
    the parameter names in number order: sent through a raw cursor, psycopg neither parses the SQL nor maps a dict
    to positions at each execution. None for SQL this does not fully convert."""
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${order.setdefault(match.group(1), len(order) + 1)}"

    converted = _PLACEHOLDER.sub(number, sql)
    if "%(" in _PLACEHOLDER.sub("", sql) or not converted.isascii():
        return None
    return converted.encode(), tuple(order)


@dataclass(frozen=True)
class _Plan:
    sql: str
    """As SQLAlchemy compiled it (pyformat): what errors and logs show."""
    query: bytes
    """`sql` with positional placeholders, as sent."""
    order: tuple[str, ...]
    """The parameter names, in placeholder order."""
    defaults: dict[str, Any]
    required: frozenset[str]
    fixed: frozenset[str]
    """IN parameters rendered into the SQL with the values the statement was built with."""
    column_defaults: tuple[tuple[str, Any], ...]
    """(parameter, ColumnDefault) of the columns whose default Python computes at insert, when not given."""
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]
    results: tuple[Callable[[Any], Any] | None, ...] | None
    """Per result column, the type's result processor (None: the value as psycopg gives it); None when none has one."""
    row: Any  # a namedtuple type of the result's keys, or None for a statement that returns no rows

    @classmethod
    def of(cls, statement: Any, dialect: Any, columns: frozenset[str] | None) -> _Plan | None:
        if dialect.driver != "psycopg":
            return None
        keys = sorted(columns) if columns is not None else None
        compiled = statement.compile(dialect=dialect, column_keys=keys)
        sql, params = compiled.string, compiled.construct_params(_check=False)
        bind_processors = compiled._bind_processors
        fixed = frozenset(compiled.bind_names[bind] for bind in compiled.post_compile_params)
        if fixed and all(not bind.required and bind.callable is None for bind in compiled.post_compile_params):
            # IN over values fixed when the statement was built (`state IN ('submitted', 'skipped')`): expanded
            # once into a parameter per value, as SQLAlchemy expands it at each execution.
            expanded = compiled._process_parameters_for_postcompile(params)
            sql, params = expanded.statement, expanded.parameters
            bind_processors = {**bind_processors, **expanded.processors}
        elif fixed:
            return None
        prefetch = [*compiled.insert_prefetch, *compiled.update_prefetch]
        if (compiled.literal_execute_params or compiled.escaped_bind_names
                or any(c.default is None or not (c.default.is_scalar or c.default.is_callable) for c in prefetch)):
            return None
        processors = tuple((name, proc) for name, proc in bind_processors.items() if proc is not None)
        if any(not callable(proc) for _, proc in processors):  # tuple-typed binds: not on a hot path
            return None
        names = [entry.keyname for entry in compiled._result_columns]  # as SQLAlchemy's rows name them
        if names and not getattr(statement, "_returning", True) and not getattr(statement, "_return_defaults", False):
            return None  # rows the statement did not ask for (implicit RETURNING): SQLAlchemy knows what they mean
        results = tuple(entry.type._cached_result_processor(dialect, None) for entry in compiled._result_columns)
        row = namedtuple("Row", names, rename=True) if names else None
        positional = _positional(sql)
        if positional is None:
            return None
        required = frozenset(name for bind, name in compiled.bind_names.items() if bind.required)
        given = {name: value for name, value in params.items() if name not in required and name not in fixed}
        return cls(sql, *positional, given, required, fixed,
                   tuple((c.key, c.default) for c in prefetch), processors, results if any(results) else None, row)

    def bind(self, params: Params) -> dict[str, Any]:
        """The statement's parameters by name: defaults, column defaults and bind processors applied."""
        values = self.defaults | dict(params)
        if self.fixed and not self.fixed.isdisjoint(params):
            raise InvalidRequestError(f"{sorted(self.fixed & params.keys())[0]!r} was fixed when the statement was "
                                      "built (app/platform/direct_sql.py): build another statement for other values")
        if not self.required <= values.keys():
            missing = sorted(self.required - values.keys())
            raise InvalidRequestError(f"A value is required for bind parameter {missing[0]!r}")
        for name, default in self.column_defaults:
            if values.get(name) is None and name not in params:
                values[name] = default.arg if default.is_scalar else default.arg(None)
        for name, proc in self.processors:
            if name in values:  # None too: a JSON column binds None as JSON null unless none_as_null
                values[name] = proc(values[name])
        return values

    def args(self, values: dict[str, Any]) -> tuple[Any, ...]:
        """`bind`'s values in placeholder order."""
        return tuple(values[name] for name in self.order)

    def rows(self, fetched: list[tuple[Any, ...]]) -> list[Any]:
        if self.results is not None:
            procs = self.results
            fetched = [tuple(v if p is None else p(v) for p, v in zip(procs, r, strict=True)) for r in fetched]
        return [self.row._make(r) for r in fetched] if self.row is not None else fetched


class Rows:
    """The rows of a statement, with the part of SQLAlchemy's `Result` the hot paths use."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return self._rows

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise NoResultFound("no row was found") if not self._rows else MultipleResultsFound("more than one row")
        return self._rows[0]

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._rows]


class CoreConnection:
    """The session's connection for Core statements: registered ones straight through psycopg where they can be,
    everything else as `Connection.execute` runs it."""

    __slots__ = ("conn", "_cursor")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._cursor: RawCursor[Any] | None = None

    def execute(self, statement: Any, params: Params | list[Params] | None = None) -> Any:
        plans = _PLANS.get(statement)
        if plans is None or self.conn._has_events or self.conn.engine._has_events:
            return self.conn.execute(statement, params)
        many = isinstance(params, list)
        plan = _plan(plans, statement, self.conn.dialect, (params[0] if isinstance(params, list) else params) or {})
        if plan is None:
            return self.conn.execute(statement, params)
        return self._run(plan, params or {}, many)

    def scalar(self, statement: Any, params: Params | None = None) -> Any:
        return self.execute(statement, params).scalar()

    def scalars(self, statement: Any, params: Params | None = None) -> Any:
        return self.execute(statement, params).scalars()

    def _run(self, plan: _Plan, params: Any, many: bool) -> Rows:
        conn = self.conn
        if self._cursor is None:  # one per transaction: a cursor keeps its dumpers, looked up once per type
            self._cursor = RawCursor(conn.connection.driver_connection)  # type: ignore[arg-type]
        cursor = self._cursor
        bound: Any = [plan.bind(p) for p in params] if many else plan.bind(params)
        try:
            if many:
                cursor.executemany(plan.query, [plan.args(values) for values in bound])
            else:
                cursor.execute(plan.query, plan.args(bound))
            # Only a statement with result columns is fetched: asking psycopg for `description` builds them anew.
            fetched = cursor.fetchall() if plan.row is not None else []
            rowcount = cursor.rowcount
        except Exception as exc:
            # Wrapped as SQLAlchemy wraps it (DBAPIError subclasses); a lost connection invalidates the pool.
            # psycopg's cursor is the DB-API cursor SQLAlchemy means; its stubs differ from SQLAlchemy's protocol.
            conn._handle_dbapi_exception(exc, plan.sql, bound, cursor, None)  # type: ignore[arg-type]
        return Rows(plan.rows(fetched), rowcount)
