"""The policy side of RL training: loading a causal LM, sampling rollouts, and per-token log-probs.

GRPO, PPO and evaluation all go through these functions, so "what the policy said and how likely
it was" is computed one way everywhere. Layout convention used throughout: a rollout batch is
`[prompt | response]`, prompts left-padded to a common width P, responses right-padded to R, so
response token t of every row sits at column P + t.

Decoding itself (seeded token choice, the KV-cache loop, stop strings, EOS ids, prompt rendering) lives
in training.sampling, shared with the app's hf backend; the tokenizer and model helpers from there are
re-exported here for the trainers. Rollouts from a server (vLLM) take any generator of
training.generation, normally `rollout_server(...)`, and the local model scores the returned text.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.generation import GenerationParams, OpenAIGenerator, SampleGenerator
from training.sampling import (
    Prompt,
    context_length,
    decode,
    draw_uniforms,
    eos_token_ids,
    finish_rows,
    fit_generation_length,
    left_pad,
    position_ids_from_mask,
    prepare_tokenizer,
    render_prompt,
    row_seed,
    unwrap,
)
from training.weights import SAFE_LOAD, require_safetensors


@dataclass
class LoraSettings:
    """LoRA adapter settings for `load_policy` (peft)."""

    r: int = 16
    """Rank of the low-rank update."""
    alpha: int = 32
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter input; keep 0 for RL so sampling and training log-probs agree."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or "all-linear"."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")


def load_policy(path: str | Path, lora: LoraSettings | None = None, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> tuple[torch.nn.Module, Any]:
    """Load `AutoModelForCausalLM` + tokenizer from a local directory, optionally wrapped with a LoRA adapter.

    Dropout is switched off (the model stays in eval mode while training): the importance ratio
    π_θ/π_old must compare the same function, not two dropout masks. Tanh-GELUs written as Python
    expressions run as torch's fused kernel (`fuse_activations`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"model: {path} is not a directory")
    require_safetensors(path, "model")
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    kwargs: dict[str, Any] = dict(SAFE_LOAD)
    if dtype is not None:
        kwargs["dtype"] = dtype
    model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)  # then, under LoRA, peft's wrapper
    fuse_activations(model)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=lora.target_modules, task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer


def fuse_activations(model: torch.nn.Module) -> int:
    """Swap GPT-2's "gelu_new" (and "gelu_fast"), a chain of Python tensor ops, for torch's fused tanh-GELU:
    the same formula 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), equal up to float rounding (transformers
    documents the two as equivalent), in one kernel forward and backward. Returns the modules swapped."""
    from transformers.activations import FastGELUActivation, GELUTanh, NewGELUActivation

    slow = (NewGELUActivation, FastGELUActivation)
    swaps = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
             if type(child) in slow]
    for parent, name in swaps:
        setattr(parent, name, GELUTanh())
    return len(swaps)


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class Reference:
    """The frozen reference policy π_ref: a copy of the policy, or the adapter-disabled base under LoRA.

    `reset(policy)` implements iterative GRPO's π_ref ← π_θ. Under LoRA the first reset snapshots
    the adapter weights and later reference passes swap the snapshot in, so the base is never copied.
    """

    def __init__(self, policy: torch.nn.Module, model: torch.nn.Module | None = None) -> None:
        policy = unwrap(policy)
        self._lora = is_peft_model(policy) and model is None
        self._snapshot: dict[str, Tensor] | None = None
        if self._lora:
            self.model = policy
        else:
            self.model = model if model is not None else copy.deepcopy(policy)
            self.model.eval()
            self.model.requires_grad_(False)

    @contextlib.contextmanager
    def active(self) -> Iterator[torch.nn.Module]:
        """The module to run as π_ref for the duration of the block."""
        if not self._lora:
            yield self.model
            return
        if self._snapshot is None:
            peft_model: Any = self.model  # disable_adapter is peft's, not nn.Module's
            with peft_model.disable_adapter():
                yield self.model
            return
        params = dict(self.model.named_parameters())
        current = {name: params[name].detach().clone() for name in self._snapshot}
        with torch.no_grad():
            for name, value in self._snapshot.items():
                params[name].copy_(value)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for name, value in current.items():
                    params[name].copy_(value)

    @torch.no_grad()
    def reset(self, policy: torch.nn.Module) -> None:
        policy = unwrap(policy)
        if self._lora:
            self._snapshot = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
        else:
            self.model.load_state_dict(policy.state_dict())

    @torch.no_grad()
    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                 temperature: float = 1.0, batch_size: int | None = None) -> Tensor:
        with self.active() as model:
            return batched_logprobs(model, input_ids, attention_mask, response_mask, temperature, batch_size)


