"""The JSONL writer's bytes: exactly `json.dumps(row, ensure_ascii=False, separators=(",", ":"))` per line, however
the batch is cut into pieces (merged low-cardinality runs, folded keys, Arrow-escaped strings) and however the file
is written (O_DIRECT through an aligned stage, or buffered); hashes describe the file; a failure leaves nothing.

The end-to-end test compares a real export of a project full of awkward text (quotes, backslashes, newlines and
other control characters, HTML, emoji, U+2028) with `json.dumps` of the same rows read back from a Parquet export of
the same snapshot, on SQLite and Postgres.
"""

from __future__ import annotations

import hashlib
import json
import random
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.annotation.pairs import expand_tiers
from app.exports import sinks as export_sinks
from app.exports import writer as export_writer
from app.exports.sinks import DirectFile, JsonlSink, json_strings
from app.models import Completion, Pair, Prompt, Ranking

# NUL only in the unit tests: Postgres text cannot hold it.
ALPHABET = ["a", "Z", "é", "✓", '"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x0b", "\x1f", "\x7f",
            "\u2028", "\u2029", "<", ">", "&", "😀", "'", "/", " ", "</script>"]
TRICKY = ['say "hi"\n<b>bold</b> & <script>alert(1)</script>', "back\\slash \\n not a newline", "tab\there\r\n",
          "emoji 😀 and e\u0301 combining, CJK 漢字, RTL שלום", "bell \x07 vt \x0b esc \x1b us \x1f",
          "line sep \u2028 para sep \u2029", "", " ", "{\"json\": [1, 2]}", "'single' `back`"]


def _expected(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows).encode()


def test_json_strings_equal_encode_basestring() -> None:
    rng = random.Random(7)
    values = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    values += TRICKY + [None]
    assert json_strings(pa.array(values)).to_pylist() == [None if v is None else encode_basestring(v)
                                                          for v in values]


def _random_batch(rng: random.Random, n: int) -> tuple[pa.Schema, list[pa.Array]]:
    words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 10))) for _ in range(15)] + TRICKY
    schema = pa.schema([("i", pa.int64()), ("s", pa.string()), ("few", pa.string()), ("f", pa.float64()),
                        ("k", pa.int64()), ("d", pa.dictionary(pa.int32(), pa.string())),
                        ("d2", pa.dictionary(pa.int32(), pa.string())), ("l", pa.list_(pa.int64())),
                        ("m", export_writer.MESSAGES), ("t", pa.string())])
    dictionary = pa.array(words)
    msgs = [{"role": "user", "content": rng.choice(words)}]
    arrays = [
        pa.array([rng.choice([None, rng.randint(-10**15, 10**15)]) for _ in range(n)], pa.int64()),
        pa.array([rng.choice(words + [None]) for _ in range(n)]),
        pa.array([rng.choice(["human", "ai", None]) for _ in range(n)]),
        pa.array([rng.choice([1.0, 0.1, 1 / 3, None, 0.0, -0.0, 1e300, 2.5e-8]) for _ in range(n)]),
        pa.array([rng.choice([1, 2, None]) for _ in range(n)], pa.int64()),
        pa.DictionaryArray.from_arrays(pa.array([rng.choice([None, *range(len(words))]) for _ in range(n)],
                                                pa.int32()), dictionary),
        pa.DictionaryArray.from_arrays(pa.array([rng.randrange(len(words)) for _ in range(n)], pa.int32()),
                                       dictionary),  # shares the dictionary, as chosen and rejected do
        pa.array([rng.choice([[1, 2], [], None]) for _ in range(n)], pa.list_(pa.int64())),
        pa.array([rng.choice([msgs, None]) for _ in range(n)], export_writer.MESSAGES),
        pa.array([rng.choice(["train", "heldout"]) for _ in range(n)]),
    ]
    return schema, arrays


