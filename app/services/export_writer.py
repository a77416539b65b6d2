"""The export writer: streams one database snapshot into JSONL, Parquet or a `datasets` directory, byte-stable.

One read transaction (REPEATABLE READ on Postgres, a deferred WAL read on SQLite) sees the whole export,
so annotation that lands meanwhile never makes it inconsistent. Rows come in `batch_size` batches from a
server-side cursor and leave as soon as they are written: memory is bounded by one batch, not the export.

Reproducibility: rows are ordered by a stable key (pair id; ranking id; prompt id; aggregated pairs by
prompt and completion ids), ids are database ids, annotators are HMAC pseudonyms, and no file holds a
timestamp, path or export id — the dataset card (README.md) included. Re-running a request on unchanged
data therefore gives byte-identical files and the same `sha256`, which covers every file, card included.
The export's own id, creation time and database snapshot live on the Export row and the job result.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # the C encoder, ensure_ascii=False
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    Engine,
    Select,
    Text,
    case,
    cast,
    create_engine,
    event,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from app.models import Completion, Constitution, Pair, Project, Prompt, Ranking, Rubric

DEFAULT_BATCH = 20_000
PSEUDONYM_HEX = 16
"""64 bits of HMAC: collision-free for any realistic annotator pool, short enough to read."""

Progress = Callable[[int, int], None]
Columns = dict[str, list[Any]]

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def annotator_pseudonym(secret: str, project_id: int, user_id: int) -> str:
    """A stable per-project id for an annotator: HMAC-SHA256(app secret, "annotator:project:user"), truncated.

    The same person gets the same id in every export of one project and unrelated ids across projects;
    without the secret nobody can map it back to a user (user ids are small and would be guessable by
    plain hashing, which is why it is keyed).
    """
    digest = hmac.new(secret.encode(), f"annotator:{project_id}:{user_id}".encode(), hashlib.sha256).hexdigest()
    return "a-" + digest[:PSEUDONYM_HEX]


@dataclass(frozen=True)
class ExportSpec:
    """What to write: validated by `app.services.exports` before it gets here."""

    project_id: int
    kind: str
    format: str
    filters: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "raw"
    conflicts: str = "keep"


@dataclass
class WriteResult:
    path: Path
    files: dict[str, str]
    """Relative file name → sha256, every file of the export (card included)."""
    sha256: str
    """sha256 over the sorted "name  sha256" lines of `files`: one hash for the whole export."""
    row_count: int
    row_counts: dict[str, int]
    snapshot: str
    """The database snapshot read (Postgres `pg_current_snapshot()`), for the record."""


# ---------------------------------------------------------------------------------------------------------
# Schemas: fixed per kind, so an empty export and a full one have the same columns and types
# ---------------------------------------------------------------------------------------------------------


def _text_or_messages(conversational: bool) -> pa.DataType:
    return MESSAGES if conversational else pa.string()


def schema_for(kind: str, aggregation: str, conversational: bool) -> pa.Schema:
    t = _text_or_messages(conversational)
    if kind == "pairs" and aggregation == "aggregated":
        fields = [("pair_id", pa.int64()), ("prompt_id", pa.int64()), ("ranking_ids", pa.list_(pa.int64())),
                  ("prompt", t), ("chosen", t), ("rejected", t), ("chosen_id", pa.int64()),
                  ("rejected_id", pa.int64()), ("source", pa.string()), ("annotators", pa.list_(pa.string())),
                  ("rubric_versions", pa.list_(pa.int64())), ("constitution_versions", pa.list_(pa.int64())),
                  ("margin", pa.float64()), ("weight", pa.float64()), ("p", pa.float64()), ("votes", pa.int64()),
                  ("total_votes", pa.int64()), ("agreement", pa.float64()), ("split", pa.string())]
    elif kind == "pairs":
        fields = [("pair_id", pa.int64()), ("prompt_id", pa.int64()), ("ranking_id", pa.int64()), ("prompt", t),
                  ("chosen", t), ("rejected", t), ("chosen_id", pa.int64()), ("rejected_id", pa.int64()),
                  ("source", pa.string()), ("annotator", pa.string()), ("rubric_version", pa.int64()),
                  ("constitution_version", pa.int64()), ("margin", pa.int64()), ("weight", pa.float64()),
                  ("p", pa.float64()), ("split", pa.string())]
    elif kind == "rankings":
        fields = [("ranking_id", pa.int64()), ("prompt_id", pa.int64()), ("prompt", t),
                  ("completion_ids", pa.list_(pa.int64())), ("completions", pa.list_(pa.string())),
                  ("tiers", pa.list_(pa.list_(pa.int64()))), ("source", pa.string()), ("annotator", pa.string()),
                  ("rubric_version", pa.int64()), ("constitution_version", pa.int64()), ("flags", pa.string()),
                  ("split", pa.string())]
    elif kind == "prompts":
        fields = [("prompt_id", pa.int64()), ("prompt", t), ("reference", pa.string()), ("split", pa.string())]
    elif kind == "sft":
        fields = [("prompt_id", pa.int64()), ("prompt", t), ("completion", t), ("completion_id", pa.int64()),
                  ("origin", pa.string()), ("votes", pa.int64()), ("rankings", pa.int64()), ("split", pa.string())]
    else:
        raise ValueError(f"unknown export kind {kind!r}")
    schema = pa.schema(fields)
    # The `datasets` features, embedded as `datasets` itself does, so load_dataset("parquet") and
    # load_from_disk type list-of-message columns without guessing.
    hf = json.dumps({"info": {"features": hf_features(schema)}})
    return schema.with_metadata({"huggingface": hf})


def _hf_feature(t: pa.DataType) -> Any:
    if pa.types.is_list(t):
        return {"feature": _hf_feature(t.value_type), "_type": "List"}
    if pa.types.is_struct(t):
        return {t.field(i).name: _hf_feature(t.field(i).type) for i in range(t.num_fields)}
    dtype = {pa.int64(): "int64", pa.float64(): "float64", pa.string(): "string", pa.bool_(): "bool"}[t]
    return {"dtype": dtype, "_type": "Value"}


def hf_features(schema: pa.Schema) -> dict[str, Any]:
    """`datasets.Features.from_arrow_schema(schema).to_dict()` for our column types, without importing
    `datasets` (a second of start-up and a hundred MB of the export's memory); a test checks they agree."""
    return {f.name: _hf_feature(f.type) for f in schema}


# ---------------------------------------------------------------------------------------------------------
# Sinks: one per file format
# ---------------------------------------------------------------------------------------------------------


class _Sink(ABC):
    """Where an export's batches go: one subclass per file format."""

    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        self.root, self.kind, self.schema = root, kind, schema
        self.hashed: dict[str, str] = {}
        """sha256 of files hashed while they were written (saves re-reading a gigabyte of JSONL)."""

    @abstractmethod
    def write(self, columns: Columns) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class JsonlSink(_Sink):
    """One JSON object per line, keys in schema order, compact separators, UTF-8 text unescaped.

    Encoded column by column: each distinct string of a batch (a prompt shared by its 18 pairs, a source, a
    split) is JSON-encoded once, and lines are assembled with one %-format per row. The bytes are exactly
    what `json.dumps(row, ensure_ascii=False, separators=(",", ":"))` gives.
    """

    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        super().__init__(root, kind, schema)
        self.fh = open(root / f"{kind}.jsonl", "wb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self.digest = hashlib.sha256()
        # allow_nan=False: NaN is not JSON and would break every reader downstream.
        self.encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        self.names = schema.names
        self.types = [schema.field(n).type for n in self.names]
        self.line = "{" + ",".join(f"{json.dumps(n)}:%s" for n in self.names) + "}\n"

    def _column(self, values: list[Any], t: pa.DataType) -> list[str]:
        cache: dict[Any, str] = {}
        if pa.types.is_int64(t):
            return list(map(str, values)) if None not in values else ["null" if v is None else str(v) for v in values]
        if pa.types.is_float64(t):
            # few distinct weights and soft labels: each is formatted once per batch, as json does (float repr)
            return [cache[v] if v in cache else cache.setdefault(v, self._float(v)) for v in values]
        if pa.types.is_string(t):
            quote = encode_basestring
            return [cache[v] if v in cache else cache.setdefault(v, "null" if v is None else quote(v))
                    for v in values]
        # lists and structs: the same object (one prompt's messages) recurs across a batch; key on identity
        encode = self.encode
        return [cache[id(v)] if id(v) in cache else cache.setdefault(id(v), encode(v)) for v in values]

    def _float(self, v: float | None) -> str:
        return "null" if v is None else self.encode(float(v))

    def write(self, columns: Columns) -> None:
        encoded = [self._column(columns[n], t) for n, t in zip(self.names, self.types, strict=True)]
        line = self.line
        data = "".join([line % row for row in zip(*encoded, strict=True)]).encode()
        self.digest.update(data)
        self.fh.write(data)

    def close(self) -> None:
        self.fh.close()
        self.hashed[f"{self.kind}.jsonl"] = self.digest.hexdigest()


class ParquetSink(_Sink):
    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        super().__init__(root, kind, schema)
        # One row group per batch; no timestamps go into Parquet metadata, so equal input gives equal bytes.
        self.writer = pq.ParquetWriter(root / f"{kind}.parquet", schema, compression="snappy")

    def write(self, columns: Columns) -> None:
        self.writer.write_table(pa.Table.from_pydict(columns, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


class HfSink(_Sink):
    """A `datasets.save_to_disk` directory written directly: an Arrow stream file plus the two JSON files.

    Writing it ourselves keeps it streaming (no cache copy) and deterministic: `save_to_disk` stores a
    fingerprint that differs between runs; ours is the hash of the Arrow file.
    """

    DATA = "data-00000-of-00001.arrow"

    def __init__(self, root: Path, kind: str, schema: pa.Schema, license_id: str) -> None:
        super().__init__(root, kind, schema)
        self.dir = root / kind
        self.dir.mkdir()
        self.sink = pa.OSFile(str(self.dir / self.DATA), "wb")
        self.writer = pa.ipc.new_stream(self.sink, schema)
        self.license_id = license_id

    def write(self, columns: Columns) -> None:
        self.writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=self.schema))

    def close(self) -> None:
        self.writer.close()
        self.sink.close()
        info = {"citation": "", "description": f"preflab {self.kind} export", "homepage": "",
                "features": hf_features(self.schema), "license": self.license_id}
        state = {"_data_files": [{"filename": self.DATA}], "_fingerprint": _sha256(self.dir / self.DATA)[:16],
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                 "_output_all_columns": False, "_split": None}
        (self.dir / "dataset_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        (self.dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def _sink(fmt: str, root: Path, kind: str, schema: pa.Schema, license_id: str) -> _Sink:
    if fmt == "jsonl":
        return JsonlSink(root, kind, schema)
    if fmt == "parquet":
        return ParquetSink(root, kind, schema)
    if fmt == "hf":
        return HfSink(root, kind, schema, license_id)
    raise ValueError(f"unknown export format {fmt!r}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_sha256(files: dict[str, str]) -> str:
    """One hash for the export: sha256 of "name  sha256\\n" lines in name order (sha256sum's layout)."""
    return hashlib.sha256("".join(f"{n}  {h}\n" for n, h in sorted(files.items())).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# The snapshot
# ---------------------------------------------------------------------------------------------------------


@contextmanager
def snapshot(engine: Engine) -> Iterator[tuple[Connection, str]]:
    """A read-only connection on one consistent snapshot, and a description of that snapshot."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as base:
            conn = base.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                # The server-side cursor is read to the end: plan for all rows, not a fast first row.
                conn.exec_driver_sql("SET LOCAL cursor_tuple_fraction = 1.0")
                # The first query fixes the snapshot for every later one in this transaction.
                snap = str(conn.exec_driver_sql("SELECT pg_current_snapshot()::text").scalar())
                yield conn, f"postgres {snap}"
        return
    # SQLite: the app's engine opens every transaction with BEGIN IMMEDIATE (the write lock), which would
    # block annotators for the length of the export. A deferred BEGIN in WAL mode is a read snapshot.
    reader = create_engine(engine.url, poolclass=NullPool, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(reader, "connect")
    def _autocommit_driver(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None

    @event.listens_for(reader, "begin")
    def _deferred_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN DEFERRED")

    try:
        with reader.connect() as conn, conn.begin():
            conn.exec_driver_sql("SELECT count(*) FROM projects").scalar()  # take the WAL snapshot now
            yield conn, "sqlite deferred read transaction"
    finally:
        reader.dispose()


# ---------------------------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------------------------


def _lo_hi(conn: Connection, a: Any, b: Any) -> tuple[Any, Any]:
    if conn.dialect.name == "postgresql":
        return func.least(a, b), func.greatest(a, b)
    return func.min(a, b), func.max(a, b)  # SQLite's scalar min/max with two arguments


def _ranking_filters(stmt: Select[Any], filters: dict[str, Any], *, pair_level: bool) -> Select[Any]:
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


def _pairs_select(spec: ExportSpec) -> Select[Any]:
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
    rankings = _ranking_filters(rankings, filters, pair_level=False)
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


def _rankings_select(spec: ExportSpec, conversational: bool) -> Select[Any]:
    stmt = (
        select(Ranking.id.label("ranking_id"), Ranking.prompt_id,
               (Prompt.messages if conversational else Prompt.text).label("prompt"),
               Ranking.tiers, Ranking.source, Ranking.annotator_id, Ranking.judge_run_id,
               Rubric.version.label("rubric_version"), Constitution.version.label("constitution_version"),
               Ranking.flags, Prompt.split, (Prompt.text if conversational else Prompt.id).label("prompt_text"))
        .join(Prompt, Ranking.prompt_id == Prompt.id)
        .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
        .outerjoin(Constitution, Ranking.constitution_id == Constitution.id)
        .where(Ranking.project_id == spec.project_id, Ranking.skipped.is_(False))
    )
    return _ranking_filters(stmt, spec.filters, pair_level=False)


# ---------------------------------------------------------------------------------------------------------
# Row producers: each yields column batches and counts what it wrote
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    conn: Connection
    spec: ExportSpec
    secret: str
    conversational: bool
    batch_size: int
    progress: Progress
    total: int = 0
    done: int = 0
    sources: Counter[str] = field(default_factory=Counter)
    splits: Counter[str] = field(default_factory=Counter)
    rubric_versions: set[int] = field(default_factory=set)
    constitution_versions: set[int] = field(default_factory=set)
    _pseudonyms: dict[int, str] = field(default_factory=dict)

    def annotator(self, annotator_id: int | None, judge_run_id: int | None) -> str | None:
        if annotator_id is not None:
            name = self._pseudonyms.get(annotator_id)
            if name is None:
                name = self._pseudonyms[annotator_id] = annotator_pseudonym(self.secret, self.spec.project_id,
                                                                            annotator_id)
            return name
        if judge_run_id is not None:
            return f"judge-run-{judge_run_id}"  # an AI judge is not a person: its run id is the lineage
        return None  # imported labels carry no labeller

    def prompt(self, value: Any, text: Any) -> Any:
        """Conversational exports: stored messages, or the plain text as one user turn."""
        if not self.conversational:
            return value
        if value:
            return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in value]
        return [{"role": "user", "content": text}]

    def response(self, text: str) -> Any:
        return [{"role": "assistant", "content": text}] if self.conversational else text

    def ranking_labels(self, ranking_ids: list[int]) -> dict[int, tuple[str | None, int | None, int | None]]:
        """ranking id → (annotator pseudonym, rubric version, constitution version), for one batch."""
        out = {}
        for chunk in _chunks(ranking_ids):
            stmt = (select(Ranking.id, Ranking.annotator_id, Ranking.judge_run_id, Rubric.version, Constitution.version)
                    .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
                    .outerjoin(Constitution, Ranking.constitution_id == Constitution.id)
                    .where(_id_in(self.conn, Ranking.id, chunk)))
            for rid, annotator_id, judge_run_id, rubric_version, constitution_version in self.conn.execute(stmt).all():
                out[rid] = (self.annotator(annotator_id, judge_run_id), rubric_version, constitution_version)
        return out

    def fill_texts(self, cols: Columns) -> None:
        """Add prompt, chosen, rejected and split to a batch from its ids: two keyed lookups per batch in the
        same snapshot, instead of repeating each prompt's text on every one of its pairs in the stream."""
        prompt_ids = sorted(set(cols["prompt_id"]))
        completion_ids = sorted(set(cols["chosen_id"]) | set(cols["rejected_id"]))
        value_column = Prompt.messages if self.conversational else Prompt.text
        prompts = {pid: (self.prompt(value, text) if self.conversational else value, split)
                   for chunk in _chunks(prompt_ids)
                   for pid, value, text, split in self.conn.execute(
                       select(Prompt.id, value_column, Prompt.text, Prompt.split)
                       .where(_id_in(self.conn, Prompt.id, chunk))).all()}
        texts = _completion_texts_by_id(self.conn, completion_ids)
        if self.conversational:
            texts = {cid: self.response(text) for cid, text in texts.items()}
        cols["prompt"], cols["split"] = _unzip(_lookup(prompts, cols["prompt_id"]), 2)
        cols["chosen"] = _lookup(texts, cols["chosen_id"])
        cols["rejected"] = _lookup(texts, cols["rejected_id"])

    def stream(self, stmt: Select[Any]) -> Iterator[list[Any]]:
        # Per statement: Connection.execution_options() would switch every later lookup to a server-side cursor.
        result = self.conn.execute(stmt, execution_options={"stream_results": True, "yield_per": self.batch_size})
        yield from result.partitions(self.batch_size)

    def stream_tuples(self, stmt: Select[Any]) -> Iterator[list[tuple[Any, ...]]]:
        """Plain tuples in batches; on Postgres straight from a binary server-side psycopg cursor, which moves
        a million id/number rows about twice as fast as the text protocol under SQLAlchemy's result layer."""
        if self.conn.dialect.name != "postgresql":
            yield from self.stream(stmt)
            return
        compiled = stmt.compile(dialect=self.conn.dialect, compile_kwargs={"render_postcompile": True})
        driver = self.conn.connection.driver_connection
        assert driver is not None
        with driver.cursor(name=f"preflab_export_{uuid.uuid4().hex[:12]}", binary=True) as cursor:
            cursor.itersize = self.batch_size
            cursor.execute(str(compiled), compiled.params)
            while rows := cursor.fetchmany(self.batch_size):
                yield rows

    def count(self, stmt: Select[Any]) -> int:
        return int(self.conn.execute(select(func.count()).select_from(stmt.order_by(None).subquery())).scalar() or 0)

    def advance(self, n: int) -> None:
        self.done += n
        self.progress(self.done, self.total)


PAIR_SCALARS = ("pair_id", "prompt_id", "ranking_id", "chosen_id", "rejected_id", "source", "margin", "weight", "p")


def _pairs_raw(run: _Run) -> Iterator[Columns]:
    base = _pairs_select(run.spec)
    if "min_agreement" in run.spec.filters:
        # Agreement of a pair = share of the (filtered) votes on its unordered pair that point its way.
        lo, hi = _lo_hi(run.conn, Pair.chosen_id, Pair.rejected_id)
        votes = func.count().over(partition_by=(Pair.prompt_id, lo, hi))
        same = func.count().over(partition_by=(Pair.prompt_id, lo, hi, Pair.chosen_id))
        inner = base.add_columns(votes.label("n_votes"), same.label("n_same")).subquery()
        cols = [c for c in inner.c if c.name not in ("n_votes", "n_same")]
        stmt = (select(*cols).where(inner.c.n_same >= run.spec.filters["min_agreement"] * inner.c.n_votes)
                .order_by(inner.c.pair_id))
    else:
        stmt = base.order_by(Pair.id)
    run.total = run.count(stmt)
    for rows in run.stream_tuples(stmt):
        # Column-wise: transpose the batch once instead of appending field by field.
        cols: Columns = dict(zip(PAIR_SCALARS, _unzip(rows, len(PAIR_SCALARS)), strict=True))
        labels = run.ranking_labels(sorted(set(cols["ranking_id"])))
        cols["annotator"], cols["rubric_version"], cols["constitution_version"] = _unzip(
            _lookup(labels, cols["ranking_id"]), 3)
        run.fill_texts(cols)
        run.sources.update(cols["source"])
        run.splits.update(cols["split"])
        run.rubric_versions.update(v for v in set(cols["rubric_version"]) if v is not None)
        run.constitution_versions.update(v for v in set(cols["constitution_version"]) if v is not None)
        yield {name: cols[name] for name in PAIR_COLUMNS}
        run.advance(len(rows))


PAIR_COLUMNS = ("pair_id", "prompt_id", "ranking_id", "prompt", "chosen", "rejected", "chosen_id", "rejected_id",
                "source", "annotator", "rubric_version", "constitution_version", "margin", "weight", "p", "split")
AGG_COLUMNS = ("pair_id", "prompt_id", "ranking_ids", "prompt", "chosen", "rejected", "chosen_id", "rejected_id",
               "source", "annotators", "rubric_versions", "constitution_versions", "margin", "weight", "p", "votes",
               "total_votes", "agreement", "split")


def _pairs_aggregated(run: _Run) -> Iterator[Columns]:
    """One row per (prompt, unordered completion pair): the majority direction, its votes and agreement.

    agreement = majority votes / all votes on the pair, and is the row's weight. A pair the votes split
    evenly on has no direction and is always dropped; any other disagreement ("conflict") is dropped
    with conflicts="drop" or kept at its lower weight with conflicts="keep". `p` is the mean soft label
    of the majority votes (1.0 for hard human labels). Rows are ordered by (prompt, lower id, higher id).
    """
    base = _pairs_select(run.spec)
    lo, hi = _lo_hi(run.conn, Pair.chosen_id, Pair.rejected_id)
    stmt = base.add_columns(lo.label("lo"), hi.label("hi")).order_by(Pair.prompt_id, lo, hi, Pair.id)
    run.total = run.count(base)
    min_agreement = run.spec.filters.get("min_agreement")
    scalar_columns = [n for n in AGG_COLUMNS if n not in ("prompt", "chosen", "rejected", "split")]
    labels: dict[int, tuple[str | None, int | None, int | None]] = {}
    cols: Columns = {n: [] for n in scalar_columns}
    group: list[Any] = []

    def emit() -> Columns:
        run.fill_texts(cols)
        run.splits.update(cols["split"])
        return {name: cols[name] for name in AGG_COLUMNS}

    def flush_group() -> None:
        forward = [g for g in group if g.chosen_id == g.lo]
        backward = [g for g in group if g.chosen_id != g.lo]
        if len(forward) == len(backward):
            return
        majority = forward if len(forward) > len(backward) else backward
        agreement = len(majority) / len(group)
        if (run.spec.conflicts == "drop" and agreement < 1.0) or (
                min_agreement is not None and agreement < min_agreement):
            return
        first = majority[0]
        sources = sorted({g.source for g in majority})
        cols["pair_id"].append(first.pair_id)
        cols["prompt_id"].append(first.prompt_id)
        cols["ranking_ids"].append([g.ranking_id for g in majority])
        cols["chosen_id"].append(first.chosen_id)
        cols["rejected_id"].append(first.rejected_id)
        cols["source"].append(sources[0] if len(sources) == 1 else "mixed")
        votes = [labels[g.ranking_id] for g in majority]
        cols["annotators"].append([v[0] for v in votes if v[0] is not None])
        cols["rubric_versions"].append(sorted({v[1] for v in votes if v[1] is not None}))
        cols["constitution_versions"].append(sorted({v[2] for v in votes if v[2] is not None}))
        cols["margin"].append(sum(g.margin for g in majority) / len(majority))
        cols["weight"].append(agreement)
        cols["p"].append(sum(float(g.p) for g in majority) / len(majority))
        cols["votes"].append(len(majority))
        cols["total_votes"].append(len(group))
        cols["agreement"].append(agreement)
        run.sources[cols["source"][-1]] += 1
        run.rubric_versions.update(cols["rubric_versions"][-1])
        run.constitution_versions.update(cols["constitution_versions"][-1])

    for rows in run.stream(stmt):
        labels.update(run.ranking_labels(sorted({r.ranking_id for r in rows} - labels.keys())))
        for r in rows:
            if group and (group[0].prompt_id, group[0].lo, group[0].hi) != (r.prompt_id, r.lo, r.hi):
                flush_group()
                group = []
                if len(labels) > 4 * run.batch_size:  # bounded: keep only the labels the open group may need
                    labels = {k: v for k, v in labels.items() if k in {x.ranking_id for x in rows}}
            group.append(r)
        if len(cols["pair_id"]) >= run.batch_size:
            yield emit()
            cols = {n: [] for n in scalar_columns}
        run.advance(len(rows))
    if group:
        flush_group()
    if cols["pair_id"]:
        yield emit()


def _lookup(mapping: dict[Any, Any], keys: list[Any]) -> list[Any]:
    """[mapping[k] for k in keys], in C: itemgetter fetches a whole batch in one call."""
    if not keys:
        return []
    if len(keys) == 1:
        return [mapping[keys[0]]]
    return list(itemgetter(*keys)(mapping))


def _unzip(rows: list[Any], width: int) -> list[list[Any]]:
    """Rows → columns (zip(*rows) in C), with `width` empty columns for an empty batch."""
    return list(zip(*rows, strict=True)) if rows else [() for _ in range(width)]  # type: ignore[list-item]


LOOKUP_CHUNK = 10_000
"""Ids per IN (…) lookup: under SQLite's and psycopg's bound-parameter limits."""


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), LOOKUP_CHUNK):
        yield ids[start:start + LOOKUP_CHUNK]


def _id_in(conn: Connection, column: Any, ids: list[int]) -> Any:
    """`column IN ids`: one array parameter on Postgres (`= ANY(%s)`), bound parameters elsewhere."""
    if conn.dialect.name == "postgresql":
        return column == func.any(literal(ids, ARRAY(BigInteger)))
    return column.in_(ids)


def _completion_texts_by_id(conn: Connection, completion_ids: list[int]) -> dict[int, str]:
    return {cid: text for chunk in _chunks(completion_ids) for cid, text in conn.execute(
        select(Completion.id, Completion.text).where(_id_in(conn, Completion.id, chunk))).all()}


def _completion_texts(run: _Run, prompt_ids: set[int]) -> dict[int, str]:
    return {cid: text for chunk in _chunks(sorted(prompt_ids)) for cid, text in run.conn.execute(
        select(Completion.id, Completion.text).where(_id_in(run.conn, Completion.prompt_id, chunk))).all()}


def _rankings(run: _Run) -> Iterator[Columns]:
    stmt = _rankings_select(run.spec, run.conversational).order_by(Ranking.id)
    run.total = run.count(stmt)
    names = ("ranking_id", "prompt_id", "prompt", "completion_ids", "completions", "tiers", "source", "annotator",
             "rubric_version", "constitution_version", "flags", "split")
    for rows in run.stream(stmt):
        texts = _completion_texts(run, {r.prompt_id for r in rows})
        cols: Columns = {n: [] for n in names}
        for r in rows:
            tiers = [sorted(int(c) for c in tier) for tier in r.tiers]
            ids = sorted(c for tier in tiers for c in tier)
            cols["ranking_id"].append(r.ranking_id)
            cols["prompt_id"].append(r.prompt_id)
            cols["prompt"].append(run.prompt(r.prompt, r.prompt_text) if run.conversational else r.prompt)
            cols["completion_ids"].append(ids)
            cols["completions"].append([texts[c] for c in ids])
            cols["tiers"].append(tiers)
            cols["source"].append(r.source)
            cols["annotator"].append(run.annotator(r.annotator_id, r.judge_run_id))
            cols["rubric_version"].append(r.rubric_version)
            cols["constitution_version"].append(r.constitution_version)
            cols["flags"].append(json.dumps(r.flags or {}, sort_keys=True, ensure_ascii=False))
            cols["split"].append(r.split)
            if r.rubric_version is not None:
                run.rubric_versions.add(r.rubric_version)
            if r.constitution_version is not None:
                run.constitution_versions.add(r.constitution_version)
        run.sources.update(cols["source"])
        run.splits.update(cols["split"])
        yield cols
        run.advance(len(rows))


def _prompts(run: _Run) -> Iterator[Columns]:
    stmt = (select(Prompt.id, Prompt.messages if run.conversational else Prompt.text, Prompt.text, Prompt.reference,
                   Prompt.split).where(Prompt.project_id == run.spec.project_id).order_by(Prompt.id))
    if "split" in run.spec.filters:
        stmt = stmt.where(Prompt.split == run.spec.filters["split"])
    run.total = run.count(stmt)
    for rows in run.stream(stmt):
        cols: Columns = {"prompt_id": [], "prompt": [], "reference": [], "split": []}
        for prompt_id, value, text, reference, split in rows:
            cols["prompt_id"].append(prompt_id)
            cols["prompt"].append(run.prompt(value, text) if run.conversational else value)
            cols["reference"].append(reference)
            cols["split"].append(split)
        run.splits.update(cols["split"])
        yield cols
        run.advance(len(rows))


SFT_COLUMNS = ("prompt_id", "prompt", "completion", "completion_id", "origin", "votes", "rankings", "split")


def _sft_best_ranked(run: _Run) -> Iterator[Columns]:
    """Per prompt, the completion most often placed in the top tier (then best mean tier, then lowest id)."""
    rankings = _rankings_select(run.spec, run.conversational).order_by(Ranking.prompt_id, Ranking.id)
    run.total += run.count(rankings)
    picked: list[tuple[int, Any, Any, str, int, int, int]] = []  # prompt, value, text, split, completion, votes, n

    def pick(group: list[Any]) -> None:
        top: Counter[int] = Counter()
        tier_sum: Counter[int] = Counter()
        seen: Counter[int] = Counter()
        for g in group:
            for index, tier in enumerate(g.tiers):
                for c in tier:
                    tier_sum[int(c)] += index
                    seen[int(c)] += 1
                    if index == 0:
                        top[int(c)] += 1
        best = min(top, key=lambda c: (-top[c], tier_sum[c] / seen[c], c))
        first = group[0]
        picked.append((first.prompt_id, first.prompt, first.prompt_text, first.split, best, top[best], len(group)))

    def emit() -> Columns:
        texts = _completion_texts(run, {p[0] for p in picked})
        cols: Columns = {n: [] for n in SFT_COLUMNS}
        for prompt_id, value, text, split, completion_id, votes, n in picked:
            cols["prompt_id"].append(prompt_id)
            cols["prompt"].append(run.prompt(value, text) if run.conversational else value)
            cols["completion"].append(run.response(texts[completion_id]))
            cols["completion_id"].append(completion_id)
            cols["origin"].append("best_ranked")
            cols["votes"].append(votes)
            cols["rankings"].append(n)
            cols["split"].append(split)
        run.sources.update(cols["origin"])
        run.splits.update(cols["split"])
        picked.clear()
        return cols

    group: list[Any] = []
    for rows in run.stream(rankings):
        for r in rows:
            if group and group[0].prompt_id != r.prompt_id:
                pick(group)
                group = []
            group.append(r)
            if r.rubric_version is not None:
                run.rubric_versions.add(r.rubric_version)
        if len(picked) >= run.batch_size:
            yield emit()
        run.advance(len(rows))
    if group:
        pick(group)
    if picked:
        yield emit()


def _sft_cai_revisions(run: _Run) -> Iterator[Columns]:
    """Revisions a lead accepted in the supervised CAI stage (critique → revision), in id order."""
    value = Prompt.messages if run.conversational else Prompt.text
    stmt = (select(Completion.id, Completion.text, Completion.meta.label("meta"), Prompt.id.label("prompt_id"),
                   value.label("prompt"), Prompt.text.label("prompt_text"), Prompt.split)
            .join(Prompt, Completion.prompt_id == Prompt.id)
            .where(Prompt.project_id == run.spec.project_id, Completion.source == "revision")
            .order_by(Completion.id))
    if "split" in run.spec.filters:
        stmt = stmt.where(Prompt.split == run.spec.filters["split"])
    run.total += run.count(stmt)
    for rows in run.stream(stmt):
        cols: Columns = {n: [] for n in SFT_COLUMNS}
        for r in rows:
            if (r.meta or {}).get("status") != "accepted":
                continue
            cols["prompt_id"].append(r.prompt_id)
            cols["prompt"].append(run.prompt(r.prompt, r.prompt_text) if run.conversational else r.prompt)
            cols["completion"].append(run.response(r.text))
            cols["completion_id"].append(r.id)
            cols["origin"].append("cai_revision")
            cols["votes"].append(0)
            cols["rankings"].append(0)
            cols["split"].append(r.split)
        run.sources.update(cols["origin"])
        run.splits.update(cols["split"])
        run.advance(len(rows))
        if cols["prompt_id"]:
            yield cols


# Where SFT rows come from, in output order; each yields batches with SFT_COLUMNS and a distinct `origin`.
SFT_SOURCES: tuple[Callable[[_Run], Iterator[Columns]], ...] = (_sft_best_ranked, _sft_cai_revisions)


def _sft(run: _Run) -> Iterator[Columns]:
    for source in SFT_SOURCES:
        yield from source(run)


def _producer(spec: ExportSpec) -> Callable[[_Run], Iterator[Columns]]:
    if spec.kind == "pairs":
        return _pairs_aggregated if spec.aggregation == "aggregated" else _pairs_raw
    return {"rankings": _rankings, "prompts": _prompts, "sft": _sft}[spec.kind]


# ---------------------------------------------------------------------------------------------------------
# The export
# ---------------------------------------------------------------------------------------------------------


def _is_conversational(conn: Connection, project_id: int) -> bool:
    """A project with any chat prompt exports every prompt as messages: one column type for all rows."""
    stmt = select(Prompt.id).where(Prompt.project_id == project_id, Prompt.messages.is_not(None)).limit(1)
    if conn.dialect.name != "postgresql":
        stmt = stmt.where(cast(Prompt.messages, Text) != "null")
    else:
        stmt = stmt.where(func.jsonb_typeof(Prompt.messages) == "array")
    return conn.execute(stmt).first() is not None


def write_export(engine: Engine, spec: ExportSpec, out_dir: Path, *, secret: str,
                 batch_size: int = DEFAULT_BATCH, progress: Progress | None = None) -> WriteResult:
    """Write the export into `out_dir` (created by an atomic rename of a temp directory beside it).

    `progress(done, total)` is called after every batch; it may raise to stop the export, in which case
    nothing is left behind. An existing `out_dir` (a retried job) is replaced.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with snapshot(engine) as (conn, snap):
            project = conn.execute(select(Project.name, Project.description, Project.settings)
                                   .where(Project.id == spec.project_id)).one()
            conversational = _is_conversational(conn, spec.project_id)
            schema = schema_for(spec.kind, spec.aggregation, conversational)
            license_id = str((project.settings or {}).get("license") or "unknown")
            run = _Run(conn, spec, secret, conversational, batch_size, progress or (lambda done, total: None))
            sink = _sink(spec.format, tmp, spec.kind, schema, license_id)
            rows = 0
            try:
                for columns in _producer(spec)(run):
                    n = len(next(iter(columns.values())))
                    sink.write(columns)
                    rows += n
            finally:
                sink.close()
            data_files = {name: sink.hashed.get(name) or _sha256(p)
                          for p in sorted(tmp.rglob("*")) if p.is_file() and (name := str(p.relative_to(tmp)))}
            card = render_card(conn, spec, project_name=project.name, description=project.description or "",
                               license_id=license_id, schema=schema, rows=rows, sources=run.sources,
                               splits=run.splits, rubric_versions=sorted(run.rubric_versions),
                               constitution_versions=sorted(run.constitution_versions), data_files=data_files,
                               conversational=conversational)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        files = data_files | {"README.md": _sha256(tmp / "README.md")}
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    counts = {f"source.{k}": v for k, v in sorted(run.sources.items())} | {
        f"split.{k}": v for k, v in sorted(run.splits.items())}
    return WriteResult(path=out_dir, files=files, sha256=manifest_sha256(files), row_count=rows, row_counts=counts,
                       snapshot=snap)




# ---------------------------------------------------------------------------------------------------------
# The dataset card
# ---------------------------------------------------------------------------------------------------------

COLUMN_DOCS = {
    "pair_id": "preflab pair id (aggregated: the first pair voting for the majority direction)",
    "prompt_id": "preflab prompt id", "ranking_id": "the ranking the pair was expanded from",
    "ranking_ids": "every ranking that voted for this direction",
    "prompt": "the prompt (text, or chat messages in a conversational export)",
    "chosen": "the preferred response", "rejected": "the other response",
    "chosen_id": "completion id of `chosen`", "rejected_id": "completion id of `rejected`",
    "source": "human, ai or imported (aggregated: mixed when the votes came from several)",
    "annotator": "pseudonymous labeller id (see below); judge-run-N for an AI judge; empty for imports",
    "annotators": "pseudonymous ids of the majority voters",
    "rubric_version": "rubric version the label was given under", "rubric_versions": "rubric versions of the votes",
    "constitution_version": "constitution version of an AI label",
    "constitution_versions": "constitution versions of the votes",
    "margin": "tiers between chosen and rejected (aggregated: mean over the votes)",
    "weight": "loss weight (aggregated: the agreement)", "p": "soft label p(chosen ≻ rejected)",
    "votes": "votes for this direction", "total_votes": "votes on this pair in either direction",
    "agreement": "votes / total_votes",
    "split": "train or heldout, by prompt: a held-out prompt's rows are all heldout",
    "completion_ids": "the ranked completion ids, ascending", "completions": "their texts, in the same order",
    "tiers": "completion ids, best tier first; ids in one tier are tied",
    "flags": "JSON: completion id → flags the labeller raised", "reference": "reference answer, if any",
    "completion": "the SFT target response", "completion_id": "its completion id",
    "origin": "where the SFT row comes from (best_ranked: most often in the top tier)",
    "rankings": "rankings of the prompt considered",
}


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in (text or "").splitlines()) or "> (empty)"


FULL_REPORT_MAX_RANKINGS = 20_000
"""Above this many human rankings the card leaves the per-ranking report (Krippendorff's alpha, Kendall's tau,
computed in Python) to the agreement dashboard, so that an export stays a streaming pass over the data."""


def _fig(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _agreement_section(conn: Connection, project_id: int) -> list[str]:
    """Agreement of the project's human labels at the snapshot: vote agreement per completion pair (in SQL,
    any size) and, for projects up to FULL_REPORT_MAX_RANKINGS rankings, the dashboard's full report."""
    from app.services.agreement import project_report

    lo, hi = _lo_hi(conn, Pair.chosen_id, Pair.rejected_id)
    forward = func.sum(case((Pair.chosen_id < Pair.rejected_id, 1), else_=0))
    votes = (select(forward.label("f"), func.count().label("n"))
             .join(Ranking, Pair.ranking_id == Ranking.id)
             .where(Ranking.project_id == project_id, Ranking.source == "human")
             .group_by(Pair.prompt_id, lo, hi).having(func.count() >= 2).subquery())
    majority = case((votes.c.f * 2 >= votes.c.n, votes.c.f), else_=votes.c.n - votes.c.f)
    shared, mean_share, unanimous = conn.execute(select(
        func.count(), func.avg(majority * 1.0 / votes.c.n),
        func.sum(case((or_(votes.c.f == 0, votes.c.f == votes.c.n), 1), else_=0)))).one()
    lines = ["## Agreement (human labels of the whole project, at export time)", "",
             f"- completion pairs with two or more human votes: {shared}",
             f"- mean share of votes for the majority direction: {_fig(mean_share)}",
             f"- unanimous pairs: {int(unanimous or 0)}"]
    human = conn.execute(select(func.count(Ranking.id)).where(Ranking.project_id == project_id,
                                                                Ranking.source == "human")).scalar() or 0
    if human > FULL_REPORT_MAX_RANKINGS:
        lines += [f"- per-ranking figures (Kendall tau-b, Krippendorff alpha): see the agreement dashboard "
                  f"({human} human rankings is above the {FULL_REPORT_MAX_RANKINGS} the card computes)", ""]
        return lines
    with Session(bind=conn) as session:
        project = session.get(Project, project_id)
        report = project_report(session, project) if project is not None else None
    if report is not None:
        lines += [f"- human rankings: {report.human_rankings} ({report.skipped} skipped)",
                  f"- prompts ranked by two or more annotators: {report.shared_prompts}",
                  f"- ranking pairs compared: {report.comparisons}",
                  f"- mean pairwise agreement: {_fig(report.mean_agreement)}",
                  f"- mean Kendall tau-b: {_fig(report.mean_kendall_tau)}",
                  f"- Krippendorff alpha (ordinal): {_fig(report.krippendorff_alpha)}"]
    return lines + [""]


def render_card(conn: Connection, spec: ExportSpec, *, project_name: str, description: str, license_id: str,
                schema: pa.Schema, rows: int, sources: Counter[str], splits: Counter[str],
                rubric_versions: list[int], constitution_versions: list[int], data_files: dict[str, str],
                conversational: bool) -> str:
    """README.md for the export: what the rows are, how they were selected, and what the labels mean.

    Deterministic on purpose (no export id, date or snapshot), so the card hashes the same on every re-run.
    """

    lines = ["---", f"license: {json.dumps(license_id)}", f"pretty_name: {json.dumps('preflab: ' + project_name)}"]
    data_file = next((n for n in data_files if n.endswith((".jsonl", ".parquet"))), None)
    if data_file:
        lines += ["configs:", "- config_name: default", "  data_files:", "  - split: train",
                  f"    path: {json.dumps(data_file)}"]
    lines += ["---", "", f"# {project_name}: {spec.kind} export", ""]
    if description:
        lines += [description, ""]
    options = {"kind": spec.kind, "format": spec.format, "filters": spec.filters}
    if spec.kind == "pairs":
        options |= {"aggregation": spec.aggregation, "conflicts": spec.conflicts}
    lines += ["## Selection", "", "```json", json.dumps(options, indent=2, sort_keys=True), "```", ""]
    lines += ["## Counts", "", f"- rows: {rows}" + ("  (empty: the filters select nothing)" if rows == 0 else "")]
    lines += [f"- source {k}: {v}" for k, v in sorted(sources.items())]
    lines += [f"- split {k}: {v}" for k, v in sorted(splits.items())]
    lines += ["", "Splits are by prompt: every row of a held-out prompt is `heldout`, so held-out prompts never "
              "reach the train split.", ""]
    lines += ["## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{f.name}` | `{f.type}` | {COLUMN_DOCS.get(f.name, '')} |" for f in schema]
    lines += [""]
    if conversational:
        lines += ["Conversational layout: `prompt` is a list of chat messages and responses are one assistant "
                  "message each (TRL's conversational preference format).", ""]
    lines += ["## Labellers", "", "`annotator` is a pseudonym: the first 64 bits of HMAC-SHA256 over the project "
              "and user ids, keyed with the deployment's secret. It is stable within this project and cannot be "
              "mapped back to a person without that secret.", ""]
    for version in rubric_versions:
        text = conn.execute(select(Rubric.text).where(Rubric.project_id == spec.project_id,
                                                      Rubric.version == version)).scalar() or ""
        lines += [f"## Rubric version {version}", "", _quote(text), ""]
    for version in constitution_versions:
        principles = conn.execute(select(Constitution.principles).where(
            Constitution.project_id == spec.project_id, Constitution.version == version)).scalar() or []
        lines += [f"## Constitution version {version}", ""]
        for p in principles:
            lines += [f"- **{p.get('name', '')}** (priority {p.get('priority', '')}): {p.get('rationale', '')}"]
        lines += [""]
    lines += _agreement_section(conn, spec.project_id)
    lines += ["## Files", "", "```"] + [f"{h}  {n}" for n, h in sorted(data_files.items())] + ["```", ""]
    return "\n".join(lines)
