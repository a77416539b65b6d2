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

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.config import PPOConfig
from training.data import PromptRow
from training.evaluate import EvalConfig, eval_metrics, evaluate, public, reward_columns
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
from training.optim import lr_lambda, make_accelerator
from training.policy import Reference, Rollouts, generate_rollouts, unwrap
from training.rewards import RewardFunction, compute_rewards
from training.run_info import atomic_dir, recover_dir, staged_dir
from training.value_head import ActorCritic

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


class PPOTrainer:
    """Holds the actor-critic, reference, optimiser, KL controller and data order of one run; `step()` is one
    rollout phase plus its update phase."""

    def __init__(self, config: PPOConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (),
                 critic: torch.nn.Module | None = None, accelerator: Any = None) -> None:
        if not train_rows:
            raise ValueError("prompts: no training prompts")
        if not functions:
            raise ValueError("no reward: give a reward model or a reward function")
        self.config = config
        self.accelerator = accelerator or make_accelerator(config.mixed_precision)
        if config.prompts_per_step % self.accelerator.num_processes:
            raise ValueError(f"prompts_per_step={config.prompts_per_step} must be divisible by the "
                             f"{self.accelerator.num_processes} processes")
        self.tokenizer = tokenizer
        self.functions = list(functions)
        self.train_rows = list(train_rows)
        self.eval_rows = list(eval_rows)
        torch.manual_seed(config.seed)
        model.eval()  # no dropout: π_θ and π_old must be the same function for the ratio
        self.reference = Reference(model)
        if not self.reference._lora:
            self.reference.model.to(self.accelerator.device)
        actor_critic = ActorCritic(model, critic)
        actor_critic.eval()
        params = [p for p in actor_critic.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))  # type: ignore[arg-type]
        # the scheduler stays unprepared: accelerate would step it once per process, and `steps` are global steps
        self.model, self.optimizer = self.accelerator.prepare(actor_critic, optimizer)
        self.scheduler = scheduler
        self.kl_controller = KLController(config.beta, config.kl_target if config.kl_control == "adaptive" else None,
                                          config.kl_horizon)
        self.moments = RunningMoments() if config.normalize_reward else None
        self.watch = HackingWatch(config.hack_kl_threshold, config.hack_window)
        self.step_count = 0
        self._order: list[int] = []
        self._epoch = 0
        self._ref_eval: dict[str, Any] | None = None
        self.samples: list[dict[str, Any]] = []

    @property
    def actor_critic(self) -> ActorCritic:
        return unwrap(self.accelerator.unwrap_model(self.model))  # type: ignore[return-value]

    @property
    def policy(self) -> torch.nn.Module:
        return self.actor_critic.policy

    # -- data -------------------------------------------------------------------------------------

    def next_prompts(self) -> list[PromptRow]:
        """This process's share of the next prompts_per_step prompts, in a seeded per-epoch shuffle."""
        need = self.config.prompts_per_step
        while len(self._order) < need:
            order = list(range(len(self.train_rows)))
            random.Random(self.config.seed * 1_000_003 + self._epoch).shuffle(order)
            self._order += order
            self._epoch += 1
        batch, self._order = self._order[:need], self._order[need:]
        share = need // self.accelerator.num_processes
        mine = batch[self.accelerator.process_index * share:(self.accelerator.process_index + 1) * share]
        return [self.train_rows[i] for i in mine]

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
                if c.max_grad_norm > 0:
                    grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), c.max_grad_norm))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
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
        self.scheduler.step()
        metrics = {k: v / updates for k, v in totals.items()}
        if c.ent_coef == 0:
            metrics.pop("entropy")  # not computed during the update; the rollout entropy is logged instead
        metrics.update(ppo_updates=updates, early_stopped=stopped, grad_norm=grad_norm)
        return metrics

    def step(self) -> dict[str, Any]:
        """One rollout phase and one update phase; returns the step's metrics (β is the one used this step)."""
        c = self.config
        started = time.perf_counter()
        rows = self.next_prompts()
        batch = self.collect(rows)
        rollout_s = time.perf_counter() - started
        beta = self.kl_controller.beta
        mask = batch.rollouts.response_mask.float()
        kl_seq = masked_sum(kl_k1(batch.old_logp, batch.ref_logp), mask, dim=-1)  # (N,) Σ_t log π/π_ref
        k3_seq = masked_sum(kl_k3(batch.old_logp, batch.ref_logp), mask, dim=-1)  # (N,)
        non_score = -beta * kl_seq
        metrics = self.update(batch)
        elapsed = time.perf_counter() - started
        self.step_count += 1
        kl_global = float(self.accelerator.reduce(kl_seq.mean().reshape(1), reduction="mean"))
        responses = len(batch.rollouts) * self.accelerator.num_processes
        self.kl_controller.update(kl_global, responses)
        lengths = batch.rollouts.lengths.float()
        metrics.update(
            step=self.step_count,
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
            self.samples = [{"step": self.step_count, "prompt": batch.rollouts.prompts[i],
                             "response": batch.rollouts.texts[i], "score": batch.score[i].item(),
                             "kl": kl_seq[i].item(), "ended": bool(batch.rollouts.ended[i])}
                            for i in range(min(c.sample_rows, len(batch.rollouts)))]
        else:
            self.samples = []
        return metrics

    # -- evaluation, saving -----------------------------------------------------------------------

    def evaluate(self, samples_path: str | Path | None = None) -> dict[str, Any] | None:
        if not self.eval_rows:
            return None
        c = self.config
        config = EvalConfig(k=c.eval_k, temperature=c.eval_temperature or c.temperature, top_p=c.top_p,
                            max_new_tokens=c.max_new_tokens, max_prompts=c.eval_max_prompts, stop=c.stop,
                            seed=c.seed + 4242)
        result = evaluate(self.policy, self.tokenizer, self.eval_rows, self.functions, self.reference, config,
                          samples_path=samples_path, reference_summary=self._ref_eval)
        self._ref_eval = result.get("reference")
        return result

    def save(self, path: str | Path, value_path: str | Path | None = None) -> None:
        """save_pretrained (safetensors) of the policy (merged under LoRA, plus the adapter) and the value model."""
        path = Path(path)
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return
        model = self.policy
        if hasattr(model, "merge_and_unload"):
            import copy

            with atomic_dir(path.parent / (path.name + "-adapter")) as adapter:
                model.save_pretrained(adapter)
            model = copy.deepcopy(model).merge_and_unload()
        with atomic_dir(path) as out:
            model.save_pretrained(out, safe_serialization=True)
            self.tokenizer.save_pretrained(out)
        if value_path is not None:
            with atomic_dir(value_path) as out:
                self.actor_critic.save_value_model(out)

    def save_checkpoint(self, path: str | Path) -> None:
        with staged_dir(path, self.accelerator) as stage:
            self.save(stage / "model", stage / "value_model")
            if self.accelerator.is_main_process:
                state = {"step": self.step_count, "order": self._order, "epoch": self._epoch,
                         "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                         "rng": torch.get_rng_state(), "beta": self.kl_controller.beta,
                         "moments": vars(self.moments) if self.moments is not None else None,
                         "watch": self.watch.state_dict()}
                torch.save(state, stage / "trainer.pt")

    def load_checkpoint(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        model = self.policy
        if hasattr(model, "merge_and_unload"):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, load_file(str(path / "model-adapter" / "adapter_model.safetensors")))
        else:
            missing, _ = model.load_state_dict(load_file(str(path / "model" / "model.safetensors")), strict=False)
            if [m for m in missing if not m.endswith("lm_head.weight")]:
                raise ValueError(f"checkpoint {path} lacks weights: {missing[:5]}")
            if hasattr(model, "tie_weights"):
                model.tie_weights()
        self.actor_critic.load_value_model(path / "value_model")
        state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count, self._order, self._epoch = state["step"], state["order"], state["epoch"]
        torch.set_rng_state(state["rng"])
        self.kl_controller.beta = state["beta"]
        if self.moments is not None and state["moments"] is not None:
            self.moments = RunningMoments(**state["moments"])
        self.watch.load_state_dict(state["watch"])


def train(config: PPOConfig, progress: bool = True) -> dict[str, Any]:
    """Run PPO end to end from `config` (paths in it); returns the final evaluation (or {})."""
    from tqdm.auto import tqdm

    from training.data import load_prompts, split_train_heldout
    from training.policy import load_policy
    from training.rewards import build_reward_functions
    from training.run_info import MetricsWriter, write_json, write_run_config
    from training.value_head import load_critic

    for name in ("prompts", "model", "out"):
        if not getattr(config, name):
            raise ValueError(f"{name} is required")
    if not config.reward_fn and not config.reward_model:
        raise ValueError("give --reward-model and/or --reward-fn")
    functions = build_reward_functions(config.reward_fn, config.reward_weights, config.reward_kwargs,
                                       config.reward_model, config.reward_model_weight)
    train_rows, eval_rows = split_train_heldout(load_prompts(config.prompts))
    model, tokenizer = load_policy(config.model, lora=config.lora_settings)
    critic = load_critic(config.critic) if config.critic else None
    trainer = PPOTrainer(config, model, tokenizer, functions, train_rows, eval_rows, critic=critic)
    out = Path(config.out)
    checkpoint = out / "checkpoint"
    if config.resume and trainer.accelerator.is_main_process:
        recover_dir(checkpoint)
    trainer.accelerator.wait_for_everyone()
    resumed = config.resume and (checkpoint / "trainer.pt").exists()
    if resumed:
        trainer.load_checkpoint(checkpoint)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        write_run_config(out, config, data={"prompts": config.prompts},
                         extra={"processes": trainer.accelerator.num_processes,
                                "resumed_from_step": trainer.step_count})
    writer = MetricsWriter(out / "metrics.jsonl", out / "tensorboard" if config.tensorboard else None,
                           append=resumed, resume_step=trainer.step_count) if main_process else None
    samples_file = (out / "rollout_samples.jsonl").open("a" if resumed else "w", encoding="utf-8") \
        if main_process else None
    bar = tqdm(total=config.steps, initial=trainer.step_count, disable=not (progress and main_process), desc="ppo")
    try:
        while trainer.step_count < config.steps:
            metrics = trainer.step()
            if config.eval_every and trainer.step_count % config.eval_every == 0 and trainer.step_count < config.steps:
                result = trainer.evaluate()
                if result is not None:
                    metrics.update(eval_metrics(result))
                    if "win_rate" in result:
                        # the score was just observed; judge the win-rate trend against it
                        warning = trainer.watch.observe(trainer.watch.scores.pop(), metrics["kl"], result["win_rate"])
                        if warning:
                            metrics["warning"] = warning
            if "warning" in metrics:
                bar.write(f"step {trainer.step_count}: {metrics['warning']}")
            if writer is not None:
                writer.log(**metrics)
            if samples_file is not None and trainer.samples:
                samples_file.writelines(json.dumps(s) + "\n" for s in trainer.samples)
                samples_file.flush()
            bar.update(1)
            if trainer.step_count % config.log_every == 0:
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", kl=f"{metrics['kl']:.3f}",
                                beta=f"{metrics['beta']:.4f}")
            if config.save_every and trainer.step_count % config.save_every == 0:
                trainer.save_checkpoint(checkpoint)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        if samples_file is not None:
            samples_file.close()
    trainer.save(out / "model", out / "value_model")
    result = trainer.evaluate(samples_path=out / "samples.jsonl" if main_process else None)
    final = public(result) if result is not None else {}
    if main_process:
        write_json(out / "eval.json", final)
    return final


