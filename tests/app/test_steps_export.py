"""The `steps` export: step labels made through the ranking API, exported through the real job worker in TRL's
stepwise layout, read back by `datasets` and tokenized the way a process reward model trainer reads it."""

from __future__ import annotations

import json
from collections import Counter
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.annotation import steps
from app.exports import steps as export_steps
from app.models import Completion, Prompt
from app.projects import projects
from tests.app.test_exports import _download, _export

# Three steps for the good answer, two for the bad one.
GOOD = "2 + 3 = 5\n5 * 2 = 10\nanswer: 10"
BAD = "2 + 3 = 6\nanswer: 12"


def test_majority_per_step_with_ties_going_to_the_worse_label() -> None:
    # Step 0: +1 +1 −1 → +1 (2 of 3). Step 1: 0 vs −1, one each → −1 (tie, the worse label); the row ends there.
    assert export_steps.aggregate([[1, 0, 1], [1, -1], [-1]], "positive") == ([1, -1], [2, 1], [3, 2])
    assert export_steps.aggregate([[1, 0, 1], [1, 0, 1]], "truncate") == ([1], [2], [2])
    assert export_steps.aggregate([[0, 1]], "truncate") is None
    assert export_steps.as_bools([1, 0, -1], "positive") == [True, True, False]
    assert export_steps.as_bools([1, 0, -1], "negative") == [True, False, False]


