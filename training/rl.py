"""What the methods that sample from the policy share (GRPO, PPO, RFT), on top of the loop's `Method`.

`RLMethod` holds the policy and its frozen reference, the reward functions, and the train/held-out prompts in a
seeded per-epoch order that a resumed run continues; it evaluates the policy against the reference on the
held-out prompts (Pass@K, Maj@K, KL, win rate) and saves the policy (merged under LoRA, with the adapter beside
it). Each method adds only its own step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from training.causal_lm import save_policy
from training.cli import Flag, eval_summary
from training.config import RLConfig, require
from training.data import PromptRow, load_prompts, split_train_heldout
from training.evaluate import EvalConfig, eval_metrics, evaluate, public
from training.loop import Method
from training.policy import Reference, load_policy, unwrap
from training.rewards import RewardFunction, build_reward_functions
from training.sampling import choose_chat_template

T = TypeVar("T")


class RLMethod(Method):
    """The policy, its reference, the rewards and the prompt order of an online run."""

    config: RLConfig
    batch_field = "prompts_per_step"
    """The config field holding the prompts of one step (must divide over the processes)."""
    divisible_fields: tuple[str, ...] = ()
    """Other batch sizes that must divide over the processes."""
    needs_reward = False
    """Refuse to start without a reward function (GRPO's reward computation refuses on its first step)."""

    def __init__(self, config: RLConfig, model: torch.nn.Module, tokenizer: Any, functions: Sequence[RewardFunction],
                 train_rows: Sequence[PromptRow], eval_rows: Sequence[PromptRow] = (), accelerator: Any = None) -> None:
        if not train_rows:
            raise ValueError("prompts: no training prompts")
        if self.needs_reward and not functions:
            raise ValueError("reward_fn: no reward; give a reward model or a reward function")
        super().__init__(config, accelerator)
        for name in (self.batch_field, *self.divisible_fields):
            self.check_divides_over_processes(name)
        self.tokenizer = choose_chat_template(tokenizer, config.use_chat_template)
        self.functions = list(functions)
        self.train_rows = list(train_rows)
        self.eval_rows = list(eval_rows)
        torch.manual_seed(config.seed)
        model.eval()  # no dropout: π_θ and π_old must be the same function for the ratio
        self.reference = Reference(model)
        if not self.reference._lora:
            self.reference.model.to(self.accelerator.device)
        self._order: list[int] = []
        self._epoch = 0
        self._ref_eval: dict[str, Any] | None = None

    def check_divides_over_processes(self, name: str) -> None:
        """ValueError unless the config field `name` (a batch's size) splits evenly over the processes."""
        value = getattr(self.config, name)
        if value % self.accelerator.num_processes:
            raise ValueError(f"{name}={value} must be divisible by the {self.accelerator.num_processes} processes")

    @property
    def policy(self) -> torch.nn.Module:
        """The causal LM being trained (unwrapped from DDP and torch.compile)."""
        return unwrap(self.unwrapped())

    # -- data -------------------------------------------------------------------------------------

    def sample_step(self, sample: Callable[[list[PromptRow]], T]) -> tuple[list[PromptRow], T, float]:
        """A step's rollout phase: the next prompts, what `sample` made of them, and the seconds it took."""
        started = time.perf_counter()
        rows = self.next_prompts()
        out = sample(rows)
        return rows, out, time.perf_counter() - started

    def next_prompts(self, need: int | None = None) -> list[PromptRow]:
        """This process's share of the next `need` prompts (default: one step's), in a seeded per-epoch shuffle."""
        need = need or getattr(self.config, self.batch_field)
        while len(self._order) < need:
            order = list(range(len(self.train_rows)))
            random.Random(self.config.seed * 1_000_003 + self._epoch).shuffle(order)
            self._order += order
            self._epoch += 1
        batch, self._order = self._order[:need], self._order[need:]
        share = need // self.accelerator.num_processes
        rank = self.accelerator.process_index
        return [self.train_rows[i] for i in batch[rank * share:(rank + 1) * share]]

    def state_dict(self) -> dict[str, Any]:
        return {"order": self._order, "epoch": self._epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._order, self._epoch = list(state.get("order", [])), int(state.get("epoch", 0))

    # -- evaluation, saving -----------------------------------------------------------------------

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any] | None:
        """The policy against its reference on the held-out prompts (the reference side is computed once)."""
        if not self.eval_rows or not self.functions:
            return None
        c = self.config
        config = EvalConfig(k=c.eval_k, temperature=c.eval_temperature or c.temperature, top_p=c.top_p,
                            max_new_tokens=c.max_new_tokens, max_prompts=c.eval_max_prompts, stop=c.stop,
                            seed=c.seed + 4242)
        result = evaluate(self.policy, self.tokenizer, self.eval_rows, self.functions, self.reference, config,
                          samples_path=samples_path, reference_summary=self._ref_eval)
        self._ref_eval = result.get("reference")
        return public(result)

    def eval_row(self, result: dict[str, Any]) -> dict[str, Any]:
        return eval_metrics(result)

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        save_policy(self.policy, self.tokenizer, path)

    def extra_tensors(self) -> dict[str, Tensor]:
        """The reference policy, when a run resets it (iterative GRPO): a resume must not fall back to the start."""
        if not getattr(self.config, "ref_reset_steps", 0):
            return {}
        if self.reference._lora:
            return {f"reference.{k}": v for k, v in (self.reference._snapshot or {}).items()}
        return {f"reference.{k}": v.detach().cpu() for k, v in self.reference.model.state_dict().items()}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        state = {k.removeprefix("reference."): v for k, v in tensors.items() if k.startswith("reference.")}
        if not state:
            return
        if self.reference._lora:
            self.reference._snapshot = state
        else:
            self.reference.model.load_state_dict(state)


def load_run(config: RLConfig) -> tuple[list[RewardFunction], list[PromptRow], list[PromptRow], Any, Any]:
    """The rewards, train and held-out prompts, policy and tokenizer a config names (for the CLI and the app)."""
    require(config, "prompts", "model", "out")
    config.check_reward()
    functions = build_reward_functions(config.reward_fn, config.reward_weights, config.reward_kwargs,
                                       config.reward_model, config.reward_model_weight,
                                       getattr(config, "process_reward_model", None),
                                       getattr(config, "process_reward_weight", 1.0))
    train_rows, eval_rows = split_train_heldout(load_prompts(config.prompts))
    model, tokenizer = load_policy(config.model, lora=config.lora_settings)
    return functions, train_rows, eval_rows, model, tokenizer


rl_summary = eval_summary("reward_mean", "kl", "win_rate", "pass_at_k", "maj_at_k")
"""The printed line of an RL command: the final evaluation's headline figures."""


def rl_flags(model_help: str = "starting policy directory") -> list[Flag]:
    """The flags of the methods that sample from the policy: prompts, model, output and the reward."""
    return [Flag("--prompts", "prompts", "prompts export (JSONL, Parquet or datasets directory)"),
            Flag("--model", "model", model_help), Flag("--out", "out", "output directory"),
            Flag("--reward-fn", "reward_fn", "module:function or a built-in name (repeatable)", repeat=True),
            Flag("--reward-model", "reward_model", "preflab reward model directory")]