@dataclass
class Rollouts:
    """Sampled responses and everything the losses need about them. Rows of one prompt are consecutive."""

    prompt_ids: Tensor
    """(N, P) left-padded prompt tokens."""
    prompt_mask: Tensor
    """(N, P) 1 on real prompt tokens."""
    response_ids: Tensor
    """(N, R) right-padded response tokens, EOS included when the response ended with it."""
    response_mask: Tensor
    """(N, R) 1 on response tokens up to and including EOS (or the token completing a stop string)."""
    old_logp: Tensor
    """(N, R) log-probs of the sampled tokens under the sampling policy (temperature applied), 0 on padding."""
    ended: Tensor
    """(N,) bool: the response finished (EOS or stop string) rather than running out of tokens."""
    prompt_index: Tensor
    """(N,) index of each row's prompt in the `prompts` list given to `generate_rollouts`."""
    prompts: list[str]
    """(N,) rendered prompt text per row."""
    texts: list[str]
    """(N,) decoded responses, special tokens dropped and cut at the stop string."""
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(dim=1)

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def to(self, device: torch.device | str) -> Rollouts:
        moved: dict[str, Any] = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}
        return Rollouts(**moved)

    def select(self, idx: Tensor | Sequence[int]) -> Rollouts:
        """A subset of rows (for minibatches), trimmed to the longest remaining response."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        rows = idx.tolist()
        mask = self.response_mask[idx]
        width = max(int(mask.sum(dim=1).max().item()) if len(rows) else 0, 1)
        pmask = self.prompt_mask[idx]
        start = int((pmask.sum(dim=0) == 0).sum().item()) if len(rows) else 0  # all-padding left columns
        start = min(start, pmask.shape[1] - 1)
        return Rollouts(
            prompt_ids=self.prompt_ids[idx, start:], prompt_mask=pmask[:, start:],
            response_ids=self.response_ids[idx, :width], response_mask=mask[:, :width],
            old_logp=self.old_logp[idx, :width], ended=self.ended[idx], prompt_index=self.prompt_index[idx],
            prompts=[self.prompts[i] for i in rows], texts=[self.texts[i] for i in rows],
            extras={k: ([v[i] for i in rows] if isinstance(v, list) else v) for k, v in self.extras.items()},
        )


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                   temperature: float = 1.0, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log π(y_t | x, y_<t) of the response (the last R columns), with gradients.

    Returns (logp, entropy): both (B, R), zero where `response_mask` is 0; entropy is None unless
    asked for. Logits are divided by `temperature` so the numbers are those of the distribution
    that was sampled from.
    """
    from training.losses import entropy_from_logits

    width = response_mask.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), logits_to_keep=width + 1, use_cache=False)
    logits = out.logits[:, -width - 1:-1, :].float()  # (B, R, V): position t predicts response token t
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -width:]
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    logp = logp * response_mask
    entropy = entropy_from_logits(logits) * response_mask if with_entropy else None
    return logp, entropy


def batched_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                     temperature: float = 1.0, batch_size: int | None = None) -> Tensor:
    """`token_logprobs` without gradients, in chunks of `batch_size` rows to bound memory."""
    size = batch_size or input_ids.shape[0]
    parts = []
    with torch.no_grad():
        for i in range(0, input_ids.shape[0], size):
            logp, _ = token_logprobs(model, input_ids[i:i + size], attention_mask[i:i + size],
                                     response_mask[i:i + size], temperature)
            parts.append(logp)
    return torch.cat(parts, dim=0)



