"""The SQL side of an export: what is asked for, one consistent snapshot, and the filtered selects.

Postgres gives every export one REPEATABLE READ, read-only transaction. The big pair scan leaves it as
packed binary records (`PackedScan`) through `COPY … TO STDOUT` on a second connection that imports the same
snapshot (`pg_export_snapshot()`): Postgres streams ahead while Python works, the first connection stays free
for the per-batch text lookups, and both see exactly the same rows. SQLite reads through one deferred WAL
transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    Engine,
    Select,
    Text,
    cast,
    create_engine,
    event,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.orm import aliased
from sqlalchemy.pool import NullPool

from app.models import Constitution, Pair, Prompt, Ranking, Rubric


@dataclass(frozen=True)
class ExportSpec:
    """What to write: validated by `app.exports.service` before it gets here."""

    project_id: int
    kind: str
    format: str
    filters: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "raw"
    conflicts: str = "keep"
    layout: str | None = None
    """"standard" (text columns), "conversational" (message lists, TRL's conversational layout); None: the
    project's own — conversational when it holds any chat prompt."""
    neutral: str = "positive"
    """steps exports: how neutral (0) steps become bool labels (positive | negative | truncate)."""
    every_step: bool = False
    """steps exports: write every labelled step of a completion, not only those up to its first wrong step."""


# ---------------------------------------------------------------------------------------------------------
# The snapshot
# ---------------------------------------------------------------------------------------------------------

_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")


@dataclass
class Snapshot:
    """A read-only connection on one consistent snapshot of the database."""

    conn: Connection
    description: str
    engine: Engine
    exported: str | None = None
    """Postgres: the `pg_export_snapshot()` id other connections can join."""

    @property
    def can_copy(self) -> bool:
        return self.exported is not None

    @contextmanager
    def side(self) -> Iterator[Connection]:
        """A second read-only connection that imports this snapshot (Postgres only): it reads exactly the rows the
        first one does, while the first stays free for other statements."""
        if self.exported is None or not _SNAPSHOT_ID.match(self.exported):
            raise RuntimeError("a second connection on the snapshot needs a Postgres snapshot")
        with self.engine.connect() as base:
            side = base.execution_options(isolation_level="REPEATABLE READ")
            with side.begin():
                side.exec_driver_sql("SET TRANSACTION READ ONLY")
                side.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{self.exported}'")
                yield side

    def copy_records(self, sql: str, params: dict[str, Any]) -> Iterator[bytes]:
        """`COPY (sql) TO STDOUT` of a query with one bytea column, value by value, read on a second connection
        that imports this snapshot (Postgres only). Closing the iterator early cancels the COPY."""
        with self.side() as side:
            driver = side.connection.driver_connection
            assert driver is not None
            # psycopg merges the parameters client-side (COPY takes none); there is always one, the project.
            with driver.cursor() as cursor, cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT binary)", params) as copy:
                copy.set_types(["bytea"])
                for (record,) in copy.rows():
                    yield record


