"""A run's estimate counts the work its config implies, as the trainers do it, and prices it at measured unit
costs; the measurement itself (`python -m training speed`) times a real model and writes figures the estimate
reads. Hand-counted work on round unit costs, so a person can check each figure."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import GRPOConfig, RewardConfig
from training.estimate import Data, Speed, estimate
from training.speed import measure

pytestmark = pytest.mark.usefixtures("one_thread")

UNIT = Speed(start_s=10.0, forward_token_s=0.001, train_token_s=0.003, optimizer_s=0.5, decode_step_s=0.02,
             decode_row_s=0.01, save_s=2.0, chars_per_token=4.0, template_tokens=0.0)


def _phases(found) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {p.name: p.seconds for p in found.phases}


def test_a_grpo_step_is_its_sampling_its_reference_pass_and_its_update() -> None:
    config = dataclasses.asdict(GRPOConfig(steps=3, prompts_per_step=2, group_size=4, max_new_tokens=100,
                                           eval_max_prompts=0))
    data = Data(train_rows=80, heldout_rows=0, prompt_chars=400)  # 100 tokens a prompt
    found = estimate("grpo", config, data, UNIT)
    # Sampling: 2 prompts read once (200 tokens × 0.001) + 100 steps × (0.02 + 8 rows × 0.01) = 0.2 + 10 = 10.2 s.
    # Reference: 8 rows × 200 tokens × 0.001 = 1.6 s. Update: 1600 tokens × 0.003 + 0.5 = 5.3 s. A step: 17.1 s.
    assert found.steps == 3
    assert _phases(found) == pytest.approx({"start": 10.0, "training": 3 * 17.1, "saving": 2.0})
    assert found.seconds == pytest.approx(12.0 + 51.3)


def test_the_evaluation_samples_policy_and_reference_and_the_kl_on_held_out_prompts() -> None:
    config = dataclasses.asdict(GRPOConfig(steps=1, prompts_per_step=1, group_size=2, max_new_tokens=10,
                                           eval_max_prompts=5, eval_k=4))
    found = estimate("grpo", config, Data(train_rows=80, heldout_rows=20, prompt_chars=40), UNIT)
    # 5 of the 20 held-out prompts, 10 tokens each. One side: greedy 5 prompts (0.05 s read + 10 × (0.02 + 0.05))
    # = 0.75 s, sampled 5 prompts × 4 (0.05 + 10 × (0.02 + 0.2)) = 2.25 s: 3.0 s. KL: 2 × 20 rows × 20 tokens ×
    # 0.001 = 0.8 s. The policy's side and the KL once, the reference's side once: 3.0 + 0.8 + 3.0 = 6.8 s.
    assert _phases(found)["evaluation"] == pytest.approx(6.8)


def test_an_offline_run_takes_epochs_of_batches_and_reads_both_answers_of_a_pair() -> None:
    config = dataclasses.asdict(RewardConfig(batch_size=16, epochs=2, max_length=256, eval_every=0))
    data = Data(train_rows=200, heldout_rows=40, prompt_chars=200, response_chars=400)  # 50 + 100 tokens
    found = estimate("reward", config, data, UNIT)
    # 2 × 200 / 16 = 25 steps; a step: 16 pairs × 2 answers × 150 tokens × 0.003 + 0.5 = 14.9 s.
    # Evaluation: 40 pairs × 2 × 150 tokens × 0.001 = 12 s.
    assert found.steps == 25
    assert _phases(found) == pytest.approx({"start": 10.0, "training": 25 * 14.9, "evaluation": 12.0, "saving": 2.0})


def test_figures_missing_or_wrong_are_named() -> None:
    figures = dataclasses.asdict(UNIT)
    del figures["decode_row_s"]
    with pytest.raises(ValueError, match="decode_row_s: missing"):
        Speed.from_dict(figures)
    with pytest.raises(ValueError, match="save_s: must be a non-negative number"):
        Speed.from_dict(dataclasses.asdict(UNIT) | {"save_s": -1})
    older = {k: v for k, v in dataclasses.asdict(UNIT).items() if k not in ("chars_per_token", "template_tokens")}
    assert Speed.from_dict(older).chars_per_token == 4.0  # files from before a figure was measured still read


@pytest.mark.slow
def test_the_measurement_times_a_real_model_and_the_command_writes_its_figures(tmp_path: Path) -> None:
    from training.demo_policy import write_demo_policy

    model = write_demo_policy(tmp_path / "tiny")
    figures = measure(model)
    speed = Speed.from_dict(figures)
    assert speed.forward_token_s > 0 and speed.train_token_s > speed.forward_token_s  # a backward pass costs more
    assert speed.decode_step_s + 16 * speed.decode_row_s > 0 and speed.optimizer_s > 0
    assert figures["parameters"] > 0 and figures["device"] == "cpu" and figures["threads"] >= 1
    assert 0.5 < speed.chars_per_token < 1.5  # a byte tokenizer: about a character a token
    out = tmp_path / "speed" / "tiny.json"
    done = subprocess.run([sys.executable, "-m", "training", "speed", "--model", str(model), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert Speed.from_dict(json.loads(out.read_text())).save_s > 0
    missing = subprocess.run([sys.executable, "-m", "training", "speed", "--out", str(out)],
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "model: a causal LM directory is needed" in missing.stderr