@torch.no_grad()
def generate_rollouts(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[Prompt], n: int = 1,
                      temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 64,
                      stop: Sequence[str] | None = None, seed: int | None = None, greedy: bool = False,
                      max_prompt_length: int | None = None, server: SampleGenerator | None = None,
                      batch_size: int | None = None, prompt_offset: int = 0) -> Rollouts:
    """Sample `n` responses per prompt; rows [i*n, (i+1)*n) belong to prompt i.

    Decoding runs with a KV cache, each prompt read once for its n samples (`training.sampling.decode`).
    Sample j of prompt i is drawn from its own random stream, seeded with `row_seed(seed, prompt_offset + i, j)`
    (inverse-CDF sampling over the temperature/top-p distribution, as the app's hf backend does), so a row's
    tokens do not depend on the other prompts of the call or of its batch: data-parallel processes that each
    take a slice of a global prompt batch, passing the slice's start as `prompt_offset`, sample what one
    process sampling the whole batch would. Without a seed, a base seed is drawn from torch's global RNG; with
    one, the global RNG is left alone.

    Old log-probs are those of the sampling distribution (logits / temperature, before top-p), taken from the
    logits that produced each token, so no second forward pass is needed. Any of the model's EOS ids ends a
    response. When the longest prompt plus `max_new_tokens` exceeds the model's positions, fewer tokens are
    generated, with a warning (`training.sampling.fit_generation_length`).

    With a `server` (any generator of training.generation, normally `rollout_server(...)`), the text comes
    from it and the local model scores it. The server gets the rendered prompt text, which it must take as it
    is (a completions API), since that text is what the local model scores the response after.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if temperature <= 0 and not greedy:
        raise ValueError(f"temperature must be positive (or use greedy=True), got {temperature}")
    rendered = [render_prompt(tokenizer, p) for p in prompts]
    tokenizer.padding_side = "left"
    truncation = {"truncation": True, "max_length": max_prompt_length} if max_prompt_length else {}
    encoded = tokenizer(rendered, add_special_tokens=False, **truncation)["input_ids"]
    max_new_tokens = fit_generation_length(context_length(model, tokenizer), max(map(len, encoded), default=0),
                                           max_new_tokens)
    device = next(model.parameters()).device
    if server is not None:
        params = GenerationParams(temperature=0.0 if greedy else temperature, top_p=top_p,
                                  max_new_tokens=max_new_tokens, seed=seed, stop=list(stop or []))
        return _server_rollouts(server, model, tokenizer, rendered, encoded, n, params, greedy, device)
    if seed is None and not greedy:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    eos_ids = eos_token_ids(model, tokenizer)
    size = batch_size or len(rendered)
    # greedy decoding gives the same answer n times: decode once, repeat after
    reps = 1 if greedy else n
    chunks = []
    for start in range(0, len(rendered), size):
        prompt_ids, prompt_mask = left_pad(encoded[start:start + size], tokenizer.pad_token_id, device)
        uniforms = None
        if not greedy:
            assert seed is not None  # drawn above
            seeds = [row_seed(seed, prompt_offset + start + i, j) for i in range(len(prompt_ids)) for j in range(n)]
            uniforms = draw_uniforms(seeds, max_new_tokens).to(device)
        response_ids, old_logp = decode(model, tokenizer, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens,
                                        eos_ids=eos_ids, uniforms=uniforms, temperature=temperature, top_p=top_p,
                                        stop=stop, reps=reps, with_logprobs=True)
        assert old_logp is not None  # with_logprobs
        chunks.append((prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0),
                       response_ids.repeat_interleave(n // reps, 0), old_logp.repeat_interleave(n // reps, 0)))
    return _assemble(tokenizer, rendered, n, chunks, stop, eos_ids, device)


def _assemble(tokenizer: Any, rendered: list[str], n: int, chunks: list[tuple[Tensor, Tensor, Tensor, Tensor]],
              stop: Sequence[str] | None, eos_ids: Sequence[int], device: torch.device) -> Rollouts:
    """One Rollouts from the decoded chunks: padded to common widths, masked through each row's end."""
    prompt_ids, prompt_mask = _pad_left([c[0] for c in chunks], [c[1] for c in chunks], tokenizer.pad_token_id)
    response_ids = _pad_right([c[2] for c in chunks], tokenizer.pad_token_id)
    old_logp = _pad_right([c[3] for c in chunks], 0.0)
    response_mask, ended, texts = finish_rows(tokenizer, response_ids.cpu(), stop, eos_ids)
    response_mask = response_mask.to(device)
    response_ids = torch.where(response_mask.bool(), response_ids, tokenizer.pad_token_id)
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        old_logp=old_logp * response_mask, ended=ended.to(device),
        prompt_index=torch.arange(len(rendered), device=device).repeat_interleave(n),
        prompts=[p for p in rendered for _ in range(n)], texts=texts,
    )