@contextmanager
def snapshot(engine: Engine) -> Iterator[Snapshot]:
    """A read-only connection on one consistent snapshot, and a description of that snapshot."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as base:
            conn = base.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                # Server-side cursors (rankings, prompts, SFT) are read to the end: plan for all rows.
                conn.exec_driver_sql("SET LOCAL cursor_tuple_fraction = 1.0")
                # The first query fixes the snapshot for every later one in this transaction.
                snap = str(conn.exec_driver_sql("SELECT pg_current_snapshot()::text").scalar())
                exported = str(conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar())
                yield Snapshot(conn, f"postgres {snap}", engine, exported)
        return
    # SQLite: the app's engine opens every transaction with BEGIN IMMEDIATE (the write lock), which would
    # block annotators for the length of the export. A deferred BEGIN in WAL mode is a read snapshot.
    reader = create_engine(engine.url, poolclass=NullPool, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(reader, "connect")
    def _autocommit_driver(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(reader, "begin")
    def _deferred_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN DEFERRED")

    try:
        with reader.connect() as conn, conn.begin():
            conn.exec_driver_sql("SELECT count(*) FROM projects").scalar()  # take the WAL snapshot now
            yield Snapshot(conn, "sqlite deferred read transaction", reader)
    finally:
        reader.dispose()


# ---------------------------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------------------------


def lo_hi(conn: Connection, a: Any, b: Any) -> tuple[Any, Any]:
    if conn.dialect.name == "postgresql":
        return func.least(a, b), func.greatest(a, b)
    return func.min(a, b), func.max(a, b)  # SQLite's scalar min/max with two arguments


def ranking_filters(stmt: Select[*tuple[Any, ...]], filters: dict[str, Any], *, pair_level: bool
                    ) -> Select[*tuple[Any, ...]]:
    """Apply the validated filters that concern rankings, prompts and (for pairs) the pair itself."""
    if "source" in filters:
        stmt = stmt.where((Pair.source if pair_level else Ranking.source).in_(filters["source"]))
    if "rubric_versions" in filters:
        stmt = stmt.where(Rubric.version.in_(filters["rubric_versions"]))
    if "constitution_versions" in filters:
        stmt = stmt.where(Constitution.version.in_(filters["constitution_versions"]))
    if pair_level and "min_confidence" in filters:
        stmt = stmt.where(Pair.p >= filters["min_confidence"])
    flagged = filters.get("flagged", "include")
    if flagged != "include":
        # flags is {} (JSON) when nothing was flagged; compared as text so both backends agree.
        unflagged = or_(Ranking.flags.is_(None), cast(Ranking.flags, Text).in_(["{}", "null"]))
        stmt = stmt.where(unflagged if flagged == "exclude" else ~unflagged)
    if "created_after" in filters:
        recent = Ranking.created_at >= datetime.fromisoformat(filters["created_after"])
        if pair_level and filters.get("replay_share"):
            # Replay (iterative RLHF): a fixed, pseudo-random share of the earlier pairs rides along with the new
            # ones; keyed on the pair id, so the same export request always picks the same pairs.
            stmt = stmt.where(or_(recent, (Pair.id * 7919) % 1000 < int(round(1000 * filters["replay_share"]))))
        else:
            stmt = stmt.where(recent)
    if "created_before" in filters:
        stmt = stmt.where(Ranking.created_at < datetime.fromisoformat(filters["created_before"]))
    if "split" in filters:
        stmt = stmt.where(Prompt.split == filters["split"])
    return stmt


def pairs_select(spec: ExportSpec) -> Select[*tuple[Any, ...]]:
    """Pair rows without any text: ids and numbers only, so the stream stays narrow.

    The pairs table alone is streamed; the rankings that pass the filters are a semi-join, and each batch
    then looks up its rankings (labeller, versions), prompts and completion texts by id.
    """
    rankings = select(Ranking.id).where(Ranking.project_id == spec.project_id)
    if "rubric_versions" in spec.filters:
        rankings = rankings.join(Rubric, Ranking.rubric_id == Rubric.id)
    if "constitution_versions" in spec.filters:
        rankings = rankings.join(Constitution, Ranking.constitution_id == Constitution.id)
    if "split" in spec.filters:
        rankings = rankings.join(Prompt, Ranking.prompt_id == Prompt.id)
    filters = {k: v for k, v in spec.filters.items() if k != "source"}
    replay = filters.pop("replay_share", None)
    after = filters.pop("created_after", None) if replay else None
    rankings = ranking_filters(rankings, filters, pair_level=False)
    stmt = select(Pair.id.label("pair_id"), Pair.prompt_id, Pair.ranking_id, Pair.chosen_id, Pair.rejected_id,
                  Pair.source, Pair.margin, Pair.weight, Pair.p).where(Pair.ranking_id.in_(rankings))
    if after is not None:
        # Replay: the new pairs, plus a fixed pseudo-random share of the earlier ones (keyed on the pair id).
        recent = select(Ranking.id).where(Ranking.project_id == spec.project_id,
                                          Ranking.created_at >= datetime.fromisoformat(after))
        stmt = stmt.where(or_(Pair.ranking_id.in_(recent), (Pair.id * 7919) % 1000 < int(round(1000 * replay))))
    if "source" in spec.filters:
        stmt = stmt.where(Pair.source.in_(spec.filters["source"]))
    if "min_confidence" in spec.filters:
        stmt = stmt.where(Pair.p >= spec.filters["min_confidence"])
    return stmt


def rankings_select(spec: ExportSpec, conversational: bool) -> Select[*tuple[Any, ...]]:
    stmt = (
        select(Ranking.id.label("ranking_id"), Ranking.prompt_id,
               (Prompt.messages if conversational else Prompt.text).label("prompt"),
               Ranking.tiers, Ranking.source, Ranking.annotator_id, Ranking.judge_run_id,
               Rubric.version.label("rubric_version"), Constitution.version.label("constitution_version"),
               Ranking.flags, Prompt.split, (Prompt.text if conversational else Prompt.id).label("prompt_text"))
        .join(Prompt, Ranking.prompt_id == Prompt.id)
        .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
        .outerjoin(Constitution, Ranking.constitution_id == Constitution.id)
        # Monte-Carlo rankings hold step labels and no order: they are no ranking to export or pick from.
        .where(Ranking.project_id == spec.project_id, Ranking.skipped.is_(False), Ranking.source != "mc")
    )
    return ranking_filters(stmt, spec.filters, pair_level=False)




def pair_scan_select(spec: ExportSpec, conn: Connection) -> Select[*tuple[Any, ...]]:
    """The raw pairs export's one big scan: the filtered pairs with their labeller, versions and split, in pair
    id order. No text: prompts and responses are looked up once per batch by id."""
    base = pairs_select(spec)
    if "min_agreement" in spec.filters:
        # Agreement of a pair = share of the (filtered) votes on its unordered pair that point its way.
        lo, hi = lo_hi(conn, Pair.chosen_id, Pair.rejected_id)
        votes = func.count().over(partition_by=(Pair.prompt_id, lo, hi))
        same = func.count().over(partition_by=(Pair.prompt_id, lo, hi, Pair.chosen_id))
        inner = base.add_columns(votes.label("n_votes"), same.label("n_same")).subquery()
        base = (select(*[c for c in inner.c if c.name not in ("n_votes", "n_same")])
                .where(inner.c.n_same >= spec.filters["min_agreement"] * inner.c.n_votes))
    pairs = base.subquery("pairs_f")
    # Aliases: the filter's IN (SELECT … FROM rankings) must not correlate with the rankings joined here.
    ranking, rubric, constitution, prompt = aliased(Ranking), aliased(Rubric), aliased(Constitution), aliased(Prompt)
    return (select(*pairs.c, ranking.annotator_id, ranking.judge_run_id, rubric.version.label("rubric_version"),
                   constitution.version.label("constitution_version"), prompt.split)
            .select_from(pairs)
            .join(ranking, pairs.c.ranking_id == ranking.id)
            .outerjoin(rubric, ranking.rubric_id == rubric.id)
            .outerjoin(constitution, ranking.constitution_id == constitution.id)
            .join(prompt, pairs.c.prompt_id == prompt.id)
            .order_by(pairs.c.pair_id))


LOOKUP_CHUNK = 10_000
"""Ids per IN (…) lookup: under SQLite's and psycopg's bound-parameter limits."""


def chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), LOOKUP_CHUNK):
        yield ids[start:start + LOOKUP_CHUNK]


def id_in(conn: Connection, column: Any, ids: list[int]) -> Any:
    """`column IN ids`: one array parameter on Postgres (`= ANY(%s)`), bound parameters elsewhere."""
    if conn.dialect.name == "postgresql":
        # One text parameter cast server-side: psycopg's Python list dumper costs more than the lookup itself.
        return column == func.any(cast(literal("{" + ",".join(map(str, ids)) + "}", Text), ARRAY(BigInteger)))
    return column.in_(ids)


@dataclass(frozen=True)
class PackedScan:
    """A scan's rows as fixed-width big-endian records, concatenated by Postgres into one bytea per block of
    `block` consecutive pair ids, and decoded by numpy: a million rows cross into Python as ~50 values instead
    of 14 million objects (per-row Python work was most of an export's time).

    Integer columns travel as int8 with -1 for NULL (ids, versions and margins are positive), floats as float8
    with NaN for NULL, and the short enumerated strings (`codes`) as int2 indexes into their allowed values.
    """

    schema: pa.Schema
    codes: dict[str, tuple[str, ...]]
    block: int

    def sql(self, conn: Connection, scan: Select[*tuple[Any, ...]]) -> tuple[str, dict[str, Any]]:
        compiled = scan.order_by(None).compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        parts = []
        for f in self.schema:
            if f.name in self.codes:
                whens = " ".join(f"WHEN '{v}' THEN {i}" for i, v in enumerate(self.codes[f.name]))
                parts.append(f"int2send((CASE s.{f.name} {whens} ELSE -1 END)::int2)")
            elif pa.types.is_floating(f.type):
                parts.append(f"float8send(coalesce(s.{f.name}, 'NaN'::float8))")
            else:
                parts.append(f"int8send(coalesce(s.{f.name}, -1))")
        first = self.schema.names[0]
        # B608: the names and codes come from this class's fixed schema and block is an int; values stay bound.
        sql = (f"SELECT string_agg({' || '.join(parts)}, ''::bytea ORDER BY s.{first}) FROM ({compiled}) AS s "
               f"GROUP BY s.{first} / {int(self.block)} ORDER BY s.{first} / {int(self.block)}")  # nosec B608
        return sql, dict(compiled.params)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(f.name, ">i2" if f.name in self.codes else ">f8" if pa.types.is_floating(f.type) else ">i8")
                         for f in self.schema])

    def decode(self, record: bytes) -> pa.RecordBatch:
        rows = np.frombuffer(record, dtype=self.dtype)
        arrays = []
        for f in self.schema:
            values = rows[f.name]
            if f.name in self.codes:
                arrays.append(pa.array(self.codes[f.name], f.type).take(pa.array(values.astype(np.int32))))
            elif pa.types.is_floating(f.type):
                native = values.astype(np.float64)
                arrays.append(pa.array(native, f.type, mask=np.isnan(native)))
            else:
                native = values.astype(np.int64)
                arrays.append(pa.array(native, f.type, mask=native == -1))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
