"""Where an export's Arrow batches go: one sink per file format (JSONL, Parquet, a `datasets` directory).

Every sink takes `pyarrow.RecordBatch`es in the export's schema, except that a text column may arrive
dictionary-encoded (the pairs producer sends each batch's distinct prompts and responses once, with indices):
JSONL encodes only the dictionary, Parquet and Arrow get plain strings. The bytes written depend on the
rows and the batch boundaries only, never on time or paths, so equal data gives equal files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import queue
import struct
import threading
from abc import ABC, abstractmethod
from json.encoder import encode_basestring  # the C encoder, ensure_ascii=False
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def hf_feature(t: pa.DataType) -> Any:
    """`datasets`' feature dict for one Arrow type (the types our schemas use)."""
    if pa.types.is_list(t):
        return {"feature": hf_feature(t.value_type), "_type": "List"}
    if pa.types.is_struct(t):
        return {t.field(i).name: hf_feature(t.field(i).type) for i in range(t.num_fields)}
    dtype = {pa.int64(): "int64", pa.float64(): "float64", pa.string(): "string", pa.bool_(): "bool"}[t]
    return {"dtype": dtype, "_type": "Value"}


def hf_features(schema: pa.Schema) -> dict[str, Any]:
    """`datasets.Features.from_arrow_schema(schema).to_dict()` for our column types, without importing
    `datasets` (a second of start-up and a hundred MB of the export's memory); a test checks they agree."""
    return {f.name: hf_feature(f.type) for f in schema}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_sha256(files: dict[str, str]) -> str:
    """One hash for the export: sha256 of "name  sha256\\n" lines in name order (sha256sum's layout)."""
    return hashlib.sha256("".join(f"{n}  {h}\n" for n, h in sorted(files.items())).encode()).hexdigest()


