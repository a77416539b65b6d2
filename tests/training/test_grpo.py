"""GRPO/GSPO: config validation, process advantages on tokens, and the proof that it learns (slow, seeded, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.tiny import addition_split, char_tokenizer, save_tiny, tiny_gpt2
from training.data import PromptRow
from training.evaluate import EvalConfig, evaluate
from training.grpo import Credit, GRPOConfig, GRPOTrainer, compute_advantages, main, step_advantages, token_step_index
from training.policy import load_policy, prepare_tokenizer
from training.rewards import RewardFunction, RewardResult, build_reward_functions, compute_rewards

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"group_size": 1}, "group_size"), ({"beta": -1}, "beta"), ({"clip_eps": 1.5}, "clip_eps"),
     ({"aggregation": "mean"}, "aggregation"), ({"scale_rewards": "x"}, "scale_rewards"), ({"mu": 0}, "mu"),
     ({"temperature": 0}, "temperature"), ({"reward_fn": ["a"], "reward_weights": [1, 2]}, "reward_weights"),
     ({"server_base_url": "http://x"}, "server_model"), ({"loss_type": "ppo"}, "loss_type"),
     ({"process_credit": "max"}, "process_credit"), ({"process_outcome_mix": -0.1}, "process_outcome_mix"),
     ({"advantage_clip": 0}, "advantage_clip")],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**kwargs)


def test_gspo_gets_its_own_clip_range():
    assert GRPOConfig().clip_eps == 0.2 and GRPOConfig().clip_eps_high is None
    gspo = GRPOConfig(loss_type="gspo")
    assert (gspo.clip_eps, gspo.clip_eps_high) == (3e-4, 4e-4)


def test_process_advantages_reach_the_tokens_of_their_step():
    tok = prepare_tokenizer(char_tokenizer())
    texts = ["a\nbc", "de\nf", "x\ny", "zz"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, ids))
    response_ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in ids])
    response_mask = (response_ids != tok.pad_token_id).long()
    step_ends = [[2, 4], [3, 4], [2, 3], [2]]
    index = token_step_index(tok, response_ids, response_mask, step_ends)
    # "a\n" is step 0 (2 tokens), "bc" + EOS step 1
    assert index[0].tolist() == [0, 0, 1, 1, 1]
    assert index[1].tolist() == [0, 0, 0, 1, 1]
    assert index[3, :3].tolist() == [0, 0, 0]

    class R:  # the rollout fields compute_advantages reads
        pass

    r = R()
    r.response_ids, r.response_mask = response_ids, response_mask
    rewards = RewardResult(total=torch.zeros(4), per_function={}, steps=[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0]],
                           step_ends=step_ends)
    adv, zero_std = compute_advantages(rewards, 2, "group", 1e-4, tok, r)
    # group 1: steps [1, 0, 0, 1], mean 0.5, std 0.577 → normalised ±0.866; A_step = sum from that step on
    s = 0.5 / (torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item() + 1e-4)
    assert adv[0, :2].tolist() == pytest.approx([0.0, 0.0], abs=1e-5)  # +s − s
    assert adv[0, 2:5].tolist() == pytest.approx([-s] * 3, abs=1e-5)
    assert adv[1, :3].tolist() == pytest.approx([0.0] * 3, abs=1e-5)
    assert adv[1, 3:5].tolist() == pytest.approx([s] * 2, abs=1e-5)
    assert zero_std == 0.0


def _lines_ok(prompts, completions, **row):
    """A process reward: 1 for each line that says ok."""
    return [[1.0 if line == "ok" else 0.0 for line in c.split("\n")] for c in completions]


def _right(prompts, completions, reference=None, **row):
    """An outcome reward: whether the answer's tag matches the reference."""
    return [1.0 if c.endswith(ref) else 0.0 for c, ref in zip(completions, reference, strict=True)]


# one group of two answers whose lines all say ok; the first answer's final answer is wrong all the same
ANSWERS = ["ok\nok", "ok\nok"]
SCORED = compute_rewards([RewardFunction("lines", _lines_ok), RewardFunction("right", _right)], ["q", "q"],
                         ["ok\nok#a", "ok\nok#b"], {"reference": ["#b", "#b"]})


