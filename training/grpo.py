"""GRPO and GSPO: group-relative policy optimisation of a causal LM against reward functions or a reward model.

One step: sample G responses for each of a batch of prompts → score them → group-relative
advantages (outcome, or process when a reward scores steps: a process reward function or a process reward model,
`--process-reward-model`, whose step scores are weighted by `process_reward_weight`, credited to each step as
`process_credit` says and mixed with the outcome advantage when `process_outcome_mix` is set) → μ optimisation
passes of `grpo_loss` / `gspo_loss`. The math
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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.cli import Command, Flag
from training.config import PROCESS_CREDITS, GRPOConfig
from training.data import PromptRow
from training.evaluate import reward_columns
from training.loop import RunResult, run
from training.losses import (
    clip_advantages,
    clip_fraction,
    first_error_advantages,
    group_advantages,
    grpo_loss,
    gspo_clip_fraction,
    gspo_loss,
    kl_k1,
    kl_k3,
    masked_sum,
    mean_process_advantages,
    min_process_advantages,
    mixed_advantages,
    process_advantages,
    progress_advantages,
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


@dataclass(frozen=True)
class Credit:
    """How process rewards become per-step advantages: `GRPOConfig`'s process_credit, process_outcome_mix and
    process_threshold (the defaults are DeepSeekMath's sum form with the outcome on the last step)."""

    form: str = "sum"
    mix: float | None = None
    threshold: float = 0.5

    @classmethod
    def of(cls, config: GRPOConfig) -> Credit:
        return cls(config.process_credit, config.process_outcome_mix, config.process_threshold)


def _group_means(values: Sequence[float], group_size: int) -> list[float]:
    """Each completion's group mean of `values` (the Monte-Carlo estimate of the prompt's value from its G samples)."""
    out: list[float] = []
    for start in range(0, len(values), group_size):
        group = list(values[start:start + group_size])
        out += [sum(group) / len(group)] * len(group)
    return out


def _with_last(steps: list[list[float]], last: Sequence[float], pick: Any) -> list[list[float]]:
    """`steps` with each completion's last step replaced by pick(its last step, last[i])."""
    return [s[:-1] + [pick(s[-1], v)] if s else [] for s, v in zip(steps, last, strict=True)]


def step_advantages(rewards: RewardResult, group_size: int, eps: float, credit: Credit = Credit()
                    ) -> list[list[float]]:
    """The per-step advantages of process rewards under `credit` (ragged, one list per completion).

    sum, mean and min read `steps` (outcome rewards added to the last step) unless a mix is set; first_error reads
    the outcome as the last step's verdict (the step is wrong when either is below the threshold), progress as the
    value after the last step, with V_0 the group's mean outcome (its G samples are Monte-Carlo rollouts of the
    prompt); a mix adds the group-normalised outcome advantage to α times the process credit of the step scores.
    """
    assert rewards.steps is not None
    process = rewards.process_steps if rewards.process_steps is not None else rewards.steps
    outcome = rewards.outcome.tolist() if rewards.outcome is not None else None
    if credit.mix is not None and outcome is None:
        raise ValueError("process_outcome_mix: no outcome reward to mix in; give a reward function or reward model "
                         "that scores whole answers beside the process reward")
    folded = rewards.steps if credit.mix is None else process
    form = credit.form
    if form == "sum":
        adv = process_advantages(folded, group_size, eps=eps)
    elif form == "mean":
        adv = mean_process_advantages(folded, group_size, eps=eps)
    elif form == "min":
        adv = min_process_advantages(folded, group_size, eps=eps)
    elif form == "first_error":
        verdicts = process if outcome is None or credit.mix is not None else _with_last(process, outcome, min)
        adv = first_error_advantages(verdicts, group_size, threshold=credit.threshold, eps=eps)
    elif form == "progress":
        values = process if outcome is None else _with_last(process, outcome, lambda _v, o: o)
        v0 = _group_means(outcome if outcome is not None else [v[-1] for v in values], group_size)
        adv = progress_advantages(values, v0, group_size, eps=eps)
    else:
        raise ValueError(f"process_credit must be one of {', '.join(PROCESS_CREDITS)}, got {form!r}")
    if credit.mix is None:
        return adv
    assert rewards.outcome is not None
    outcome_adv, _ = group_advantages(rewards.outcome, group_size, scale="group", eps=eps)
    return mixed_advantages(outcome_adv.tolist(), adv, group_size, credit.mix, eps=eps)


def compute_advantages(rewards: RewardResult, group_size: int, scale: str, eps: float, tokenizer: Any = None,
                       rollouts: Rollouts | None = None, credit: Credit = Credit(), clip: float | None = None
                       ) -> tuple[Tensor, float]:
    """Outcome advantages (N,) from the total reward, or process advantages (N, R) when per-step rewards exist
    (credited as `credit` says); every token's advantage clipped to [−clip, clip] when `clip` is given."""
    adv, zero_std, _ = advantages_by_step(rewards, group_size, scale, eps, tokenizer, rollouts, credit, clip)
    return adv, zero_std


def advantages_by_step(rewards: RewardResult, group_size: int, scale: str, eps: float, tokenizer: Any = None,
                       rollouts: Rollouts | None = None, credit: Credit = Credit(), clip: float | None = None
                       ) -> tuple[Tensor, float, list[list[float]] | None]:
    """`compute_advantages` and, for process rewards, the per-step advantages it spread over the tokens."""
    if rewards.steps is None:
        adv, zero_std = group_advantages(rewards.total, group_size, scale=scale, eps=eps)  # type: ignore[arg-type]
        return (adv if clip is None else clip_advantages(adv, clip)), zero_std, None
    if tokenizer is None or rollouts is None or rewards.step_ends is None:
        raise ValueError("process rewards need the tokenizer and rollouts to map steps to tokens")
    step_adv = step_advantages(rewards, group_size, eps, credit)
    index = token_step_index(tokenizer, rollouts.response_ids.cpu(), rollouts.response_mask.cpu(), rewards.step_ends)
    adv = torch.zeros(index.shape)
    for i, values in enumerate(step_adv):
        adv[i] = torch.tensor(values, dtype=torch.float32)[index[i].clamp(max=len(values) - 1)]
    if clip is not None:
        adv = clip_advantages(adv, clip)
    zero_std = sum(len(set(sum(rewards.steps[g:g + group_size], []))) <= 1
                   for g in range(0, len(rewards.steps), group_size)) / (len(rewards.steps) // group_size)
    return adv.to(rollouts.response_ids.device) * rollouts.response_mask, zero_std, step_adv


STEP_INDICES_LOGGED = 16
"""Step indices whose mean reward and advantage, and how many rollouts reach them, a process run logs
(`step_reward/j`, `step_adv/j`, `step_reached/j`)."""


def step_index_sums(step_rewards: list[list[float]], step_adv: list[list[float]]) -> Tensor:
    """(3, J) sums over completions of each step index's reward and advantage, and how many completions reach it."""
    sums = torch.zeros(3, STEP_INDICES_LOGGED, dtype=torch.float64)
    for rewards, adv in zip(step_rewards, step_adv, strict=True):
        for j, (r, a) in enumerate(zip(rewards[:STEP_INDICES_LOGGED], adv, strict=False)):
            sums[0, j] += r
            sums[1, j] += a
            sums[2, j] += 1
    return sums


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
            adv = adv if c.advantage_clip is None else clip_advantages(adv, c.advantage_clip)
            step_adv = None
        else:
            adv, zero_std, step_adv = advantages_by_step(rewards, c.group_size, c.scale_rewards, c.advantage_eps,
                                                         self.tokenizer, rollouts, Credit.of(c), c.advantage_clip)
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
        if step_adv is not None:
            metrics.update(self._step_figures(rewards, step_adv))
        return metrics

    def _step_figures(self, rewards: RewardResult, step_adv: list[list[float]]) -> dict[str, float]:
        """Per step index j, the mean step reward (process scores alone) and advantage over the rollouts that reach
        step j (`step_reward/j`, `step_adv/j`) and how many rollouts do (`step_reached/j`, over every process); and the
        share of groups whose outcome reward does not vary."""
        assert rewards.process_steps is not None
        device = self.accelerator.device
        sums = self.accelerator.reduce(step_index_sums(rewards.process_steps, step_adv).float().to(device),
                                       reduction="sum").cpu()
        out: dict[str, float] = {}
        for j in range(STEP_INDICES_LOGGED):
            if sums[2, j] > 0:
                out[f"step_reward/{j}"] = (sums[0, j] / sums[2, j]).item()
                out[f"step_adv/{j}"] = (sums[1, j] / sums[2, j]).item()
                out[f"step_reached/{j}"] = sums[2, j].item()
        if rewards.outcome is not None:
            grouped = rewards.outcome.view(-1, self.config.group_size)
            flat = (grouped.max(dim=1).values - grouped.min(dim=1).values < 1e-8).float().mean().reshape(1)
            out["outcome_zero_std_frac"] = self.accelerator.reduce(flat.to(device), reduction="mean").item()
        return out

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
        # running sums as tensors (no host sync per micro-batch): loss, clipfrac, entropy, k3, k1, |A|, A²
        sums = torch.zeros(7, device=device)
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
        per_token = adv if adv.dim() == 2 else adv.unsqueeze(1).expand_as(full)
        sums[5] = masked_sum(per_token.abs(), full)
        sums[6] = masked_sum(per_token ** 2, full)
        # one all-reduce for every logged figure: means over processes, sums over the global batch's tokens
        mean_part = self.accelerator.reduce(sums[:2], reduction="mean")
        totals = self.accelerator.reduce(torch.cat([sums[2:], full.sum().reshape(1)]), reduction="sum")
        loss_value, clipfrac = mean_part.tolist()
        entropy_sum, k3_sum, k1_sum, adv_sum, adv_sq_sum, tokens = totals.tolist()
        tokens = max(tokens, 1.0)
        stats: dict[str, Any] = {"loss": loss_value, "clipfrac": clipfrac, "entropy": entropy_sum / tokens}
        if ref_logp is not None:
            stats["kl"] = k3_sum / tokens  # token-mean k3, the quantity β multiplies
            stats["kl_seq"] = k1_sum / (n * world)  # sequence-level KL estimate Σ_t log π/π_ref, mean over responses
        if c.max_grad_norm > 0:
            stats["grad_norm"] = grad_norm_first
        stats["adv_abs_mean"] = adv_sum / tokens
        stats["adv_rms"] = (adv_sq_sum / tokens) ** 0.5  # the advantage's scale, which acts like a learning rate
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
