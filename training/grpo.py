"""GRPO and GSPO: group-relative policy optimisation of a causal LM against reward functions or a reward model.

One step: sample G responses for each of a batch of prompts → score them → group-relative
advantages (outcome or process) → μ optimisation passes of `grpo_loss` / `gspo_loss`. The math
lives in `training/losses.py`; this module moves tensors between those functions, logs, evaluates
and saves. `accelerate launch --num_processes N -m training grpo ...` runs it data-parallel (on a machine
without GPUs add `--multi_gpu`, so that accelerate starts N gloo processes: `--cpu` alone starts one, or use
`torchrun --nproc_per_node N -m training grpo ...`): each process samples its slice of every step's global
prompt batch, with sampling streams keyed by the global prompt index, and DDP averages the gradients, so N
processes follow the one-process run (tests/training/test_grpo.py).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.config import GRPOConfig
from training.data import PromptRow
from training.evaluate import EvalConfig, eval_metrics, evaluate, public, reward_columns
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
from training.optim import lr_lambda, make_accelerator
from training.policy import (
    Reference,
    Rollouts,
    ServerGenerator,
    generate_rollouts,
    token_logprobs,
    unwrap,
)
from training.rewards import RewardFunction, RewardResult, compute_rewards
from training.run_info import atomic_dir, recover_dir, staged_dir

# ---------------------------------------------------------------------------------------------
# pieces of a step, each usable on its own (PPO reuses the rollout/reward plumbing)


def token_step_index(tokenizer: Any, response_ids: Tensor, response_mask: Tensor, step_ends: list[list[int]]
                     ) -> Tensor:
    """(N, R) index of the newline-separated step each response token belongs to (EOS joins the last step)."""
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


class GRPOTrainer:
    """Holds the policy, reference, optimiser and data order of one run; `step()` does one GRPO update."""

    def __init__(self, config: GRPOConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (), accelerator: Any = None,
                 server: ServerGenerator | None = None) -> None:
        if not train_rows:
            raise ValueError("prompts: no training prompts")
        self.config = config
        self.accelerator = accelerator or make_accelerator(config.mixed_precision)
        if config.prompts_per_step % self.accelerator.num_processes:
            raise ValueError(f"prompts_per_step={config.prompts_per_step} must be divisible by the "
                             f"{self.accelerator.num_processes} processes")
        self.tokenizer = tokenizer
        self.functions = list(functions)
        self.train_rows = list(train_rows)
        self.eval_rows = list(eval_rows)
        self.server = server
        torch.manual_seed(config.seed)
        model.eval()  # no dropout: π_θ and π_old must be the same function for the ratio
        self.reference = Reference(model)
        if not self.reference._lora:
            self.reference.model.to(self.accelerator.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))
        # the scheduler stays unprepared: accelerate would step it once per process, and `steps` are global steps
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = scheduler
        self.step_count = 0
        self._order: list[int] = []
        self._epoch = 0
        self._ref_eval: dict[str, Any] | None = None

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
        rows = self.next_prompts()
        rollouts = self.rollouts(rows)
        gen_seconds = time.perf_counter() - started
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
        self.step_count += 1
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
            step=self.step_count,
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

    def _optimise(self, rollouts: Rollouts, adv: Tensor, ref_logp: Tensor | None, loss_mask: Tensor
                  ) -> dict[str, Any]:
        c = self.config
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
            self.optimizer.zero_grad(set_to_none=True)
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
            if c.max_grad_norm > 0:
                grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                if _pass == 0:
                    grad_norm_first = grad_norm
            self.optimizer.step()
        self.scheduler.step()
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
            stats["grad_norm"] = float(grad_norm_first)
        stats["adv_abs_mean"] = adv_sum / tokens
        return stats

    # -- evaluation, saving -----------------------------------------------------------------------

    def evaluate(self, samples_path: str | Path | None = None) -> dict[str, Any] | None:
        if not self.eval_rows or not self.functions:
            return None
        c = self.config
        config = EvalConfig(k=c.eval_k, temperature=c.eval_temperature or c.temperature, top_p=c.top_p,
                            max_new_tokens=c.max_new_tokens, max_prompts=c.eval_max_prompts, stop=c.stop,
                            seed=c.seed + 4242)
        result = evaluate(unwrap(self.model), self.tokenizer, self.eval_rows, self.functions, self.reference, config,
                          samples_path=samples_path, reference_summary=self._ref_eval)
        self._ref_eval = result.get("reference")
        return result

    def save(self, path: str | Path) -> None:
        """save_pretrained (safetensors) of the policy; under LoRA the merged model, plus the adapter."""
        path = Path(path)
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return
        model = unwrap(self.accelerator.unwrap_model(self.model))
        if hasattr(model, "merge_and_unload"):
            import copy

            with atomic_dir(path.parent / (path.name + "-adapter")) as adapter:
                model.save_pretrained(adapter)
            model = copy.deepcopy(model).merge_and_unload()
        with atomic_dir(path) as out:
            model.save_pretrained(out, safe_serialization=True)
            self.tokenizer.save_pretrained(out)

    def save_checkpoint(self, path: str | Path) -> None:
        with staged_dir(path, self.accelerator) as stage:
            self.save(stage / "model")
            if self.accelerator.is_main_process:
                state = {"step": self.step_count, "order": self._order, "epoch": self._epoch,
                         "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                         "rng": torch.get_rng_state()}
                if self.config.ref_reset_steps:
                    state["reference"] = self._reference_state()
                torch.save(state, stage / "trainer.pt")

    def _reference_state(self) -> dict[str, Tensor]:
        if self.reference._lora:
            return dict(self.reference._snapshot or {})
        return {k: v.detach().cpu() for k, v in self.reference.model.state_dict().items()}

    def load_checkpoint(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        model = unwrap(self.accelerator.unwrap_model(self.model))
        if hasattr(model, "merge_and_unload"):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, load_file(str(path / "model-adapter" / "adapter_model.safetensors")))
        else:
            weights = load_file(str(path / "model" / "model.safetensors"))
            missing, _ = model.load_state_dict(weights, strict=False)
            if [m for m in missing if not m.endswith("lm_head.weight")]:
                raise ValueError(f"checkpoint {path} lacks weights: {missing[:5]}")
            if hasattr(model, "tie_weights"):
                model.tie_weights()
        state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count, self._order, self._epoch = state["step"], state["order"], state["epoch"]
        torch.set_rng_state(state["rng"])
        if "reference" in state:
            if self.reference._lora:
                self.reference._snapshot = state["reference"] or None
            else:
                self.reference.model.load_state_dict(state["reference"])


def train(config: GRPOConfig, progress: bool = True) -> dict[str, Any]:
    """Run GRPO/GSPO end to end from `config` (paths in it); returns the final evaluation (or {})."""
    from tqdm.auto import tqdm

    from training.data import load_prompts, split_train_heldout
    from training.policy import load_policy
    from training.rewards import build_reward_functions
    from training.run_info import MetricsWriter, write_json, write_run_config

    for name in ("prompts", "model", "out"):
        if not getattr(config, name):
            raise ValueError(f"{name} is required")
    functions = build_reward_functions(config.reward_fn, config.reward_weights, config.reward_kwargs,
                                       config.reward_model, config.reward_model_weight)
    train_rows, eval_rows = split_train_heldout(load_prompts(config.prompts))
    model, tokenizer = load_policy(config.model, lora=config.lora_settings)
    server = ServerGenerator(config.server_base_url, config.server_model) if config.server_base_url else None
    trainer = GRPOTrainer(config, model, tokenizer, functions, train_rows, eval_rows, server=server)
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
    bar = tqdm(total=config.steps, initial=trainer.step_count, disable=not (progress and main_process), desc="grpo")
    try:
        while trainer.step_count < config.steps:
            metrics = trainer.step()
            if config.eval_every and trainer.step_count % config.eval_every == 0 and trainer.step_count < config.steps:
                result = trainer.evaluate()
                if result is not None:
                    metrics.update(eval_metrics(result))
            if writer is not None:
                writer.log(**metrics)
            bar.update(1)
            if trainer.step_count % config.log_every == 0:
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", kl=f"{metrics.get('kl', 0.0):.4f}")
            if config.save_every and trainer.step_count % config.save_every == 0:
                trainer.save_checkpoint(checkpoint)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    trainer.save(out / "model")
    result = trainer.evaluate(samples_path=out / "samples.jsonl" if main_process else None)
    final = public(result) if result is not None else {}
    if main_process:
        write_json(out / "eval.json", final)
    return final


def main(argv: list[str] | None = None) -> int:
    """`python -m training grpo --prompts PATH --model DIR --out DIR (--reward-fn F ... | --reward-model DIR)
    [--config run.toml] [--set key=value ...]`."""
    from training.config import field_docs, load_config

    docs = field_docs(GRPOConfig)
    parser = argparse.ArgumentParser(
        prog="python -m training grpo", description="GRPO / GSPO on a prompts export.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config fields (--set key=value or a TOML file):\n" + "\n".join(f"  {k}: {v}" for k, v in docs.items()))
    parser.add_argument("--prompts", help="prompts export (JSONL, Parquet or datasets directory)")
    parser.add_argument("--model", help="starting policy directory")
    parser.add_argument("--out", help="output directory")
    parser.add_argument("--reward-fn", action="append", default=None, help="module:function or a built-in name")
    parser.add_argument("--reward-model", help="preflab reward model directory")
    parser.add_argument("--config", help="TOML file with GRPOConfig fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        config = load_config(GRPOConfig, args.config, args.set, prompts=args.prompts, model=args.model, out=args.out,
                             reward_fn=args.reward_fn, reward_model=args.reward_model)
        if not config.reward_fn and not config.reward_model:
            raise ValueError("give --reward-fn and/or --reward-model")
        result = train(config, progress=not args.quiet)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps({k: result[k] for k in ("reward_mean", "kl", "win_rate", "pass_at_k", "maj_at_k")
                      if k in result}))
    return 0
