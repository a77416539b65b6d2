"""The reward model learns a synthetic preference rule; soft labels, truncation, CLI, resume, early stopping, DDP."""

import json
import math
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    PreTrainedTokenizerFast,
)

from tests.training.tiny import one_and_two_processes
from training.data import PairRow
from training.loop import plan_batches
from training.losses import bradley_terry_loss
from training.reward_model import (
    PairEncoder,
    RewardConfig,
    RewardModel,
    main,
    pair_loss,
    pairwise_metrics,
    prepare_tokenizer_and_model,
    train_reward_model,
)
from training.run_info import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


# The rule: a response's worth is (#good words − #bad words); the chosen response is always worth more.
GOOD = ["great", "kind", "clear", "helpful"]
BAD = ["rude", "wrong", "vague", "lazy"]
NEUTRAL = [f"w{i}" for i in range(24)]
PROMPTS = ["tell me about cats", "how do i cook rice", "what is rain", "explain maths"]
WORDS = GOOD + BAD + NEUTRAL + sorted({w for p in PROMPTS for w in p.split()})


def word_tokenizer(specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]"), bert=True) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(list(specials) + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bert:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                       cls_token="[CLS]", sep_token="[SEP]")
    # a GPT-2-style tokenizer: no pad token, only an end-of-text token
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eot>")


def tiny_bert_dir(path: Path, seed: int = 0) -> Path:
    tokenizer = word_tokenizer()
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=1, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def response(rng: random.Random, worth: int) -> str:
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 8))]
    for _ in range(abs(worth)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if worth > 0 else BAD))
    return " ".join(words)


def synthetic_pairs(n: int, seed: int, **columns) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        hi, lo = sorted(rng.sample(range(-2, 3), 2), reverse=True)
        rows.append({"prompt": rng.choice(PROMPTS), "chosen": response(rng, hi), "rejected": response(rng, lo),
                     **columns})
    return rows


def as_rows(dicts):
    return [PairRow(**d) for d in dicts]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


FAST = dict(batch_size=16, lr=1e-3, max_length=32, progress=False)




@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-bert"))


# --- config and building blocks ----------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("batch_size", 0), ("lr", 0.0), ("warmup_ratio", 1.0),
                                               ("lr_schedule", "step"), ("mixed_precision", "fp8"),
                                               ("max_length", 4), ("eval_every", -1)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RewardConfig(**{field: value})


def test_the_old_field_names_still_work_and_name_the_new_ones():
    from training.config import load_config

    with pytest.warns(DeprecationWarning, match="'max_steps' is deprecated; use 'steps'"):
        config = RewardConfig(max_steps=7, learning_rate=1e-3, lr_scheduler="constant", checkpoint_every=2,
                              tensorboard=True)
    assert (config.steps, config.lr, config.lr_schedule, config.save_every, config.report_to) == (
        7, 1e-3, "constant", 2, ["tensorboard"])
    with pytest.warns(DeprecationWarning, match="use 'lr'"):
        assert load_config(RewardConfig, None, ["learning_rate=0.5", "max_steps=3"]).lr == 0.5
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="^lr must be positive"):
        RewardConfig(learning_rate=0.0)


def test_encoder_truncates_from_the_left_and_keeps_the_response():
    tokenizer = word_tokenizer()
    encoder = PairEncoder(tokenizer, max_length=8)  # [CLS] + 6 tokens + [SEP]
    ids, cut = encoder.encode(["tell me about cats", "what is rain"], ["great kind clear", "w1"])
    words = [tokenizer.convert_ids_to_tokens(x) for x in ids]
    # 4 prompt + 3 response words = 7 > 6: the oldest prompt word "tell" goes, the response stays whole
    assert words[0] == ["[CLS]", "me", "about", "cats", "great", "kind", "clear", "[SEP]"]
    assert words[1] == ["[CLS]", "what", "is", "rain", "w1", "[SEP]"]
    assert cut == [True, False]


