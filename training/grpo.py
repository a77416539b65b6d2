"""GRPO and GSPO: group-relative policy optimisation of a causal LM against reward functions or a reward model.

One step: sample G responses for each of a batch of prompts → score them → group-relative
advantages (outcome, or process when a reward scores steps: a process reward function or a process reward model,
`--process-reward-model`, whose step scores are weighted by `process_reward_weight` and to whose last step the
outcome rewards are added) → μ optimisation passes of `grpo_loss` / `gspo_loss`. The math
lives in `training/losses.py`, the loop (checkpoints, logging, evaluation, saving) in `training/loop.py`; this
module moves tensors between the losses. `accelerate launch --num_processes N -m training grpo ...` runs it
data-parallel (on a machine without GPUs add `--multi_gpu`, so that accelerate starts N gloo processes: `--cpu`
alone starts one, or use
`torchrun --nproc_per_node N -m training grpo ...`): each process samples its slice of every step's global
prompt batch, with sampling streams keyed by the global prompt index, and DDP averages the gradients, so N
processes follow the one-process run (tests/training/test_grpo.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.cli import Command, Flag
from training.config import GRPOConfig
from training.data import PromptRow
from training.evaluate import reward_columns
from training.loop import RunResult, run
from training.losses import (
    clip_fraction,
    group_advantages,
    grpo_loss,
    gspo_clip_fraction,
    gspo_loss,
    kl_k1,
    kl_k3,
    masked_sum,
    process_advantages,
)
from training.policy import Rollouts, generate_rollouts, rollout_server, token_logprobs, unwrap
from training.rewards import RewardFunction, RewardResult, compute_rewards
from training.rl import RLMethod, load_run, rl_flags, rl_summary

# ---------------------------------------------------------------------------------------------
# pieces of a step, each usable on its own (PPO reuses the rollout/reward plumbing)


def token_step_index(tokenizer: Any, response_ids: Tensor, response_mask: Tensor, step_ends: list[list[int]]
                     ) -> Tensor:
    """(N, R) index of the step (by its end offset in the text) each response token belongs to (EOS joins the last
    step)."""
    n, width = response_ids.shape
    index = torch.zeros(n, width, dtype=torch.long)
    for i in range(n):
        length = int(response_mask[i].sum())
        ids = response_ids[i, :length].tolist()
        ends = step_ends[i]
        token = 0
        for j, end in enumerate(ends[:-1]):
            # first token count whose decoded text reaches this step's end
            lo, hi = token, length
            while lo < hi:
                mid = (lo + hi) // 2
                if len(tokenizer.decode(ids[:mid + 1], skip_special_tokens=True)) >= end:
                    hi = mid
                else:
                    lo = mid + 1
            index[i, token:lo + 1] = j
            token = lo + 1
        index[i, token:] = len(ends) - 1
    return index


def compute_advantages(rewards: RewardResult, group_size: int, scale: str, eps: float, tokenizer: Any = None,
                       rollouts: Rollouts | None = None) -> tuple[Tensor, float]:
    """Outcome advantages (N,) from the total reward, or process advantages (N, R) when per-step rewards exist."""
    if rewards.steps is None:
        return group_advantages(rewards.total, group_size, scale=scale, eps=eps)  # type: ignore[arg-type]
    if tokenizer is None or rollouts is None or rewards.step_ends is None:
        raise ValueError("process rewards need the tokenizer and rollouts to map steps to tokens")
    step_adv = process_advantages(rewards.steps, group_size, eps=eps)
    index = token_step_index(tokenizer, rollouts.response_ids.cpu(), rollouts.response_mask.cpu(), rewards.step_ends)
    adv = torch.zeros(index.shape)
    for i, values in enumerate(step_adv):
        adv[i] = torch.tensor(values, dtype=torch.float32)[index[i].clamp(max=len(values) - 1)]
    zero_std = sum(len(set(sum(rewards.steps[g:g + group_size], []))) <= 1
                   for g in range(0, len(rewards.steps), group_size)) / (len(rewards.steps) // group_size)
    return adv.to(rollouts.response_ids.device) * rollouts.response_mask, zero_std


class GRPOTrainer(RLMethod):
    """GRPO/GSPO on the shared loop: `step()` samples G responses per prompt, scores them, and runs μ passes."""

    name = "grpo"
    config: GRPOConfig

    def __init__(self, config: GRPOConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (), accelerator: Any = None,
                 server: Any = None) -> None:
        super().__init__(config, model, tokenizer, functions, train_rows, eval_rows, accelerator)
        self.server = server
        self.prepare(model)

    # -- one step ---------------------------------------------------------------------------------

    def rollouts(self, rows: Sequence[PromptRow]) -> Rollouts:
        c = self.config
        # one seed for every process: sample streams are keyed by the prompt's index in the global batch, so N
        # processes sample exactly what one process would for the same global batch
        seed = c.seed * 1_000_003 + self.step_count * 101
        return generate_rollouts(
            unwrap(self.model), self.tokenizer, [r.prompt for r in rows], n=c.group_size, temperature=c.temperature,
            top_p=c.top_p, max_new_tokens=c.max_new_tokens, stop=c.stop or None, seed=seed,
            prompt_offset=self.accelerator.process_index * len(rows),
            max_prompt_length=c.max_prompt_length or None, server=self.server,
            batch_size=c.generation_batch_size or None,
        )

    def step(self) -> dict[str, Any]:
        """Sample, score, compute advantages, run μ passes; returns the step's metrics."""
        c = self.config
        started = time.perf_counter()
        rows, rollouts, gen_seconds = self.sample_step(self.rollouts)
        rewards = compute_rewards(self.functions, [r.prompt for r in rows for _ in range(c.group_size)],
                                  rollouts.texts, reward_columns(rows, c.group_size))
        if c.scale_rewards == "batch" and self.accelerator.num_processes > 1 and rewards.steps is None:
            # the batch std must be the global one: scale by hand with the gathered rewards
            everyone = self.accelerator.gather(rewards.total.to(self.accelerator.device)).float().cpu()
            adv, zero_std = group_advantages(rewards.total, c.group_size, scale="none", eps=c.advantage_eps)
            adv = adv / (everyone.std() + c.advantage_eps)
        else:
            adv, zero_std = compute_advantages(rewards, c.group_size, c.scale_rewards, c.advantage_eps,
                                               self.tokenizer, rollouts)
        device = self.accelerator.device
        adv = adv.to(device)
        mask = rollouts.response_mask.float()
        loss_mask = mask * rollouts.ended.float().unsqueeze(1) if c.mask_truncated else mask
        args = (rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask)
        ref_logp = None
        if c.beta > 0 or c.kl_metric:
            ref_logp = self.reference.logprobs(*args, temperature=c.temperature,
                                               batch_size=c.micro_batch_size or None)
        metrics = self._optimise(rollouts, adv, ref_logp, loss_mask)
        self.finish_step()
        if c.ref_reset_steps and self.step_count % c.ref_reset_steps == 0:
            self.reference.reset(self.model)
            self._ref_eval = None
        # per-response figures of every process in one gather: the logged step is the global batch's
        columns = [rewards.total.float(), rollouts.lengths.float().cpu(), rollouts.ended.float().cpu()]
        names = list(rewards.per_function) if len(self.functions) > 1 else []
        columns += [rewards.per_function[name].float() for name in names]
        table = self.accelerator.gather(torch.stack(columns, dim=1).to(device)).cpu()  # (N_global, 3 + F)
        zero_std = self.accelerator.reduce(torch.tensor([zero_std], device=device), reduction="mean").item()
        elapsed = time.perf_counter() - started
        metrics.update(
            reward_mean=table[:, 0].mean().item(),
            reward_std=table[:, 0].std().item(),
            zero_std_frac=zero_std,
            response_length=table[:, 1].mean().item(),
            truncated_frac=1.0 - table[:, 2].mean().item(),
            lr=self.scheduler.get_last_lr()[0],
            tokens_per_s=table[:, 1].sum().item() / elapsed,
            generation_s=gen_seconds,
            step_s=elapsed,
        )
        for k, name in enumerate(names):
            metrics[f"reward/{name}"] = torch.nanmean(table[:, 3 + k]).item()
        return metrics

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "kl": f"{metrics.get('kl', 0.0):.4f}"}

    def _optimise(self, rollouts: Rollouts, adv: Tensor, ref_logp: Tensor | None, loss_mask: Tensor
                  ) -> dict[str, Any]:
        c = self.config
        assert c.clip_eps is not None  # GRPOConfig.__post_init__ sets the loss type's default
        n = len(rollouts)
        world = self.accelerator.num_processes
        size = c.micro_batch_size or n
        device = loss_mask.device
        if c.aggregation == "token" and c.loss_type == "grpo":
            # the token mean is over the global batch's tokens: DDP averages the processes' gradients, so each
            # micro-batch is weighted by its share of the global token count, times the number of processes
            total_tokens = self.accelerator.reduce(loss_mask.sum(), reduction="sum").clamp(min=1.0) / world
        full = rollouts.response_mask.float()
        # running sums as tensors (no host sync per micro-batch): loss, clipfrac, entropy, k3, k1, |A|
        sums = torch.zeros(6, device=device)
        for _pass in range(c.mu):
            for start in range(0, n, size):
                rows = slice(start, start + size)
                mb_mask = loss_mask[rows]
                first = _pass == 0
                logp, entropy = token_logprobs(self.model, rollouts.input_ids[rows], rollouts.attention_mask[rows],
                                               rollouts.response_mask[rows], temperature=c.temperature,
                                               with_entropy=first)
                # μ = 1 is exactly on-policy: π_old is π_θ itself, so the ratio is 1 with the right gradient
                old_logp = logp.detach() if c.mu == 1 else rollouts.old_logp[rows]
                mb_ref = ref_logp[rows] if ref_logp is not None else None
                mb_adv = adv[rows]
                if c.loss_type == "gspo":
                    loss = gspo_loss(logp, old_logp, mb_ref if c.beta > 0 else None, mb_adv, mb_mask, c.clip_eps,
                                     c.beta, c.clip_eps_high)
                    weight = mb_mask.shape[0] / n
                    clipped = gspo_clip_fraction(logp, old_logp, mb_adv, mb_mask, c.clip_eps, c.clip_eps_high)
                else:
                    loss = grpo_loss(logp, old_logp, mb_ref if c.beta > 0 else None, mb_adv, mb_mask, c.clip_eps,
                                     c.beta, c.aggregation, c.clip_eps_high, max_tokens=c.max_new_tokens)
                    # re-weight micro-batch losses so their sum is the full-batch aggregation
                    weight = mb_mask.sum() / total_tokens if c.aggregation == "token" else mb_mask.shape[0] / n
                    clipped = clip_fraction(logp, old_logp, mb_adv, mb_mask, c.clip_eps, c.clip_eps_high)
                self.accelerator.backward(loss * weight)
                if first:
                    with torch.no_grad():
                        mb_full = full[rows]
                        sums[0] += loss.detach() * weight
                        sums[1] += clipped.detach() * (mb_mask.shape[0] / n)
                        if entropy is not None:
                            sums[2] += masked_sum(entropy.detach(), mb_full)
                        if mb_ref is not None:
                            sums[3] += masked_sum(kl_k3(logp.detach(), mb_ref), mb_full)
                            sums[4] += masked_sum(kl_k1(logp.detach(), mb_ref), mb_full)
            grad_norm = self.optimizer_step()
            if _pass == 0:
                grad_norm_first = grad_norm
        sums[5] = masked_sum(adv.abs() if adv.dim() == 2 else adv.abs().unsqueeze(1).expand_as(full), full)
        # one all-reduce for every logged figure: means over processes, sums over the global batch's tokens
        mean_part = self.accelerator.reduce(sums[:2], reduction="mean")
        totals = self.accelerator.reduce(torch.cat([sums[2:], full.sum().reshape(1)]), reduction="sum")
        loss_value, clipfrac = mean_part.tolist()
        entropy_sum, k3_sum, k1_sum, adv_sum, tokens = totals.tolist()
        tokens = max(tokens, 1.0)
        stats: dict[str, Any] = {"loss": loss_value, "clipfrac": clipfrac, "entropy": entropy_sum / tokens}
        if ref_logp is not None:
            stats["kl"] = k3_sum / tokens  # token-mean k3, the quantity β multiplies
            stats["kl_seq"] = k1_sum / (n * world)  # sequence-level KL estimate Σ_t log π/π_ref, mean over responses
        if c.max_grad_norm > 0:
            stats["grad_norm"] = grad_norm_first
        stats["adv_abs_mean"] = adv_sum / tokens
        return stats

def train(config: GRPOConfig) -> RunResult:
    """Run GRPO/GSPO end to end from `config` (paths in it): OUT/model, eval.json, metrics.jsonl, run.json."""
    functions, train_rows, eval_rows, model, tokenizer = load_run(config)
    server = None
    if config.server_base_url:
        assert config.server_model is not None  # GRPOConfig takes the two together
        server = rollout_server(config.server_base_url, config.server_model)
    trainer = GRPOTrainer(config, model, tokenizer, functions, train_rows, eval_rows, server=server)
    return run(trainer, data={"prompts": config.prompts})


COMMAND = Command(
    name="grpo", config=GRPOConfig, description="GRPO / GSPO on a prompts export.", train=train, summary=rl_summary,
    check=GRPOConfig.check_reward,
    flags=[*rl_flags(), Flag("--process-reward-model", "process_reward_model",
                             "preflab process reward model directory: per-step scores, process advantages")])


def main(argv: list[str] | None = None) -> int:
    """`python -m training grpo --prompts PATH --model DIR --out DIR (--reward-fn F ... | --reward-model DIR |
    --process-reward-model DIR) [--config run.toml] [--set key=value ...]`."""
    return cli.main(COMMAND, argv)
