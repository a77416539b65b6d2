"""Ensemble reward models: N heads on one encoder, each on its own bootstrap; their spread is the uncertainty."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.training.test_reward_model import FAST, as_rows, synthetic_pairs, tiny_bert_dir, write_jsonl
from training.reward_model import (
    RewardConfig,
    RewardModel,
    bootstrap_weights,
    main,
    pearson,
    train_reward_model,
    uncertainty_metrics,
)

pytestmark = pytest.mark.usefixtures("one_thread")




@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.mark.parametrize("field", ["ensemble", "uncertainty_quantiles"])
def test_config_errors_name_the_field(field):
    with pytest.raises(ValueError, match=f"^{field} must be at least 1"):
        RewardConfig(**{field: 0})


def test_uncertainty_metrics_by_hand():
    # two heads, four pairs (label: chosen wins). Head deltas: pair 0 (2, 2) sure and right; pair 1 (1, −1) torn,
    # mean 0 → a tie, half right; pair 2 (−2, −2) sure and wrong; pair 3 (3, 1) right, heads differ a bit.
    heads_c = torch.tensor([[2.0, 2.0], [1.0, -1.0], [-2.0, -2.0], [3.0, 1.0]])
    heads_r = torch.zeros(4, 2)
    m = uncertainty_metrics(heads_c, heads_r, torch.ones(4), quantiles=2)
    s = torch.sigmoid(torch.tensor(1.0)).item()  # σ(1) = 0.731059
    # spread = |σ(a) − σ(b)| / 2 per pair: 0, (σ(1) − σ(−1))/2 = σ(1) − 0.5, 0, (σ(3) − σ(1))/2
    spread_3 = (torch.sigmoid(torch.tensor(3.0)).item() - s) / 2
    assert m["heads"] == 2
    assert m["mean_spread"] == pytest.approx((s - 0.5 + spread_3) / 4, abs=1e-6)
    # lowest spread half: pairs 0 and 2 (right, wrong) → 0.5; highest half: pairs 3 and 1 (right, tie) → 0.75
    assert [b["pairs"] for b in m["accuracy_by_uncertainty"]] == [2, 2]
    assert [b["accuracy"] for b in m["accuracy_by_uncertainty"]] == [0.5, 0.75]
    assert m["head_accuracy"] == [0.75, 0.5]  # head 0: 2, 1, −2, 3; head 1: 2, −1, −2, 1
    expected = pearson(torch.tensor([0.0, 0.5, 1.0, 0.0]), torch.tensor([0.0, s - 0.5, 0.0, spread_3]))
    assert m["error_spread_correlation"] == pytest.approx(expected)
    assert pearson(torch.ones(3), torch.tensor([1.0, 2.0, 3.0])) is None  # a constant: undefined, not NaN


def test_pearson_by_hand():
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])) == pytest.approx(1.0)
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 1.0])) == pytest.approx(0.0)


def test_bootstrap_gives_each_head_its_own_resample_and_repeats_with_the_seed():
    weight = torch.tensor([1.0, 2.0] * 500)
    assert torch.equal(bootstrap_weights(weight, 1, True, seed=0), weight[None])  # one head: the data as it is
    assert torch.equal(bootstrap_weights(weight, 3, False, seed=0), weight.expand(3, -1))
    boot = bootstrap_weights(weight, 3, True, seed=0)
    counts = boot / weight
    assert torch.equal(counts, counts.round()) and (counts >= 0).all()
    assert not torch.equal(counts[0], counts[1]) and counts.mean().item() == pytest.approx(1.0, abs=0.1)
    assert 0.25 < (counts == 0).float().mean().item() < 0.5  # Poisson(1) leaves out e^−1 ≈ 37% of the pairs
    assert torch.equal(bootstrap_weights(weight, 3, True, seed=0), boot)
    assert not torch.equal(bootstrap_weights(weight, 3, True, seed=1), boot)


def test_ensemble_learns_and_its_spread_marks_the_pairs_it_gets_wrong(bert_dir, tmp_path):
    train, heldout = as_rows(synthetic_pairs(800, seed=1)), as_rows(synthetic_pairs(200, seed=2))
    config = RewardConfig(model=str(bert_dir), epochs=3, eval_every=50, ensemble=4, **FAST)
    result = train_reward_model(config, train, heldout, tmp_path / "out")

    ev = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert ev["accuracy"] >= 0.9 and ev["heads"] == 4 and len(ev["head_accuracy"]) == 4
    assert all(a >= 0.85 for a in ev["head_accuracy"])
    buckets = ev["accuracy_by_uncertainty"]
    assert [b["pairs"] for b in buckets] == [50, 50, 50, 50]
    assert sum(b["accuracy"] * b["pairs"] for b in buckets) / 200 == pytest.approx(ev["accuracy"])
    assert buckets[0]["spread"][0] <= buckets[0]["spread"][1] <= buckets[1]["spread"][0]  # lowest spread first
    # whether the spread marks the errors is what eval.json is there to tell (on this easy rule the heads of a
    # shared, fine-tuned encoder agree closely and it does not): a correlation, reported, not assumed
    assert -1 <= ev["error_spread_correlation"] <= 1 and ev["mean_spread"] > 0
    assert result.eval["loss"] < 0.4

    # the model dir is an ordinary sequence-classification model with 4 outputs; the heads are not copies
    weights = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    head = weights["classifier.weight"]
    assert head.shape[0] == 4 and not torch.allclose(head[0], head[1])
    initial = load_file(str(bert_dir / "model.safetensors"))
    assert not torch.equal(weights["bert.embeddings.word_embeddings.weight"],
                           initial["bert.embeddings.word_embeddings.weight"])

    # it loads and scores through the same API as a single-head model
    model = RewardModel.load(tmp_path / "out" / "model", device="cpu")
    assert model.heads == 4
    prompts, responses = ["what is rain"] * 2, ["great kind w1", "rude wrong w1"]
    mean, per_head = model.score(prompts, responses), model.score(prompts, responses, per_head=True)
    assert mean.shape == (2,) and per_head.shape == (2, 4)
    assert torch.allclose(per_head.mean(-1), mean, atol=1e-6) and mean[0] > mean[1]
    pref = model.compare([r.prompt for r in heldout], [r.chosen for r in heldout], [r.rejected for r in heldout])
    assert pref.p.shape == pref.spread.shape == (200,) and pref.p_heads.shape == (200, 4)
    assert ((pref.reward_first > pref.reward_second).float().mean().item()
            == pytest.approx(ev["accuracy"], abs=0.011))
    assert (pref.spread > 0).all() and pref.spread.mean().item() == pytest.approx(ev["mean_spread"], rel=0.01)


def test_a_single_head_model_compares_with_zero_spread(bert_dir):
    model = RewardModel.load(bert_dir, device="cpu")
    assert model.heads == 1
    pref = model.compare(["what is rain"] * 2, ["great", "w1"], ["rude", "w1"])
    assert torch.equal(pref.spread, torch.zeros(2))
    assert pref.p[1].item() == pytest.approx(0.5)  # the same response on both sides
    with pytest.raises(ValueError, match="2 prompts, 2 first and 1 second"):
        model.compare(["a", "b"], ["x", "y"], ["z"])


def test_cli_trains_an_ensemble_with_set(bert_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", synthetic_pairs(64, seed=6, split="train")
                       + synthetic_pairs(16, seed=7, split="heldout"))
    out = tmp_path / "out"
    assert main(["--train", str(data), "--model", str(bert_dir), "--out", str(out), "--set", "ensemble=3",
                 "--set", "batch_size=16", "--set", "progress=false", "--set", "max_length=32"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["heads"] == 3 and "error_spread_correlation" in summary
    assert json.loads((out / "model" / "preflab_reward.json").read_text())["heads"] == 3
    assert json.loads((out / "run.json").read_text())["config"]["ensemble"] == 3
    assert RewardModel.load(out / "model").score(["what is rain"], ["great"], per_head=True).shape == (1, 3)
    assert main(["--train", str(data), "--out", str(out / "x"), "--set", "ensemble=0"]) == 2
    assert "ensemble must be at least 1" in capsys.readouterr().err
