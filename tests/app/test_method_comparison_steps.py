"""benchmarks/method_comparison.py's PRM data, at tiny size: SFT-like samples go into a project with step labels on,
a scripted annotator ranks and labels each line through the queue and rankings.submit, the export job writes the
steps export, and every exported row carries the line checker's labels (up to the first wrong step, where the
export ends a row)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _step_project import Item, label_through_project  # noqa: E402
from method_comparison import check_lines, final_right, pick_completions, solution  # noqa: E402

from training.data import load_steps  # noqa: E402


def _items() -> list[Item]:
    # Per prompt: one right, a slip in line 1 carried on (its line 2 is right given line 1), a slip in line 2, and
    # for the last prompt a third line, which the checker calls wrong.
    return [
        Item(prompt="1+2+3=", completions=[solution(1, 2, 3), solution(1, 2, 3, slip1=1), solution(1, 2, 3, slip2=1)]),
        Item(prompt="4+0+2=", completions=[solution(4, 0, 2, slip2=1), solution(4, 0, 2), "4+0=4\n4+2=6\n6+0=6"]),
        Item(prompt="3+3+1=", completions=[solution(3, 3, 1), solution(3, 3, 1, slip1=1), "3+3=6\n6+1=8"],
             split="heldout"),
    ]


def test_the_steps_export_holds_the_checkers_labels_for_every_completion(tmp_path: Path) -> None:
    items = _items()
    out = label_through_project(items, 3, check_lines, final_right, workdir=tmp_path)
    assert out.tasks == 3 and out.rows == 9
    assert out.row_counts == {"source.human": 9, "split.train": 6, "split.heldout": 3}
    assert out.step_labels == sum(len(c.splitlines()) for item in items for c in item.completions)
    rows = [json.loads(line) for line in out.path.read_text(encoding="utf-8").splitlines()]
    seen = set()
    for row in rows:
        item = next(i for i in items if i.prompt == row["prompt"])
        text = next(c for c in item.completions if c.splitlines()[: len(row["completions"])] == row["completions"])
        steps = text.splitlines()
        want = check_lines(row["prompt"], steps)
        cut = want.index(False) + 1 if False in want else len(want)
        assert row["completions"] == steps[:cut] and row["labels"] == want[:cut]
        assert row["step_labels"] == [1 if ok else -1 for ok in want[:cut]]
        assert row["first_error"] == (cut - 1 if False in want else None)
        assert row["source"] == "human" and len(row["annotators"]) == 1 and row["split"] == item.split
        seen.add((row["prompt"], text))
    assert len(seen) == 9
    # The slip in line 1 is wrong at step 0, and the row ends there.
    slip = next(r for r in rows if r["completions"] == ["1+2=4"])
    assert slip["labels"] == [False]
    # The training side reads the file as it is: 6 train rows, 3 held-out.
    assert len(load_steps(out.path, split="train")) == 6 and len(load_steps(out.path, split="heldout")) == 3


def test_completions_the_queue_cannot_rank_are_refused_before_any_write(tmp_path: Path) -> None:
    same = Item(prompt="1+1+1=", completions=[solution(1, 1, 1), solution(1, 1, 1)])
    with pytest.raises(ValueError, match=r"items\[0\]\.completions: need 2 distinct"):
        label_through_project([same], 2, check_lines, final_right, workdir=tmp_path)
    with pytest.raises(ValueError, match="k must be at least 2"):
        label_through_project([], 1, check_lines, final_right, workdir=tmp_path)
    assert not (tmp_path / "preflab.db").exists()


def test_picking_k_distinct_samples_with_a_right_and_a_wrong_one() -> None:
    right, wrong = solution(1, 2, 3), solution(1, 2, 3, slip2=1)
    assert pick_completions("1+2+3=", [right, right + "\n", "", wrong, solution(1, 2, 3, slip1=1)], 3) == [
        right, wrong, solution(1, 2, 3, slip1=1)]
    assert pick_completions("1+2+3=", [right, "1+2=3\n3+3=6 "], 2) is None  # one text once stripped, and right
    assert pick_completions("1+2+3=", [right, wrong], 3) is None  # too few distinct
