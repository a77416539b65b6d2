"""Reading exports: JSONL, Parquet and datasets directories; errors name file, line and field."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.data import (
    DataError,
    load_pairs,
    load_prompts,
    render_prompt,
    sha256_of,
    split_implicit_prompt,
    split_train_heldout,
)
from training.run_info import MetricsWriter, git_commit, package_versions, read_metrics, write_run_config

PAIRS = [
    {"prompt": "Say hi", "chosen": "hi", "rejected": "go away", "split": "train"},
    {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": "4", "rejected": "5", "p": 0.9, "margin": 2,
     "weight": 0.5, "split": "heldout", "source": "ai"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_pairs_from_jsonl_with_optional_columns(tmp_path):
    rows = load_pairs(write_jsonl(tmp_path / "pairs.jsonl", PAIRS))
    assert [r.chosen for r in rows] == ["hi", "4"]
    assert rows[0].p is None and rows[0].weight is None and rows[0].split == "train"
    assert rows[1].prompt == [{"role": "user", "content": "2+2?"}]
    assert (rows[1].p, rows[1].margin, rows[1].weight) == (0.9, 2.0, 0.5)
    assert rows[1].extra == {"source": "ai"}
    train, heldout = split_train_heldout(rows)
    assert [r.chosen for r in train] == ["hi"] and [r.chosen for r in heldout] == ["4"]
    assert [r.chosen for r in load_pairs(tmp_path / "pairs.jsonl", split="heldout")] == ["4"]


def test_pairs_from_parquet_and_datasets_dir(tmp_path):
    flat = [dict(r, prompt=r["prompt"] if isinstance(r["prompt"], str) else "2+2?") for r in PAIRS]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "pairs.parquet")
    assert [r.rejected for r in load_pairs(tmp_path / "pairs.parquet")] == ["go away", "5"]

    import datasets

    datasets.Dataset.from_list(flat).save_to_disk(str(tmp_path / "ds"))
    assert [r.prompt for r in load_pairs(tmp_path / "ds")] == ["Say hi", "2+2?"]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}]),
                               "test": datasets.Dataset.from_list([{"prompt": "d", "chosen": "e", "rejected": "f"}])})
    dd.save_to_disk(str(tmp_path / "dd"))
    rows = load_pairs(tmp_path / "dd")
    assert [(r.prompt, r.split) for r in rows] == [("a", "train"), ("d", "test")]


def test_conversational_responses_are_reduced_to_text(tmp_path):
    row = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
           "rejected": [{"role": "assistant", "content": "no"}]}
    pair = load_pairs(write_jsonl(tmp_path / "c.jsonl", [row]))[0]
    assert (pair.chosen, pair.rejected) == ("hello", "no")


def test_implicit_prompt_hh_layout(tmp_path):
    chosen = "\n\nHuman: how do I bake bread?\n\nAssistant: Mix flour and water."
    rejected = "\n\nHuman: how do I bake bread?\n\nAssistant: I won't help."
    assert split_implicit_prompt(chosen, rejected) == (
        "\n\nHuman: how do I bake bread?\n\nAssistant:", " Mix flour and water.", " I won't help.")
    with gzip.open(tmp_path / "hh.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"chosen": chosen, "rejected": rejected}) + "\n")
    pair = load_pairs(tmp_path / "hh.jsonl.gz")[0]
    assert pair.prompt.endswith("Assistant:") and pair.chosen == " Mix flour and water."


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "x", "chosen": "a"}', "line 2: missing field 'rejected'"),
    ('{"prompt": "x", "chosen": "a", "rejected": "b", "p": 1.5}', r"line 2: field 'p' must be in \[0.0, 1.0\]"),
    ('{"prompt": "x", "chosen": "a", "rejected": "b", "weight": -1}', "line 2: field 'weight'"),
    ('{"prompt": "x", "chosen": 3, "rejected": "b"}', "line 2: field 'chosen' must be a string"),
    ('{"prompt": "", "chosen": "a", "rejected": "b"}', "line 2: field 'prompt' is empty"),
    ('{"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}', r"line 2: field 'prompt'\[0\]"),
    ('{"prompt": "x", "chosen": "a", "rejected": "b", "margin": "big"}', "line 2: field 'margin'"),
    ("not json", "line 2: invalid JSON"),
])
def test_pair_errors_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok", "chosen": "a", "rejected": "b"}\n' + line + "\n")
    with pytest.raises(DataError, match=message) as info:
        load_pairs(path)
    assert str(path) in str(info.value)


def test_prompts_from_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [
        {"prompt": "What is 2+3?", "reference": "#### 5", "split": "train", "id": 7},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"prompt": "1+1=", "reference": 2, "split": "heldout"},
    ])
    rows = load_prompts(path)
    assert rows[0].prompt == "What is 2+3?" and rows[0].reference == "#### 5" and rows[0].extra == {"id": 7}
    assert rows[1].prompt[1] == {"role": "user", "content": "Hi"} and rows[1].reference is None
    assert rows[2].reference == "2" and rows[2].split == "heldout"
    assert [r.prompt for r in load_prompts(path, split="heldout")] == [rows[1].prompt, "1+1="]


def test_prompt_errors(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"reference": "5"}])
    with pytest.raises(DataError, match=r"p.jsonl:line 2: missing field 'prompt'"):
        load_prompts(path)
    with pytest.raises(DataError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no prompts"):
        load_prompts(tmp_path / "empty.jsonl")


def test_render_prompt_without_and_with_chat_template():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt("plain") == "plain"
    assert render_prompt(messages) == "system: Be brief.\nuser: Hi\nassistant: "

    class Templated:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "|".join(m["content"] for m in messages) + "|>"

    assert render_prompt(messages, Templated()) == "Be brief.|Hi|>"


def test_sha256_of_file_and_directory(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"abc")
    # the well-known digest of "abc"
    assert sha256_of(tmp_path / "a.txt") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"1")
    before = sha256_of(tmp_path / "d")
    (tmp_path / "d" / "x").write_bytes(b"2")
    assert sha256_of(tmp_path / "d") != before


def test_run_info_files(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        lr: float = 1e-3

    (tmp_path / "data.jsonl").write_text("{}\n")
    path = write_run_config(tmp_path / "out", Cfg(), data={"train": tmp_path / "data.jsonl", "eval": None})
    record = json.loads(path.read_text())
    assert record["config"] == {"lr": 1e-3}
    assert record["versions"]["torch"] and "python" in package_versions()
    assert record["data"]["train"]["sha256"] == sha256_of(tmp_path / "data.jsonl") and "eval" not in record["data"]
    assert record["git_commit"] == git_commit()
    with MetricsWriter(tmp_path / "out" / "metrics.jsonl") as metrics:
        metrics.log(1, loss=0.5)
        metrics.log(2, loss=0.25, note="x")
    assert read_metrics(tmp_path / "out" / "metrics.jsonl") == [{"step": 1, "loss": 0.5},
                                                                {"step": 2, "loss": 0.25, "note": "x"}]
