"""The export writer: streams one database snapshot into JSONL, Parquet or a `datasets` directory, byte-stable.

One read transaction (REPEATABLE READ on Postgres, a deferred WAL read on SQLite) sees the whole export,
so annotation that lands meanwhile never makes it inconsistent (`export_queries`). Rows come in `batch_size`
Arrow batches and leave as soon as a background writer has them (`export_sinks`): memory is bounded by a few
batches, not the export. Raw pairs, the big case, are assembled column-wise without Python work per row.

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
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import Connection, Engine, Select, Text, cast, func, select

from app.exports import steps as export_steps
from app.exports.card import agreement_section, render_card
from app.exports.queries import (
    ExportSpec,
    PackedScan,
    Snapshot,
    chunks,
    id_in,
    lo_hi,
    pair_scan_select,
    pairs_select,
    rankings_select,
    snapshot,
)
from app.exports.sinks import WriteBehind, file_sha256, hf_features, make_sink, manifest_sha256
from app.models import LABEL_SOURCES, SPLITS, Completion, Constitution, Pair, Project, Prompt, Ranking, Rubric
from training.shared.files import replace_dir

__all__ = ["ExportSpec", "WriteResult", "annotator_pseudonym", "hf_features", "manifest_sha256", "schema_for",
           "write_export"]

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


@dataclass
class WriteResult:
    """What one write made: the export's directory, its files and hashes, its row counts, the snapshot it read."""

    path: Path
    files: dict[str, str]
    """Relative file name → sha256, every file of the export (card included)."""
    sha256: str
    """sha256 over the sorted "name  sha256" lines of `files`: one hash for the whole export."""
    row_count: int
    row_counts: dict[str, int]
    """Rows per labeller (`source.human`, `source.ai`, `source.mixed`, …) and, for steps exports, per split
    (`split.<name>`), as the export's record keeps them."""
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
    elif kind == "steps":
        fields = list(export_steps.schema())
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


