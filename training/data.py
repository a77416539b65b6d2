"""Reading export files (pairs, prompts, SFT rows, step labels): JSONL, Parquet or a `datasets.save_to_disk` dir.

Errors are `DataError` (a `ValueError`) naming the file, the line (JSONL) or row (Parquet, datasets)
and the field, so a bad export is fixed at the source instead of debugged in a trainer.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = dict[str, Any]
Text = str | list[Message]

HELDOUT_SPLITS = frozenset({"heldout", "held_out", "test", "eval", "validation", "valid", "dev"})


class DataError(ValueError):
    """A malformed export: the message names the file, the line or row, and the field."""


@dataclass
class ExportRow:
    """What any export's row may carry beside its own fields (keyword-only, so each kind lists its own first)."""

    split: str | None = field(default=None, kw_only=True)
    """"train", "heldout", … when the export carries a split column."""
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)
    """Every other column (origin, votes, …); a prompt's are passed to reward functions as keyword arguments."""


@dataclass
class PromptRow(ExportRow):
    """One prompt of a prompts export."""

    prompt: Text
    """The prompt as text, or as chat messages ({"role", "content"} dicts) to render with a chat template."""
    reference: str | None = None
    """A reference answer (e.g. GSM8K's "#### 42"), for exact-match rewards and Pass@K / Maj@K."""


@dataclass
class SFTRow(ExportRow):
    """One example of an SFT export: a prompt and the target completion."""

    prompt: Text
    """The prompt as text, or as chat messages (every turn before the target)."""
    completion: str
    """The target response: what the loss covers."""


@dataclass
class PairRow(ExportRow):
    """One chosen/rejected pair of a pairs export (the TRL preference layout plus our soft-label columns)."""

    prompt: Text
    """The shared prompt, text or chat messages."""
    chosen: str
    """The preferred response (its text only, without the prompt)."""
    rejected: str
    """The other response."""
    p: float | None = None
    """Soft label p(chosen ≻ rejected) in [0, 1], e.g. from an AI judge; None means a hard label (p = 1)."""
    margin: float | None = None
    """How much better the chosen response is (e.g. tiers apart); subtracted inside the BT loss."""
    weight: float | None = None
    """Non-negative weight of the pair in the loss; None means 1."""


@dataclass
class StepRow(ExportRow):
    """One step-labelled completion of a steps export (TRL's stepwise-supervision layout)."""

    prompt: Text
    """The prompt, text or chat messages."""
    completions: list[str]
    """The completion's steps, in order."""
    labels: list[bool]
    """One label per step: True when the step is correct."""


# ----------------------------------------------------------------------------------------------
# raw rows


def _is_datasets_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in ("dataset_info.json", "state.json",
                                                                       "dataset_dict.json"))


def read_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (location, record) for every row; location is "FILE:line N" or "FILE:row N" for error messages."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if _is_datasets_dir(path):
        yield from _read_datasets_dir(path)
    elif path.is_dir():
        raise DataError(f"{path}: a directory, but not one written by datasets.save_to_disk")
    elif path.name.endswith(".parquet"):
        yield from _read_parquet(path)
    else:
        yield from _read_jsonl(path)


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _read_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: cannot read as Parquet ({exc})") from None
    for number, record in enumerate(table.to_pylist(), start=1):
        yield f"{path}:row {number}", record