def _pad_left(ids: list[Tensor], masks: list[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    width = max(t.shape[1] for t in ids)
    out_ids = [torch.nn.functional.pad(t, (width - t.shape[1], 0), value=pad) for t in ids]
    out_mask = [torch.nn.functional.pad(m, (width - m.shape[1], 0), value=0) for m in masks]
    return torch.cat(out_ids), torch.cat(out_mask)


def _pad_right(parts: list[Tensor], value: float) -> Tensor:
    width = max(max(t.shape[1] for t in parts), 1)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in parts])


def rollout_server(base_url: str, model: str, api_key: str | None = None) -> OpenAIGenerator:
    """The generator for rollouts from an OpenAI-compatible server (vLLM, TGI, llama.cpp) at `base_url`, serving
    the current policy weights as `model` (syncing them is the caller's job): the `/v1/completions` API, fed
    the rendered prompt text by `generate_rollouts`. The URL is checked now, so a malformed one fails at
    start-up rather than at the first step (SpecError, a ValueError naming base_url).

    Old log-probs are recomputed by the local model on its own tokenisation of the returned text, since the
    server's tokens and ours need not line up.
    """
    # One request per prompt (up to max_n samples each): enough of them in flight that the server batches a
    # whole step's prompts together, and a long step's requests do not time out while they queue.
    server = OpenAIGenerator(base_url, model, api_key=api_key, api="completions", timeout_s=600.0, concurrency=64)
    server.check()
    return server


def _server_rollouts(server: SampleGenerator, model: torch.nn.Module, tokenizer: Any, rendered: list[str],
                     encoded: list[list[int]], n: int, params: GenerationParams, greedy: bool,
                     device: torch.device) -> Rollouts:
    api = getattr(server, "api", "completions")
    if api != "completions":
        # a chat API would wrap the already rendered prompt in the chat template a second time
        raise ValueError(f'rollouts need a server on the completions API (api="completions"), got api={api!r}; '
                         "see rollout_server")
    grouped = server.generate(rendered, n, params)
    max_new_tokens = params.max_new_tokens
    rows, ended, texts = [], [], []
    for group in grouped:
        for sample in group:
            ids = tokenizer(sample.text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            finished = sample.finish_reason == "stop"
            if finished and len(ids) < max_new_tokens:
                ids = ids + [tokenizer.eos_token_id]
            rows.append(ids or [tokenizer.eos_token_id])
            ended.append(finished)
            texts.append(sample.text)
    width = max(len(r) for r in rows)
    response_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], device=device)
    response_mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long().to(device)
    prompt_ids, prompt_mask = left_pad(encoded, tokenizer.pad_token_id, device)
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    old_logp = batched_logprobs(model, torch.cat([prompt_ids, response_ids], 1),
                                torch.cat([prompt_mask, response_mask], 1), response_mask,
                                1.0 if greedy else params.temperature)
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        old_logp=old_logp, ended=torch.tensor(ended, device=device),
        prompt_index=torch.arange(len(rendered), device=device).repeat_interleave(n),
        prompts=[p for p in rendered for _ in range(n)], texts=texts,
    )