# ---------------------------------------------------------------------------------------------------------
# Row producers: each yields column batches and counts what it wrote
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    snap: Snapshot
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

    @property
    def conn(self) -> Connection:
        return self.snap.conn

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

    def response(self, text: str, meta: Any = None) -> Any:
        """Conversational exports: the response's stored turns (a multi-turn chat response), or one assistant
        turn."""
        if not self.conversational:
            return text
        turns = meta.get("messages") if isinstance(meta, dict) else None
        if isinstance(turns, list) and turns:
            return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in turns]
        return [{"role": "assistant", "content": text}]

    def ranking_labels(self, ranking_ids: list[int]) -> dict[int, tuple[str | None, int | None, int | None]]:
        """ranking id → (annotator pseudonym, rubric version, constitution version), for one batch."""
        out: dict[int, tuple[str | None, int | None, int | None]] = {}
        for chunk in chunks(ranking_ids):
            stmt = (select(Ranking.id, Ranking.annotator_id, Ranking.judge_run_id, Rubric.version, Constitution.version)
                    .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
                    .outerjoin(Constitution, Ranking.constitution_id == Constitution.id)
                    .where(id_in(self.conn, Ranking.id, chunk)))
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
                   for chunk in chunks(prompt_ids)
                   for pid, value, text, split in self.conn.execute(
                       select(Prompt.id, value_column, Prompt.text, Prompt.split)
                       .where(id_in(self.conn, Prompt.id, chunk))).all()}
        if self.conversational:
            texts = {cid: self.response(text, meta) for chunk in chunks(completion_ids)
                     for cid, text, meta in self.conn.execute(
                         select(Completion.id, Completion.text, Completion.meta)
                         .where(id_in(self.conn, Completion.id, chunk))).all()}
        else:
            texts = _completion_texts_by_id(self.conn, completion_ids)
        cols["prompt"], cols["split"] = _unzip(_lookup(prompts, cols["prompt_id"]), 2)
        cols["chosen"] = _lookup(texts, cols["chosen_id"])
        cols["rejected"] = _lookup(texts, cols["rejected_id"])

    def stream(self, stmt: Select[*tuple[Any, ...]]) -> Iterator[Sequence[Any]]:
        # Per statement: Connection.execution_options() would switch every later lookup to a server-side cursor.
        result = self.conn.execute(stmt, execution_options={"stream_results": True, "yield_per": self.batch_size})
        yield from result.partitions(self.batch_size)

    def scan(self, stmt: Select[*tuple[Any, ...]], schema: pa.Schema, packed: PackedScan | None = None
             ) -> Iterator[pa.RecordBatch]:
        """The rows of `stmt` as Arrow batches of exactly `batch_size` rows (the last one shorter).

        Postgres with a `packed` layout: binary records by COPY on the snapshot's second connection, decoded by
        numpy, so no Python object is made per row. Otherwise the rows in batches through the cursor, transposed
        once.
        """
        if self.snap.can_copy and packed is not None:
            sql, params = packed.sql(self.conn, stmt)
            yield from _rebatch((packed.decode(r) for r in self.snap.copy_records(sql, params)), schema,
                                self.batch_size)
            return
        for rows in self.stream(stmt):
            columns = _unzip(rows, len(schema))
            yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
                                             schema=schema)

    def lookup(self, stmt: Select[*tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """A keyed lookup's rows; on Postgres from a binary psycopg cursor, without SQLAlchemy's row objects."""
        if self.conn.dialect.name != "postgresql":
            return [tuple(r) for r in self.conn.execute(stmt).all()]
        compiled = stmt.compile(dialect=self.conn.dialect, compile_kwargs={"render_postcompile": True})
        driver = self.conn.connection.driver_connection
        assert driver is not None
        with driver.cursor(binary=True) as cursor:
            cursor.execute(str(compiled), compiled.params)
            return cursor.fetchall()

    def by_id(self, column: pa.Array, table_id: Any, values: tuple[Any, ...], make: Callable[..., Any],
              value_type: pa.DataType) -> pa.DictionaryArray:
        """`column` (ids) as a dictionary array: each distinct id's row is fetched once and made into one value
        by `make(*values)`; rows share it through their index."""
        ids = pc.unique(column).to_pylist()
        rows = [r for chunk in chunks(ids) for r in self.lookup(
            select(table_id, *values).where(id_in(self.conn, table_id, chunk)))]
        found = pa.array([r[0] for r in rows], pa.int64())
        dictionary = pa.array([make(*r[1:]) for r in rows], value_type)
        return pa.DictionaryArray.from_arrays(pc.index_in(column, value_set=found), dictionary)

    def count(self, stmt: Select[*tuple[Any, ...]]) -> int:
        return int(self.conn.execute(select(func.count()).select_from(stmt.order_by(None).subquery())).scalar() or 0)

    def advance(self, n: int) -> None:
        self.done += n
        self.progress(self.done, self.total)


SCAN_SCHEMA = pa.schema([
    ("pair_id", pa.int64()), ("prompt_id", pa.int64()), ("ranking_id", pa.int64()), ("chosen_id", pa.int64()),
    ("rejected_id", pa.int64()), ("source", pa.string()), ("margin", pa.int64()), ("weight", pa.float64()),
    ("p", pa.float64()), ("annotator_id", pa.int64()), ("judge_run_id", pa.int64()),
    ("rubric_version", pa.int64()), ("constitution_version", pa.int64()), ("split", pa.string())])
"""The columns of `pair_scan_select`, in order."""
PACKED_SCAN = PackedScan(SCAN_SCHEMA, {"source": LABEL_SOURCES, "split": SPLITS}, block=DEFAULT_BATCH)


def _pairs_raw(run: _Run) -> Iterator[Columns | pa.RecordBatch]:
    """Raw pairs, column-wise in Arrow: the scan brings ids, numbers and labels; each batch's distinct prompts
    and responses are fetched once and attached as dictionary columns (a prompt's text is not repeated for
    each of its pairs until a sink needs plain strings)."""
    stmt = pair_scan_select(run.spec, run.conn)
    # The scan's joins are one-to-one (non-null foreign keys), so the bare filtered pairs count the same, in a
    # quarter of the time; the agreement filter's window is part of the count.
    run.total = run.count(stmt if "min_agreement" in run.spec.filters else pairs_select(run.spec))
    schema = schema_for("pairs", "raw", run.conversational)
    for scan in run.scan(stmt, SCAN_SCHEMA, PACKED_SCAN):
        col = dict(zip(SCAN_SCHEMA.names, scan.columns, strict=True))
        people = col["annotator_id"].dictionary_encode()
        names = pa.array([annotator_pseudonym(run.secret, run.spec.project_id, i)
                          for i in people.dictionary.to_pylist()], pa.string())
        # An AI judge is not a person: its run id is the lineage. Imported labels carry no labeller (null).
        judges = pc.binary_join_element_wise("judge-run-", pc.cast(col["judge_run_id"], pa.string()), "")
        annotator = pc.coalesce(names.take(people.indices), judges)
        text_type = schema.field("prompt").type
        if run.conversational:
            prompt = run.by_id(col["prompt_id"], Prompt.id, (Prompt.messages, Prompt.text), run.prompt, text_type)
        else:
            prompt = run.by_id(col["prompt_id"], Prompt.id, (Prompt.text,), _same, text_type)
        # chosen and rejected share one dictionary: fetch both columns' completions in one lookup
        n = scan.num_rows
        both = run.by_id(pa.concat_arrays([col["chosen_id"], col["rejected_id"]]), Completion.id,
                         (Completion.text, Completion.meta) if run.conversational else (Completion.text,),
                         run.response, text_type)
        columns = col | {"annotator": annotator, "prompt": prompt, "chosen": both.slice(0, n),
                         "rejected": both.slice(n)}
        batch = pa.RecordBatch.from_arrays([columns[name] for name in schema.names], names=schema.names)
        run.sources.update(_value_counts(col["source"]))
        run.splits.update(_value_counts(col["split"]))
        run.rubric_versions.update(pc.unique(col["rubric_version"]).drop_null().to_pylist())
        run.constitution_versions.update(pc.unique(col["constitution_version"]).drop_null().to_pylist())
        yield batch
        run.advance(n)


def _same(value: Any) -> Any:
    return value


def _value_counts(array: pa.Array) -> dict[Any, int]:
    counts = pc.value_counts(array)
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))