def _seed(db, make_user, make_project, *, annotators=2):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2, overlap=annotators)
    steps.set_options(db, project, lead, enabled=True, separator=None)
    engineer = make_user(db, "engineer")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    people = [make_user(db, "annotator") for _ in range(annotators)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    for i, split in enumerate(("train", "heldout")):
        prompt = Prompt(project_id=project.id, text=f"(2 + 3) * 2, case {i}?", text_hash=f"s{i}-{project.id}",
                        split=split)
        db.add(prompt)
        db.flush()
        for text in (GOOD, BAD):
            db.add(Completion(prompt_id=prompt.id, text=text, steps=steps.split(text)))
    db.flush()
    return lead, engineer, project, people


def _label_everything(db, api, token_for, project, people, labels_of) -> None:  # type: ignore[no-untyped-def]
    """Every annotator ranks every prompt, the good answer first, with step labels `labels_of(person, text)`."""
    clients = [api(token_for(db, p)) for p in people]
    db.commit()
    for n, client in enumerate(clients):
        while (r := client.get(f"/api/projects/{project.id}/tasks/next")).status_code == 200:
            task = r.json()
            by_text = {c["text"]: c["id"] for c in task["completions"]}
            body = {"assignment_id": task["assignment_id"], "tiers": [[by_text[GOOD]], [by_text[BAD]]],
                    "rubric_version": 1, "submission_id": f"s-{n}-{task['assignment_id']}",
                    "step_labels": {str(cid): labels_of(n, text) for text, cid in by_text.items()}}
            assert client.post(f"/api/projects/{project.id}/rankings", json=body).status_code == 201


def _two_annotators(n: int, text: str) -> list[int]:
    # Both call every step of GOOD correct except annotator 1, who finds step 2 neutral; both stop BAD at step 1.
    if text == GOOD:
        return [1, 1, 1] if n == 0 else [1, 0, 1]
    return [-1]


@pytest.fixture
def labelled(db, make_user, make_project, token_for, api):  # type: ignore[no-untyped-def]
    lead, engineer, project, people = _seed(db, make_user, make_project)
    _label_everything(db, api, token_for, project, people, _two_annotators)
    client = api(token_for(db, engineer))
    db.commit()
    return project.id, client


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_one_row_per_labelled_completion_in_trls_stepwise_layout(labelled, app, tmp_path: Path) -> None:
    project_id, client = labelled
    out = _export(client, app, project_id, kind="steps", format="jsonl")
    assert out["row_count"] == 4 and out["row_counts"] == {"source.human": 4, "split.heldout": 2, "split.train": 2}
    rows = _rows(_download(client, out, tmp_path) / "steps.jsonl")
    good = [r for r in rows if len(r["completions"]) == 3]
    bad = [r for r in rows if r not in good]
    assert len(good) == len(bad) == 2
    for row in good:
        # Step 2: +1 and 0 tie → 0 (the worse), a neutral step, True under the default `neutral: positive`.
        assert row["completions"] == ["2 + 3 = 5", "5 * 2 = 10", "answer: 10"]
        assert row["labels"] == [True, True, True] and row["step_labels"] == [1, 0, 1]
        assert row["votes"] == [2, 1, 2] and row["total_votes"] == [2, 2, 2] and row["first_error"] is None
        assert row["agreement"] == pytest.approx((1 + 0.5 + 1) / 3)
    for row in bad:
        # A list that stopped at the first −1: the row ends there.
        assert row["completions"] == ["2 + 3 = 6"] and row["labels"] == [False] and row["first_error"] == 0
    for row in rows:
        assert isinstance(row["prompt"], str) and len(row["ranking_ids"]) == 2 and len(row["annotators"]) == 2
        assert row["source"] == "human" and row["rubric_versions"] == [1]
    assert sorted(r["split"] for r in rows) == ["heldout", "heldout", "train", "train"]
    assert {r["prompt_id"] for r in rows if r["split"] == "heldout"}.isdisjoint(
        {r["prompt_id"] for r in rows if r["split"] == "train"})
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "## Step labels" in card and "`neutral: positive`" in card and "PRMTrainer" in card
    assert '"neutral": "positive"' in card


def test_the_neutral_option_changes_labels_and_is_recorded(labelled, app, tmp_path: Path) -> None:
    project_id, client = labelled
    negative = _export(client, app, project_id, kind="steps", format="jsonl", neutral="negative")
    assert negative["filters"]["neutral"] == "negative"
    rows = _rows(_download(client, negative, tmp_path / "n") / "steps.jsonl")
    assert sorted(r["labels"] for r in rows) == [[False], [False], [True, False, True], [True, False, True]]
    truncated = _export(client, app, project_id, kind="steps", format="jsonl", neutral="truncate")
    rows = _rows(_download(client, truncated, tmp_path / "t") / "steps.jsonl")
    assert sorted(r["completions"] for r in rows) == [["2 + 3 = 5"], ["2 + 3 = 5"], ["2 + 3 = 6"], ["2 + 3 = 6"]]


def _label_past_errors(n: int, text: str) -> list[int]:
    # An annotator who labels every step: BAD's first step is wrong, its second right given the first.
    return [1, 1, 1] if text == GOOD else [-1, 1]


def test_every_step_keeps_the_steps_after_the_first_error(db, make_user, make_project, token_for, api, app,
                                                          tmp_path: Path) -> None:
    lead, engineer, project, people = _seed(db, make_user, make_project, annotators=1)
    _label_everything(db, api, token_for, project, people, _label_past_errors)
    client = api(token_for(db, engineer))
    db.commit()
    cut = _export(client, app, project.id, kind="steps", format="jsonl")
    full = _export(client, app, project.id, kind="steps", format="jsonl", every_step=True)
    # the default is recorded as before (no key), the option by name
    assert "every_step" not in cut["filters"] and full["filters"]["every_step"] is True
    cut_rows = _rows(_download(client, cut, tmp_path / "cut") / "steps.jsonl")
    rows = _rows(_download(client, full, tmp_path / "full") / "steps.jsonl")
    bad = [r for r in rows if r["completions"][0] == "2 + 3 = 6"]
    assert [r["completions"] for r in bad] == [["2 + 3 = 6", "answer: 12"]] * 2
    assert [r["labels"] for r in bad] == [[False, True]] * 2 and [r["first_error"] for r in bad] == [0, 0]
    assert sorted(r["completions"] for r in cut_rows if r["first_error"] == 0) == [["2 + 3 = 6"]] * 2
    # each prompt's two answers are each a row, in both exports
    for exported in (rows, cut_rows):
        assert sorted(Counter(r["prompt_id"] for r in exported).values()) == [2, 2]
    card = (tmp_path / "full" / "README.md").read_text(encoding="utf-8")
    assert "`every_step: true`" in card and '"every_step": true' in card
    refused = client.post(f"/api/projects/{project.id}/exports", json={"kind": "pairs", "format": "jsonl",
                                                                       "every_step": True})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "every_step"


def test_neutral_is_refused_for_other_kinds(labelled) -> None:
    project_id, client = labelled
    r = client.post(f"/api/projects/{project_id}/exports", json={"kind": "pairs", "format": "jsonl",
                                                                 "neutral": "negative"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "neutral"


def test_the_same_request_gives_the_same_bytes(labelled, app) -> None:
    project_id, client = labelled
    first = _export(client, app, project_id, kind="steps", format="parquet")
    again = _export(client, app, project_id, kind="steps", format="parquet")
    assert first["sha256"] == again["sha256"] and set(first["files"]) == {"steps.parquet", "README.md"}


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_it_loads_into_datasets_and_tokenizes_as_a_prm_trainer_reads_it(labelled, app, tmp_path: Path,
                                                                        fmt: str) -> None:
    """TRL 1.16 no longer ships PRMTrainer (it was removed after 0.2x); its data path was: `datasets` rows with
    `prompt` (str), `completions` (list of str) and `labels` (list of bool), each step tokenized, a separator
    appended, and the step's label put on the separator's token (−100 elsewhere), mapped with int64 output
    features. This runs that path, written here, on the export as loaded."""
    import datasets

    from tests.training.tiny import char_tokenizer

    project_id, client = labelled
    out = _export(client, app, project_id, kind="steps", format=fmt)
    root = _download(client, out, tmp_path)
    if fmt == "hf":
        data = datasets.load_from_disk(str(root / "steps"))
    else:
        data = datasets.load_dataset("parquet", data_files=str(root / "steps.parquet"), split="train")
    assert data.features["prompt"] == datasets.Value("string")
    assert data.features["labels"].feature == datasets.Value("bool")
    assert data.features["completions"].feature == datasets.Value("string")
    tokenizer = char_tokenizer()
    separator = tokenizer.encode("\n", add_special_tokens=False)

    def tokenize(row: dict[str, Any]) -> dict[str, list[int]]:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        per_step = [tokenizer(s, add_special_tokens=False)["input_ids"] + separator for s in row["completions"]]
        marks = [[-100] * (len(ids) - 1) + [int(label)] for ids, label in zip(per_step, row["labels"], strict=True)]
        return {"input_ids": prompt + list(chain(*per_step)), "labels": [-100] * len(prompt) + list(chain(*marks))}

    tokenized = data.map(tokenize, remove_columns=data.column_names, features=datasets.Features(
        {"labels": datasets.Sequence(datasets.Value("int64")), "input_ids": datasets.Sequence(datasets.Value("int64"))}))
    for row, source in zip(tokenized, data, strict=True):
        scored = [label for label in row["labels"] if label != -100]
        assert scored == [int(b) for b in source["labels"]]
        positions = [i for i, label in enumerate(row["labels"]) if label != -100]
        assert all(row["input_ids"][i] == separator[-1] for i in positions)


def test_a_project_without_step_labels_exports_an_empty_steps_file(db, make_user, make_project, token_for, api,
                                                                   app, tmp_path: Path) -> None:
    lead, engineer, project, people = _seed(db, make_user, make_project)
    _label_everything(db, api, token_for, project, people, lambda n, text: [])  # ranked, no step labels
    client = api(token_for(db, engineer))
    pid = project.id
    db.commit()
    out = _export(client, app, pid, kind="steps", format="jsonl")
    assert out["row_count"] == 0 and out["empty"] is True
    assert (_download(client, out, tmp_path) / "steps.jsonl").read_bytes() == b""


def test_a_labelled_completion_without_stored_steps_is_left_out(labelled, db, app, tmp_path: Path) -> None:
    project_id, client = labelled
    emptied = db.scalars(select(Completion).join(Prompt).where(Prompt.project_id == project_id,
                                                               Completion.text == BAD)).first()
    emptied.steps = []
    db.commit()
    out = _export(client, app, project_id, kind="steps", format="jsonl")
    assert out["status"] == "ready" and out["row_count"] == 3
    rows = _rows(_download(client, out, tmp_path) / "steps.jsonl")
    assert emptied.id not in {r["completion_id"] for r in rows}
