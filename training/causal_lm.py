"""What the methods that fine-tune a causal LM on text share (sft, dpo, rft): (prompt, target) examples tokenised
the way rollouts are, batches in the rollout layout, packed rows, the target tokens' log-probs, and saving.

The layout is the one `training.policy` uses for rollouts: prompts left-padded to a common width P, targets
right-padded to R, so target token t of every row sits at column P + t and `token_logprobs` computes logits for
the R target positions only. A model fine-tuned here therefore sees prompts tokenised exactly as GRPO, PPO and
evaluation will show them to it (`training.sampling.render_prompt`: through the chat template when the tokenizer
has one, a plain-text prompt as one user turn; no special tokens added).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.data import Text
from training.sampling import choose_chat_template, render_prompt

ADAPTER_DIR = "adapter"
"""Under LoRA, OUT/model holds the merged model (plain transformers loads it) and OUT/model/adapter the adapter."""


@dataclass
class Example:
    """One tokenised (prompt, target) example."""

    prompt: list[int]
    target: list[int]
    """The target tokens, EOS included: what the loss covers."""
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.prompt) + len(self.target)


def encode_examples(tokenizer: Any, prompts: Sequence[Text], targets: Sequence[str], max_length: int,
                    max_prompt_length: int = 0) -> list[Example]:
    """Tokenise (prompt, target) pairs: target + EOS, at most `max_length` tokens in all.

    A long prompt loses its oldest tokens first (down to a quarter of max_length), then the target its last ones;
    `max_prompt_length` caps the prompt before that. Prompts shared by several targets are tokenised once.
    """
    rendered = [render_prompt(tokenizer, p) for p in prompts]
    unique = list(dict.fromkeys(rendered))
    prompt_ids = dict(zip(unique, _tokenize(tokenizer, unique), strict=True))
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for text, target in zip(rendered, _tokenize(tokenizer, list(targets)), strict=True):
        out.append(fit(prompt_ids[text], target + eos, max_length, max_prompt_length))
    return out


def fit(prompt: list[int], target: list[int], max_length: int, max_prompt_length: int = 0) -> Example:
    """The example cut to `max_length` tokens: the prompt's oldest tokens go first, then the target's last ones."""
    cut = False
    if max_prompt_length and len(prompt) > max_prompt_length:
        prompt, cut = prompt[-max_prompt_length:], True
    if len(prompt) + len(target) > max_length:
        keep = min(len(prompt), max(max_length - len(target), max_length // 4))
        prompt, target, cut = prompt[len(prompt) - keep:], target[:max_length - keep], True
    return Example(prompt=list(prompt), target=list(target), truncated=cut)


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]


def collate(examples: Sequence[Example], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, target_mask) in the rollout layout: prompts left-padded, targets right-padded;
    target_mask is (B, R), 1 on target tokens."""
    p = max(len(e.prompt) for e in examples)
    r = max(max(len(e.target) for e in examples), 1)
    ids = torch.full((len(examples), p + r), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), p + r), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, p - len(e.prompt):p] = torch.tensor(e.prompt, dtype=torch.long)
        ids[i, p:p + len(e.target)] = torch.tensor(e.target, dtype=torch.long)
        mask[i, p - len(e.prompt):p + len(e.target)] = 1
    return ids.to(device), mask.to(device), mask[:, p:].to(device)


def target_logprobs(model: torch.nn.Module, examples: Sequence[Example], pad_id: int, device: torch.device
                    ) -> tuple[Tensor, Tensor]:
    """(logp, mask), both (B, R): log π of each target token given what precedes it, with gradients."""
    from training.policy import token_logprobs

    ids, attention, target_mask = collate(examples, pad_id, device)
    logp, _ = token_logprobs(model, ids, attention, target_mask)
    return logp, target_mask.float()


def sequence_logprobs(model: torch.nn.Module, examples: Sequence[Example], pad_id: int, device: torch.device,
                      batch_size: int) -> Tensor:
    """Σ_t log π(target_t | ·) per example, without gradients, `batch_size` at a time; (N,) on the CPU."""
    out = torch.empty(len(examples))
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))  # longest first: little padding
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            logp, mask = target_logprobs(model, [examples[i] for i in chunk], pad_id, device)
            out[torch.tensor(chunk)] = (logp * mask).sum(dim=1).float().cpu()
    return out


# ----------------------------------------------------------------------------------------------
# packing


@dataclass
class PackedRow:
    """Several whole examples in one row: positions restart at 0 for each, so attention stays inside it."""

    ids: list[int]
    positions: list[int]
    targets: list[int]
    """1 where the token is a target (predicted from the tokens before it in the same example)."""

    def __len__(self) -> int:
        return len(self.ids)


def pack(examples: Sequence[Example], max_length: int) -> list[PackedRow]:
    """First-fit packing in the given order into rows of at most `max_length` tokens."""
    rows: list[PackedRow] = []
    for e in examples:
        ids = e.prompt + e.target
        if not rows or len(rows[-1]) + len(ids) > max_length:
            rows.append(PackedRow([], [], []))
        row = rows[-1]
        row.ids += ids
        row.positions += list(range(len(ids)))
        row.targets += [0] * len(e.prompt) + [1] * len(e.target)
    return rows


def packed_logprobs(model: torch.nn.Module, rows: Sequence[PackedRow], pad_id: int, device: torch.device
                    ) -> tuple[Tensor, Tensor]:
    """(logp, mask) of packed rows, both (B, L−1): target token t+1 predicted at position t. No attention mask is
    passed, so transformers reads the restarting position ids as packed sequences and keeps each one's attention
    to itself; padding is one more sequence, whose tokens are never targets."""
    from training.losses import logprobs_from_logits

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    targets = torch.zeros((len(rows), width))
    for i, r in enumerate(rows):
        n = len(r)
        ids[i, :n], targets[i, :n] = torch.tensor(r.ids), torch.tensor(r.targets, dtype=torch.float)
        positions[i, :n] = torch.tensor(r.positions)
        positions[i, n:] = torch.arange(width - n)  # padding: its own sequence
    ids, positions, targets = ids.to(device), positions.to(device), targets.to(device)
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1]
    mask = targets[:, 1:] * (positions[:, 1:] > 0)  # a token that starts an example is not predicted from another
    return logprobs_from_logits(logits, ids[:, 1:]) * mask, mask


# ----------------------------------------------------------------------------------------------
# loading, saving


def model_to_train(config: Any, model: torch.nn.Module | None, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
    """The causal LM a method fine-tunes: the one given (tests, callers holding one), else `config.model`, wrapped
    in a LoRA adapter when the config asks for one; its tokenizer keeps its chat template only when the config
    uses it."""
    if model is None:
        from training.policy import load_policy

        model, tokenizer = load_policy(config.model, lora=config.lora_settings)
    return model, choose_chat_template(tokenizer, config.use_chat_template)



def save_policy(model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """save_pretrained (safetensors) and the tokenizer into `path`; under LoRA the merged model, with the adapter
    alone in path/adapter."""
    pretrained: Any = model  # save_pretrained and merge_and_unload are transformers' and peft's, not nn.Module's
    if hasattr(pretrained, "merge_and_unload"):
        pretrained.save_pretrained(path / ADAPTER_DIR)
        pretrained = copy.deepcopy(pretrained).merge_and_unload()
    pretrained.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