def _rebatch(tables: Iterator[pa.Table | pa.RecordBatch], schema: pa.Schema, size: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of tables into batches of exactly `size` rows (the last one shorter): batch boundaries,
    and so Parquet row groups, depend on the rows only, never on how the COPY stream happened to split."""
    pending: list[pa.Table] = []
    have = 0
    for table in tables:
        pending.append(pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table)
        have += table.num_rows
        while have >= size:
            merged = pa.concat_tables(pending).combine_chunks()
            yield _one_batch(merged.slice(0, size), schema)
            rest = merged.slice(size)
            pending, have = [rest], rest.num_rows
    if have:
        yield _one_batch(pa.concat_tables(pending), schema)


def _one_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=schema)


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
    base = pairs_select(run.spec)
    lo, hi = lo_hi(run.conn, Pair.chosen_id, Pair.rejected_id)
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


def _unzip(rows: Sequence[Any], width: int) -> list[Any]:
    """Rows → columns, as tuples (zip(*rows) in C), with `width` empty columns for an empty batch."""
    return list(zip(*rows, strict=True)) if rows else [() for _ in range(width)]


def _completion_texts_by_id(conn: Connection, completion_ids: list[int]) -> dict[int, str]:
    return {cid: text for chunk in chunks(completion_ids) for cid, text in conn.execute(
        select(Completion.id, Completion.text).where(id_in(conn, Completion.id, chunk))).all()}


def _completion_texts(run: _Run, prompt_ids: set[int]) -> dict[int, str]:
    return {cid: text for chunk in chunks(sorted(prompt_ids)) for cid, text in run.conn.execute(
        select(Completion.id, Completion.text).where(id_in(run.conn, Completion.prompt_id, chunk))).all()}


def _rankings(run: _Run) -> Iterator[Columns]:
    stmt = rankings_select(run.spec, run.conversational).order_by(Ranking.id)
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
    rankings = rankings_select(run.spec, run.conversational).order_by(Ranking.prompt_id, Ranking.id)
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


def _producer(spec: ExportSpec) -> Callable[[_Run], Iterator[Columns | pa.RecordBatch]]:
    if spec.kind == "pairs":
        return _pairs_aggregated if spec.aggregation == "aggregated" else _pairs_raw
    producers: dict[str, Callable[[_Run], Iterator[Columns | pa.RecordBatch]]] = {
        "rankings": _rankings, "prompts": _prompts, "sft": _sft, "steps": export_steps.rows}
    return producers[spec.kind]


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


class _AgreementBeside:
    """The card's agreement section, one GROUP BY over the whole project's pairs (14 s of a 6M-pair export when it
    ran after the rows), computed on a second connection in the same snapshot while the rows stream (Postgres).
    On SQLite `result()` is None and the card computes it at the end, in the export's one read transaction."""

    def __init__(self, snap: Snapshot, project_id: int) -> None:
        self.lines: list[str] | None = None
        self.error: BaseException | None = None
        self.driver: Any = None
        self.thread: threading.Thread | None = None
        if snap.can_copy:
            self.thread = threading.Thread(target=self._run, args=(snap, project_id), name="export-card-agreement",
                                           daemon=True)
            self.thread.start()

    def _run(self, snap: Snapshot, project_id: int) -> None:
        try:
            with snap.side() as side:
                self.driver = side.connection.driver_connection
                self.lines = agreement_section(side, project_id)
        except BaseException as exc:  # noqa: BLE001 - raised in the exporting thread by result()
            self.error = exc

    def result(self) -> list[str] | None:
        if self.thread is None:
            return None
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.lines

    def cancel(self) -> None:
        """The export failed: stop the query, and wait until its connection is back in the pool."""
        if self.thread is None or not self.thread.is_alive():
            return
        driver = self.driver
        if driver is not None:
            try:
                (getattr(driver, "cancel_safe", None) or driver.cancel)()
            except Exception:  # noqa: BLE001, S110 - the query may have just finished; the join below waits anyway
                pass
        self.thread.join()


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
        with snapshot(engine) as snap:
            conn = snap.conn
            project = conn.execute(select(Project.name, Project.description, Project.settings)
                                   .where(Project.id == spec.project_id)).one()
            conversational = spec.layout == "conversational" or (
                spec.layout is None and _is_conversational(conn, spec.project_id))
            schema = schema_for(spec.kind, spec.aggregation, conversational)
            license_id = str((project.settings or {}).get("license") or "unknown")
            run = _Run(snap, spec, secret, conversational, batch_size, progress or (lambda done, total: None))
            beside = _AgreementBeside(snap, spec.project_id)
            try:
                sink = WriteBehind(make_sink(spec.format, tmp, spec.kind, schema, license_id))
                rows = 0
                try:
                    for produced in _producer(spec)(run):
                        batch = produced if isinstance(produced, pa.RecordBatch) else pa.RecordBatch.from_pydict(
                            produced, schema=schema)
                        sink.write(batch)
                        rows += batch.num_rows
                finally:
                    sink.close()
                agreement = beside.result()
            except BaseException:
                beside.cancel()
                raise
            data_files = {name: sink.hashed.get(name) or file_sha256(p)
                          for p in sorted(tmp.rglob("*")) if p.is_file() and (name := str(p.relative_to(tmp)))}
            card = render_card(conn, spec, project_name=project.name, description=project.description or "",
                               license_id=license_id, schema=schema, rows=rows, sources=run.sources,
                               splits=run.splits, rubric_versions=sorted(run.rubric_versions),
                               constitution_versions=sorted(run.constitution_versions), data_files=data_files,
                               conversational=conversational, agreement=agreement)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        files = data_files | {"README.md": file_sha256(tmp / "README.md")}
        # On disk before the rename: the row's hashes must describe bytes that survive a power cut.
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    counts = {f"source.{k}": v for k, v in sorted(run.sources.items())} | {
        f"split.{k}": v for k, v in sorted(run.splits.items())}
    return WriteResult(path=out_dir, files=files, sha256=manifest_sha256(files), row_count=rows, row_counts=counts,
                       snapshot=snap.description)
