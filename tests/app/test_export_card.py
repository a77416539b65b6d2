"""The dataset card describes the rows actually written, for every kind, aggregation, layout and file format: its
counts are the rows' counts, and the split its front matter gives the data file is the rows' split. A file that
holds train and held-out rows is never called `train`, read the way `datasets` reads a Hub repository."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from app.exports import writer as export_writer
from tests.app.test_steps_export import labelled  # noqa: F401 - fixture: 2 train and 2 held-out prompts, ranked

KINDS = [("pairs", "raw"), ("pairs", "aggregated"), ("rankings", "raw"), ("prompts", "raw"), ("sft", "raw"),
         ("steps", "raw")]
LAYOUTS = (None, "standard", "conversational")


def _rows(out: Path, kind: str, fmt: str) -> list[dict[str, Any]]:
    if fmt == "jsonl":
        return [json.loads(line) for line in (out / f"{kind}.jsonl").read_text(encoding="utf-8").splitlines()]
    return pq.read_table(out / f"{kind}.parquet").to_pylist()


def _front_matter_split(card: str) -> tuple[str, str]:
    """(split, path) of the one data file the card's YAML front matter declares."""
    head = card.split("\n---\n", 1)[0]
    (found,) = re.findall(r"^  - split: (\S+)\n    path: (\S+)$", head, flags=re.M)
    return found[0], json.loads(found[1])


def _counts(card: str) -> tuple[int, Counter[str], Counter[str]]:
    """(rows, rows per split, rows per source) as the card's Counts section states them."""
    section = card.split("## Counts\n", 1)[1].split("\n## ", 1)[0]
    rows = int(re.search(r"^- rows: (\d+)", section, flags=re.M).group(1))
    per = {what: Counter({k: int(v) for k, v in re.findall(rf"^- {what} (\S+): (\d+)$", section, flags=re.M)})
           for what in ("split", "source")}
    return rows, per["split"], per["source"]


def _hub_splits(out: Path) -> dict[str, list[str]]:
    """What `datasets` makes of the export as a Hub repository (the card's configs): split name → rows' splits."""
    import datasets

    # A cache of its own: `datasets` keys its cache on the folder's name, which repeats across these exports.
    loaded = datasets.load_dataset(str(out), cache_dir=str(out.parent / f"{out.name}.cache"))
    return {name: list(ds["split"]) for name, ds in loaded.items()}


def _write(engine: Any, out: Path, project_id: int, kind: str, aggregation: str, fmt: str, layout: str | None,
           filters: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], str]:
    spec = export_writer.ExportSpec(project_id, kind, fmt, filters or {}, aggregation=aggregation, layout=layout)
    export_writer.write_export(engine, spec, out, secret="s" * 40)
    return _rows(out, kind, fmt), (out / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(("kind", "aggregation"), KINDS)
def test_the_card_states_the_rows_and_never_calls_held_out_rows_train(
        labelled, engine: Any, tmp_path: Path, kind: str, aggregation: str) -> None:  # noqa: F811
    project_id, _ = labelled
    for layout in LAYOUTS:
        for fmt in ("jsonl", "parquet"):
            out = tmp_path / f"{layout}-{fmt}"
            rows, card = _write(engine, out, project_id, kind, aggregation, fmt, layout)
            rows_said, splits_said, sources_said = _counts(card)
            splits = Counter(r["split"] for r in rows)
            assert set(splits) == {"train", "heldout"}, f"the seed holds both splits: {splits}"
            assert rows_said == len(rows) and splits_said == splits, (layout, fmt)
            if "source" in rows[0]:
                assert sources_said == Counter(r["source"] for r in rows), (layout, fmt)
            split, path = _front_matter_split(card)
            assert path == f"{kind}.{fmt}" and split == "train_and_heldout", (layout, fmt, split)
            assert "`split` column is `train` to train" in card
            assert _hub_splits(out) == {"train_and_heldout": [r["split"] for r in rows]}
    # Filtered to one split, the file is that split, by name.
    for only in ("train", "heldout"):
        out = tmp_path / f"only-{only}"
        rows, card = _write(engine, out, project_id, kind, aggregation, "jsonl", None, {"split": only})
        assert rows and {r["split"] for r in rows} == {only}
        assert _counts(card)[:2] == (len(rows), Counter({only: len(rows)}))
        assert _front_matter_split(card) == (only, f"{kind}.jsonl") and "holds both splits" not in card
        assert _hub_splits(out) == {only: [only] * len(rows)}

