"""Reading import files (JSON Lines, CSV, Parquet) into validated prompt rows or pair rows; no database here.

Every problem is reported with the line (JSONL: physical line; CSV: physical line, header = 1; Parquet:
row index + 1; 0 for the file as a whole) and the field, so a person can fix the file in one pass.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import itertools
import json
import math
import os.path
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from app.imports import presets as import_presets
from app.imports.presets import PresetError
from app.models import SPLITS
from app.platform.formats import IMPORT_FORMAT_NAMES, ImportFormat

MAX_ERRORS = 100
"""Problems listed in one rejection; the rest are only counted (a broken file can have 200k)."""
MAX_TEXT_CHARS = 100_000
"""Longest prompt, completion, reference or message content accepted, in characters."""
MAX_METADATA_CHARS = 20_000
"""Longest metadata object, as compact JSON."""
MAX_DEPTH = 16
"""Deepest nesting of objects and arrays inside metadata."""
MAX_MESSAGES = 200
HH_ASSISTANT = "\n\nAssistant:"
CHAT_ROLES = ("system", "user", "assistant")

Format = ImportFormat
Kind = Literal["prompts", "pairs", "rankings", "steps"]

EXTENSIONS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
FORMAT_NAMES = IMPORT_FORMAT_NAMES
PROMPT_FIELDS = ("prompt", "messages", "completions", "reference", "split", "metadata")
PAIR_FIELDS = ("prompt", "messages", "chosen", "rejected", "p", "margin", "weight", "split", "metadata",
               "score_chosen", "score_rejected")
NUMBER_FIELDS = ("p", "margin", "weight", "score_chosen", "score_rejected")
MAX_EXTRA_LISTED = 20
"""Extra column names listed in an import's answer; more are counted."""
COMPLETION_COLUMN = re.compile(r"completion_(\d+)")

# CSV cells may hold a JSON array of several long completions; the stdlib default (128 KiB) is too small.
# The limit is process-wide, so it is only ever raised.
csv.field_size_limit(max(csv.field_size_limit(), 64 * 1024 * 1024))


# --- errors -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowError:
    line: int
    """JSONL/CSV: 1-based physical line (CSV header = 1); Parquet: row index + 1; 0: the whole file."""
    field: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        where = f"line {self.line}, " if self.line else ""
        return f"{where}{self.field}: {self.message}"


class ImportRejected(Exception):
    """The file was refused; nothing was written. `errors` holds at most MAX_ERRORS, `omitted` counts the rest."""

    def __init__(self, errors: list[RowError], omitted: int = 0) -> None:
        self.errors = errors
        self.omitted = omitted
        more = f" (and {omitted} more)" if omitted else ""
        super().__init__(f"import rejected, {len(errors) + omitted} problem(s){more}; first: {errors[0]}")

    @property
    def more(self) -> int:
        """Alias of `omitted` (problems beyond the MAX_ERRORS listed)."""
        return self.omitted

    def detail(self) -> list[dict[str, Any]]:
        """The API's 422 body: one {line, field, message} per problem, then one line counting the rest."""
        items = [e.as_dict() for e in self.errors]
        if self.omitted:
            items.append({"line": 0, "field": "file", "message": f"{self.omitted} more problem(s) not listed"})
        return items


class _Problems:
    """Collects row errors up to MAX_ERRORS; `fatal` stops reading at once (the rest of the file is unreadable)."""

    def __init__(self, unit: str = "line") -> None:
        self.errors: list[RowError] = []
        self.omitted = 0
        self.unit = unit

    def add(self, line: int, field: str, message: str) -> None:
        if self.unit != "line" and line:
            message = f"{self.unit} {line}: {message}"
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(RowError(line, field, message))
        else:
            self.omitted += 1

    def fatal(self, line: int, field: str, message: str) -> ImportRejected:
        self.add(line, field, message)
        return ImportRejected(self.errors, self.omitted)

    def raise_if_any(self) -> None:
        if self.errors:
            raise ImportRejected(self.errors, self.omitted)

    def __len__(self) -> int:
        return len(self.errors) + self.omitted


def _reject(line: int, field: str, message: str) -> ImportRejected:
    return ImportRejected([RowError(line, field, message)])


# --- canonical prompt form ----------------------------------------------------------------------


def render_messages(messages: list[dict[str, str]]) -> str:
    """A chat as plain text, one `role: content` block per message (what Prompt.text holds for chats)."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def canonical_prompt(text: str | None = None, messages: list[dict[str, str]] | None = None) -> str:
    """The form two prompts are compared in: stripped text, or the messages as compact, key-sorted JSON."""
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text or messages")
    if messages is not None:
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return json.dumps(plain, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert text is not None
    return text.strip()


def prompt_text_hash(text: str | None = None, messages: list[dict[str, str]] | None = None) -> str:
    """sha256 (hex) of the prompt's canonical form: the value of Prompt.text_hash, unique per project."""
    return hashlib.sha256(canonical_prompt(text, messages).encode("utf-8")).hexdigest()


# --- parsed rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RowPrompt:
    """Where a row stands in the file and the prompt it carries, as every row kind has them."""

    line: int
    text: str
    """Stripped prompt text; for chats, render_messages(messages)."""
    messages: list[dict[str, str]] | None
    text_hash: str


