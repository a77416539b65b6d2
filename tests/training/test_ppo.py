"""PPO: hand-computed GAE and loss, KL control, score shaping, the actor-critic, and the proof that it learns
(slow, seeded, CPU)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from tests.training.tiny import CHARS, char_tokenizer, save_tiny, tiny_gpt2
from training.data import PairRow, PromptRow
from training.losses import gae, per_token_rewards
from training.policy import generate_rollouts, load_policy, prepare_tokenizer, token_logprobs
from training.ppo import (
    HackingWatch,
    KLController,
    PPOConfig,
    PPOTrainer,
    RunningMoments,
    explained_variance,
    main,
    ppo_objective,
    shape_scores,
)
from training.rewards import RewardFunction, reward_model_fn
from training.value_head import ActorCritic, load_critic


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"minibatch_size": 0}, "minibatch_size"), ({"ppo_epochs": 0}, "ppo_epochs"), ({"beta": -1}, "beta"),
     ({"clip_eps": 0}, "clip_eps"), ({"clip_value": -0.1}, "clip_value"), ({"vf_coef": 0}, "vf_coef"),
     ({"gamma": 1.5}, "gamma"), ({"lam": -0.1}, "lam"), ({"kl_control": "pid"}, "kl_control"),
     ({"kl_control": "adaptive", "kl_target": 0}, "kl_target"), ({"target_kl": -1}, "target_kl"),
     ({"reward_fn": ["a"], "reward_weights": [1, 2]}, "reward_weights"), ({"temperature": 0}, "temperature"),
     ({"missing_eos_penalty": -1}, "missing_eos_penalty"), ({"samples_per_prompt": 0}, "samples_per_prompt")],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PPOConfig(**kwargs)


# ------------------------------------------------------------------------------------------------
# a tiny hand-made batch, every number checkable on paper

# two responses: row 0 has two tokens, row 1 one token (then padding)
MASK = t([[1, 1], [1, 0]])
OLD_LOGP = t([[-1.0, -2.0], [-0.5, 0.0]])
REF_LOGP = t([[-1.5, -2.0], [-0.25, 0.0]])
SCORE = t([1.0, -1.0])
OLD_VALUES = t([[0.5, 0.8], [0.2, 0.0]])


def test_shaped_rewards_and_gae_by_hand():
    # r_t = −β·(log π − log π_ref) with β = 0.1, plus the score on the last token
    rewards = per_token_rewards(SCORE, OLD_LOGP, REF_LOGP, MASK, beta=0.1)
    assert rewards.flatten().tolist() == pytest.approx([-0.05, 1.0, 0.025 - 1.0, 0.0])
    adv, returns = gae(rewards, OLD_VALUES, MASK, gamma=1.0, lam=0.9)
    # row 0: δ_1 = 1.0 − 0.8 = 0.2 (terminal), δ_0 = −0.05 + 0.8 − 0.5 = 0.25, Â_0 = 0.25 + 0.9·0.2 = 0.43
    # row 1: δ_0 = −0.975 − 0.2 = −1.175; padding gets 0
    assert adv.flatten().tolist() == pytest.approx([0.43, 0.2, -1.175, 0.0])
    assert returns.flatten().tolist() == pytest.approx([0.93, 1.0, -0.975, 0.0])


def test_full_loss_by_hand():
    adv = t([[0.43, 0.2], [-1.175, 0.0]])
    returns = t([[0.93, 1.0], [-0.975, 0.0]])
    # ratios π/π_old: 1.5 (A > 0: clipped to 1.2), 1.0, 0.5 (A < 0: clipped to 0.8, the larger penalty stays)
    logp = OLD_LOGP + torch.log(t([[1.5, 1.0], [0.5, 1.0]]))
    values = t([[0.9, 0.8], [0.0, 0.0]])
    entropy = t([[1.0, 2.0], [3.0, 9.0]])
    loss, stats = ppo_objective(logp, OLD_LOGP, adv, values, OLD_VALUES, returns, entropy, MASK, clip_eps=0.2,
                                clip_value=0.2, vf_coef=0.5, ent_coef=0.01)
    # surrogates: min(0.645, 0.516) = 0.516, 0.2, min(−0.5875, −0.94) = −0.94; L_policy = −mean = 0.224 / 3
    pg = 0.224 / 3
    assert stats["pg_loss"].item() == pytest.approx(pg)
    assert stats["clipfrac"].item() == pytest.approx(2 / 3)
    # values: V_clip of 0.9 is 0.5 + 0.2 = 0.7, (0.7 − 0.93)² = 0.0529 beats (0.9 − 0.93)² = 0.0009;
    # then (0.8 − 1)² = 0.04 and (0 + 0.975)² = 0.950625; L_value = ½·mean
    vl = 0.5 * (0.0529 + 0.04 + 0.950625) / 3
    assert stats["value_loss"].item() == pytest.approx(vl)
    assert stats["value_clipfrac"].item() == pytest.approx(1 / 3)
    assert stats["entropy"].item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3, padding's 9 ignored
    assert loss.item() == pytest.approx(pg + 0.5 * vl - 0.01 * 2.0)
    # approx-KL(π_old ‖ π) = mean of (r − 1) − log r: 1.5 → 0.5 − 0.405465, 1 → 0, 0.5 → −0.5 + 0.693147
    assert stats["approx_kl"].item() == pytest.approx((0.5 - math.log(1.5) - 0.5 + math.log(2)) / 3)


def test_full_loss_gradients_reach_policy_and_values():
    logp = (OLD_LOGP + 0.1).requires_grad_()
    values = OLD_VALUES.clone().requires_grad_()
    loss, _ = ppo_objective(logp, OLD_LOGP, t([[1.0, 1.0], [-1.0, 0.0]]), values, OLD_VALUES, t([[2.0, 2.0], [0, 0]]),
                            None, MASK, 0.2, None, 1.0, 0.0)
    loss.backward()
    assert logp.grad[0, 0] < 0 and logp.grad[1, 0] > 0  # push up A > 0, push down A < 0
    assert values.grad[0, 0] < 0 and logp.grad[1, 1] == 0 and values.grad[1, 1] == 0  # padding untouched


def test_explained_variance_by_hand():
    returns = t([[1.0, 3.0], [2.0, 99.0]])
    mask = t([[1, 1], [1, 0]])
    # Var[R] over {1, 3, 2} = 2/3; a perfect V gives 1, V = mean gives 0, V off by (1, −1, 0) gives 1 − (2/3)/(2/3) = 0
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    assert explained_variance(t([[0.0, 4.0], [2.0, 0.0]]), returns, mask) == pytest.approx(0.0)
    assert explained_variance(t([[1.0, 3.0], [2.0, -5.0]]), returns, mask) == pytest.approx(1.0)


def test_adaptive_kl_controller_follows_ziegler():
    # KL 9 against target 6: error 0.5 clipped to 0.2; β ← 0.1·(1 + 0.2·64/1000)
    controller = KLController(beta=0.1, target=6.0, horizon=1000)
    assert controller.update(kl=9.0, n=64) == pytest.approx(0.1 * (1 + 0.2 * 0.064))
    # KL 5.4: error −0.1 is inside the clip
    beta = controller.beta
    assert controller.update(kl=5.4, n=64) == pytest.approx(beta * (1 - 0.1 * 0.064))
    fixed = KLController(beta=0.1)
    assert fixed.update(kl=100.0, n=64) == 0.1


def test_running_moments_match_the_whole_stream():
    torch.manual_seed(0)
    chunks = [torch.randn(n) * 3 + 2 for n in (5, 17, 1, 40)]
    moments = RunningMoments()
    for c in chunks:
        moments.update(c)
    everything = torch.cat(chunks).double()
    assert moments.count == everything.numel()
    assert moments.mean == pytest.approx(everything.mean().item())
    assert moments.var == pytest.approx(everything.var(unbiased=False).item())


def test_score_shaping_penalises_unfinished_then_normalises_then_clips():
    config = PPOConfig(missing_eos_penalty=1.0, reward_clip=0.5)
    score = shape_scores(t([2.0, 0.2, -3.0]), torch.tensor([True, False, True]), config, None)
    assert score.tolist() == pytest.approx([0.5, -0.5, -0.5])  # 2 → clip 0.5; 0.2 − 1 = −0.8 → −0.5; −3 → −0.5
    moments = RunningMoments()
    score = shape_scores(t([1.0, 3.0]), torch.tensor([True, True]), PPOConfig(), moments)
    assert score.tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)  # mean 2, std 1


def test_hacking_watch_warns_on_rising_score_with_high_kl_or_falling_win_rate():
    watch = HackingWatch(kl_threshold=5.0, window=4)
    assert [watch.observe(s, kl=9.0) for s in (1.0, 2.0, 3.0)] == [None, None, None]  # window not full
    assert "KL = 9.00" in watch.observe(4.0, kl=9.0)
    assert watch.observe(5.0, kl=1.0) is None  # rising but close to the reference
    quiet = HackingWatch(kl_threshold=5.0, window=4)
    for s in (4.0, 3.0, 2.0, 1.0):
        assert quiet.observe(s, kl=50.0) is None  # far away but not gaining: not this warning
    trend = HackingWatch(kl_threshold=50.0, window=2)
    assert trend.observe(1.0, kl=1.0, win_rate=0.7) is None
    assert "win rate fell" in trend.observe(2.0, kl=1.0, win_rate=0.6)


# ------------------------------------------------------------------------------------------------
# the actor-critic


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = prepare_tokenizer(char_tokenizer())
    return save_tiny(tiny_gpt2(tok, seed=0), tok, tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("separate", [False, True])
def test_actor_critic_logprobs_match_the_policy_and_values_start_at_zero(tiny_dir, tmp_path, separate):
    model, tok = load_policy(tiny_dir)
    critic = load_critic(tiny_dir) if separate else None
    ac = ActorCritic(model, critic)
    r = generate_rollouts(model, tok, ["ab:", "c:"], n=2, max_new_tokens=5, seed=0)
    logp, entropy, values = ac(r.input_ids, r.attention_mask, r.response_mask, with_entropy=True)
    expected, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(logp, r.old_logp, atol=1e-4)  # the same numbers generation recorded
    assert values.shape == logp.shape and torch.all(values == 0)  # zero-initialised head
    assert entropy is not None and torch.all(entropy[r.response_mask.bool()] > 0)
    with torch.no_grad():
        ac.value_head.linear.bias.fill_(0.5)
    ac.save_value_model(tmp_path / "v")
    fresh = ActorCritic(load_policy(tiny_dir)[0], load_critic(tiny_dir) if separate else None)
    fresh.load_value_model(tmp_path / "v")
    _, _, again = fresh(r.input_ids, r.attention_mask, r.response_mask)
    assert torch.allclose(again, 0.5 * r.response_mask.float())


def test_encoder_critic_is_refused(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="causal decoder"):
        load_critic(tmp_path)


# ------------------------------------------------------------------------------------------------
# learning on CPU


def count_a(prompts, completions, **row):
    """The target-token reward: +1 per "a" in the response."""
    return [float(c.count("a")) for c in completions]


PROMPTS = [PromptRow(prompt=p) for p in ["ab:", "cd:", "ef:", "gh:", "ij:", "kl:", "mn:", "op:"]]


def _target_token_run(tiny_dir, beta: float, steps: int = 30):
    torch.set_num_threads(1)
    model, tok = load_policy(tiny_dir)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = PPOConfig(prompts_per_step=8, samples_per_prompt=4, minibatch_size=8, ppo_epochs=2, max_new_tokens=8,
                       lr=1e-3, beta=beta, vf_coef=0.5, steps=steps, seed=0, sample_every=0)
    trainer = PPOTrainer(config, model, tok, [RewardFunction("count_a", count_a)], PROMPTS)
    history = [trainer.step() for _ in range(steps)]
    changed = sum(not torch.equal(p, start[n]) for n, p in model.named_parameters())
    return history, changed


def _mean(history, key):
    return sum(h[key] for h in history) / len(history)


@pytest.mark.slow
def test_target_token_reward_rises_with_kl_held_by_beta_and_the_value_head_learns(tiny_dir):
    held, changed = _target_token_run(tiny_dir, beta=0.4)
    free, _ = _target_token_run(tiny_dir, beta=0.0)
    assert changed > 0
    # the optimum of r − β·KL puts p(a) ∝ p_ref(a)·e^{1/β}: e^2.5 ≈ 12× the reference's ~1/70, so ~1.2 "a" per
    # response at a KL of ~1.8 nats; the untrained model starts near 8/70
    assert _mean(held[-10:], "reward_mean") > _mean(held[:3], "reward_mean") + 0.5, [h["reward_mean"] for h in held]
    assert max(h["kl"] for h in held) < 4.0
    # without the penalty the policy collapses onto "a": the KL runs away
    assert _mean(free[-10:], "reward_mean") > 6.0
    assert _mean(free[-10:], "kl") > 5 * _mean(held[-10:], "kl")
    assert all(h["beta"] == 0.4 for h in held) and all(h["non_score_reward"] <= 1e-6 for h in free)
    # the zero-initialised value head starts knowing nothing (EV = 0) and learns to predict the returns
    assert held[0]["explained_variance"] == pytest.approx(0.0, abs=1e-6)
    assert _mean(held[-5:], "explained_variance") > 0.3, [h["explained_variance"] for h in held]


def _letters(rng: random.Random, n_a: int, length: int = 8) -> str:
    others = [c for c in CHARS if c not in "a\n"]
    out = [rng.choice(others) for _ in range(length - n_a)] + ["a"] * n_a
    rng.shuffle(out)
    return "".join(out)


@pytest.fixture(scope="module")
def a_reward_model(tmp_path_factory):
    """A tiny GPT-2 reward model trained on pairs where the response with more "a"s is preferred."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from training.reward_model import RewardConfig, train_reward_model

    torch.set_num_threads(1)
    tok = prepare_tokenizer(char_tokenizer())
    base = tmp_path_factory.mktemp("rm-base")
    torch.manual_seed(0)
    GPT2ForSequenceClassification(GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2, num_labels=1, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=tok.pad_token_id)).save_pretrained(base)
    tok.save_pretrained(base)
    rng = random.Random(0)
    pairs = []
    for _ in range(600):
        lo, hi = sorted(rng.sample(range(4), 2))
        pairs.append(PairRow(prompt=rng.choice(PROMPTS).prompt, chosen=_letters(rng, hi), rejected=_letters(rng, lo)))
    out = tmp_path_factory.mktemp("rm")
    config = RewardConfig(model=str(base), max_length=24, batch_size=16, lr=3e-3, epochs=2, seed=0,
                          eval_every=0, progress=False)
    result = train_reward_model(config, pairs[:500], pairs[500:], out)
    assert result.eval["accuracy"] > 0.85, result.eval
    return out / "model"