def test_first_error_credit_reads_the_outcome_as_the_last_steps_verdict():
    scored = RewardResult(total=SCORED.total, per_function={}, steps=[[1.0, 1.0], [1.0, 2.0]],
                          step_ends=[[3, 5], [3, 5]], outcome=torch.tensor([0.0, 1.0]),
                          process_steps=[[1.0, 1.0], [1.0, 1.0]])
    # verdicts: the first answer's last step is wrong by its outcome → v [1, 0] and [1, 1];
    # mean 0.75, std 0.5 → [0.5, −1.5] and [0.5, 0.5]
    a, b = step_advantages(scored, 2, eps=0.0, credit=Credit("first_error"))
    assert a == pytest.approx([0.5, -1.5]) and b == pytest.approx([0.5, 0.5])


def test_progress_credit_starts_from_the_groups_success_rate_and_ends_at_the_outcome():
    scored = RewardResult(total=torch.zeros(2), per_function={}, steps=[[1.0, 1.0], [1.0, 2.0]],
                          step_ends=[[3, 5], [3, 5]], outcome=torch.tensor([0.0, 1.0]),
                          process_steps=[[1.0, 1.0], [1.0, 1.0]])
    # V_0 = mean outcome 0.5; V = [1, 0] and [1, 1] → gains [0.5, −1] and [0.5, 0]; rms √0.375 = 0.612372
    a, b = step_advantages(scored, 2, eps=0.0, credit=Credit("progress"))
    assert a == pytest.approx([0.816497, -1.632993], abs=1e-6) and b == pytest.approx([0.816497, 0.0], abs=1e-6)


def test_mix_needs_an_outcome_reward_and_keeps_it_out_of_the_step_rewards():
    process_only = compute_rewards([RewardFunction("lines", _lines_ok)], ["q", "q"], ANSWERS)
    with pytest.raises(ValueError, match="process_outcome_mix"):
        step_advantages(process_only, 2, eps=1e-4, credit=Credit("sum", mix=0.3))
    # SCORED: both answers' process steps are [1, 0]: sum form [0, −0.866] each, [0, −1.414214] at unit rms, the
    # same for both, so the outcome alone (−1 and +1 at unit rms) separates them: −1 + 0.3·(−1.414214) = −1.424264
    a, b = step_advantages(SCORED, 2, eps=0.0, credit=Credit("sum", mix=0.3))
    assert a == pytest.approx([-1.0, -1.424264], abs=1e-6) and b == pytest.approx([1.0, 0.575736], abs=1e-6)
    with pytest.raises(ValueError, match="process_outcome_mix"):
        GRPOConfig(reward_model=None, process_reward_model="prm", process_outcome_mix=0.1).check_reward()


# ------------------------------------------------------------------------------------------------
# learning on CPU


def _rows(pairs, split=None):
    return [PromptRow(prompt=p, reference=a, split=split) for p, a in pairs]


def _learn(addition_sft, loss_type: str, steps: int):
    path, rl, heldout = addition_sft
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    functions = build_reward_functions(["gsm8k_exact_match"])
    config = GRPOConfig(loss_type=loss_type, group_size=8, prompts_per_step=16, lr=1e-3, beta=0.04,
                        max_new_tokens=4, steps=steps, seed=0)
    trainer = GRPOTrainer(config, model, tok, functions, _rows(rl), _rows(heldout))
    eval_config = EvalConfig(k=16, max_new_tokens=4, seed=7)
    before = evaluate(model, tok, _rows(heldout), functions, trainer.reference, eval_config)
    history = [trainer.step() for _ in range(steps)]
    after = evaluate(model, tok, _rows(heldout), functions, trainer.reference, eval_config)
    changed = sum(not torch.equal(p, start[n]) for n, p in model.named_parameters())
    return before, after, history, changed


def _assert_learned(before, after, history, changed):
    assert changed > 0
    first = sum(h["reward_mean"] for h in history[:10]) / 10
    last = sum(h["reward_mean"] for h in history[-10:]) / 10
    assert last > first + 0.15, (first, last)
    b, a = before["policy"], after["policy"]
    assert a["accuracy"] > b["accuracy"] + 0.05, (b, a)
    assert a["maj_at_k"] >= b["maj_at_k"] + 0.05, (b, a)
    # β > 0 keeps the drift bounded: per-step token k3 stays small, the held-out sequence KL under 2 nats
    assert 0 < after["kl"] < 2.0 and max(h["kl"] for h in history) < 6.0
    assert before["kl"] == pytest.approx(0.0, abs=1e-6) and before["win_rate"] == 0.5
    assert after["win_rate"] > 0.5


@pytest.mark.slow
def test_grpo_raises_heldout_accuracy_and_maj_at_k(addition_sft):
    _assert_learned(*_learn(addition_sft, "grpo", steps=80))