@dataclass(frozen=True)
class PromptRow(_RowPrompt):
    completions: list[str]
    reference: str | None
    split: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class PairRow(_RowPrompt):
    chosen: str
    rejected: str
    p: float
    """Soft label p(chosen ≻ rejected)."""
    margin: int
    weight: float
    split: str | None
    """None when the row did not say; a prompt created by the import then goes to "train"."""
    chosen_messages: list[dict[str, str]] | None = None
    """The chosen response as chat turns, when it is more than one assistant turn (then `chosen` renders them)."""
    rejected_messages: list[dict[str, str]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """Stored on the pair: the row's metadata, extra columns and scores."""


@dataclass(frozen=True)
class SourceRanking:
    """One annotator's order of a row's completions, from another labelling tool."""

    annotator: str
    """"tool:id", the same for every ranking of one person in the file (a pseudonymous user is made for it)."""
    tiers: list[list[int]]
    """Indexes into the row's completions, best tier first."""
    meta: dict[str, Any]


@dataclass(frozen=True)
class RankedRow(_RowPrompt):
    """A prompt with its completions and the rankings other tools' annotators gave them."""

    completions: list[str]
    rankings: list[SourceRanking]
    metadata: dict[str, Any]


@dataclass(frozen=True)
class StepRow(_RowPrompt):
    """One completion of a prompt as its steps, with one labeller's label per step (trl-stepwise, prm800k)."""

    steps: list[str]
    """Stripped, none empty."""
    labels: list[int]
    """+1, 0 or −1 per step."""
    annotator: str | None
    """"tool:id" of the labeller (a pseudonymous user is made for it), or None: the dataset itself."""
    reference: str | None
    meta: dict[str, Any]
    """Provenance of the labels (tool, timestamp…), kept on the ranking that carries them."""
    metadata: dict[str, Any]


@dataclass
class ParsedImport:
    filename: str
    format: Format
    kind: Kind
    sha256: str
    """Of the uploaded bytes, for the audit log."""
    size: int
    prompts: list[PromptRow] = field(default_factory=list)
    pairs: list[PairRow] = field(default_factory=list)
    ranked: list[RankedRow] = field(default_factory=list)
    stepped: list[StepRow] = field(default_factory=list)
    preset: str = "preflab"
    """The layout the file was read in: the one asked for, or the one detected."""
    extra_columns: list[str] = field(default_factory=list)
    """Columns not in preflab's layout, kept in each row's metadata, in the order first seen."""

    @property
    def rows(self) -> int:
        return len(self.prompts) + len(self.pairs) + len(self.ranked) + len(self.stepped)

    def extra_columns_note(self) -> str | None:
        """"kept 3 extra columns: prompt_id, source, model" (the import report), or None when there were none."""
        if not self.extra_columns:
            return None
        n = len(self.extra_columns)
        names = ", ".join(self.extra_columns[:MAX_EXTRA_LISTED])
        more = f" and {n - MAX_EXTRA_LISTED} more" if n > MAX_EXTRA_LISTED else ""
        return f"kept {n} extra column{'s' if n != 1 else ''}: {names}{more}"


# --- entry point --------------------------------------------------------------------------------


def parse_import(
    filename: str, data: bytes, *, max_rows: int = 200_000, preset: str | None = None, strict: bool = False
) -> ParsedImport:
    """Read and validate a whole file; raise ImportRejected listing every bad row, or return all rows.

    `preset` names the layout (import_presets.PRESETS); without one it is detected from the first row.
    `strict` refuses columns preflab does not know instead of keeping them in each row's metadata."""
    if preset is not None and preset not in import_presets.PRESETS:
        raise _reject(0, "preset", f"unknown preset {preset!r}; use one of {', '.join(import_presets.PRESETS)}")
    fmt = detect_format(filename, data)
    problems = _Problems("row" if fmt == "parquet" else "line")
    options = _ReadOptions(strict=strict or preset in import_presets.ANNOTATED, preset=preset)
    if fmt == "parquet":
        records = _parquet_records(data, max_rows, problems, options)
    else:
        text = _decode(data)
        if fmt == "jsonl":
            records = _json_records(text, max_rows, problems, preset)
        else:
            records = _csv_records(text, max_rows, problems, options)
    seen, first = import_presets.first_record(records)
    chosen_preset = preset or (import_presets.detect(first) if first is not None else "preflab") or "preflab"
    if fmt == "jsonl" and text.lstrip().startswith("[") and chosen_preset != "label-studio":
        raise problems.fatal(
            1, "json", "the file holds a JSON array; preflab reads JSON Lines, one object per line "
            "(convert with: jq -c '.[]' in.json > out.jsonl), or a Label Studio export (preset label-studio)"
        )
    validator = _Validator(problems, strict=strict, preset=chosen_preset)
    kind = validator.run(itertools.chain(seen, records))
    problems.raise_if_any()
    return ParsedImport(
        filename=filename,
        format=fmt,
        kind=kind,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        prompts=validator.prompts,
        pairs=validator.pairs,
        ranked=validator.ranked,
        stepped=validator.stepped,
        preset=chosen_preset,
        extra_columns=list(validator.extra_columns),
    )


@dataclass(frozen=True)
class _ReadOptions:
    strict: bool = False
    preset: str | None = None


def detect_format(filename: str, data: bytes) -> Format:
    """The format named by the extension, checked against what the bytes look like."""
    ext = os.path.splitext(filename.lower())[1]
    if ext not in EXTENSIONS:
        raise _reject(0, "file", f"unsupported file type '{ext or filename}'; use .jsonl, .csv or .parquet")
    by_name = EXTENSIONS[ext]
    if not data.strip():
        raise _reject(0, "file", "the file is empty")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise _reject(1, "encoding", "the file is UTF-16; save it as UTF-8")
    looks: str
    if data[:4] == b"PAR1":
        looks = "parquet"
    elif data[:2] == b"\x1f\x8b":
        raise _reject(0, "file", "the file is gzip-compressed; decompress it first")
    elif data[:4] == b"PK\x03\x04":
        raise _reject(0, "file", "the file is a ZIP archive (an Excel workbook?); export it as CSV")
    else:
        head = data.removeprefix(codecs.BOM_UTF8).lstrip()[:1]
        looks = "jsonl" if head in (b"{", b"[") else "csv"
    if looks != by_name:
        raise _reject(
            0, "file", f"the file is named {ext} but its content looks like {FORMAT_NAMES[looks]}; "
            "rename it or check how it was exported"
        )
    return by_name


def _decode(data: bytes) -> str:
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = f"0x{data[exc.start]:02x}"
        raise _reject(line, "encoding", f"not valid UTF-8 (byte {bad}); save the file as UTF-8") from None


# --- readers: each yields (line, record-or-None) with cells already turned into JSON-like values ------


def _too_many_rows(max_rows: int) -> str:
    return f"the file has more than {max_rows} rows, the limit for one import; split it"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def _json_records(
    text: str, max_rows: int, problems: _Problems, preset: str | None
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """JSON Lines; or one JSON array of objects (Label Studio's export), each named by the line it starts on."""
    if text.lstrip().startswith("["):
        return _json_array_records(text, max_rows, problems)
    return _jsonl_records(text, max_rows, problems)


def _json_array_records(text: str, max_rows: int, problems: _Problems) -> Iterator[tuple[int, dict[str, Any] | None]]:
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    pos = len(text) - len(text.lstrip()) + 1
    rows = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        line = text.count("\n", 0, pos) + 1
        if pos >= len(text):
            raise problems.fatal(line, "json", "the JSON array is not closed with ]")
        if text[pos] == "]":
            return
        rows += 1
        if rows > max_rows:
            raise problems.fatal(line, "file", _too_many_rows(max_rows))
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            message = f"invalid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else f"invalid JSON: {exc}"
            raise problems.fatal(line, "json", message) from None
        if not isinstance(obj, dict):
            problems.add(line, "json", f"each array item must be a JSON object, got {_type_name(obj)}")
            yield line, None
            continue
        yield line, obj


def _jsonl_records(text: str, max_rows: int, problems: _Problems) -> Iterator[tuple[int, dict[str, Any] | None]]:
    rows = 0
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        rows += 1
        if rows > max_rows:
            raise problems.fatal(line, "file", _too_many_rows(max_rows))
        try:
            obj = json.loads(raw, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            problems.add(line, "json", f"invalid JSON: {exc.msg} (column {exc.colno})")
            yield line, None
            continue
        except RecursionError:
            problems.add(line, "json", "JSON nested too deeply")
            yield line, None
            continue
        except ValueError as exc:  # NaN / Infinity, refused by _reject_constant
            problems.add(line, "json", f"invalid JSON: {exc}")
            yield line, None
            continue
        if not isinstance(obj, dict):
            problems.add(line, "json", f"each line must be a JSON object, got {_type_name(obj)}")
            yield line, None
            continue
        yield line, obj


def _check_columns(columns: list[str], problems: _Problems, line: int, options: _ReadOptions) -> None:
    """Header names must be unique, and of one kind (prompt rows or pair rows); in strict mode, also known
    (otherwise an unknown column is kept in each row's metadata). A preset of another tool reads its own columns."""
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            problems.add(line, name, "column appears twice in the header")
        seen.add(name)
    if options.preset in import_presets.ANNOTATED + import_presets.STEPPED:
        return
    is_pairs = "chosen" in seen or "rejected" in seen
    allowed = PAIR_FIELDS if is_pairs else PROMPT_FIELDS
    for name in columns:
        if name in allowed or (not is_pairs and COMPLETION_COLUMN.fullmatch(name)):
            continue
        if not name:
            problems.add(line, "header", "a column has no name")
        elif is_pairs and (name in PROMPT_FIELDS or COMPLETION_COLUMN.fullmatch(name)):
            problems.add(
                line, name, "prompt-row column in a file of pairs (it has chosen/rejected); a file holds one kind"
            )
        elif options.strict:
            known = ", ".join(allowed) + ("" if is_pairs else ", completion_1..completion_N")
            problems.add(line, name, f"unknown column; expected {known}")
    if "completions" in seen and any(COMPLETION_COLUMN.fullmatch(n) for n in seen):
        problems.add(line, "completions", "use either a completions column or completion_1..N columns, not both")


def _completion_columns(columns: list[str]) -> list[str]:
    numbered = [(int(m.group(1)), n) for n in columns if (m := COMPLETION_COLUMN.fullmatch(n))]
    return [n for _, n in sorted(numbered)]


def _json_cell(value: Any, field: str, line: int, problems: _Problems) -> Any:
    """CSV and Parquet carry arrays and objects as JSON text in a string cell."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value, parse_constant=_reject_constant)
    except RecursionError:
        problems.add(line, field, "JSON nested too deeply")
    except ValueError as exc:
        problems.add(line, field, f"cell is not valid JSON: {exc}")
    return _INVALID


_LABELS: Any = object()
"""Key under which a CSV/Parquet record keeps its completion_N column names, for error messages (an object,
so no JSON key can collide with it)."""

_INVALID = object()
"""A cell whose problem has already been reported; the row is dropped without a second message."""


def _looks_like_chat(cell: str) -> bool:
    """A CSV cell holding a chat as JSON text: [{"role": …}, …]."""
    head = cell.lstrip()
    return head.startswith("[") and head[1:].lstrip().startswith("{") and '"role"' in head[:200]


def _number_cell(value: str, field: str, line: int, problems: _Problems) -> Any:
    try:
        return float(value)
    except ValueError:
        problems.add(line, field, f"must be a number, got {value!r}")
        return _INVALID


def _cells_to_record(
    cells: dict[str, Any], columns: list[str], line: int, problems: _Problems
) -> dict[Any, Any] | None:
    """One CSV or Parquet row (empty cells already dropped) as the same dict a JSONL line would give."""
    record: dict[Any, Any] = {}
    for name in ("prompt", "chosen", "rejected", "reference", "split", *NUMBER_FIELDS):
        if name in cells:
            record[name] = cells[name]
    for name in ("prompt", "chosen", "rejected"):
        if isinstance(record.get(name), str) and _looks_like_chat(record[name]):
            record[name] = _json_cell(record[name], name, line, problems)
    for name in ("messages", "completions", "metadata"):
        if name in cells:
            record[name] = _json_cell(cells[name], name, line, problems)
    for name in columns:
        if name in cells and name not in PAIR_FIELDS and name not in PROMPT_FIELDS \
                and not COMPLETION_COLUMN.fullmatch(name):
            record[name] = cells[name]
    if isinstance(record.get("metadata"), list) and all(
        isinstance(item, tuple) and len(item) == 2 for item in record["metadata"]
    ):
        record["metadata"] = dict(record["metadata"])  # a Parquet map column arrives as (key, value) pairs
    numbered = [n for n in _completion_columns(columns) if n in cells]
    if numbered:
        record["completions"] = [cells[n] for n in numbered]
        record[_LABELS] = numbered
    if any(v is _INVALID for v in record.values()):
        return None
    return record



def _csv_records(
    text: str, max_rows: int, problems: _Problems, options: _ReadOptions
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
    except csv.Error as exc:
        raise problems.fatal(1, "csv", f"unreadable header: {exc}") from None
    columns = [name.strip() for name in header]
    _check_columns(columns, problems, 1, options)
    problems.raise_if_any()
    is_pairs = "chosen" in columns or "rejected" in columns
    rows = 0
    line = reader.line_num + 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            # The reader cannot resynchronise after a broken quote; report where the record started.
            raise problems.fatal(line, "csv", f"malformed CSV: {exc}") from None
        start, line = line, reader.line_num + 1
        if not any(cell.strip() for cell in cells):
            continue
        rows += 1
        if rows > max_rows:
            raise problems.fatal(start, "file", _too_many_rows(max_rows))
        if len(cells) != len(columns):
            problems.add(start, "csv", f"{len(cells)} cells but the header has {len(columns)} columns")
            yield start, None
            continue
        present: dict[str, Any] = {}
        for name, cell in zip(columns, cells, strict=True):
            if cell.strip() == "":
                continue  # an empty cell means "not given"
            if name in NUMBER_FIELDS:
                present[name] = _number_cell(cell.strip(), name, start, problems)
            elif name == "split":
                present[name] = cell.strip()
            else:
                present[name] = cell
        record = _cells_to_record(present, columns, start, problems)
        if record is not None and is_pairs:
            record.setdefault("chosen", _MISSING)
            record.setdefault("rejected", _MISSING)
        yield start, record


def _parquet_records(
    data: bytes, max_rows: int, problems: _Problems, options: _ReadOptions
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _reject(0, "file", f"not a readable Parquet file: {exc}") from None
    if parquet.metadata.num_rows > max_rows:
        raise _reject(0, "file", _too_many_rows(max_rows))
    columns = list(parquet.schema_arrow.names)
    _check_columns(columns, problems, 0, options)
    problems.raise_if_any()
    is_pairs = "chosen" in columns or "rejected" in columns
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=4096):
            for values in batch.to_pylist():
                row += 1
                present = {k: v for k, v in values.items() if v is not None}
                record = _cells_to_record(present, columns, row, problems)
                if record is not None and is_pairs:
                    record.setdefault("chosen", _MISSING)
                    record.setdefault("rejected", _MISSING)
                yield row, record
    except (pa.ArrowException, OSError) as exc:
        raise problems.fatal(row + 1, "file", f"unreadable Parquet data: {exc}") from None


# --- validation shared by all formats -----------------------------------------------------------

_MISSING: Any = object()


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _unstorable(text: str) -> str | None:
    """Why Postgres would refuse this string, if it would: NUL bytes and unpaired surrogates."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired UTF-16 surrogate"
    return None


class _RowCheck:
    """Validation of one record; every problem is added to `problems`, and `ok` says whether any was found."""

    def __init__(self, record: dict[str, Any], line: int, problems: _Problems, *, strict: bool = True) -> None:
        self.record = record
        self.line = line
        self.problems = problems
        self.ok = True
        self.strict = strict
        self.extras: dict[str, Any] = {}
        """Fields preflab does not know, kept in the row's metadata (when not strict)."""

    def fail(self, field: str, message: str) -> None:
        self.ok = False
        self.problems.add(self.line, field, message)

    def text(self, value: Any, field: str, *, required: bool = True) -> str | None:
        if value is _MISSING or value is None:
            if required:
                self.fail(field, "missing" if value is _MISSING else "must be a string, got null")
            return None
        if not isinstance(value, str):
            self.fail(field, f"must be a string, got {_type_name(value)}")
            return None
        if not value.strip():
            self.fail(field, "must not be empty")
            return None
        if len(value) > MAX_TEXT_CHARS:
            self.fail(field, f"{len(value)} characters; the limit is {MAX_TEXT_CHARS}")
            return None
        if (why := _unstorable(value)) is not None:
            self.fail(field, why)
            return None
        return value

    def number(self, name: str, default: float, low: float, high: float | None, *, integer: bool = False) -> float:
        value = self.record.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.fail(name, f"must be a number, got {_type_name(value)}")
            return default
        if integer and value != int(value):
            self.fail(name, f"must be a whole number, got {value}")
            return default
        if value < low or (high is not None and value > high):
            bounds = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            self.fail(name, f"must be {bounds}, got {value:g}")
            return default
        return int(value) if integer else float(value)

    def split(self) -> str | None:
        value = self.record.get("split")
        if value is None:
            return None
        if value not in SPLITS:
            self.fail("split", f"must be one of {', '.join(SPLITS)}, got {value!r}")
            return None
        return str(value)

    def messages(self, value: Any, name: str = "messages", *, need_user: bool = True) -> list[dict[str, str]] | None:
        if not isinstance(value, list):
            self.fail(name, f"must be an array of {{role, content}} objects, got {_type_name(value)}")
            return None
        if not value:
            self.fail(name, "must hold at least one message")
            return None
        if len(value) > MAX_MESSAGES:
            self.fail(name, f"{len(value)} messages; the limit is {MAX_MESSAGES}")
            return None
        out: list[dict[str, str]] = []
        for i, message in enumerate(value):
            where = f"{name}[{i}]"
            if not isinstance(message, dict):
                self.fail(where, f"must be an object with role and content, got {_type_name(message)}")
                continue
            for key in message:
                if key not in ("role", "content"):
                    self.fail(f"{where}.{key}", "unknown field; a message has role and content")
            role = message.get("role", _MISSING)
            if role is _MISSING:
                self.fail(f"{where}.role", "missing")
            elif role not in CHAT_ROLES:
                self.fail(f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
            content = self.text(message.get("content", _MISSING), f"{where}.content")
            if role in CHAT_ROLES and content is not None:
                out.append({"role": role, "content": content})
        if need_user and len(out) == len(value) and not any(m["role"] == "user" for m in out):
            self.fail(name, "needs at least one user message")
        return out if len(out) == len(value) else None

    def prompt(self, *, required: bool) -> tuple[str, list[dict[str, str]] | None] | None:
        """(text, messages) from `prompt` or `messages`; None when absent (and not required) or invalid."""
        has_text = self.record.get("prompt") is not None
        has_messages = self.record.get("messages") is not None
        if has_text and has_messages:
            self.fail("messages", "give either prompt or messages, not both")
            return None
        if has_messages:
            messages = self.messages(self.record["messages"])
            return (render_messages(messages), messages) if messages is not None else None
        if required and "prompt" not in self.record and "messages" not in self.record:
            self.fail("prompt", "missing; give prompt (text) or messages (a chat)")
            return None
        if has_text or required:
            text = self.text(self.record.get("prompt", _MISSING), "prompt")
            return (text.strip(), None) if text is not None else None
        return None

    def prompt_fields(self, prompt: tuple[str, list[dict[str, str]] | None]) -> dict[str, Any]:
        """What every row kind holds of its place and prompt (`_RowPrompt`'s fields), from `prompt()`'s answer."""
        text, messages = prompt
        return {"line": self.line, "text": text, "messages": messages,
                "text_hash": prompt_text_hash(text=text if messages is None else None, messages=messages)}

    def metadata(self, more: dict[str, Any] | None = None) -> dict[str, Any]:
        """The row's metadata object with its extra columns (and `more`) added; its own keys win."""
        value = self.record.get("metadata")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.fail("metadata", f"must be an object, got {_type_name(value)}")
            return {}
        value = {**self.extras, **(more or {}), **value}
        if not value:
            return {}
        if (why := _json_problem(value)) is not None:
            self.fail("metadata", why)
            return {}
        if len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) > MAX_METADATA_CHARS:
            self.fail("metadata", f"longer than {MAX_METADATA_CHARS} characters as JSON")
            return {}
        return value

    def unknown_fields(self, allowed: tuple[str, ...], kind: Kind) -> None:
        """A field of the other kind of row is refused; any other unknown field is refused when strict, and kept
        in `extras` (for the row's metadata) when not."""
        for key in self.record:
            if key in allowed or key == _LABELS:
                continue
            other = PAIR_FIELDS if kind == "prompts" else PROMPT_FIELDS
            if key in other:
                hint = " (it belongs to the other kind of row)"
            elif not self.strict:
                self.extras[key] = self.record[key]
                continue
            else:
                hint = ""
            self.fail(key, f"unknown field for {'a prompt' if kind == 'prompts' else 'a pair'} row{hint}; "
                      f"expected {', '.join(allowed)}")


def _json_problem(value: Any) -> str | None:
    """Why `value` cannot be stored as JSON on both databases (depth, key types, NaN, NUL), if it cannot."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"object keys must be strings, got {_type_name(key)}"
                if (why := _unstorable(key)) is not None:
                    return f"key {key[:40]!r} {why}"
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            if (why := _unstorable(item)) is not None:
                return f"a string value {why}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "NaN and Infinity are not JSON"
        elif not (item is None or isinstance(item, bool | int)):
            return f"values must be JSON (string, number, boolean, null, array, object), got {_type_name(item)}"
    return None


def _same_text_key(text: str) -> str:
    """Texts equal under this key are the same answer to annotators: runs of whitespace collapse, ends trimmed."""
    return " ".join(text.split())


def _prompt_row(check: _RowCheck) -> PromptRow | None:
    record = check.record
    check.unknown_fields(PROMPT_FIELDS, "prompts")
    prompt = check.prompt(required=True)
    completions: list[str] = []
    raw = record.get("completions")
    labels: list[str] | None = record.get(_LABELS)
    if raw is not None and not isinstance(raw, list):
        check.fail("completions", f"must be an array of strings, got {_type_name(raw)}")
    elif raw is not None:
        first_seen: dict[str, tuple[str, str]] = {}
        for i, value in enumerate(raw):
            name = labels[i] if labels else f"completions[{i}]"
            text = check.text(value, name)
            if text is None:
                continue
            key = _same_text_key(text)  # identical whitespace aside counts as identical, as sampling screens them
            if key in first_seen:
                earlier, earlier_text = first_seen[key]
                aside = "" if earlier_text == text else " (whitespace aside)"
                check.fail(name, f"same text as {earlier}{aside}; each completion must differ")
                continue
            first_seen[key] = (name, text)
            completions.append(text)
    reference = check.text(record.get("reference"), "reference", required=False)
    split = check.split()
    metadata = check.metadata()
    if not check.ok or prompt is None:
        return None
    return PromptRow(
        **check.prompt_fields(prompt),
        completions=completions,
        reference=reference,
        split=split or "train",
        metadata=metadata,
    )


def split_hh(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """HH-RLHF layout: (prompt, chosen response, rejected response), the prompt being the shared text up to
    and including the last "\\n\\nAssistant:"; None when the two share no such prefix."""
    shared = os.path.commonprefix([chosen, rejected])
    cut = shared.rfind(HH_ASSISTANT)
    if cut < 0:
        return None
    cut += len(HH_ASSISTANT)
    return chosen[:cut].strip(), chosen[cut:].strip(), rejected[cut:].strip()


def _soft_label(check: _RowCheck) -> tuple[float, dict[str, Any]]:
    """p(chosen ≻ rejected): the row's `p`; else, with both scores, σ(score_chosen − score_rejected) (the
    Bradley–Terry probability of the score gap); else 1. The scores are kept in the pair's metadata."""
    p = check.number("p", 1.0, 0.0, 1.0)
    score_chosen = check.number("score_chosen", math.nan, -math.inf, None)
    score_rejected = check.number("score_rejected", math.nan, -math.inf, None)
    scores = {k: v for k, v in (("score_chosen", score_chosen), ("score_rejected", score_rejected))
              if not math.isnan(v)}
    if check.record.get("p") is None and len(scores) == 2:
        gap = max(-50.0, min(50.0, score_chosen - score_rejected))
        p = 1.0 / (1.0 + math.exp(-gap))
    return p, scores


def _pair_row(check: _RowCheck) -> PairRow | None:
    record = check.record
    check.unknown_fields(PAIR_FIELDS, "pairs")
    if any(isinstance(record.get(k), list) for k in ("chosen", "rejected", "prompt")):
        return _chat_pair_row(check)
    prompt = check.prompt(required=False)
    chosen = check.text(record.get("chosen", _MISSING), "chosen")
    rejected = check.text(record.get("rejected", _MISSING), "rejected")
    label = _pair_label(check)
    if chosen is None or rejected is None:
        return None
    has_prompt = record.get("prompt") is not None or record.get("messages") is not None
    if not has_prompt:
        parts = split_hh(chosen, rejected)
        if parts is None:
            check.fail("prompt", "missing, and chosen and rejected share no prefix ending in '\\n\\nAssistant:' "
                       "(the HH-RLHF layout) to take the prompt from; add a prompt field, or choose preset trl to take "
                       "their shared opening text as the prompt")
            return None
        # An empty response stays: HH-RLHF has a few (an empty reply preferred to, say, leaking an
        # address), and they are real labels.
        text, chosen, rejected = parts
        prompt = (text, None)
    if _same_text_key(chosen) == _same_text_key(rejected):
        check.fail("rejected", "same text as chosen; a pair needs two different responses")
    if not check.ok or prompt is None:
        return None
    return PairRow(**check.prompt_fields(prompt), chosen=chosen, rejected=rejected, **label)


def _pair_label(check: _RowCheck) -> dict[str, Any]:
    """p, margin, weight, split and metadata of a pair row (problems reported on `check`)."""
    p, scores = _soft_label(check)
    return {
        "p": p,
        "margin": int(check.number("margin", 1, 1, None, integer=True)),
        "weight": check.number("weight", 1.0, 0.0, None),
        "split": check.split(),
        "metadata": check.metadata(scores),
    }


def _shared_turns(a: list[dict[str, str]], b: list[dict[str, str]]) -> int:
    """How many opening turns two chats share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _chat_prompt(check: _RowCheck, chosen: list[dict[str, str]],
                 rejected: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The prompt of a chat pair: explicit (`prompt` or `messages` as turns, or `prompt` as text = one user
    turn), stripped from the responses when they repeat it; or implicit, the longest run of opening turns the
    two responses share."""
    record = check.record
    if record.get("prompt") is not None and record.get("messages") is not None:
        check.fail("messages", "give either prompt or messages, not both")
        return None
    explicit = record.get("prompt") if record.get("prompt") is not None else record.get("messages")
    name = "prompt" if record.get("prompt") is not None else "messages"
    if isinstance(explicit, str):
        text = check.text(explicit, "prompt")
        return [{"role": "user", "content": text.strip()}] if text is not None else None
    if explicit is not None:
        return check.messages(explicit, name)
    shared = _shared_turns(chosen, rejected)
    if shared == 0 or not any(m["role"] == "user" for m in chosen[:shared]):
        check.fail("prompt", "missing, and chosen and rejected share no opening user turn to take the prompt "
                   "from (the implicit-prompt layout); add a prompt field")
        return None
    return chosen[:shared]


def _response(turns: list[dict[str, str]]) -> tuple[str, list[dict[str, str]] | None]:
    """A response's stored text, and its turns when it is more than one assistant turn."""
    if len(turns) == 1 and turns[0]["role"] == "assistant":
        return turns[0]["content"], None
    return render_messages(turns), turns


def _chat_pair_row(check: _RowCheck) -> PairRow | None:
    """chosen/rejected as message lists (TRL's conversational layout, UltraFeedback)."""
    record = check.record
    sides = {}
    for name in ("chosen", "rejected"):
        value = record.get(name, _MISSING)
        if value is _MISSING:
            check.fail(name, "missing")
        elif not isinstance(value, list):
            other = "rejected" if name == "chosen" else "chosen"
            check.fail(name, f"must be an array of messages, as {other} is, got {_type_name(value)}")
        else:
            sides[name] = check.messages(value, name, need_user=False)
    label = _pair_label(check)
    chosen, rejected = sides.get("chosen"), sides.get("rejected")
    if chosen is None or rejected is None:
        return None
    prompt = _chat_prompt(check, chosen, rejected)
    if prompt is None:
        return None
    if chosen[: len(prompt)] == prompt and rejected[: len(prompt)] == prompt:
        chosen, rejected = chosen[len(prompt):], rejected[len(prompt):]
    for name, turns in (("chosen", chosen), ("rejected", rejected)):
        if not turns:
            check.fail(name, "has no turns after the prompt; a response needs at least one")
    if not check.ok:
        return None
    chosen_text, chosen_turns = _response(chosen)
    rejected_text, rejected_turns = _response(rejected)
    if chosen_text.strip() == rejected_text.strip():
        check.fail("rejected", "same text as chosen; a pair needs two different responses")
        return None
    return PairRow(**check.prompt_fields((render_messages(prompt), prompt)), chosen=chosen_text,
                   rejected=rejected_text, chosen_messages=chosen_turns, rejected_messages=rejected_turns, **label)


def _ranked_row(check: _RowCheck) -> RankedRow | None:
    """A Label Studio or Argilla row mapped by its preset: a prompt, its completions, and the rankings."""
    record = check.record
    prompt = check.prompt(required=True)
    completions: list[str] = []
    raw = record.get("completions") or []
    for i, value in enumerate(raw):
        text = check.text(value, f"completions[{i}]")
        if text is not None:
            completions.append(text)
    if len(set(completions)) != len(completions):
        check.fail("completions", "two responses have the same text; each must differ")
    out: list[SourceRanking] = []
    for ranking in record.get("rankings", []):
        flat = [i for tier in ranking["tiers"] for i in tier]
        if len(set(flat)) != len(flat):
            check.fail("rankings", f"{ranking['annotator']} ranks one response twice")
            continue
        if (why := _json_problem(ranking["meta"])) is not None:
            check.fail("rankings", why)
            continue
        out.append(SourceRanking(annotator=str(ranking["annotator"])[:200], tiers=ranking["tiers"],
                                 meta=ranking["meta"]))
    metadata = check.metadata(record.get("_metadata"))
    if not check.ok or prompt is None:
        return None
    return RankedRow(**check.prompt_fields(prompt), completions=completions, rankings=out, metadata=metadata)


MAX_STEPS = 100
"""Steps per imported completion: as many as a project splits a completion into (app.annotation.steps.MAX_STEPS)."""


def _step_row(check: _RowCheck) -> StepRow | None:
    """A TRL-stepwise or PRM800K row mapped by its preset: a prompt and one labelled path of steps."""
    record = check.record
    prompt = check.prompt(required=True)
    steps: list[str] = []
    for value, where in zip(record["steps"], record["step_fields"], strict=True):
        text = check.text(value, where)
        if text is not None:
            steps.append(text.strip())
    if len(record["steps"]) > MAX_STEPS:
        check.fail(record["step_fields"][0].rpartition(".")[0] or "completions",
                   f"{len(record['steps'])} steps; a completion has at most {MAX_STEPS}")
    reference = check.text(record.get("reference"), "question.ground_truth_answer", required=False)
    if (why := _json_problem(record["meta"])) is not None:
        check.fail("label", why)
    metadata = check.metadata(record.get("_metadata"))
    if not check.ok or prompt is None:
        return None
    return StepRow(**check.prompt_fields(prompt), steps=steps, labels=list(record["step_labels"]),
                   annotator=record["annotator"], reference=reference, meta=record["meta"], metadata=metadata)


def _row_kind(record: dict[str, Any]) -> Kind:
    return "pairs" if ("chosen" in record or "rejected" in record) else "prompts"


class _Validator:
    """Validates every record in file order, through the preset's mapping; collects rows and extra columns."""

    def __init__(self, problems: _Problems, *, strict: bool, preset: str) -> None:
        self.problems = problems
        self.strict = strict
        self.preset = preset
        self.prompts: list[PromptRow] = []
        self.pairs: list[PairRow] = []
        self.ranked: list[RankedRow] = []
        self.stepped: list[StepRow] = []
        self.extra_columns: dict[str, None] = {}

    def _mapped(self, line: int, record: dict[str, Any]) -> dict[str, Any] | None:
        try:
            if self.preset in import_presets.ANNOTATED:
                mapped = import_presets.map_annotated(self.preset, record)
                mapped["_metadata"] = mapped.pop("metadata")
                return mapped
            if self.preset in import_presets.STEPPED:
                mapped = import_presets.map_stepped(self.preset, record)
                mapped["_metadata"] = mapped.pop("metadata")
                return mapped
            return import_presets.map_pair_record(self.preset, record)
        except PresetError as exc:
            self.problems.add(line, exc.field, f"{exc.message} (preset {self.preset})")
            return None

    def _one(self, line: int, record: dict[str, Any], kind: Kind) -> None:
        check = _RowCheck(record, line, self.problems, strict=self.strict)
        if kind == "rankings":
            row: PromptRow | PairRow | RankedRow | StepRow | None = _ranked_row(check)
        elif kind == "steps":
            row = _step_row(check)
        elif kind == "prompts":
            row = _prompt_row(check)
        else:
            row = _pair_row(check)
        self.extra_columns.update(dict.fromkeys(check.extras))
        if isinstance(row, RankedRow):
            self.ranked.append(row)
        elif isinstance(row, StepRow):
            self.stepped.append(row)
        elif isinstance(row, PromptRow):
            self.prompts.append(row)
        elif isinstance(row, PairRow):
            self.pairs.append(row)

    def _kind_of(self, record: dict[str, Any]) -> Kind:
        if self.preset in import_presets.ANNOTATED:
            return "rankings"
        if self.preset in import_presets.STEPPED:
            return "steps"
        return _row_kind(record)

    def run(self, records: Iterator[tuple[int, dict[str, Any] | None]]) -> Kind:
        kind: Kind | None = None
        first_line = 0
        mixed_reported = False
        seen_any = False
        for line, raw in records:
            seen_any = True
            if raw is None:
                continue
            record = self._mapped(line, raw)
            if record is None:
                continue
            row_kind = self._kind_of(record)
            if kind is None:
                kind, first_line = row_kind, line
            elif row_kind != kind:
                if not mixed_reported:
                    what = "a pair row (it has chosen/rejected)" if row_kind == "pairs" else "a prompt row"
                    first = "prompt rows" if kind == "prompts" else "pair rows"
                    self.problems.add(line, "chosen", f"{what} in a file of {first} (from line {first_line}); "
                                      "a file holds one kind")
                    mixed_reported = True
                continue
            self._one(line, record, kind)
        if not seen_any:
            raise self.problems.fatal(0, "file", "the file holds no rows")
        return kind or "prompts"
