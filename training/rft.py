"""Rejection-sampling fine-tuning (RFT), offline and online: `RFTTrainer` on the shared loop, and the `rft` command.

`python -m training rft --prompts PATH --model DIR --out DIR (--reward-fn module:function ... | --reward-model DIR)
[--set online=true ...]`. A round samples N answers to each of `prompts_per_round` prompts, scores them with the
reward functions and/or reward model, keeps those above `threshold` (or the best `top_k` of each prompt), and
fine-tunes on what it kept for `steps_per_round` steps of the SFT loss. Online RFT resamples every round from the
current policy; offline RFT samples every round's prompts once, from the starting model, before the first step,
so both draw the same number of samples. metrics.jsonl rows carry `loss`, `reward_mean` and `kept_fraction` of the
current round's samples and `samples` (how many it drew); eval.json is the held-out comparison with the starting
model (Pass@K, Maj@K, KL, win rate), as for GRPO and PPO.

Seen as a weighting of the log-probability gradient (DeepSeekMath §5.2.1's unified view), RFT puts weight 1 on
accepted samples and 0 on the rest: SFT on the model's own best answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from training import cli
from training.causal_lm import Example, fit, target_logprobs
from training.cli import Command
from training.config import RFTConfig, RLConfig
from training.data import PromptRow
from training.evaluate import reward_columns
from training.loop import RunResult, run
from training.losses import sft_loss
from training.policy import generate_rollouts
from training.rewards import RewardFunction, compute_rewards
from training.rl import RLMethod, load_run, rl_flags, rl_summary


def select_samples(rewards: Sequence[float], n: int, keep: str, threshold: float, top_k: int,
                   texts: Sequence[str] | None = None) -> list[int]:
    """Indices of the kept samples; rows [i·n, (i+1)·n) answer prompt i.

    "threshold" keeps every sample whose reward is at least `threshold`; "top_k" the best `top_k` of each prompt
    (ties in sampling order). With `texts`, an answer a prompt already kept is not kept twice.
    """
    kept: list[int] = []
    for start in range(0, len(rewards), n):
        group = list(range(start, min(start + n, len(rewards))))
        if keep == "top_k":
            candidates = sorted(group, key=lambda i: (-rewards[i], i))
        else:
            candidates = [i for i in group if rewards[i] >= threshold]
        seen: set[str] = set()
        chosen = []
        for i in candidates:
            if texts is not None:
                if texts[i] in seen:
                    continue
                seen.add(texts[i])
            chosen.append(i)
            if keep == "top_k" and len(chosen) == top_k:
                break
        kept += sorted(chosen)
    return kept


class RFTTrainer(RLMethod):
    """RFT on the shared loop: a round of sampling and selection every `steps_per_round` steps (online) or all
    rounds up front (offline), then SFT steps on the round's kept samples."""

    name = "rft"
    config: RFTConfig
    batch_field = "prompts_per_round"
    divisible_fields = ("batch_size",)
    needs_reward = True

    def __init__(self, config: RFTConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (), accelerator: Any = None) -> None:
        super().__init__(config, model, tokenizer, functions, train_rows, eval_rows, accelerator)
        self.prepare(model)
        self.rounds: list[dict[str, Any]] = []
        """Per round sampled so far: its kept examples (every process's) and its figures."""
        self._round_order: list[int] = []  # the current round's kept examples, in a seeded order
        self._position = 0

    # -- sampling rounds ----------------------------------------------------------------------------

    def sample_round(self, index: int) -> dict[str, Any]:
        """One round: sample, score, keep; the kept examples of every process, and the round's figures."""
        from accelerate.utils import gather_object

        c = self.config
        rows = self.next_prompts()
        rollouts = generate_rollouts(
            self.policy, self.tokenizer, [r.prompt for r in rows], n=c.samples_per_prompt,
            temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, stop=c.stop or None,
            seed=c.seed * 1_000_003 + index * 101, prompt_offset=self.accelerator.process_index * len(rows),
            max_prompt_length=c.max_prompt_length or None, batch_size=c.generation_batch_size or None)
        rewards = compute_rewards(self.functions, [r.prompt for r in rows for _ in range(c.samples_per_prompt)],
                                  rollouts.texts, reward_columns(rows, c.samples_per_prompt)).total.float()
        kept = select_samples(rewards.tolist(), c.samples_per_prompt, c.keep, c.threshold, c.top_k,
                              rollouts.texts if c.distinct else None)
        examples = [self._example(rollouts, i) for i in kept]
        everyone = gather_object([(asdict(e) | {"reward": rewards[i].item()}) for e, i in zip(examples, kept,
                                                                                            strict=True)])
        totals = self.accelerator.reduce(torch.tensor([float(len(rewards)), rewards.sum().item()],
                                                      device=self.accelerator.device), reduction="sum").tolist()
        samples, reward_sum = totals
        return {"examples": [{k: v for k, v in e.items() if k != "reward"} for e in everyone],
                "samples": int(samples), "reward_mean": reward_sum / max(samples, 1.0),
                "kept_fraction": len(everyone) / max(samples, 1.0),
                "kept_reward_mean": sum(e["reward"] for e in everyone) / len(everyone) if everyone else None}

    def _example(self, rollouts: Any, i: int) -> Example:
        prompt = rollouts.prompt_ids[i][rollouts.prompt_mask[i].bool()].tolist()
        target = rollouts.response_ids[i][rollouts.response_mask[i].bool()].tolist()
        return fit(prompt, target, self.config.max_length)

    def _start_round(self, index: int) -> None:
        c = self.config
        if c.online:
            self.rounds.append(self.sample_round(index))
        elif not self.rounds:  # offline: every round from the starting model, before the first update
            self.rounds = [self.sample_round(r) for r in range(c.rounds())]
        kept = len(self.rounds[index]["examples"])
        self._round_order = list(range(kept))
        random.Random(c.seed * 7919 + index).shuffle(self._round_order)
        self._position = 0

    # -- one step -------------------------------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        c = self.config
        index = self.step_count // c.steps_per_round
        if self.step_count % c.steps_per_round == 0:
            self._start_round(index)
        current = self.rounds[index]
        examples = [Example(**e) for e in current["examples"]]
        metrics: dict[str, Any] = {"round": index + 1, "samples": current["samples"],
                                   "reward_mean": current["reward_mean"], "kept_fraction": current["kept_fraction"],
                                   "kept": len(examples)}
        if current["kept_reward_mean"] is not None:
            metrics["kept_reward_mean"] = current["kept_reward_mean"]
        if examples:  # the same on every process (the kept set is gathered), so DDP stays in step
            metrics |= self._fine_tune(examples)
        else:
            metrics["loss"] = float("nan")  # nothing accepted this round: no update, the step still counts
        self.finish_step()
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _fine_tune(self, examples: list[Example]) -> dict[str, float]:
        """One SFT step on the next global batch of kept examples (cycling through them in a seeded order)."""
        c, acc = self.config, self.accelerator
        batch = [self._round_order[(self._position + j) % len(self._round_order)] for j in range(c.batch_size)]
        self._position = (self._position + c.batch_size) % len(self._round_order)
        local = batch[acc.process_index::acc.num_processes]
        tokens = sum(len(examples[i].target) for i in batch)
        logp, mask = target_logprobs(self.model, [examples[i] for i in local], self.tokenizer.pad_token_id, acc.device)
        loss = sft_loss(logp, mask, num_tokens=tokens / acc.num_processes)
        acc.backward(loss)
        grad_norm = self.optimizer_step()
        return {"loss": acc.reduce(loss.detach(), reduction="mean").item(), "grad_norm": grad_norm}

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "kept": f"{metrics['kept_fraction']:.2f}"}

    # -- resume -------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"rounds": self.rounds, "round_order": self._round_order,
                                       "round_position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = list(state.get("rounds", []))
        self._round_order = list(state.get("round_order", []))
        self._position = int(state.get("round_position", 0))


def train(config: RFTConfig) -> RunResult:
    """Run RFT end to end from `config` (paths in it): OUT/model, eval.json, metrics.jsonl, run.json."""
    functions, train_rows, eval_rows, model, tokenizer = load_run(config)
    trainer = RFTTrainer(config, model, tokenizer, functions, train_rows, eval_rows)
    return run(trainer, data={"prompts": config.prompts})


COMMAND = Command(
    name="rft", config=RFTConfig, description="Rejection-sampling fine-tuning (offline or online) on a prompts export.",
    train=train, summary=rl_summary, check=RLConfig.check_reward,
    flags=rl_flags("starting policy directory (usually the SFT model)"))


def main(argv: list[str] | None = None) -> int:
    return cli.main(COMMAND, argv)
