"""DPO: the implicit reward learns the preference, soft labels behave as label smoothing, the reference options agree,
and the policy's own answers get better (slow, seeded, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from training.config import DPOConfig
from training.data import PairRow, PromptRow
from training.dpo import DPOTrainer, main
from training.evaluate import EvalConfig, evaluate
from training.loop import run
from training.policy import load_policy
from training.rewards import build_reward_functions
from training.run_info import read_metrics


def pairs(problems, p=None) -> list[PairRow]:
    """Right answer over the careless model's habitual slip (answer + 1)."""
    return [PairRow(prompt=q, chosen=a, rejected=str(int(a) + 1), p=p) for q, a in problems]


def write_pairs(path: Path, train, heldout) -> Path:
    with path.open("w") as fh:
        for row, split in [(r, "train") for r in pairs(train)] + [(r, "heldout") for r in pairs(heldout)]:
            fh.write(json.dumps({"prompt": row.prompt, "chosen": row.chosen, "rejected": row.rejected,
                                 "split": split}) + "\n")
    return path


def _config(path: Path, out: Path, **kw) -> DPOConfig:
    base = dict(model=str(path), out=str(out), lr=1e-3, beta=0.1, batch_size=16, lr_schedule="constant",
                progress=False, seed=0)
    return DPOConfig(**(base | kw))


def test_config_errors_name_the_field():
    for kwargs, field in [({"beta": 0}, "beta"), ({"loss_type": "hinge"}, "loss_type"),
                          ({"label_smoothing": 0.5}, "label_smoothing"), ({"lr": -1}, "lr")]:
        with pytest.raises(ValueError, match=f"^{field}"):
            DPOConfig(**kwargs)


def test_coin_flip_labels_leave_the_policy_where_it_was(addition_sft, tmp_path):
    # p = 0.5 everywhere: at the reference (h = 0) the soft-label loss has zero gradient, so Adam does not move
    path, rl, _ = addition_sft
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPOTrainer(_config(path, tmp_path, steps=1), pairs(rl[:16], p=0.5), model=model, tokenizer=tok)
    metrics = trainer.step()
    assert metrics["loss"] == pytest.approx(0.6931, abs=1e-4)  # log 2: the reference itself
    assert all(torch.equal(p, start[n]) for n, p in trainer.unwrapped().named_parameters())


def test_precomputed_reference_log_probs_give_the_same_step_as_a_live_reference(addition_sft, tmp_path):
    path, rl, _ = addition_sft
    losses = []
    for precompute in (False, True):
        trainer = DPOTrainer(_config(path, tmp_path, steps=2, precompute_ref_logps=precompute), pairs(rl[:32]))
        losses.append([trainer.step()["loss"] for _ in range(2)])
        assert (trainer.reference is None) == precompute  # precomputed: the reference copy is freed
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("loss_type", "rpo_alpha", "steps", "lr"),
                         [("sigmoid", 0.0, 40, 1e-4), ("ipo", 0.0, 40, 1e-4), ("sigmoid", 1.0, 100, 3e-4)])
def test_dpo_learns_the_preference_and_with_rpo_the_answers_get_right(addition_sft, tmp_path, loss_type, rpo_alpha,
                                                                      steps, lr):
    path, rl, heldout = addition_sft
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = _config(path, tmp_path / loss_type, steps=steps, loss_type=loss_type, eval_every=20, lr=lr,
                     rpo_alpha=rpo_alpha)
    trainer = DPOTrainer(config, pairs(rl), pairs(heldout), model=model, tokenizer=tok)
    before = trainer.evaluate()
    functions = build_reward_functions(["gsm8k_exact_match"])
    prompts = [PromptRow(prompt=q, reference=a) for q, a in heldout]
    exact = EvalConfig(k=8, max_new_tokens=4, seed=1)
    reward_before = evaluate(model, tok, prompts, functions, None, exact)["policy"]["reward_mean"]
    result = run(trainer)
    reward_after = evaluate(trainer.unwrapped(), tok, prompts, functions, None, exact)["policy"]["reward_mean"]
    assert sum(not torch.equal(p, start[n]) for n, p in trainer.unwrapped().named_parameters()) > 0
    # at the start the policy is its reference: every implicit reward 0, accuracy a coin flip (ties count half)
    assert before["margin"] == pytest.approx(0.0, abs=1e-6) and before["accuracy"] == 0.5
    # the implicit reward β·log π/π_ref learned the preference on held-out pairs it never trained on
    assert result.eval["accuracy"] >= 0.75 and result.eval["margin"] > 0, result.eval
    assert result.eval["reward_chosen"] > result.eval["reward_rejected"]
    if rpo_alpha:  # and the answers the policy samples on held-out prompts got more often right
        assert reward_after > reward_before + 0.1, (reward_before, reward_after)
    else:  # plain DPO lowered the chosen answers too: "smaller than the slip" is what it learned (see dpo.py)
        assert result.eval["reward_chosen"] < 0 and reward_after < reward_before, (reward_before, reward_after)
    rows = read_metrics(Path(config.out) / "metrics.jsonl")
    assert {"loss", "accuracy", "margin", "reward_chosen", "reward_rejected"} <= set(rows[0])
    assert "eval_accuracy" in rows[19]


@pytest.mark.slow
def test_cli_end_to_end_with_resume_and_lora(addition_sft, tmp_path):
    path, rl, heldout = addition_sft
    data = write_pairs(tmp_path / "pairs.jsonl", rl[:32], heldout[:8])
    out = tmp_path / "run"
    common = ["--train", str(data), "--model", str(path), "--out", str(out), "--set", "batch_size=8",
              "--set", "lr=1e-3", "--set", "save_every=2", "--set", "lora=true", "--set", "lora_r=4", "--quiet"]
    assert main(common + ["--set", "steps=2"]) == 0
    assert main(common + ["--set", "steps=4", "--resume"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all({"accuracy", "margin"} <= set(r) for r in rows)
    report = json.loads((out / "eval.json").read_text())
    assert report["pairs"] == 8 and report["split"] == "heldout" and {"accuracy", "margin", "loss"} <= set(report)
    assert json.loads((out / "run.json").read_text())["resumed_from_step"] == 2
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    base = AutoModelForCausalLM.from_pretrained(path)
    assert any(not torch.equal(a, b) for a, b in zip(merged.parameters(), base.parameters(), strict=True))


def test_cli_errors_name_the_field(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3", "p": 1.5}\n')
    assert main(["--train", str(data), "--model", "m", "--out", str(tmp_path / "o")]) == 2
    assert "line 1: field 'p'" in capsys.readouterr().err
    assert main(["--train", str(data), "--out", str(tmp_path / "o"), "--set", "beta=0"]) == 2
    assert "beta must be positive" in capsys.readouterr().err