def decoded(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch with dictionary-encoded columns turned back into the schema's plain types."""
    columns = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _Sink(ABC):
    """Where an export's batches go: one subclass per file format."""

    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        self.root, self.kind, self.schema = root, kind, schema
        self.hashed: dict[str, str] = {}
        """sha256 of files hashed while they were written (saves re-reading a gigabyte of JSONL)."""

    @abstractmethod
    def write(self, batch: pa.RecordBatch) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class JsonlSink(_Sink):
    """One JSON object per line, keys in schema order, compact separators, UTF-8 text unescaped.

    Vectorised: a batch's lines are a dozen Arrow arrays of JSON text glued by one `binary_join_element_wise`, and
    the result's buffer is hashed and written as is. Strings are escaped by Arrow kernels (the few holding other
    control characters by Python's own encoder), integers with many values are cast in C, and the few distinct
    floats and small integers of a batch are encoded once in Python. Adjacent columns with few value combinations
    (source, annotator, versions, margin, weight, p, split: a few dozen per batch) become one array of whole
    `,"key":value,…` runs, and every key is folded into the array beside it, so the join glues a dozen pieces per
    line instead of two per column. The bytes are exactly what `json.dumps(row, ensure_ascii=False,
    separators=(",", ":"))` gives, with no Python work per row.
    """

    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        super().__init__(root, kind, schema)
        self.out = DirectFile(root / f"{kind}.jsonl")
        self.digest = hashlib.sha256()
        # allow_nan=False: NaN is not JSON and would break every reader downstream.
        self.encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        self._encoded: dict[tuple[int, ...], tuple[pa.Array, pa.Array]] = {}
        self.keys = [("{" if i == 0 else ",") + json.dumps(name) + ":" for i, name in enumerate(schema.names)]

    def fragments(self, array: pa.Array) -> pa.Array:
        """The JSON text of every value of one column (null → "null"), as a large_string array."""
        t = array.type
        if pa.types.is_integer(t):
            out = pc.cast(array, pa.large_string())
        elif _encodable(t):
            texts, index = self._values(array)
            return texts.take(pa.array(index))
        else:  # lists and structs: rare columns (rankings' tiers, message lists) encoded value by value
            out = pa.array([None if v is None else self.encode(v) for v in array.to_pylist()], pa.large_string())
        return pc.fill_null(out, "null") if out.null_count else out

    def _texts(self, values: pa.Array) -> pa.Array:
        """The JSON text of each value of a (dictionary's) array, as large_string; null → "null"."""
        t = values.type
        if pa.types.is_integer(t):
            out = pc.cast(values, pa.large_string())
        elif pa.types.is_floating(t):  # json's float repr ("1.0", "0.1"), which Arrow's cast does not give
            out = pa.array([None if v is None else self.encode(float(v)) for v in values.to_pylist()],
                           pa.large_string())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            out = json_strings(values)
        else:  # a dictionary of message lists (conversational prompts and responses): value by value
            out = pa.array([None if v is None else self.encode(v) for v in values.to_pylist()], pa.large_string())
        return pc.fill_null(out, "null") if out.null_count else out

    def _values(self, array: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """(JSON text of each distinct value, each row's index into it) for a string, float, integer or dictionary
        column. A dictionary (chosen and rejected share one) is encoded once per batch."""
        if pa.types.is_dictionary(array.type):
            dictionary = array.dictionary
            key = tuple(b.address if b is not None else 0 for b in dictionary.buffers()) + (len(dictionary),)
            if key not in self._encoded:
                self._encoded[key] = (dictionary, self._texts(dictionary))
            texts = self._encoded[key][1]
            indices = array.indices
        else:
            encoded = pc.dictionary_encode(array, null_encoding="encode")
            texts, indices = self._texts(encoded.dictionary), encoded.indices
        if indices.null_count:  # a null row of a dictionary column
            texts = pa.concat_arrays([texts, pa.array(["null"], pa.large_string())])
            indices = pc.fill_null(indices, len(texts) - 1)
        return texts, np.asarray(indices, dtype=np.int64)

    def _mergeable(self, column: pa.Array, limit: int) -> tuple[pa.Array, np.ndarray] | None:
        """(texts, index) of a column whose distinct values are encoded once each; None for integers with more
        than `limit` distinct values in the batch (cast in C instead) and for lists and structs."""
        t = column.type
        if pa.types.is_integer(t):
            encoded = pc.dictionary_encode(column, null_encoding="encode")
            if len(encoded.dictionary) > limit:
                return None
            return self._texts(encoded.dictionary), np.asarray(encoded.indices, dtype=np.int64)
        return self._values(column) if _encodable(t) else None

    def _pieces(self, batch: pa.RecordBatch) -> list[Any]:
        """The batch's lines as `binary_join_element_wise` arguments, in order: per-row text arrays and constant
        strings, a key folded into the array beside it wherever that array is made of per-value texts."""
        limit = max(16, batch.num_rows // 8)
        pieces: list[Any] = []
        run: list[tuple[str, pa.Array, np.ndarray]] = []  # adjacent columns with few value combinations
        for key, column in zip(self.keys, batch.columns, strict=True):
            values = self._mergeable(column, limit)
            if values is None:
                if run:
                    pieces.append(_Texts.merged(run))
                    run = []
                pieces += [key, self.fragments(column)]
                continue
            combinations = len(values[0]) * int(np.prod([len(t) for _, t, _ in run], dtype=np.int64))
            if run and combinations > limit:
                pieces.append(_Texts.merged(run))
                run = []
            run.append((key, *values))
        if run:
            pieces.append(_Texts.merged(run))
        pieces.append("}\n")
        return _fold_constants(pieces)

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._encoded = {}  # keyed by buffer address: the entry holds the dictionary, so addresses stay taken
        arrays = [p if isinstance(p, pa.Array) else pa.scalar(p, pa.large_string()) for p in self._pieces(batch)]
        self._encoded = {}
        glue = pa.scalar("", pa.large_string())
        lines = arrays[0] if len(arrays) == 1 else pc.binary_join_element_wise(*arrays, glue)
        # A fresh large_string array: its value buffer is the batch's lines, back to back.
        offsets, data = lines.buffers()[1], lines.buffers()[2]
        start, end = struct.unpack_from("<qq", offsets, 8 * lines.offset)[0], struct.unpack_from(
            "<q", offsets, 8 * (lines.offset + len(lines)))[0]
        view = memoryview(data)[start:end]
        self.digest.update(view)
        self.out.write(view)

    def close(self) -> None:
        self.out.close()
        self.hashed[f"{self.kind}.jsonl"] = self.digest.hexdigest()


def _encodable(t: pa.DataType) -> bool:
    """Columns whose distinct values are encoded once per batch: strings (plain or dictionary) and floats."""
    return pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or \
        pa.types.is_floating(t)


# json's escapes with ensure_ascii=False (json.encoder.ESCAPE_DCT): backslash first, since the others add one.
_SHORT_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\b", "\\b"),
                  ("\f", "\\f"))
_OTHER_CONTROL = r"[\x00-\x07\x0b\x0e-\x1f]"
"""Control characters json writes as \\u00XX: rare, so their strings are encoded by Python's encoder instead."""
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'
"""Any character json escapes: most texts have none, and skip the replacements."""


def json_strings(values: pa.Array) -> pa.Array:
    """`encode_basestring` (json's string encoder, ensure_ascii=False) of every value, by Arrow kernels: quotes
    around, and for the strings that need any escape, the short escapes by substring replacement (those holding
    other control characters by Python's encoder). Nulls stay null."""
    values = pc.cast(values, pa.large_string())
    escape = pc.fill_null(pc.match_substring_regex(values, _NEEDS_ESCAPE), False)
    if pc.any(escape).as_py():
        which = pc.indices_nonzero(escape)
        subset = values.take(which)
        odd = pc.match_substring_regex(subset, _OTHER_CONTROL)
        if pc.any(odd).as_py():
            escaped = pa.array([encode_basestring(v)[1:-1] for v in subset.to_pylist()], pa.large_string())
        else:
            escaped = subset
            for char, replacement in _SHORT_ESCAPES:
                escaped = pc.replace_substring(escaped, char, replacement)
        values = pc.replace_with_mask(values, escape, escaped)
    return _join('"', values, '"')


class _Texts:
    """Per-row JSON text as (distinct texts, each row's index into them), until constants beside it are folded
    into the texts (`_fold_constants`); then one `take` makes the per-row array."""

    def __init__(self, texts: pa.Array, index: np.ndarray) -> None:
        self.texts, self.index = texts, index

    @classmethod
    def merged(cls, run: list[tuple[str, pa.Array, np.ndarray]]) -> _Texts:
        """One piece for adjacent columns: each combination of their values that occurs is written out once,
        keys included (a single column: its texts with its key in front)."""
        if len(run) == 1:
            key, texts, index = run[0]
            return cls(_join(key, texts), index)
        sizes = [len(texts) for _, texts, _ in run]
        code = np.zeros(len(run[0][2]), dtype=np.int64)
        for size, (_, _, index) in zip(sizes, run, strict=True):
            code = code * size + index
        used = np.flatnonzero(np.bincount(code, minlength=int(np.prod(sizes, dtype=np.int64))))
        remap = np.zeros(int(np.prod(sizes, dtype=np.int64)), dtype=np.int64)
        remap[used] = np.arange(len(used))
        columns = [(key, texts.to_pylist()) for key, texts, _ in run]
        digits = []
        rest = used
        for size in reversed(sizes):
            digits.append(rest % size)
            rest = rest // size
        digits.reverse()
        texts = ["".join(key + values[d] for (key, values), d in zip(columns, combo, strict=True))
                 for combo in zip(*(d.tolist() for d in digits), strict=True)]
        return cls(pa.array(texts, pa.large_string()), remap[code])

    def fold(self, before: str = "", after: str = "") -> None:
        self.texts = _join(before, self.texts, after)

    def array(self) -> pa.Array:
        return self.texts.take(pa.array(self.index))


def _join(*parts: str | pa.Array) -> pa.Array:
    """Arrays and constant strings concatenated row by row (large_string)."""
    args = [pa.scalar(p, pa.large_string()) if isinstance(p, str) else p for p in parts]
    return pc.binary_join_element_wise(*args, pa.scalar("", pa.large_string()))


def _fold_constants(pieces: list[Any]) -> list[Any]:
    """Fold each constant string into the _Texts before it (else after it), join adjacent constants, and make the
    _Texts arrays."""
    out: list[Any] = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], _Texts):
            out[-1].fold(after=piece)
        elif isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
        elif isinstance(piece, _Texts) and out and isinstance(out[-1], str):
            piece.fold(before=out.pop())
            out.append(piece)
        else:
            out.append(piece)
    return [p.array() if isinstance(p, _Texts) else p for p in out]