@pytest.mark.slow
def test_ppo_raises_a_trained_reward_models_score_and_heldout_win_rate(tiny_dir, a_reward_model):
    from training.evaluate import EvalConfig, evaluate

    torch.set_num_threads(1)
    model, tok = load_policy(tiny_dir)
    functions = [RewardFunction("reward_model", reward_model_fn(a_reward_model, device="cpu"))]
    heldout = [PromptRow(prompt=p) for p in ["qr:", "st:", "uv:", "wx:"]]
    config = PPOConfig(prompts_per_step=8, samples_per_prompt=4, minibatch_size=8, ppo_epochs=2, max_new_tokens=8,
                       lr=1e-3, beta=0.1, vf_coef=0.5, normalize_reward=True, steps=25, seed=0, sample_every=0)
    trainer = PPOTrainer(config, model, tok, functions, PROMPTS, heldout)
    eval_config = EvalConfig(k=16, max_new_tokens=8, seed=3)
    before = evaluate(model, tok, heldout, functions, trainer.reference, eval_config)
    history = [trainer.step() for _ in range(config.steps)]
    after = evaluate(model, tok, heldout, functions, trainer.reference, eval_config)
    assert _mean(history[-5:], "reward_mean") > _mean(history[:3], "reward_mean") + 0.5, \
        [round(h["reward_mean"], 2) for h in history]
    assert after["policy"]["reward_mean"] > before["policy"]["reward_mean"] + 0.5
    assert before["win_rate"] == 0.5 and after["win_rate"] > 0.7, after["win_rate"]
    assert 0 < after["kl"] < 10.0


