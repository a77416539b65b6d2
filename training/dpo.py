"""Direct preference optimisation: `DPOTrainer` on the shared loop, and the `dpo` command.

`python -m training dpo --train PATH --model DIR --out DIR [--eval PATH] [--reference DIR] [--set key=value ...]`
trains a causal LM on a pairs export against a frozen reference: `losses.dpo_loss` (β, soft AI labels `p` as
per-pair label smoothing, margins, weights) or `losses.ipo_loss`. The reference is a frozen copy of the model, the
adapter-disabled base under LoRA, or `--reference`; `precompute_ref_logps` scores every pair under it once and then
frees it; `rpo_alpha` adds the chosen answers' NLL (RPO). metrics.jsonl rows carry `loss`, the implicit-reward
`accuracy` and `margin`, and the chosen and rejected rewards β·log π/π_ref; eval.json the same on the held-out pairs.

DPO only asks that chosen beat rejected: on small data it often lowers both, moving probability to answers no pair
mentions (tests/training/test_dpo.py shows it on addition). RPO's NLL term holds the chosen answers up.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.causal_lm import Example, collate, encode_examples, model_to_train, save_policy, sequence_logprobs
from training.cli import Command, Flag
from training.config import DPOConfig, require
from training.data import PairRow, load_pairs, train_and_heldout
from training.loop import BatchMethod, RunResult, run
from training.losses import dpo_logits, dpo_loss, ipo_loss, sft_loss
from training.policy import Reference, load_policy, token_logprobs


@dataclass
class EncodedPairs:
    """Tokenised pairs with their labels, ready for training or evaluation."""

    chosen: list[Example]
    rejected: list[Example]
    p: Tensor
    """(N,) probability that chosen is preferred: 1 − label_smoothing, or the pair's soft label."""
    margin: Tensor
    weight: Tensor

    def __len__(self) -> int:
        return len(self.chosen)

    @property
    def truncated(self) -> int:
        return sum(c.truncated or r.truncated for c, r in zip(self.chosen, self.rejected, strict=True))