class DirectFile:
    """A new file, written append-only around the page cache (O_DIRECT) where the filesystem allows it.

    An export writes gigabytes once. Through the page cache the kernel copies every byte and the final fsync then
    waits for the writeback (on the bench machine a new 1 GB file took 1.6 s of kernel CPU at ~200 MB/s; O_DIRECT
    0.13 s at 1.1 GB/s), and other processes' cached pages are pushed out. O_DIRECT needs block-aligned memory,
    lengths and offsets, so the bytes are staged in aligned buffers and written in whole blocks by a thread of its
    own (the caller fills one stage while the other is on its way to the disk); the last partial block goes out
    with O_DIRECT turned off. Where O_DIRECT is refused (tmpfs, other systems) writes are buffered and inline.
    """

    ALIGN = 4096
    STAGE = 8 << 20

    def __init__(self, path: Path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0)
        self.fd = -1
        if direct:
            try:
                self.fd = os.open(path, flags | direct, 0o644)
            except OSError:
                self.fd = -1
        self.direct = self.fd >= 0
        if not self.direct:
            self.fd = os.open(path, flags, 0o644)
        self.stage: mmap.mmap | None = None
        self.filled = 0
        self.error: BaseException | None = None
        if self.direct:
            self.stage = mmap.mmap(-1, self.STAGE)  # anonymous memory is page-aligned
            self.spare: queue.Queue[mmap.mmap] = queue.Queue()
            self.spare.put(mmap.mmap(-1, self.STAGE))
            self.full: queue.Queue[mmap.mmap | None] = queue.Queue()
            self.thread = threading.Thread(target=self._drain, name="export-direct-io", daemon=True)
            self.thread.start()

    def write(self, data: memoryview) -> None:
        if self.stage is None:
            _write_all(self.fd, data)
            return
        pos, size = 0, len(data)
        while pos < size:
            n = min(self.STAGE - self.filled, size - pos)
            self.stage[self.filled:self.filled + n] = data[pos:pos + n]
            self.filled += n
            pos += n
            if self.filled == self.STAGE:
                self._hand_over()

    def _hand_over(self) -> None:
        """Queue the full stage for the disk and go on filling the spare one."""
        assert self.stage is not None
        if self.error is not None:
            raise self.error
        self.full.put(self.stage)
        self.stage, self.filled = self.spare.get(), 0
        if self.error is not None:
            raise self.error

    def _drain(self) -> None:
        while (stage := self.full.get()) is not None:
            if self.error is None:
                try:
                    with memoryview(stage) as view:
                        self._write_blocks(view)
                except BaseException as exc:  # noqa: BLE001 - raised to the writer by _hand_over or close
                    # Without its traceback: the frames hold views of the stage, which could not be unmapped.
                    self.error = exc.with_traceback(None)
            self.spare.put(stage)

    def _write_blocks(self, view: memoryview) -> None:
        try:
            _write_all(self.fd, view)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._buffered()  # opened with O_DIRECT but refused on write (some FUSE and network filesystems)
            _write_all(self.fd, view)

    def _buffered(self) -> None:
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False

    def close(self) -> None:
        if self.fd < 0:
            return  # closed already (a second close after an error)
        try:
            if self.stage is not None:
                self.full.put(None)
                self.thread.join()
                if self.error is not None:
                    raise self.error
                whole = self.filled - self.filled % self.ALIGN
                with memoryview(self.stage) as view:
                    if whole:
                        self._write_blocks(view[:whole])
                    if self.filled > whole:
                        if self.direct:
                            self._buffered()
                        _write_all(self.fd, view[whole:self.filled])
                self.filled = 0
        finally:
            os.close(self.fd)
            self.fd = -1
            if self.stage is not None:
                stages = [self.stage]
                while not self.spare.empty():
                    stages.append(self.spare.get())
                for stage in stages:
                    with contextlib.suppress(BufferError):  # a raised error's frames still view it: GC unmaps it
                        stage.close()
                self.stage = None