def main(argv: list[str] | None = None) -> int:
    """`python -m training ppo --prompts PATH --model DIR --out DIR (--reward-model DIR | --reward-fn F ...)
    [--critic DIR] [--config run.toml] [--set key=value ...]`."""
    from training.config import field_docs, load_config

    docs = field_docs(PPOConfig)
    parser = argparse.ArgumentParser(
        prog="python -m training ppo", description="PPO with a value model, a frozen reference and a reward model.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config fields (--set key=value or a TOML file):\n" + "\n".join(f"  {k}: {v}" for k, v in docs.items()))
    parser.add_argument("--prompts", help="prompts export (JSONL, Parquet or datasets directory)")
    parser.add_argument("--model", help="starting policy directory")
    parser.add_argument("--out", help="output directory")
    parser.add_argument("--reward-model", help="preflab reward model directory")
    parser.add_argument("--reward-fn", action="append", default=None, help="module:function or a built-in name")
    parser.add_argument("--critic", help="separate critic directory (default: value head on the policy)")
    parser.add_argument("--config", help="TOML file with PPOConfig fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        config = load_config(PPOConfig, args.config, args.set, prompts=args.prompts, model=args.model, out=args.out,
                             reward_fn=args.reward_fn, reward_model=args.reward_model, critic=args.critic)
        if not config.reward_fn and not config.reward_model:
            raise ValueError("give --reward-model and/or --reward-fn")
        result = train(config, progress=not args.quiet)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps({k: result[k] for k in ("reward_mean", "kl", "win_rate") if k in result}))
    return 0