def test_pad_token_is_set_and_decoder_pooling_ignores_padding():
    # A GPT-2-style tokenizer has no pad token. Once it is set and the model knows its id, a short sequence
    # scores the same alone and padded next to a long one (the head pools the last real token, not padding).
    tokenizer = word_tokenizer(specials=("<eot>", "[UNK]"), bert=False)
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=2,
                                                     n_head=2, num_labels=1))
    assert tokenizer.pad_token is None
    prepare_tokenizer_and_model(tokenizer, model)
    assert tokenizer.pad_token == "<eot>" and model.config.pad_token_id == tokenizer.pad_token_id
    scorer = RewardModel(model, tokenizer, max_length=32, device="cpu")
    alone = scorer.score(["what is rain"], ["great"])
    batched = scorer.score(["what is rain", "tell me about cats"], ["great", "w1 w2 w3 w4 w5 w6 w7 w8"], batch_size=2)
    assert batched[0].item() == pytest.approx(alone[0].item(), abs=1e-5)


def test_pair_loss_hard_soft_margin_and_weights():
    r_c, r_r = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0])
    margin, weight, ones = torch.tensor([0.5, 0.0]), torch.tensor([1.0, 3.0]), torch.ones(2)
    hard = pair_loss(r_c, r_r, ones, margin, weight, soft=False)
    assert hard.item() == pytest.approx(bradley_terry_loss(r_c, r_r, margin, weight).item())
    # −log σ(0.5) = 0.474077 and −log σ(−0.5) = 0.974077, weighted 1:3 → (0.474077 + 3·0.974077) / 4 = 0.849077
    assert hard.item() == pytest.approx(0.849077, abs=1e-6)
    # the soft form at p = 1 is the hard one, margin included
    assert pair_loss(r_c, r_r, ones, margin, weight, soft=True).item() == pytest.approx(hard.item())


def test_pairwise_metrics_by_hand():
    # Δ = [2, −1, 0]: right, wrong, tie (half) → accuracy 0.5; mean margin (2 − 1 + 0)/3 = ⅓
    m = pairwise_metrics(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0]), torch.ones(3), torch.zeros(3),
                         torch.ones(3), torch.tensor([5, 10, 20]), soft=False, calibration_bins=5, length_buckets=3)
    assert m["accuracy"] == pytest.approx(0.5) and m["mean_margin"] == pytest.approx(1 / 3)
    assert m["pairs"] == 3
    # confidences max(σ(Δ), 1 − σ(Δ)) = [0.8808, 0.7311, 0.5]: bins [0.5, 0.6) has the tie, [0.7, 0.8) and [0.8, 0.9)
    assert [b["pairs"] for b in m["calibration"]] == [1, 0, 1, 1, 0]
    assert m["calibration"][2]["accuracy"] == 0.0 and m["calibration"][3]["accuracy"] == 1.0
    # ECE = ⅓·|0.5 − 0.5| + ⅓·|0 − 0.7311| + ⅓·|1 − 0.8808| = 0.283468
    assert m["ece"] == pytest.approx((0.7310586 + (1 - 0.8807971)) / 3, abs=1e-6)
    assert sum(b["pairs"] for b in m["accuracy_by_length"]) == 3


def test_length_grouped_batches_cover_every_pair_once_and_pad_less():
    rng = random.Random(0)
    lengths = [rng.randint(5, 500) for _ in range(1000)]
    grouped = plan_batches(lengths, 16, seed=0, epoch=0, group_by_length=True, megabatch_factor=50)
    plain = plan_batches(lengths, 16, seed=0, epoch=0, group_by_length=False, megabatch_factor=50)
    for plan in (grouped, plain):
        assert sorted(i for b in plan for i in b) == list(range(1000))

    def padded(plan):
        return sum(len(b) * max(lengths[i] for i in b) for b in plan)

    assert padded(grouped) < 0.6 * padded(plain)
    assert plan_batches(lengths, 16, 0, 1, True, 50) != grouped  # a new order every epoch
    assert plan_batches(lengths, 16, 0, 0, True, 50) == grouped  # and the same order for the same epoch


# --- learning ----------------------------------------------------------------------------------


