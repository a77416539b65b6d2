"""RFT: which samples are kept, and proof that fine-tuning on the accepted ones raises held-out accuracy, online
(resampling from the improving policy) and offline (every round from the starting model)."""

from __future__ import annotations

import json

import pytest
import torch

from training.config import RFTConfig
from training.data import PromptRow
from training.evaluate import EvalConfig, evaluate
from training.loop import run
from training.policy import load_policy
from training.rewards import build_reward_functions
from training.rft import RFTTrainer, main, select_samples
from training.run_info import read_metrics


def rows(problems) -> list[PromptRow]:
    return [PromptRow(prompt=q, reference=a) for q, a in problems]


def test_select_samples_by_threshold_top_k_and_distinct_answers():
    rewards = [1.0, 0.0, 1.0, 0.5,    0.0, 0.0, 0.0, 0.0]  # two prompts, n = 4
    texts = ["7", "8", "7", "6",      "a", "b", "c", "d"]
    assert select_samples(rewards, 4, "threshold", 1.0, 1) == [0, 2]
    assert select_samples(rewards, 4, "threshold", 1.0, 1, texts) == [0]  # "7" twice is kept once
    assert select_samples(rewards, 4, "threshold", 0.5, 1) == [0, 2, 3]
    # the best 2 of each prompt, ties broken by sampling order; a prompt whose samples all fail still gives its best
    assert select_samples(rewards, 4, "top_k", 0.0, 2) == [0, 2, 4, 5]
    assert select_samples(rewards, 4, "top_k", 0.0, 2, texts) == [0, 3, 4, 5]


def test_config_errors_name_the_field():
    for kwargs, field in [({"samples_per_prompt": 0}, "samples_per_prompt"), ({"keep": "best"}, "keep"),
                          ({"steps_per_round": 0}, "steps_per_round"), ({"top_k": 0}, "top_k")]:
        with pytest.raises(ValueError, match=f"^{field}"):
            RFTConfig(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("online", [True, False])
def test_rft_raises_heldout_accuracy(addition_sft, tmp_path, online):
    path, rl, heldout = addition_sft
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    functions = build_reward_functions(["gsm8k_exact_match"])
    exact = EvalConfig(k=8, max_new_tokens=4, seed=1)
    before = evaluate(model, tok, rows(heldout), functions, None, exact)["policy"]["reward_mean"]
    config = RFTConfig(model=str(path), out=str(tmp_path / "out"), lr=1e-3, steps=80, steps_per_round=5,
                       prompts_per_round=32, samples_per_prompt=8, batch_size=32, max_new_tokens=4, online=online,
                       distinct=False, progress=False, eval_k=4)
    trainer = RFTTrainer(config, model, tok, functions, rows(rl), rows(heldout))
    result = run(trainer)
    after = evaluate(trainer.unwrapped(), tok, rows(heldout), functions, None, exact)["policy"]["reward_mean"]
    assert sum(not torch.equal(p, start[n]) for n, p in trainer.unwrapped().named_parameters()) > 0
    assert after > before + 0.08, (before, after)  # held-out prompts: fine-tuned only on its own right answers
    history = result.history
    assert len(trainer.rounds) == 16 and {h["samples"] for h in history} == {32 * 8}
    assert all(0 < h["kept_fraction"] < 1 and h["kept_reward_mean"] == 1.0 for h in history)
    if online:  # resampled from the improving policy: later rounds accept more of its answers
        assert history[-1]["kept_fraction"] > history[0]["kept_fraction"]
    assert {"reward_mean", "kl", "win_rate", "pass_at_k"} <= set(result.eval)


@pytest.mark.slow
def test_cli_end_to_end_with_resume(addition_sft, tmp_path):
    path, rl, heldout = addition_sft
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as fh:
        for (q, a), split in [(x, "train") for x in rl] + [(x, "heldout") for x in heldout[:8]]:
            fh.write(json.dumps({"prompt": q, "reference": a, "split": split}) + "\n")
    out = tmp_path / "run"
    common = ["--prompts", str(prompts), "--model", str(path), "--out", str(out), "--reward-fn", "gsm8k_exact_match",
              "--set", "online=true", "--set", "steps_per_round=2", "--set", "prompts_per_round=4",
              "--set", "samples_per_prompt=4", "--set", "batch_size=4", "--set", "max_new_tokens=4",
              "--set", "lr=1e-3", "--set", "save_every=3", "--set", "eval_k=2", "--quiet"]
    assert main(common + ["--set", "steps=3"]) == 0
    assert main(common + ["--set", "steps=6", "--resume"]) == 0
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4, 5, 6]
    assert all({"loss", "reward_mean", "kept_fraction", "samples"} <= set(r) for r in metrics)
    assert [r["round"] for r in metrics] == [1, 1, 2, 2, 3, 3]  # the resumed run continued round 2 from its samples
    assert json.loads((out / "run.json").read_text())["resumed_from_step"] == 3
    assert (out / "model" / "model.safetensors").exists() and (out / "samples.jsonl").exists()


def test_cli_rejects_missing_reward(tmp_path, capsys):
    assert main(["--prompts", "p.jsonl", "--model", "m", "--out", str(tmp_path)]) == 2
    assert "--reward-fn" in capsys.readouterr().err
