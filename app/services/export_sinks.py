"""Where an export's Arrow batches go: one sink per file format (JSONL, Parquet, a `datasets` directory).

Every sink takes `pyarrow.RecordBatch`es in the export's schema, except that a text column may arrive
dictionary-encoded (the pairs producer sends each batch's distinct prompts and responses once, with indices):
JSONL encodes only the dictionary, Parquet and Arrow get plain strings. The bytes written depend on the
rows and the batch boundaries only, never on time or paths, so equal data gives equal files.
"""

from __future__ import annotations

import hashlib
import json
import queue
import struct
import threading
from abc import ABC, abstractmethod
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # the C encoder, ensure_ascii=False
from pathlib import Path
from typing import Any

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

    Vectorised: each column becomes an Arrow array of JSON fragments (integers cast in C; each distinct string
    and float of a batch encoded once by Python's own JSON encoder and spread with `take`), and one
    `binary_join_element_wise` glues the fragments into lines whose buffer is written as is. The bytes are
    exactly what `json.dumps(row, ensure_ascii=False, separators=(",", ":"))` gives, with no Python work per row.
    """

    def __init__(self, root: Path, kind: str, schema: pa.Schema) -> None:
        super().__init__(root, kind, schema)
        self.fh = open(root / f"{kind}.jsonl", "wb", buffering=0)  # noqa: SIM115 - closed in close(); batches are large
        self.digest = hashlib.sha256()
        # allow_nan=False: NaN is not JSON and would break every reader downstream.
        self.encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        self._encoded: dict[tuple[int, ...], tuple[pa.Array, pa.Array]] = {}
        self.keys = [pa.scalar(("{" if i == 0 else ",") + json.dumps(name) + ":", pa.large_string())
                     for i, name in enumerate(schema.names)]
        self.end, self.glue = pa.scalar("}\n", pa.large_string()), pa.scalar("", pa.large_string())

    def fragments(self, array: pa.Array) -> pa.Array:
        """The JSON text of every value of one column (null → "null"), as a large_string array."""
        t = array.type
        if pa.types.is_dictionary(t):
            # chosen and rejected share one dictionary: encode it once per batch
            dictionary = array.dictionary
            key = tuple(b.address if b is not None else 0 for b in dictionary.buffers()) + (len(dictionary),)
            if key not in self._encoded:
                self._encoded[key] = (dictionary, self.fragments(dictionary))
            out = self._encoded[key][1].take(array.indices)
        elif pa.types.is_integer(t):
            out = pc.cast(array, pa.large_string())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            unique = array.dictionary_encode()
            out = pa.array([encode_basestring(v) for v in unique.dictionary.to_pylist()], pa.large_string()
                           ).take(unique.indices)
        elif pa.types.is_floating(t):
            # json's float repr ("1.0", "0.1"), which Arrow's cast does not give; few distinct weights per batch
            unique = array.dictionary_encode()
            out = pa.array([self.encode(float(v)) for v in unique.dictionary.to_pylist()], pa.large_string()
                           ).take(unique.indices)
        else:  # lists and structs: rare columns (rankings' tiers, message lists) encoded value by value
            out = pa.array([None if v is None else self.encode(v) for v in array.to_pylist()], pa.large_string())
        return pc.fill_null(out, "null") if out.null_count else out

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._encoded = {}  # keyed by buffer address: the entry holds the dictionary, so addresses stay taken
        pieces: list[Any] = []
        for key, column in zip(self.keys, batch.columns, strict=True):
            pieces += [key, self.fragments(column)]
        lines = pc.binary_join_element_wise(*pieces, self.end, self.glue)
        self._encoded = {}
        # A fresh large_string array: its value buffer is the batch's lines, back to back.
        offsets, data = lines.buffers()[1], lines.buffers()[2]
        start, end = struct.unpack_from("<qq", offsets, 8 * lines.offset)[0], struct.unpack_from(
            "<q", offsets, 8 * (lines.offset + len(lines)))[0]
        view = memoryview(data)[start:end]
        self.digest.update(view)
        self.fh.write(view)

    def close(self) -> None:
        self.fh.close()
        self.hashed[f"{self.kind}.jsonl"] = self.digest.hexdigest()


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
        state = {"_data_files": [{"filename": self.DATA}], "_fingerprint": file_sha256(self.dir / self.DATA)[:16],
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