def _read_datasets_dir(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        # a DatasetDict's split names become the rows' split unless a split column says otherwise
        for split_name, part in loaded.items():
            for number, record in enumerate(part, start=1):
                record.setdefault("split", split_name)
                yield f"{path}[{split_name}]:row {number}", record
    else:
        for number, record in enumerate(loaded, start=1):
            yield f"{path}:row {number}", record


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, or of a directory's files (relative names and contents, sorted)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# field validation


def _text(where: str, name: str, value: Any, allow_messages: bool) -> Text:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: field {name!r} is empty")
        return value
    if allow_messages and isinstance(value, list):
        return _messages(where, name, value)
    kind = "a string or a list of chat messages" if allow_messages else "a string"
    raise DataError(f"{where}: field {name!r} must be {kind}, got {type(value).__name__}")


def _messages(where: str, name: str, value: list[Any]) -> list[Message]:
    if not value:
        raise DataError(f"{where}: field {name!r} is an empty message list")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise DataError(f"{where}: field {name!r}[{i}] must be an object with string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _response(where: str, name: str, value: Any) -> str:
    """A response is text; a conversational export's [{"role": "assistant", …}] is reduced to its content."""
    if isinstance(value, list):
        messages = _messages(where, name, value)
        return "\n".join(m["content"] for m in messages)
    text = _text(where, name, value, allow_messages=False)
    assert isinstance(text, str)
    return text


def _number(where: str, name: str, value: Any, low: float | None = None, high: float | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataError(f"{where}: field {name!r} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise DataError(f"{where}: field {name!r} must be in {bounds}, got {value!r}")
    return float(value)


def _split(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataError(f"{where}: field 'split' must be a string, got {type(value).__name__}")
    return value


def split_implicit_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) from two full transcripts sharing a prefix (the HH-RLHF layout).

    The prompt ends with the last "Assistant:" turn marker the two share, so the responses are the
    final assistant turns; without such a marker it is the longest common prefix, cut at whitespace.
    """
    common = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        common += 1
    prefix = chosen[:common]
    marker = prefix.rfind("Assistant:")
    cut = marker + len("Assistant:") if marker >= 0 else max(prefix.rfind(" "), prefix.rfind("\n")) + 1
    return chosen[:cut], chosen[cut:], rejected[cut:]


# ----------------------------------------------------------------------------------------------
# public loaders


PAIR_FIELDS = {"prompt", "chosen", "rejected", "p", "margin", "weight", "split"}
PROMPT_FIELDS = {"prompt", "messages", "reference", "split"}
SFT_FIELDS = {"prompt", "completion", "messages", "split"}


def load_pairs(path: str | Path, split: str | None = None) -> list[PairRow]:
    """Read a pairs export; `split` keeps only rows whose split equals it (rows without a split are kept).

    Without a `prompt` column, chosen and rejected are taken as full transcripts and the shared
    prefix becomes the prompt (TRL's "implicit prompt" layout, as in HH-RLHF).
    """
    rows: list[PairRow] = []
    for where, record in read_records(path):
        for name in ("chosen", "rejected"):
            if record.get(name) is None:
                raise DataError(f"{where}: missing field {name!r}")
        prompt: Text
        if record.get("prompt") is None:
            chosen_full = _text(where, "chosen", record["chosen"], allow_messages=False)
            rejected_full = _text(where, "rejected", record["rejected"], allow_messages=False)
            prompt, chosen, rejected = split_implicit_prompt(str(chosen_full), str(rejected_full))
            if not prompt.strip():
                raise DataError(f"{where}: missing field 'prompt' and chosen/rejected share no prompt prefix")
        else:
            prompt = _text(where, "prompt", record["prompt"], allow_messages=True)
            chosen = _response(where, "chosen", record["chosen"])
            rejected = _response(where, "rejected", record["rejected"])
        row = PairRow(
            prompt=prompt, chosen=chosen, rejected=rejected,
            p=_number(where, "p", record.get("p"), 0.0, 1.0),
            margin=_number(where, "margin", record.get("margin")),
            weight=_number(where, "weight", record.get("weight"), 0.0),
            split=_split(where, record.get("split")),
            extra={k: v for k, v in record.items() if k not in PAIR_FIELDS},
        )
        if _in_split(row, split):
            rows.append(row)
    return _nonempty(rows, path, "pairs", split)


def load_prompts(path: str | Path, split: str | None = None) -> list[PromptRow]:
    """Read a prompts export: `prompt` (text or messages) or `messages`, optional `reference` and `split`.

    `split` keeps only rows whose split equals it (rows without a split are kept). A numeric
    reference is turned into text.
    """
    rows: list[PromptRow] = []
    for where, record in read_records(path):
        if record.get("prompt") is not None:
            prompt = _text(where, "prompt", record["prompt"], allow_messages=True)
        elif record.get("messages") is not None:
            if not isinstance(record["messages"], list):
                raise DataError(f"{where}: field 'messages' must be a list of chat messages")
            prompt = _messages(where, "messages", record["messages"])
        else:
            raise DataError(f"{where}: missing field 'prompt' (or 'messages')")
        reference = record.get("reference")
        if reference is not None and not isinstance(reference, str):
            if isinstance(reference, bool) or not isinstance(reference, int | float):
                raise DataError(f"{where}: field 'reference' must be a string, got {type(reference).__name__}")
            reference = str(reference)
        row = PromptRow(prompt=prompt, reference=reference, split=_split(where, record.get("split")),
                        extra={k: v for k, v in record.items() if k not in PROMPT_FIELDS})
        if _in_split(row, split):
            rows.append(row)
    return _nonempty(rows, path, "prompts", split)


def load_sft(path: str | Path, split: str | None = None) -> list[SFTRow]:
    """Read an SFT export: `prompt` (text or messages) and `completion`, or chat `messages` whose last turn is the
    assistant's target; optional `split`. `split` keeps only rows whose split equals it (rows without one stay)."""
    rows: list[SFTRow] = []
    for where, record in read_records(path):
        if record.get("completion") is not None:
            if record.get("prompt") is None:
                raise DataError(f"{where}: missing field 'prompt' (a completion needs the prompt it answers)")
            prompt = _text(where, "prompt", record["prompt"], allow_messages=True)
            completion = _response(where, "completion", record["completion"])
        elif isinstance(record.get("messages"), list):
            messages = _messages(where, "messages", record["messages"])
            if messages[-1]["role"] != "assistant" or len(messages) < 2:
                raise DataError(f"{where}: field 'messages' must end with an assistant turn after at least one other")
            prompt, completion = messages[:-1], messages[-1]["content"]
        else:
            raise DataError(f"{where}: missing field 'completion' (or chat 'messages')")
        row = SFTRow(prompt=prompt, completion=completion, split=_split(where, record.get("split")),
                     extra={k: v for k, v in record.items() if k not in SFT_FIELDS})
        if _in_split(row, split):
            rows.append(row)
    return _nonempty(rows, path, "SFT rows", split)


STEP_FIELDS = {"prompt", "completions", "labels", "split"}


def _step_labels(where: str, value: Any, steps: int) -> list[bool]:
    """Step labels: booleans (or 0/1), one per step."""
    if not isinstance(value, list):
        raise DataError(f"{where}: field 'labels' must be a list of booleans, got {type(value).__name__}")
    if len(value) != steps:
        raise DataError(f"{where}: field 'labels' has {len(value)} labels for {steps} steps in 'completions'")
    labels = []
    for i, label in enumerate(value):
        if isinstance(label, bool) or (isinstance(label, int) and label in (0, 1)):
            labels.append(bool(label))
        else:
            raise DataError(f"{where}: field 'labels'[{i}] must be true or false, got {label!r}")
    return labels


def load_steps(path: str | Path, split: str | None = None) -> list[StepRow]:
    """Read a steps export: `prompt` (text or messages), `completions` (the steps, a list of strings) and `labels`
    (one boolean per step), optional `split`; every other column is provenance (`extra`). `split` keeps only rows
    whose split equals it (rows without one stay)."""
    rows: list[StepRow] = []
    for where, record in read_records(path):
        for name in ("prompt", "completions", "labels"):
            if record.get(name) is None:
                raise DataError(f"{where}: missing field {name!r}")
        prompt = _text(where, "prompt", record["prompt"], allow_messages=True)
        steps = record["completions"]
        if not isinstance(steps, list) or not steps:
            raise DataError(f"{where}: field 'completions' must be a non-empty list of steps (strings)")
        completions = [str(_text(where, f"completions[{i}]", step, allow_messages=False))
                       for i, step in enumerate(steps)]
        row = StepRow(prompt=prompt, completions=completions,
                      labels=_step_labels(where, record["labels"], len(completions)),
                      split=_split(where, record.get("split")),
                      extra={k: v for k, v in record.items() if k not in STEP_FIELDS})
        if _in_split(row, split):
            rows.append(row)
    return _nonempty(rows, path, "step-labelled completions", split)


def _in_split(row: Any, split: str | None) -> bool:
    """Whether a row belongs to `split` (every row does when no split is asked for, and so does a row without one)."""
    return split is None or row.split is None or row.split == split


def _nonempty(rows: list[Any], path: str | Path, what: str, split: str | None) -> list[Any]:
    if not rows:
        raise DataError(f"{path}: no {what}" + (f" in split {split!r}" if split else ""))
    return rows


def train_and_heldout(load: Callable[[str], list[Any]], train: str, heldout: str | None = None
                      ) -> tuple[list[Any], list[Any]]:
    """(train rows, held-out rows) of a method's data: `heldout`'s rows when given, else the rows of `train` whose
    split is held-out; DataError when nothing is left to train on."""
    if heldout:
        return load(train), load(heldout)
    train_rows, heldout_rows = split_train_heldout(load(train))
    if not train_rows:
        raise DataError(f"{train}: every row is in a held-out split; nothing to train on")
    return train_rows, heldout_rows


def split_train_heldout(rows: list[Any]) -> tuple[list[Any], list[Any]]:
    """Rows whose `split` names a held-out set ("heldout", "test", "eval", …) versus all the others."""
    heldout = [r for r in rows if r.split is not None and r.split.lower() in HELDOUT_SPLITS]
    train = [r for r in rows if r.split is None or r.split.lower() not in HELDOUT_SPLITS]
    return train, heldout


def render_prompt(prompt: Text, tokenizer: Any = None) -> str:
    """Prompt text for a model: chat messages go through the tokenizer's chat template when it has one
    (with the generation prompt appended), otherwise become "role: content" lines ending in "assistant: "."""
    if isinstance(prompt, str):
        return prompt
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant: "