def _write_all(fd: int, data: memoryview) -> None:
    pos = 0
    while pos < len(data):
        pos += os.write(fd, data[pos:])


class ParquetSink(_Sink):
    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        super().__init__(root, kind, schema)
        # One row group per batch; no timestamps go into Parquet metadata, so equal input gives equal bytes.
        self.writer = pq.ParquetWriter(root / f"{kind}.parquet", schema, compression="snappy")

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(decoded(batch, self.schema))

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

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(decoded(batch, self.schema))

    def close(self) -> None:
        self.writer.close()
        self.sink.close()
        info = {"citation": "", "description": f"preflab {self.kind} export", "homepage": "",
                "features": hf_features(self.schema), "license": self.license_id}
        state: dict[str, Any] = {
            "_data_files": [{"filename": self.DATA}], "_fingerprint": file_sha256(self.dir / self.DATA)[:16],
            "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
            "_output_all_columns": False, "_split": None}
        (self.dir / "dataset_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        (self.dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


class WriteBehind:
    """A sink driven from one background thread, a couple of batches behind the producer.

    Encoding, hashing and the disk write (Arrow kernels, hashlib and file writes release the GIL) then overlap
    with the database read and the assembly of the next batch. At most `depth` batches wait in between, so
    memory stays bounded; the first error on the writer thread is raised to the producer.
    """

    def __init__(self, sink: _Sink, depth: int = 2) -> None:
        self.sink = sink
        self.queue: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drain, name=f"export-{sink.kind}-writer", daemon=True)
        self.thread.start()

    @property
    def hashed(self) -> dict[str, str]:
        return self.sink.hashed

    def _drain(self) -> None:
        while (batch := self.queue.get()) is not None:
            if self.error is None:  # after a failure, keep taking batches so the producer never blocks
                try:
                    self.sink.write(batch)
                except BaseException as exc:  # noqa: BLE001 - handed to the producer thread
                    self.error = exc

    def write(self, batch: pa.RecordBatch) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(batch)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self.sink.close()
        if self.error is not None:
            raise self.error


def make_sink(fmt: str, root: Path, kind: str, schema: pa.Schema, license_id: str) -> _Sink:
    if fmt == "jsonl":
        return JsonlSink(root, kind, schema)
    if fmt == "parquet":
        return ParquetSink(root, kind, schema)
    if fmt == "hf":
        return HfSink(root, kind, schema, license_id)
    raise ValueError(f"unknown export format {fmt!r}")