@pytest.mark.parametrize("direct", [True, False])
def test_random_batches_are_exactly_json_dumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               direct: bool) -> None:
    """Random batches (nulls everywhere, shared dictionaries, few and many distinct values, sizes either side of
    the O_DIRECT stage and block) against json.dumps; with and without O_DIRECT."""
    if not direct:
        monkeypatch.delattr(export_sinks.os, "O_DIRECT", raising=False)
    monkeypatch.setattr(DirectFile, "STAGE", 3 * DirectFile.ALIGN)  # many stage flushes and a partial tail
    rng = random.Random(3)
    for trial in range(25):
        schema, arrays = _random_batch(rng, rng.choice([1, 2, 7, 100, 600]))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        out = tmp_path / str(trial)
        out.mkdir()
        sink = JsonlSink(out, "t", schema)
        assert sink.out.direct is direct
        sink.write(batch)
        sink.write(batch.slice(len(batch) // 2))
        sink.close()
        plain = pa.Table.from_batches([export_sinks.decoded(batch, pa.schema(
            [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema]))])
        rows = plain.to_pylist()
        data = (out / "t.jsonl").read_bytes()
        assert data == _expected(rows + rows[len(rows) // 2:]), trial
        assert sink.hashed["t.jsonl"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("direct", [True, False])
def test_a_failed_write_raises_and_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool) -> None:
    """A disk error mid-file reaches the caller, from the O_DIRECT thread too (the export then fails and removes
    its temp directory); a second close after it does nothing."""
    if not direct:
        monkeypatch.delattr(export_sinks.os, "O_DIRECT", raising=False)
    file = DirectFile(tmp_path / "x")
    assert file.direct is direct

    def full(fd: int, data: memoryview) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_sinks.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        for _ in range(4):  # the thread's error surfaces at a later hand-over or at the latest in close()
            file.write(memoryview(b"x" * (DirectFile.STAGE + 1)))
        file.close()
    monkeypatch.undo()
    if direct and file.fd != -1:  # write() raised the thread's error: close() says it again, and releases all
        with pytest.raises(OSError, match="No space"):
            file.close()
    file.close()
    assert file.fd == -1
    file.close()


def _tricky_project(db, make_user, make_project):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3, overlap=2)
    people = [make_user(db, "annotator") for _ in range(2)]
    for i, text in enumerate(TRICKY):
        prompt = Prompt(project_id=project.id, text=f"{text} #{i}", text_hash=f"tricky-{i}",
                        split="heldout" if i % 4 == 0 else "train", reference=TRICKY[-1 - i])
        db.add(prompt)
        db.flush()
        cs = [Completion(prompt_id=prompt.id, text=TRICKY[(i + j) % len(TRICKY)] + f" ({j})") for j in range(3)]
        db.add_all(cs)
        db.flush()
        for n, who in enumerate(people):
            order = cs if n == 0 else list(reversed(cs))
            tiers = [[c.id] for c in order] if i % 3 else [[order[0].id, order[1].id], [order[2].id]]
            ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=who.id,
                              rubric_id=project.current_rubric_id, tiers=tiers,
                              display_order=[c for t in tiers for c in t])
            db.add(ranking)
            db.flush()
            for spec in expand_tiers(tiers):
                db.add(Pair(ranking_id=ranking.id, prompt_id=prompt.id, chosen_id=spec.chosen,
                            rejected_id=spec.rejected, margin=spec.margin, source="human",
                            weight=0.5 if i % 2 else 1.0, p=0.9 if i % 5 == 0 else 1.0))
    db.flush()
    db.commit()
    return project


@pytest.mark.parametrize(("batch_size", "layout"), [(7, None), (export_writer.DEFAULT_BATCH, None),
                                                    (7, "conversational")])
def test_a_tricky_project_exports_the_bytes_json_dumps_gives(db, engine, make_user, make_project, tmp_path,
                                                             batch_size: int, layout: str | None) -> None:
    """Whole exports, SQLite and Postgres (Postgres: the COPY scan), text and message-list layouts: JSONL bytes
    equal json.dumps of the rows of a Parquet export of the same data, file hashes equal the files, and the
    manifest hash covers them."""
    project = _tricky_project(db, make_user, make_project)
    for kind in ("pairs", "rankings", "prompts", "sft"):
        results = {}
        for fmt in ("jsonl", "parquet"):
            spec = export_writer.ExportSpec(project.id, kind, fmt, layout=layout)
            results[fmt] = export_writer.write_export(engine, spec, tmp_path / kind / fmt, secret="s" * 40,
                                                      batch_size=batch_size)
        rows = pq.read_table(tmp_path / kind / "parquet" / f"{kind}.parquet").to_pylist()
        assert rows, kind
        data = (tmp_path / kind / "jsonl" / f"{kind}.jsonl").read_bytes()
        assert data == _expected(rows), kind
        jsonl = results["jsonl"]
        for name, sha in jsonl.files.items():
            assert hashlib.sha256((tmp_path / kind / "jsonl" / name).read_bytes()).hexdigest() == sha
        assert jsonl.sha256 == export_sinks.manifest_sha256(jsonl.files)
        assert jsonl.row_count == len(rows)


def test_a_writer_failure_mid_export_leaves_nothing(db, engine, make_user, make_project, tmp_path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fails on the second batch: the export raises, and neither its directory nor its temp one stays."""
    project = _tricky_project(db, make_user, make_project)
    real = JsonlSink.write
    calls = []

    def failing(self: JsonlSink, batch: pa.RecordBatch) -> None:
        calls.append(batch.num_rows)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(self, batch)

    monkeypatch.setattr(JsonlSink, "write", failing)
    with pytest.raises(OSError, match="No space"):
        export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", "jsonl"),
                                   tmp_path / "x" / "1", secret="s" * 40, batch_size=5)
    assert len(calls) >= 2
    assert list((tmp_path / "x").iterdir()) == []