class DPOTrainer(BatchMethod):
    """DPO/IPO on the shared loop: chosen and rejected in one forward pass of the policy (and of the reference,
    unless its log-probs were precomputed)."""

    name = "dpo"
    config: DPOConfig

    def __init__(self, config: DPOConfig, train_rows: Sequence[PairRow], eval_rows: Sequence[PairRow] = (),
                 accelerator: Any = None, model: torch.nn.Module | None = None, tokenizer: Any = None,
                 reference: torch.nn.Module | None = None) -> None:
        if not train_rows:
            raise ValueError("train: no training pairs")
        super().__init__(config, accelerator)
        model, tokenizer = model_to_train(config, model, tokenizer)
        if reference is None and config.reference:
            reference, _ = load_policy(config.reference)
        self.reference: Reference | None = Reference(model, model=reference)
        if not self.reference._lora:
            self.reference.model.to(self.accelerator.device)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.train = self.encode(train_rows)
        self.heldout = self.encode(eval_rows) if eval_rows else None
        if self.train.truncated and self.accelerator.is_main_process:
            print(f"{self.train.truncated} of {len(self.train)} training pairs exceed max_length={config.max_length} "
                  "tokens and were truncated", file=sys.stderr)
        self.set_lengths([max(len(c), len(r)) for c, r in zip(self.train.chosen, self.train.rejected, strict=True)])
        self.prepare(model)
        self.ref_logps: dict[str, tuple[Tensor, Tensor]] = {}
        if config.precompute_ref_logps:
            for name, pairs in (("train", self.train), ("heldout", self.heldout)):
                if pairs is not None:
                    self.ref_logps[name] = self._sequence_logps(pairs, reference=True)
            if not self.reference._lora:
                self.reference = None  # its log-probs are all that was needed: free the copy

    def encode(self, rows: Sequence[PairRow]) -> EncodedPairs:
        c = self.config
        prompts = [r.prompt for r in rows]
        chosen = encode_examples(self.tokenizer, prompts, [r.chosen for r in rows], c.max_length, c.max_prompt_length)
        rejected = encode_examples(self.tokenizer, prompts, [r.rejected for r in rows], c.max_length,
                                   c.max_prompt_length)
        soft = c.use_soft_labels
        return EncodedPairs(
            chosen=chosen, rejected=rejected,
            p=torch.tensor([r.p if soft and r.p is not None else 1.0 - c.label_smoothing for r in rows]),
            margin=torch.tensor([(r.margin or 0.0) * c.margin_scale if c.use_margin else 0.0 for r in rows]),
            weight=torch.tensor([r.weight if c.use_weights and r.weight is not None else 1.0 for r in rows]))

    # -- the loss -----------------------------------------------------------------------------------

    def loss(self, h: Tensor, p: Tensor, margin: Tensor, weight: Tensor) -> Tensor:
        """The configured loss of the log-ratio margins h; (B,) → ()."""
        c = self.config
        if c.loss_type == "ipo":
            return ipo_loss(h, c.beta, p, weight)
        return dpo_loss(h, c.beta, p, margin if c.use_margin else None, weight)

    def _policy_and_reference(self, local: list[int], split: str, pairs: EncodedPairs
                              ) -> tuple[Tensor, Tensor, Tensor]:
        """Sequence log-probs (2b,) of [chosen; rejected] under the policy (with gradients) and the reference, and
        the chosen responses' token-mean NLL (for RPO)."""
        examples = [pairs.chosen[i] for i in local] + [pairs.rejected[i] for i in local]
        ids, attention, target_mask = collate(examples, self.pad_id, self.accelerator.device)
        logp, _ = token_logprobs(self.model, ids, attention, target_mask)
        policy = (logp * target_mask).sum(dim=1)
        b = len(local)
        nll = sft_loss(logp[:b], target_mask[:b].float())
        if split in self.ref_logps:
            ref_c, ref_r = self.ref_logps[split]
            idx = torch.tensor(local)
            reference = torch.cat([ref_c[idx], ref_r[idx]]).to(policy.device)
        else:
            assert self.reference is not None
            ref = self.reference.logprobs(ids, attention, target_mask)
            reference = (ref * target_mask).sum(dim=1)
        return policy, reference, nll

    def batch_loss(self, local: list[int], global_batch: list[int]) -> tuple[Tensor, dict[str, float]]:
        train, b = self.train, len(local)
        policy, reference, nll = self._policy_and_reference(local, "train", train)
        h = dpo_logits(policy[:b], policy[b:], reference[:b], reference[b:])  # (b,)
        idx = torch.tensor(local)
        p, margin, weight = (t[idx].to(h.device) for t in (train.p, train.margin, train.weight))
        # the local weighted mean, rescaled so DDP's average over processes is the global batch's weighted mean
        weight_share = self.accelerator.num_processes * train.weight[idx].sum() / \
            train.weight[torch.tensor(global_batch)].sum().clamp(min=1e-8)
        loss = self.loss(h, p, margin, weight) * weight_share.to(h.device)
        if self.config.rpo_alpha:
            loss = loss + self.config.rpo_alpha * nll * self.share(local, global_batch)
        with torch.no_grad():
            beta = self.config.beta
            r_c, r_r = beta * (policy[:b] - reference[:b]), beta * (policy[b:] - reference[b:])
            share = self.share(local, global_batch)
            stats = torch.stack([(r_c > r_r).float().mean(), (r_c - r_r).mean(), r_c.mean(), r_r.mean()]) * share
            accuracy, margin_mean, chosen, rejected = self.accelerator.reduce(stats, reduction="mean").tolist()
        return loss, {"accuracy": accuracy, "margin": margin_mean, "reward_chosen": chosen,
                      "reward_rejected": rejected}

    # -- evaluation, saving -------------------------------------------------------------------------

    def _sequence_logps(self, pairs: EncodedPairs, reference: bool) -> tuple[Tensor, Tensor]:
        """(chosen, rejected) sequence log-probs (N,) of every pair, without gradients, on the CPU."""
        size = self.config.eval_batch_size
        if reference:
            assert self.reference is not None
            with self.reference.active() as model:
                both = sequence_logprobs(model, pairs.chosen + pairs.rejected, self.pad_id, self.accelerator.device,
                                         size)
        else:
            model = self.unwrapped()
            was_training = model.training
            model.eval()
            both = sequence_logprobs(model, pairs.chosen + pairs.rejected, self.pad_id, self.accelerator.device,
                                     size)
            model.train(was_training)
        return both[:len(pairs)], both[len(pairs):]

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any]:
        """Loss, implicit-reward accuracy and margin, chosen/rejected rewards on the held-out pairs (or train)."""
        split = "heldout" if self.heldout is not None else "train"
        pairs = self.heldout if self.heldout is not None else self.train
        logp_c, logp_r = self._sequence_logps(pairs, reference=False)
        ref_c, ref_r = self.ref_logps.get(split) or self._sequence_logps(pairs, reference=True)
        h = dpo_logits(logp_c, logp_r, ref_c, ref_r)
        beta = self.config.beta
        r_c, r_r = beta * (logp_c - ref_c), beta * (logp_r - ref_r)
        label = pairs.p >= 0.5
        # A tie within float32 rounding of the four log-probs counts as a tie: the policy and its reference, equal
        # weights, give log-probs a few ulps apart when their batches are shaped differently.
        rounding = beta * 4 * torch.finfo(torch.float32).eps * (logp_c.abs() + logp_r.abs() + ref_c.abs() + ref_r.abs())
        tie = (r_c - r_r).abs() <= rounding
        correct = torch.where(tie, torch.full_like(r_c, 0.5), ((r_c > r_r) == label).float())
        return {"loss": self.loss(h, pairs.p, pairs.margin, pairs.weight).item(), "accuracy": correct.mean().item(),
                "margin": (r_c - r_r).mean().item(), "reward_chosen": r_c.mean().item(),
                "reward_rejected": r_r.mean().item(), "pairs": len(pairs), "truncated": pairs.truncated,
                "split": split}

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        save_policy(self.unwrapped(), self.tokenizer, path)


def train(config: DPOConfig) -> RunResult:
    """The `dpo` command: pairs from `config.train` (its held-out split, or `config.eval`), trained into OUT."""
    require(config, "train", "model", "out")
    trainer = DPOTrainer(config, *train_and_heldout(load_pairs, config.train, config.eval))
    return run(trainer, data={"train": config.train, "eval": config.eval or None,
                              "reference": config.reference or None})


COMMAND = Command(
    name="dpo", config=DPOConfig, description=__doc__.splitlines()[0], train=train,
    summary=cli.eval_summary("loss", "accuracy", "margin", "pairs", "steps"),
    flags=[*cli.data_flags("pairs export", "starting causal LM directory (usually the SFT model)"),
           Flag("--reference", "reference", "reference model directory (default: a frozen copy of --model)")])


def main(argv: list[str] | None = None) -> int:
    return cli.main(COMMAND, argv)
