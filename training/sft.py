"""Supervised fine-tuning of a causal LM: `SFTTrainer` on the shared loop, and the `sft` command.

`python -m training sft --train PATH --model DIR --out DIR [--eval PATH] [--set key=value ...]` trains on an SFT
export (`prompt`/`completion`, or chat `messages` rendered with the model's chat template) with the token-mean NLL
of the completion tokens (`losses.sft_loss`), optionally packed and optionally under LoRA. It writes OUT/model
(plain transformers loads it; under LoRA the merged model, the adapter in OUT/model/adapter), metrics.jsonl (`step`,
`loss`, …), eval.json (held-out loss and perplexity) and run.json.

Seen as a weighting of the log-probability gradient (DeepSeekMath §5.2.1's unified view), SFT puts weight 1 on
every target token; RFT (`training/rft.py`) puts 1 on accepted samples and 0 on the rest, GRPO a continuous
advantage.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.causal_lm import (
    Example,
    PackedRow,
    encode_examples,
    model_to_train,
    pack,
    packed_logprobs,
    save_policy,
    target_logprobs,
)
from training.cli import Command
from training.config import SFTConfig, require
from training.data import SFTRow, load_sft, train_and_heldout
from training.loop import BatchMethod, RunResult, run
from training.losses import sft_loss


class SFTTrainer(BatchMethod):
    """SFT on the shared loop: each global batch of examples (or packed rows) → the global token-mean NLL."""

    name = "sft"
    config: SFTConfig

    def __init__(self, config: SFTConfig, train_rows: Sequence[SFTRow], eval_rows: Sequence[SFTRow] = (),
                 accelerator: Any = None, model: torch.nn.Module | None = None, tokenizer: Any = None) -> None:
        if not train_rows:
            raise ValueError("train: no training examples")
        super().__init__(config, accelerator)
        model, tokenizer = model_to_train(config, model, tokenizer)
        if not config.disable_dropout:
            model.train()  # load_policy leaves the model in eval mode: dropout off
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.train_examples = self.encode(train_rows)
        self.eval_examples = self.encode(eval_rows) if eval_rows else []
        truncated = sum(e.truncated for e in self.train_examples)
        if truncated and self.accelerator.is_main_process:
            print(f"{truncated} of {len(self.train_examples)} training examples exceed max_length="
                  f"{config.max_length} tokens and were truncated", file=sys.stderr)
        self.units: list[Example] | list[PackedRow] = self.train_examples
        if config.packing:  # rows packed once, in a seeded order; the loop then shuffles rows per epoch
            order = list(range(len(self.train_examples)))
            random.Random(config.seed).shuffle(order)
            self.units = pack([self.train_examples[i] for i in order], config.max_length)
        self.targets = [_targets(u) for u in self.units]
        self.set_lengths([len(u) for u in self.units])
        self.prepare(model)

    def encode(self, rows: Sequence[SFTRow]) -> list[Example]:
        c = self.config
        examples = encode_examples(self.tokenizer, [r.prompt for r in rows], [r.completion for r in rows],
                                   c.max_length)
        if not c.completion_only:  # every token is a target, but the first: it has nothing to be predicted from
            examples = [Example(prompt=(e.prompt + e.target)[:1], target=(e.prompt + e.target)[1:],
                                truncated=e.truncated) for e in examples]
        return examples

    def _logprobs(self, units: Sequence[Example | PackedRow]) -> tuple[Tensor, Tensor]:
        device = self.accelerator.device
        if self.config.packing:
            return packed_logprobs(self.model, units, self.pad_id, device)  # type: ignore[arg-type]
        return target_logprobs(self.model, units, self.pad_id, device)  # type: ignore[arg-type]

    def batch_loss(self, local: list[int], global_batch: list[int]) -> tuple[Tensor, dict[str, float]]:
        tokens = sum(self.targets[i] for i in global_batch)
        logp, mask = self._logprobs([self.units[i] for i in local])
        # each process divides by the global token count over the processes: DDP's mean is the global token mean
        loss = sft_loss(logp, mask, num_tokens=tokens / self.accelerator.num_processes)
        return loss, {"tokens": float(tokens)}

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any]:
        """Held-out loss (token-mean NLL of the completions) and perplexity; on the training set without one."""
        examples = self.eval_examples or self.train_examples
        acc, size = self.accelerator, self.config.eval_batch_size
        mine = examples[acc.process_index::acc.num_processes]
        mine = sorted(mine, key=len, reverse=True)  # longest first: little padding
        totals = torch.zeros(2, device=acc.device)  # Σ NLL, Σ tokens
        self.model.eval()
        with torch.no_grad():
            for start in range(0, len(mine), size):
                logp, mask = target_logprobs(self.model, mine[start:start + size], self.pad_id, acc.device)
                totals += torch.stack([-(logp * mask).sum(), mask.sum()])
        if not self.config.disable_dropout:
            self.model.train()
        nll, tokens = acc.reduce(totals, reduction="sum").tolist()
        loss = nll / max(tokens, 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "examples": len(examples),
                "tokens": int(tokens), "split": "heldout" if self.eval_examples else "train",
                "truncated": sum(e.truncated for e in examples)}

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        save_policy(self.unwrapped(), self.tokenizer, path)


def _targets(unit: Example | PackedRow) -> int:
    if isinstance(unit, PackedRow):
        return sum(t for t, p in zip(unit.targets[1:], unit.positions[1:], strict=True) if p > 0)
    return len(unit.target)


def train(config: SFTConfig) -> RunResult:
    """The `sft` command: rows from `config.train` (its held-out split, or `config.eval`), trained into OUT."""
    require(config, "train", "model", "out")
    trainer = SFTTrainer(config, *train_and_heldout(load_sft, config.train, config.eval))
    return run(trainer, data={"train": config.train, "eval": config.eval or None})


COMMAND = Command(name="sft", config=SFTConfig, description=__doc__.splitlines()[0], train=train,
                  summary=cli.eval_summary("loss", "perplexity", "examples", "steps"),
                  flags=cli.data_flags("SFT export", "starting causal LM directory"))


def main(argv: list[str] | None = None) -> int:
    return cli.main(COMMAND, argv)

