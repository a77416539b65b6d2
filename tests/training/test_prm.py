"""The process reward model learns which steps go wrong: loss and metrics by hand, step splitting, the data loader's
errors, learning on a synthetic step-labelled task, the scoring API, the CLI and a resume after SIGKILL."""

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2ForTokenClassification, PreTrainedTokenizerFast

from tests.training.tiny import one_and_two_processes
from training.config import PRMConfig
from training.data import DataError, StepRow, load_steps
from training.losses import step_bce_loss
from training.prm import (
    META_FILE,
    ProcessRewardModel,
    StepEncoder,
    aggregate,
    first_error,
    main,
    split_steps,
    step_metrics,
    train_prm,
)
from training.run_info import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]

# The task: a completion is a few steps of neutral words; a step that holds a slip word is wrong, and so is every
# step after it (the solution went off the rails there), the way Math-Shepherd labels steps.
SLIPS = ["oops", "wrong", "typo", "flip"]
NEUTRAL = [f"w{i}" for i in range(24)]
PROMPTS = ["add the numbers", "solve for x", "count the apples", "sort the list"]
WORDS = SLIPS + NEUTRAL + sorted({w for p in PROMPTS for w in p.split()})


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Whitespace words, GPT-2 style (no pad, no [SEP]: the step separator falls back to the end-of-text token)."""
    vocab = {w: i for i, w in enumerate(["<eot>", "[UNK]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eot>")


def tiny_prm_dir(path: Path, seed: int = 0) -> Path:
    tokenizer = word_tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, num_labels=1)
    GPT2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def synthetic_rows(n: int, seed: int, **columns) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        steps, labels, ok = [], [], True
        for _ in range(rng.randint(2, 4)):
            words = [rng.choice(NEUTRAL) for _ in range(rng.randint(2, 3))]
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words) + 1), rng.choice(SLIPS))
                ok = False
            steps.append(" ".join(words))
            labels.append(ok)
        rows.append({"prompt": rng.choice(PROMPTS), "completions": steps, "labels": labels, **columns})
    return rows


def as_rows(dicts):
    return [StepRow(prompt=d["prompt"], completions=d["completions"], labels=d["labels"]) for d in dicts]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


FAST = dict(batch_size=16, lr=3e-3, max_length=48, progress=False)




@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory) -> Path:
    return tiny_prm_dir(tmp_path_factory.mktemp("tiny-prm"))


# --- formulas and building blocks ---------------------------------------------------------------


def test_step_bce_loss_by_hand():
    # step 1: s = 0, y = 1 → −log σ(0) = log 2 = 0.693147; step 2: s = ln 3 (σ = 0.75), y = 0 → −log 0.25 = 1.386294;
    # the padding position (mask 0) is left out: mean (0.693147 + 1.386294) / 2 = 1.039721
    s = torch.tensor([[0.0, math.log(3.0), 5.0]])
    y = torch.tensor([[1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert step_bce_loss(s, y, mask).item() == pytest.approx(1.039721, abs=1e-6)
    # over a global batch of 4 steps the same sum is divided by 4
    assert step_bce_loss(s, y, mask, num_steps=4).item() == pytest.approx(2.079442 / 4, abs=1e-6)


def test_split_steps_one_per_non_empty_line_or_by_a_pattern():
    text = "a = 1\n\n  b = 2\nc = 3"
    steps, ends = split_steps(text)
    assert steps == ["a = 1", "b = 2", "c = 3"]
    # the blank line belongs to the step before it; the offsets cover the whole text
    assert ends == [7, 15, len(text)] and text[:ends[0]] == "a = 1\n\n"
    assert split_steps("x; y;z;", r";\s*") == (["x", "y", "z"], [3, 5, 7])
    # a lookahead separator (it matches empty) cuts before each match
    assert split_steps("Step 1: a Step 2: b", r"(?=Step \d+:)") == (["Step 1: a", "Step 2: b"], [10, 19])
    assert split_steps("  \n\n") == ([], [])


@pytest.mark.parametrize(("field", "value"), [("threshold", 1.0), ("step_pattern", "("), ("step_pattern", "x*"),
                                               ("step_separator", ""), ("batch_size", 0)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}"):
        PRMConfig(**{field: value})


def test_step_metrics_by_hand():
    scores = [[0.9, 0.8], [0.9, 0.2, 0.1], [0.4, 0.6]]
    labels = [[True, True], [True, False, False], [True, True]]
    m = step_metrics(scores, labels, ["p", "p", "q"], threshold=0.5)
    # steps right: 2 + 3 + 1 (0.4 < 0.5 says wrong, the label says right) = 6 of 7
    assert m["step_accuracy"] == pytest.approx(6 / 7)
    # first errors predicted/labelled: (2, 2) ✓, (1, 1) ✓, (0, 2) ✗
    assert m["first_error_accuracy"] == pytest.approx(2 / 3)
    # prompt "p" has one all-correct and one wrong completion: min 0.8 > min 0.1 → right; "q" has no wrong one
    assert m["pairs"] == 1 and m["pair_accuracy"] == 1.0
    assert m["labelled_steps"] == 7 and m["completions"] == 3
    assert first_error([True, False, True]) == 1 and first_error([True]) == 1
    assert aggregate([0.5, 0.8], "min") == 0.5 and aggregate([0.5, 0.8], "product") == pytest.approx(0.4)
    assert aggregate([0.5, math.nan], "product") == 0.5 and aggregate([], "min") == 0.0


def test_encoder_keeps_whole_steps_and_the_newest_prompt_tokens():
    tokenizer = word_tokenizer()
    encoder = StepEncoder(tokenizer, max_length=8, separator="\n")
    eot = tokenizer.eos_token_id
    assert encoder.separator == [eot]  # "\n" is no token for a whitespace tokenizer: the end-of-text token stands in
    [fits, cut] = encoder.encode(["add the numbers", "solve for x"], [["w1 w2", "w3"], ["w1 w2 w3", "w4 w5", "w6"]])
    words = tokenizer.convert_ids_to_tokens(fits.ids)
    assert words == ["add", "the", "numbers", "w1", "w2", "<eot>", "w3", "<eot>"] and fits.positions == [5, 7]
    assert not fits.truncated
    # 4 + 3 tokens of steps fit in 8, the third step (2 more) does not; one prompt token ("x") is left room for
    assert tokenizer.convert_ids_to_tokens(cut.ids) == ["x", "w1", "w2", "w3", "<eot>", "w4", "w5", "<eot>"]
    assert cut.positions == [4, 7] and cut.truncated


def test_load_steps_reads_the_trl_layout_and_names_line_and_field(tmp_path):
    good = write_jsonl(tmp_path / "steps.jsonl", [{"prompt": "p", "completions": ["a", "b"], "labels": [True, 0],
                                                   "split": "train", "export_id": 3}])
    [row] = load_steps(good)
    assert row.labels == [True, False] and row.split == "train" and row.extra == {"export_id": 3}
    cases = [({"prompt": "p", "completions": ["a", "b"], "labels": [True]}, "field 'labels' has 1 labels for 2"),
             ({"prompt": "p", "completions": ["a"], "labels": [-1]}, "field 'labels'[0] must be true or false"),
             ({"prompt": "p", "completions": [], "labels": []}, "field 'completions' must be a non-empty list"),
             ({"prompt": "p", "completions": ["a", 3], "labels": [True, True]}, "field 'completions[1]'"),
             ({"completions": ["a"], "labels": [True]}, "missing field 'prompt'")]
    for record, message in cases:
        bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completions": ["a"], "labels": [True]}, record])
        with pytest.raises(DataError, match=re.escape(f"bad.jsonl:line 2: {message}")):
            load_steps(bad)


# --- learning -------------------------------------------------------------------------------------


def test_learns_which_steps_go_wrong(prm_dir, tmp_path):
    train, heldout = as_rows(synthetic_rows(400, seed=1)), as_rows(synthetic_rows(120, seed=2))
    untrained = ProcessRewardModel(GPT2ForTokenClassification.from_pretrained(prm_dir, num_labels=1),
                                   word_tokenizer(), max_length=48, device="cpu")
    before = step_metrics(untrained.score_steps([r.prompt for r in heldout], [r.completions for r in heldout]),
                          [r.labels for r in heldout], [r.prompt for r in heldout])
    initial = load_file(str(prm_dir / "model.safetensors"))
    config = PRMConfig(model=str(prm_dir), out=str(tmp_path / "out"), epochs=6, eval_every=25, **FAST)
    result = train_prm(config, train, heldout)

    last = result.eval
    assert last["step_accuracy"] >= 0.95 and last["step_accuracy"] > before["step_accuracy"] + 0.2
    assert last["first_error_accuracy"] >= 0.9 > before["first_error_accuracy"]
    assert last["pairs"] == before["pairs"] > 100 and last["pair_accuracy"] >= 0.95
    assert last["truncated"] == 0
    evals = [r for r in read_metrics(tmp_path / "out" / "metrics.jsonl") if "eval_step_accuracy" in r]
    assert [r["step"] for r in evals] == [25, 50, 75, 100, 125, 150] and result.steps == 150
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] < before["loss"]
    trained = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert {"step_accuracy", "first_error_accuracy", "pairs"} <= set(report)

    # the scoring API: a slip marks its step and the ones after it; batching does not change a score
    prm = ProcessRewardModel.load(tmp_path / "out" / "model", device="cpu")
    [clean, slipped] = prm.score_steps(["solve for x"] * 2, [["w1 w2", "w3 w4", "w5"], ["w1 w2", "w3 oops", "w5"]])
    assert min(clean) > 0.8 and slipped[0] > 0.8 and max(slipped[1:]) < 0.2
    steps = [r.completions for r in heldout]
    one_by_one = [prm.score_steps([r.prompt], [r.completions])[0] for r in heldout[:10]]
    batched = prm.score_steps([r.prompt for r in heldout], steps, batch_size=7)[:10]
    for a, b in zip(one_by_one, batched, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    # score_text cuts a rollout the way the model was trained (one step per non-empty line)
    assert prm.score_text(["solve for x"], ["w1 w2\n\nw3 oops\nw5\n"])[0] == pytest.approx(slipped, abs=1e-5)
    # a step past max_length is scored NaN: the model never saw it
    long = prm.score_steps(["solve for x"], [["w1 w2 w3"] * 20])[0]
    assert len(long) == 20 and not math.isnan(long[0]) and math.isnan(long[-1])


def test_the_shipped_minilm_is_the_default_and_trains(tmp_path):
    rows = as_rows(synthetic_rows(16, seed=3))
    result = train_prm(PRMConfig(out=str(tmp_path / "out"), steps=2, batch_size=8, max_length=32, progress=False),
                       rows)
    meta = json.loads((tmp_path / "out" / "model" / META_FILE).read_text())
    assert meta["kind"] == "prm" and meta["step_separator"] == "\n" and len(meta["separator_ids"]) == 1
    assert result.steps == 2 and 0 <= result.eval["step_accuracy"] <= 1
    assert len(ProcessRewardModel.load(tmp_path / "out" / "model").score_text(["q"], ["a\nb"])[0]) == 2


# --- command line, resume after a kill -----------------------------------------------------------


def test_cli_end_to_end_with_a_split_column_and_help(prm_dir, tmp_path, capsys):
    rows = synthetic_rows(64, seed=4, split="train") + synthetic_rows(24, seed=5, split="heldout")
    data = write_jsonl(tmp_path / "steps.jsonl", rows)
    out = tmp_path / "out"
    code = main(["--train", str(data), "--model", str(prm_dir), "--out", str(out), "--set", "epochs=2",
                 "--set", "batch_size=16", "--set", "max_length=48", "--set", "step_pattern=;", "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "eval.json").read_text())
    assert summary["steps"] == report["steps"] == 8 and report["completions"] == 24 and report["split"] == "heldout"
    assert json.loads((out / "model" / META_FILE).read_text())["step_pattern"] == ";"
    assert len(json.loads((out / "run.json").read_text())["data"]["train"]["sha256"]) == 64

    assert main(["--train", str(data), "--out", str(tmp_path / "o"), "--set", "threshold=2"]) == 2
    assert "threshold must be in (0, 1)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "step_separator" in text and "step_pattern" in text and "steps export" in text


def test_resume_after_sigkill_continues_where_the_checkpoint_left_off(prm_dir, tmp_path):
    data = write_jsonl(tmp_path / "steps.jsonl", synthetic_rows(96, seed=6))
    settings = ["--set", "batch_size=16", "--set", "max_length=48", "--set", "lr=3e-3", "--set", "epochs=2",
                "--set", "eval_every=0", "--set", "log_every=1", "--set", "lr_schedule=constant", "--quiet"]
    full = tmp_path / "full"
    assert main(["--train", str(data), "--model", str(prm_dir), "--out", str(full), *settings]) == 0

    cut, release = tmp_path / "cut", tmp_path / "release"
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PREFLAB_TEST_HOLD": f"train.step.6={release}"}
    args = [sys.executable, "-m", "training", "prm", "--train", str(data), "--model", str(prm_dir), "--out", str(cut),
            *settings, "--set", "save_every=3"]
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not Path(f"{release}.held").exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the trainer never reached step 6"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # held at step 6, checkpointed at step 6: nothing after it happens
    finally:
        proc.wait()
    assert not (cut / "model").exists()
    assert json.loads((cut / "checkpoint" / "trainer_state.json").read_text())["step"] == 6

    assert main(["--train", str(data), "--model", str(prm_dir), "--out", str(cut), *settings, "--resume"]) == 0
    losses = {r["step"]: r["loss"] for r in read_metrics(cut / "metrics.jsonl") if "loss" in r}
    expected = {r["step"]: r["loss"] for r in read_metrics(full / "metrics.jsonl") if "loss" in r}
    assert sorted(losses) == sorted(expected) == list(range(1, 13))
    for step in expected:
        assert losses[step] == pytest.approx(expected[step], abs=1e-5)
    a = load_file(str(full / "model" / "model.safetensors"))
    b = load_file(str(cut / "model" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_load_steps_reads_parquet_and_datasets_directories(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"prompt": "p", "completions": ["a", "b"], "labels": [True, False], "split": "train"},
               {"prompt": "q", "completions": ["c"], "labels": [True], "split": "heldout"}]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "steps.parquet")
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "hf"))
    for path in (tmp_path / "steps.parquet", tmp_path / "hf"):
        rows = load_steps(path)
        assert [(r.completions, r.labels, r.split) for r in rows] == [(["a", "b"], [True, False], "train"),
                                                                      (["c"], [True], "heldout")]


# --- data-parallel -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_process_ddp_follows_one_process_with_the_same_global_batch(prm_dir, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", synthetic_rows(64, seed=10))
    heldout = write_jsonl(tmp_path / "eval.jsonl", synthetic_rows(32, seed=11))
    args = ["-m", "training", "prm", "--train", str(train), "--eval", str(heldout), "--model", str(prm_dir)]
    for s in ["batch_size=16", "lr=3e-3", "lr_schedule=constant", "max_length=48", "epochs=3", "log_every=1",
              "eval_every=0", "progress=false"]:
        args += ["--set", s]
    curve_one, curve_two, eval_one, eval_two = one_and_two_processes(args, tmp_path)
    assert len(curve_one) == len(curve_two) == 12
    assert curve_one[-1] < curve_one[0] - 0.1  # the curve moves, so agreeing along it means something
    # each process divides its steps' BCE by the global step count: the DDP mean is the one-process loss
    assert curve_two[:6] == pytest.approx(curve_one[:6], abs=1e-4)
    assert curve_two == pytest.approx(curve_one, rel=2e-2)
    assert eval_two["completions"] == 32 and eval_two["labelled_steps"] == eval_one["labelled_steps"]
    assert abs(eval_two["step_accuracy"] - eval_one["step_accuracy"]) <= 2 / eval_one["labelled_steps"]