@pytest.mark.slow
def test_gspo_raises_heldout_accuracy_and_maj_at_k(addition_sft):
    _assert_learned(*_learn(addition_sft, "gspo", steps=80))


@pytest.mark.slow
def test_cli_end_to_end_and_resume(addition_sft, tmp_path):
    path, rl, heldout = addition_sft
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as fh:
        for (p, a), split in [(x, "train") for x in rl] + [(x, "heldout") for x in heldout[:10]]:
            fh.write(json.dumps({"prompt": p, "reference": a, "split": split, "topic": "sums"}) + "\n")
    out = tmp_path / "run"
    common = ["--prompts", str(prompts), "--model", str(path), "--out", str(out), "--reward-fn", "gsm8k_exact_match",
              "--reward-fn", "length_penalty", "--set", "reward_kwargs={\"length_penalty\": {\"max_length\": 3, "
              "\"cache\": 1}}", "--set", "group_size=4", "--set", "prompts_per_step=4", "--set", "max_new_tokens=4",
              "--set", "lr=1e-3", "--set", "eval_k=2", "--set", "save_every=2", "--quiet"]
    assert main(common + ["--set", "steps=2"]) == 0
    assert main(common + ["--set", "steps=4", "--set", "resume=true", "--set", "eval_every=3"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_std", "kl", "loss", "entropy", "clipfrac", "zero_std_frac",
                "response_length", "lr", "tokens_per_s", "reward/gsm8k_exact_match", "reward/length_penalty"):
        assert key in rows[0], key
    assert "eval_accuracy" in rows[2]
    result = json.loads((out / "eval.json").read_text())
    assert set(result["reward_mean"]) == {"policy", "reference"}
    assert {"kl", "win_rate", "pass_at_k", "maj_at_k"} <= set(result)
    config = json.loads((out / "run.json").read_text())
    assert config["config"]["group_size"] == 4 and config["resumed_from_step"] == 2
    assert (out / "model" / "model.safetensors").exists() and (out / "samples.jsonl").exists()
    trained, _ = load_policy(out / "model")
    base, _ = load_policy(path)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters(), strict=True))


def test_cli_rejects_missing_reward(tmp_path, capsys):
    assert main(["--prompts", "p.jsonl", "--model", "m", "--out", str(tmp_path)]) == 2
    assert "--reward-fn" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# data-parallel: 2 CPU processes (gloo) follow the 1-process curve for the same global batch


def _grpo_run(command: list[str], out: Path, env: dict[str, str]) -> list[dict]:
    done = subprocess.run(command + ["--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_follow_the_one_process_curve_with_the_same_global_batch(tmp_path):
    # the same 4 prompts × G=4 per step, split 2 + 2 over two gloo processes; sampling streams are keyed by the
    # prompt's global index, so both runs sample the same completions, and DDP's gradient mean plus the
    # token-share weighting give the one-process update. A linear schedule catches a scheduler stepped per process.
    tok = prepare_tokenizer(char_tokenizer())
    model_dir = save_tiny(tiny_gpt2(tok, seed=3), tok, tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "reference": a}) + "\n"
                               for p, a in addition_split(16, 0, seed=1)[0]))
    args = ["-m", "training", "grpo", "--prompts", str(prompts), "--model", str(model_dir),
            "--reward-fn", "tests.training.tiny:digit_share", "--quiet"]
    for item in ("group_size=4", "prompts_per_step=4", "max_new_tokens=6", "steps=6", "lr=3e-3", "beta=0.04",
                 "aggregation=token", "lr_schedule=linear", "seed=5", "mixed_precision=no"):
        args += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    # --multi_gpu makes accelerate start N processes; without CUDA the trainer then picks gloo (training/optim.py)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    two = _grpo_run(launch + args, tmp_path / "two", env)
    one = _grpo_run([sys.executable] + args, tmp_path / "one", env)
    assert json.loads((tmp_path / "two" / "run.json").read_text())["processes"] == 2
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in two] == pytest.approx([r["lr"] for r in one])
    # the same completions: rewards and lengths agree to float noise, every step
    for key in ("reward_mean", "reward_std", "response_length"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-6), key
    assert len({round(r["reward_mean"], 6) for r in one}) > 1  # the policy moves, so agreeing means something
    # losses and KL: float sums in another order across processes, within tolerance
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], abs=1e-4)
    assert [r["kl"] for r in two] == pytest.approx([r["kl"] for r in one], rel=1e-3, abs=1e-6)
    assert max(r["kl"] for r in one) > 0  # the policy left the reference
