"""PPO for RLHF: policy + value model, frozen reference, reward model or reward functions (Ziegler et al. 2019;
Stiennon et al. 2020; Ouyang et al. 2022).

One step has two phases. **Rollouts:** sample responses, record old log-probs and values (one
forward of the actor-critic), reference log-probs, and score the responses; the per-token reward is
−β·(log π − log π_ref) on every token plus the (penalised, normalised, clipped) score on the last.
**Updates:** GAE advantages (whitened) and returns, then `ppo_epochs` passes over shuffled
minibatches of L = L_policy + c_v·L_value − c_e·H, stopping early when the approx-KL to the rollout
policy passes `target_kl`. β is fixed or follows the adaptive controller. The formulas live in
`training/losses.py`; this module moves tensors between them, logs, evaluates and saves.
`accelerate launch --num_processes N -m training ppo ...` runs it data-parallel (add `--multi_gpu` on a machine
without GPUs: `--cpu` alone starts one process).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.cli import Command, Flag
from training.config import PPOConfig, RLConfig
from training.data import PromptRow
from training.evaluate import reward_columns
from training.loop import RunResult, run
from training.losses import (
    clip_fraction,
    gae,
    kl_k1,
    kl_k3,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    per_token_rewards,
    ppo_clip_loss,
    value_loss,
)
from training.policy import Rollouts, generate_rollouts, unwrap
from training.rewards import RewardFunction, compute_rewards
from training.rl import RLMethod, load_run, rl_flags, rl_summary
from training.run_info import truncate_after
from training.shared.files import atomic_dir
from training.value_head import ActorCritic, load_critic

SAMPLES_FILE = "rollout_samples.jsonl"

# ---------------------------------------------------------------------------------------------
# pieces of a step, each usable and testable on its own


@dataclass
class KLController:
    """β of the per-token KL penalty: fixed, or adaptive (Ziegler et al. 2019, §2.2):
    β ← β·(1 + clip((KL − target) / target, −0.2, 0.2)·n / horizon), n = responses in the step."""

    beta: float
    """Current β."""
    target: float | None = None
    """Target sequence KL in nats; None keeps β fixed."""
    horizon: int = 10000
    """Responses over which β may change by the clipped proportional error."""

    def update(self, kl: float, n: int) -> float:
        """Move β after a step whose mean sequence KL was `kl` over `n` responses; returns the new β."""
        if self.target is not None:
            error = min(max((kl - self.target) / self.target, -0.2), 0.2)
            self.beta *= 1 + error * n / self.horizon
        return self.beta


@dataclass
class RunningMoments:
    """Mean and variance of every score seen so far, merged batch by batch (Chan et al. 1979)."""

    mean: float = 0.0
    var: float = 1.0
    count: int = 0

    def update(self, x: Tensor) -> None:
        x = x.double().flatten()
        n = x.numel()
        if n == 0:
            return
        batch_mean, batch_var = x.mean().item(), x.var(unbiased=False).item()
        total = self.count + n
        delta = batch_mean - self.mean
        # M2 of the union = M2_a + M2_b + δ²·n_a·n_b / n
        m2 = self.var * self.count + batch_var * n + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    def normalise(self, x: Tensor) -> Tensor:
        return (x - self.mean) / (self.var ** 0.5 + 1e-8)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """EV = 1 − Var[R − V] / Var[R] over the unmasked tokens: 1 is a perfect value model, 0 predicts the mean,
    < 0 is worse than predicting the mean."""
    var_returns = masked_var(returns, mask, unbiased=False)
    if var_returns.item() < 1e-12:
        return float("nan")
    return (1 - masked_var(returns - values, mask, unbiased=False) / var_returns).item()


def shape_scores(score: Tensor, ended: Tensor, config: PPOConfig, moments: RunningMoments | None,
                 everyone: Tensor | None = None) -> Tensor:
    """The score that goes on the last token: minus the missing-EOS penalty, normalised by the running moments
    (updated with `everyone`, the scores of all processes, when given), then clipped to ±reward_clip."""
    score = score.float() - config.missing_eos_penalty * (~ended.bool()).float()
    if moments is not None:
        moments.update(everyone if everyone is not None else score)
        score = moments.normalise(score)
    if config.reward_clip > 0:
        score = score.clamp(-config.reward_clip, config.reward_clip)
    return score


def ppo_objective(logp: Tensor, old_logp: Tensor, adv: Tensor, values: Tensor, old_values: Tensor, returns: Tensor,
                  entropy: Tensor | None, mask: Tensor, clip_eps: float, clip_value: float | None, vf_coef: float,
                  ent_coef: float) -> tuple[Tensor, dict[str, Tensor]]:
    """L = L_policy + c_v·L_value − c_e·H (Schulman et al. 2017, eq. 9, as a loss), and its parts.

    Every term is a token mean over `mask`. Returns (L, stats) with stats pg_loss, value_loss, entropy,
    clipfrac, value_clipfrac and approx_kl = mean k3(π_old ‖ π) (detached).
    """
    pg = ppo_clip_loss(logp, old_logp, adv, mask, clip_eps)
    vl = value_loss(values, old_values, returns, mask, clip_value)
    ent = masked_mean(entropy, mask) if entropy is not None else torch.zeros((), device=logp.device)
    loss = pg + vf_coef * vl - ent_coef * ent
    with torch.no_grad():
        stats = {
            "pg_loss": pg.detach(), "value_loss": vl.detach(), "entropy": ent.detach(),
            "clipfrac": clip_fraction(logp, old_logp, adv, mask, clip_eps),
            # k3 with the roles swapped: samples come from π_old, so KL(π_old ‖ π) ≈ E[(r − 1) − log r]
            "approx_kl": masked_mean(kl_k3(old_logp, logp.detach()), mask),
        }
        if clip_value is not None:
            stats["value_clipfrac"] = masked_mean(((values - old_values).abs() > clip_value).float(), mask)
    return loss, stats


class HackingWatch:
    """Warns when the score keeps rising while the policy drifts far from the reference, or while the
    held-out win rate against the reference falls: the usual signs that the policy exploits the reward model."""

    def __init__(self, kl_threshold: float, window: int) -> None:
        self.kl_threshold = kl_threshold
        self.window = window
        self.scores: list[float] = []
        self.win_rates: list[float] = []

    def rising(self) -> bool:
        recent = self.scores[-self.window:]
        if len(recent) < max(2, self.window):
            return False
        half = len(recent) // 2
        return sum(recent[half:]) / (len(recent) - half) > sum(recent[:half]) / half

    def observe(self, score: float, kl: float, win_rate: float | None = None) -> str | None:
        self.scores.append(score)
        if win_rate is not None:
            self.win_rates.append(win_rate)
        if not self.rising():
            return None
        if kl > self.kl_threshold:
            return (f"possible reward hacking: the score keeps rising while KL = {kl:.2f} nats > "
                    f"{self.kl_threshold}; read the samples")
        if len(self.win_rates) >= 2 and self.win_rates[-1] < self.win_rates[-2] and win_rate is not None:
            return (f"possible reward hacking: the score keeps rising while the held-out win rate fell "
                    f"{self.win_rates[-2]:.3f} → {self.win_rates[-1]:.3f}")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"scores": self.scores, "win_rates": self.win_rates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scores, self.win_rates = list(state["scores"]), list(state["win_rates"])


@dataclass
class Batch:
    """A scored rollout batch with everything the update phase needs, all (N, R) unless noted."""

    rollouts: Rollouts
    old_logp: Tensor
    ref_logp: Tensor
    values: Tensor
    rewards: Tensor
    adv: Tensor
    returns: Tensor
    score: Tensor
    """(N,) raw score (reward model and functions)."""
    shaped_score: Tensor
    """(N,) the score on the last token after penalty, normalisation and clipping."""
    entropy: Tensor


class PPOTrainer(RLMethod):
    """PPO on the shared loop: holds the actor-critic, KL controller, score statistics and reward-hacking watch;
    `step()` is one rollout phase plus its update phase."""

    name = "ppo"
    config: PPOConfig
    needs_reward = True

    def __init__(self, config: PPOConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (),
                 critic: torch.nn.Module | None = None, accelerator: Any = None) -> None:
        super().__init__(config, model, tokenizer, functions, train_rows, eval_rows, accelerator)
        actor_critic = ActorCritic(model, critic)
        actor_critic.eval()
        self.prepare(actor_critic)
        self.kl_controller = KLController(config.beta, config.kl_target if config.kl_control == "adaptive" else None,
                                          config.kl_horizon)
        self.moments = RunningMoments() if config.normalize_reward else None
        self.watch = HackingWatch(config.hack_kl_threshold, config.hack_window)
        self.samples: list[dict[str, Any]] = []
        self._last_kl = 0.0
        self._warning: str | None = None
        self._resumed = self._samples_written = False

    @property
    def actor_critic(self) -> ActorCritic:
        return unwrap(self.unwrapped())  # type: ignore[return-value]

    @property
    def policy(self) -> torch.nn.Module:
        return self.actor_critic.policy

    # -- phase 1: rollouts --------------------------------------------------------------------------

    @torch.no_grad()
    def collect(self, rows: Sequence[PromptRow]) -> Batch:
        """Sample, score, and compute old log-probs, values, reference log-probs, shaped rewards, GAE."""
        c = self.config
        n = c.samples_per_prompt
        # one seed for every process: streams are keyed by the global prompt index (generate_rollouts)
        seed = c.seed * 1_000_003 + self.step_count * 101
        rollouts = generate_rollouts(
            self.policy, self.tokenizer, [r.prompt for r in rows], n=n, temperature=c.temperature, top_p=c.top_p,
            max_new_tokens=c.max_new_tokens, stop=c.stop or None, seed=seed,
            prompt_offset=self.accelerator.process_index * len(rows),
            max_prompt_length=c.max_prompt_length or None, batch_size=c.generation_batch_size or None)
        args = (rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask)
        # old log-probs and values from the same code path the update uses, so the first ratio is exactly 1
        parts = [self.actor_critic(*(a[i:i + c.minibatch_size] for a in args), temperature=c.temperature,
                                   with_entropy=True) for i in range(0, len(rollouts), c.minibatch_size)]
        old_logp, entropy, values = (torch.cat([p[k] for p in parts]) for k in range(3))
        ref_logp = self.reference.logprobs(*args, temperature=c.temperature, batch_size=c.minibatch_size)
        score = compute_rewards(self.functions, [r.prompt for r in rows for _ in range(n)], rollouts.texts,
                                reward_columns(rows, n)).total.float().to(old_logp.device)
        everyone = self.accelerator.gather(score) if self.moments is not None else None
        shaped = shape_scores(score, rollouts.ended, c, self.moments, everyone)
        mask = rollouts.response_mask.float()
        rewards = per_token_rewards(shaped, old_logp, ref_logp, mask, self.kl_controller.beta)  # (N, R)
        adv, returns = gae(rewards, values, mask, c.gamma, c.lam)
        if c.whiten_advantages:
            adv = masked_whiten(adv, mask)
        return Batch(rollouts, old_logp, ref_logp, values, rewards, adv, returns, score, shaped, entropy)

    # -- phase 2: updates ---------------------------------------------------------------------------

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over shuffled minibatches; stops after the minibatch whose approx-KL passes target_kl."""
        c = self.config
        r = batch.rollouts
        input_ids, attention_mask = r.input_ids, r.attention_mask
        mask = r.response_mask.float()
        n = len(r)
        generator = torch.Generator().manual_seed(c.seed * 7919 + self.step_count)
        totals: dict[str, float] = {}
        updates, stopped, grad_norm = 0, False, float("nan")
        self.model.train(False)
        for _epoch in range(c.ppo_epochs):
            order = torch.randperm(n, generator=generator).to(mask.device)
            for start in range(0, n, c.minibatch_size):
                idx = order[start:start + c.minibatch_size]
                logp, entropy, values = self.model(input_ids[idx], attention_mask[idx], r.response_mask[idx],
                                                   temperature=c.temperature, with_entropy=c.ent_coef > 0)
                loss, stats = ppo_objective(logp, batch.old_logp[idx], batch.adv[idx], values, batch.values[idx],
                                            batch.returns[idx], entropy, mask[idx], c.clip_eps, c.clip_value,
                                            c.vf_coef, c.ent_coef)
                self.accelerator.backward(loss)
                grad_norm = self.optimizer_step()
                updates += 1
                stats["loss"] = loss.detach()
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
                # the decision must be the same on every process, or DDP would wait forever
                approx_kl = float(self.accelerator.reduce(stats["approx_kl"].reshape(1), reduction="mean"))
                if c.target_kl and approx_kl > c.target_kl:
                    stopped = True
                    break
            if stopped:
                break
        metrics = {k: v / updates for k, v in totals.items()}
        if c.ent_coef == 0:
            metrics.pop("entropy")  # not computed during the update; the rollout entropy is logged instead
        metrics.update(ppo_updates=updates, early_stopped=stopped, grad_norm=grad_norm)
        return metrics

    def step(self) -> dict[str, Any]:
        """One rollout phase and one update phase; returns the step's metrics (β is the one used this step)."""
        c = self.config
        started = time.perf_counter()
        rows, batch, rollout_s = self.sample_step(self.collect)
        beta = self.kl_controller.beta
        mask = batch.rollouts.response_mask.float()
        kl_seq = masked_sum(kl_k1(batch.old_logp, batch.ref_logp), mask, dim=-1)  # (N,) Σ_t log π/π_ref
        k3_seq = masked_sum(kl_k3(batch.old_logp, batch.ref_logp), mask, dim=-1)  # (N,)
        non_score = -beta * kl_seq
        metrics: dict[str, Any] = self.update(batch)
        elapsed = time.perf_counter() - started
        self.finish_step()
        kl_global = float(self.accelerator.reduce(kl_seq.mean().reshape(1), reduction="mean"))
        responses = len(batch.rollouts) * self.accelerator.num_processes
        self.kl_controller.update(kl_global, responses)
        lengths = batch.rollouts.lengths.float()
        metrics.update(
            reward_mean=batch.score.mean().item(),
            reward_std=batch.score.std().item() if len(batch.score) > 1 else 0.0,
            score_shaped_mean=batch.shaped_score.mean().item(),
            non_score_reward=non_score.mean().item(),
            rlhf_reward=(batch.shaped_score + non_score).mean().item(),
            kl=kl_seq.mean().item(),
            kl_k3=k3_seq.mean().item(),
            beta=beta,
            rollout_entropy=masked_mean(batch.entropy, mask).item(),
            value_mean=masked_mean(batch.values, mask).item(),
            explained_variance=explained_variance(batch.values, batch.returns, mask),
            response_length=lengths.mean().item(),
            ended_frac=batch.rollouts.ended.float().mean().item(),
            lr=self.scheduler.get_last_lr()[0],
            tokens_per_s=mask.sum().item() / elapsed,
            rollout_s=rollout_s,
            step_s=elapsed,
        )
        metrics.setdefault("entropy", metrics["rollout_entropy"])
        warning = self.watch.observe(metrics["reward_mean"], metrics["kl"])
        if warning:
            metrics["warning"] = warning
        if c.sample_every and self.step_count % c.sample_every == 0:
            self._write_samples([{"step": self.step_count, "prompt": batch.rollouts.prompts[i],
                                  "response": batch.rollouts.texts[i], "score": batch.score[i].item(),
                                  "kl": kl_seq[i].item(), "ended": bool(batch.rollouts.ended[i])}
                                 for i in range(min(c.sample_rows, len(batch.rollouts)))])
        self._last_kl = metrics["kl"]
        return metrics

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "kl": f"{metrics['kl']:.3f}",
                "beta": f"{metrics['beta']:.4f}"}

    def _write_samples(self, rows: list[dict[str, Any]]) -> None:
        """A few rollouts per `sample_every` steps, appended to OUT/rollout_samples.jsonl (main process)."""
        self.samples = rows
        if not self.config.out or not self.accelerator.is_main_process:
            return
        path = Path(self.config.out) / SAMPLES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (self._resumed or self._samples_written)  # a new run starts the file, a resumed one continues it
        with path.open("w" if fresh else "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        self._samples_written = True

    # -- evaluation, resume, saving ----------------------------------------------------------------

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any] | None:
        result = super().evaluate(samples_path)
        if result is not None and "win_rate" in result and self.watch.scores and samples_path is None:
            # the step's score was just observed; judge the win-rate trend against it
            self._warning = self.watch.observe(self.watch.scores.pop(), self._last_kl, result["win_rate"])
        return result

    def eval_row(self, result: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = dict(super().eval_row(result))
        warning, self._warning = self._warning, None
        if warning:
            row["warning"] = warning
        return row

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"beta": self.kl_controller.beta, "watch": self.watch.state_dict(),
                                       "moments": vars(self.moments) if self.moments is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.kl_controller.beta = state["beta"]
        if self.moments is not None and state.get("moments") is not None:
            self.moments = RunningMoments(**state["moments"])
        self.watch.load_state_dict(state["watch"])
        self._resumed = True
        if self.config.out and self.accelerator.is_main_process and (Path(self.config.out) / SAMPLES_FILE).exists():
            truncate_after(Path(self.config.out) / SAMPLES_FILE, self.step_count)  # rows of steps run again

    def save(self, path: str | Path) -> None:
        """The policy into OUT/model (the shared layout) and the value model into OUT/value_model."""
        super().save(path)
        if self.accelerator.is_main_process:
            with atomic_dir(Path(path).parent / "value_model") as out:
                self.actor_critic.save_value_model(out)
        self.accelerator.wait_for_everyone()


def train(config: PPOConfig) -> RunResult:
    """Run PPO end to end from `config` (paths in it): OUT/model, value_model, eval.json, metrics.jsonl, run.json."""
    functions, train_rows, eval_rows, model, tokenizer = load_run(config)
    critic = load_critic(config.critic) if config.critic else None
    trainer = PPOTrainer(config, model, tokenizer, functions, train_rows, eval_rows, critic=critic)
    return run(trainer, data={"prompts": config.prompts})


COMMAND = Command(
    name="ppo", config=PPOConfig, description="PPO with a value model, a frozen reference and a reward model.",
    train=train, summary=rl_summary, check=RLConfig.check_reward,
    flags=[*rl_flags(), Flag("--critic", "critic", "separate critic directory (default: value head on the policy)")])


def main(argv: list[str] | None = None) -> int:
    """`python -m training ppo --prompts PATH --model DIR --out DIR (--reward-model DIR | --reward-fn F ...)
    [--critic DIR] [--config run.toml] [--set key=value ...]`."""
    return cli.main(COMMAND, argv)