def test_learns_a_synthetic_rule_to_high_heldout_accuracy(bert_dir, tmp_path):
    train, heldout = as_rows(synthetic_pairs(800, seed=1)), as_rows(synthetic_pairs(200, seed=2))
    before = RewardModel.load(bert_dir, device="cpu")
    initial_weights = load_file(str(bert_dir / "model.safetensors"))
    r_c = before.score([r.prompt for r in heldout], [r.chosen for r in heldout])
    r_r = before.score([r.prompt for r in heldout], [r.rejected for r in heldout])
    accuracy_before = (r_c > r_r).float().mean().item()

    result = train_reward_model(RewardConfig(model=str(bert_dir), epochs=3, eval_every=50, **FAST), train, heldout,
                                tmp_path / "out")
    assert result.eval["accuracy"] >= 0.9 > accuracy_before + 0.2
    assert result.eval["pairs"] == 200 and result.eval["truncated"] == 0 and result.steps == 150
    trained = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    assert any(not torch.equal(trained[k], initial_weights[k]) for k in initial_weights)

    # the saved model scores through the public API and agrees with the trainer's own evaluation
    after = RewardModel.load(tmp_path / "out" / "model", device="cpu")
    good = after.score(["what is rain"] * 2, ["great kind w1", "rude wrong w1"])
    assert good[0] > good[1]
    r_c = after.score([r.prompt for r in heldout], [r.chosen for r in heldout], batch_size=7)
    r_r = after.score([r.prompt for r in heldout], [r.rejected for r in heldout], batch_size=64)
    assert (r_c > r_r).float().mean().item() == pytest.approx(result.eval["accuracy"], abs=0.011)

    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [50, 100, 150]  # every 50 steps; the last one is the final evaluation
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] < math.log(2)
    assert {"calibration", "accuracy_by_length", "ece", "mean_margin"} <= set(result.eval)


def test_soft_labels_train_towards_the_label_probability(bert_dir, tmp_path):
    # the same pairs labelled p = 0.75: BT with soft labels is minimised where σ(r_c − r_r) = 0.75,
    # so the model should become far less confident than with hard labels
    soft = as_rows(synthetic_pairs(400, seed=3, p=0.75))
    hard = as_rows(synthetic_pairs(400, seed=3))
    config = RewardConfig(model=str(bert_dir), epochs=6, eval_every=0, **dict(FAST, lr=3e-3))
    soft_result = train_reward_model(config, soft, soft, tmp_path / "soft")
    train_reward_model(config, hard, hard, tmp_path / "hard")

    def mean_prob(out):
        scorer = RewardModel.load(out / "model", device="cpu")
        delta = scorer.score([r.prompt for r in soft], [r.chosen for r in soft]) - \
            scorer.score([r.prompt for r in soft], [r.rejected for r in soft])
        return torch.sigmoid(delta).mean().item()

    assert mean_prob(tmp_path / "soft") == pytest.approx(0.75, abs=0.08)
    assert mean_prob(tmp_path / "hard") > 0.93
    assert soft_result.eval["accuracy"] >= 0.85  # the direction is still learned


def test_early_stopping_keeps_the_best_heldout_model(bert_dir, tmp_path):
    # training labels are the reverse of the held-out rule: the held-out loss only gets worse, so training
    # stops after `patience` evaluations and the model kept is the one at the best (first) evaluation
    flipped = [dict(r, chosen=r["rejected"], rejected=r["chosen"]) for r in synthetic_pairs(320, seed=4)]
    config = RewardConfig(model=str(bert_dir), epochs=3, eval_every=2, early_stopping_patience=2,
                          **dict(FAST, lr=3e-3))
    result = train_reward_model(config, as_rows(flipped), as_rows(synthetic_pairs(100, seed=5)), tmp_path / "out")
    assert result.stopped_early and result.steps < 60
    evals = [r for r in result.history if "eval_loss" in r]
    assert result.eval["loss"] == pytest.approx(min(r["eval_loss"] for r in evals), abs=1e-5)
    assert result.eval["best_step"] == 2


# --- command line, resume ----------------------------------------------------------------------