@pytest.mark.slow
def test_cli_end_to_end_with_reward_model_separate_critic_and_resume(tiny_dir, a_reward_model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as fh:
        for row, split in [(r, "train") for r in PROMPTS] + [({"prompt": "qr:"}, "heldout"), ({"prompt": "st:"}, "heldout")]:
            fh.write(json.dumps({"prompt": row["prompt"] if isinstance(row, dict) else row.prompt, "split": split}) + "\n")
    out = tmp_path / "run"
    common = ["--prompts", str(prompts), "--model", str(tiny_dir), "--out", str(out), "--reward-model",
              str(a_reward_model), "--critic", str(tiny_dir), "--set", "prompts_per_step=4", "--set",
              "minibatch_size=4", "--set", "ppo_epochs=1", "--set", "max_new_tokens=6", "--set", "lr=1e-3",
              "--set", "kl_control=adaptive", "--set", "kl_target=0.5", "--set", "kl_horizon=100", "--set",
              "eval_k=2", "--set", "save_every=2", "--set", "sample_every=2", "--set", "target_kl=100", "--quiet"]
    assert main(common + ["--set", "steps=2"]) == 0
    assert main(common + ["--set", "steps=4", "--set", "resume=true", "--set", "eval_every=3"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_std", "kl", "kl_k3", "beta", "value_loss", "clipfrac", "approx_kl",
                "explained_variance", "entropy", "non_score_reward", "response_length", "tokens_per_s", "pg_loss"):
        assert key in rows[0], key
    assert "eval_win_rate" in rows[2]
    # adaptive β moved between steps, and the resumed run continued from the checkpointed β
    betas = [r["beta"] for r in rows]
    assert len(set(betas)) == 4 and betas[0] == 0.05
    result = json.loads((out / "eval.json").read_text())
    assert set(result["reward_mean"]) == {"policy", "reference"} and {"kl", "win_rate"} <= set(result)
    config = json.loads((out / "run.json").read_text())
    assert config["config"]["critic"] == str(tiny_dir) and config["resumed_from_step"] == 2
    assert (out / "model" / "model.safetensors").exists() and (out / "samples.jsonl").exists()
    assert (out / "value_model" / "value_head.safetensors").exists()
    assert (out / "value_model" / "model.safetensors").exists()  # the separate critic's decoder
    samples = [json.loads(line) for line in (out / "rollout_samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {2, 4} and {"prompt", "response", "score", "kl"} <= set(samples[0])
    trained, _ = load_policy(out / "model")
    base, _ = load_policy(tiny_dir)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters(), strict=True))


def test_cli_rejects_missing_reward(tmp_path, capsys):
    assert main(["--prompts", "p.jsonl", "--model", "m", "--out", str(tmp_path)]) == 2
    assert "--reward-model" in capsys.readouterr().err