def test_cli_end_to_end_with_split_column_and_truncation(bert_dir, tmp_path, capsys):
    rows = synthetic_pairs(96, seed=6, split="train") + synthetic_pairs(32, seed=7, split="heldout")
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    # max_length 12 leaves 10 words for prompt + response: count by hand which held-out pairs exceed it
    words = [max(len((r["prompt"] + " " + r["chosen"]).split()), len((r["prompt"] + " " + r["rejected"]).split()))
             for r in rows[96:]]
    expected_truncated = sum(n > 10 for n in words)
    assert 0 < expected_truncated < 32
    toml = tmp_path / "run.toml"
    toml.write_text("batch_size = 16\nlr = 1e-3\nprogress = false\n")
    out = tmp_path / "out"
    code = main(["--train", str(data), "--model", str(bert_dir), "--out", str(out), "--config", str(toml),
                 "--set", "max_length=12", "--set", "epochs=2"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "eval.json").read_text())
    assert report["pairs"] == 32 and report["truncated"] == expected_truncated == summary["truncated"]
    assert isinstance(report["accuracy"], float) and report["train_pairs"] == 96 and report["steps"] == 12
    assert (out / "model" / "model.safetensors").exists() and (out / "model" / "tokenizer.json").exists()
    assert json.loads((out / "model" / "preflab_reward.json").read_text())["max_length"] == 12
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["max_length"] == 12 and run["config"]["batch_size"] == 16
    assert len(run["data"]["train"]["sha256"]) == 64 and "torch" in run["versions"] and "git_commit" in run
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")][:3] == [1, 2, 3]  # a short run logs every step
    assert RewardModel.load(out / "model").score(["what is rain"], ["great"]).shape == (1,)


def test_cli_errors_name_file_line_and_field(tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"},
                                              {"prompt": "a", "chosen": "b", "rejected": "c", "p": 2}])
    assert main(["--train", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:line 2: field 'p'" in capsys.readouterr().err
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    assert main(["--train", str(good), "--out", str(tmp_path / "o"), "--set", "batch_size=0"]) == 2
    assert "batch_size" in capsys.readouterr().err
    assert main(["--train", str(good), "--out", str(tmp_path / "o"), "--set", "nope=1"]) == 2
    assert "unknown config field 'nope'" in capsys.readouterr().err


def test_resume_continues_exactly_where_the_checkpoint_left_off(bert_dir, tmp_path):
    train, heldout = as_rows(synthetic_pairs(96, seed=8)), as_rows(synthetic_pairs(32, seed=9))
    base = dict(FAST, model=str(bert_dir), lr_schedule="constant", log_every=1, eval_every=0, epochs=2)
    full = train_reward_model(RewardConfig(**base), train, heldout, tmp_path / "full")
    # the same run, interrupted after 5 of its 12 steps (the checkpoint at step 5), then resumed
    train_reward_model(RewardConfig(**base, steps=5, save_every=5), train, heldout, tmp_path / "cut")
    assert (tmp_path / "cut" / "checkpoint" / "trainer_state.json").exists()
    resumed = train_reward_model(RewardConfig(**base, steps=12, resume=True), train, heldout, tmp_path / "cut")
    assert resumed.steps == full.steps == 12
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl") if "loss" in r}
    expected = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "loss" in r}
    assert sorted(losses) == list(range(1, 13))
    for step in range(1, 13):
        assert losses[step] == pytest.approx(expected[step], abs=1e-6)
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "model" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


# --- data-parallel -----------------------------------------------------------------------------


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(bert_dir, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", synthetic_pairs(64, seed=10))
    heldout = write_jsonl(tmp_path / "eval.jsonl", synthetic_pairs(32, seed=11))
    sets = ["batch_size=16", "lr=5e-3", "lr_schedule=constant", "max_length=32", "epochs=3", "log_every=1",
            "progress=false"]
    args = ["-m", "training", "reward", "--train", str(train), "--eval", str(heldout), "--model", str(bert_dir)]
    for s in sets:
        args += ["--set", s]
    curve_one, curve_two, eval_one, eval_two = one_and_two_processes(args, tmp_path)
    assert len(curve_one) == len(curve_two) == 12
    assert curve_one[-1] < curve_one[0] - 0.2  # the curve moves, so agreeing along it means something
    # float32 sums run in another order across two processes (~1e-7); Adam amplifies that over the steps,
    # so the first half of the curve must agree tightly and the rest within 2%
    assert curve_two[:6] == pytest.approx(curve_one[:6], abs=1e-4)
    assert curve_two == pytest.approx(curve_one, rel=2e-2)
    assert eval_two["pairs"] == 32 and abs(eval_two["accuracy"] - eval_one["accuracy"]) <= 1 / 32
    # the held-out loss comes after the steep steps (gradient norms 0.0005 → 2.6, clipped): Adam turns the
    # order-of-summation noise of the near-zero early gradients into full-size updates (m/√v ≈ ±1), so the two
    # final models differ by a few percent in loss (measured: 0.316 vs 0.324) while their accuracy agrees
    assert eval_two["loss"] == pytest.approx(eval_one["loss"], rel=5e-2)
