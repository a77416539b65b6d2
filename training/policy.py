"""The policy side of RL training: loading a causal LM, sampling rollouts, and per-token log-probs.

GRPO, PPO and evaluation all go through these functions, so "what the policy said and how likely
it was" is computed one way everywhere. Layout convention used throughout: a rollout batch is
`[prompt | response]`, prompts left-padded to a common width P, responses right-padded to R, so
response token t of every row sits at column P + t.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.generation import StopOnText
from training.weights import SAFE_LOAD, require_safetensors

Prompt = str | list[dict[str, Any]]


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


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give the tokenizer a pad token (EOS, else UNK) and left padding, which batched generation needs."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
        else:
            tokenizer.add_special_tokens({"pad_token": "<pad>"})
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token; set one so responses can end")
    tokenizer.padding_side = "left"
    return tokenizer


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
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
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


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP/accelerate wrappers (`.module`)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


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
            with self.model.disable_adapter():
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


def render_prompt(tokenizer: Any, prompt: Prompt) -> str:
    """Text to condition on: chat messages through the tokenizer's chat template; plain strings unchanged."""
    from training.data import render_prompt as render

    return render(prompt, tokenizer)


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
        moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}
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


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens only, as `generate` does for left-padded rows."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


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


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _cut_at_stop(tokenizer: Any, ids: list[int], stop: Sequence[str]) -> int | None:
    """Fewest tokens whose decoding contains a stop string (binary search: containment only grows)."""
    if _first_stop(tokenizer.decode(ids, skip_special_tokens=True), stop) is None:
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _first_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stop) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def eos_token_ids(model: torch.nn.Module | None, tokenizer: Any) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and all of the model's generation-config EOS ids
    (a list in several chat models, e.g. Llama 3's <|end_of_text|> and <|eot_id|>)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = getattr(unwrap(model), "generation_config", None) if model is not None else None
    configured = getattr(config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(i) for i in configured)
    return sorted(ids)


def _finish(tokenizer: Any, response_ids: Tensor, stop: Sequence[str] | None, eos_ids: Sequence[int] | None = None
            ) -> tuple[Tensor, Tensor, list[str]]:
    """Response mask (through the first EOS or stop string), ended flags, and texts cut at the stop string.

    Any of `eos_ids` (default: the tokenizer's EOS) ends a response. Stop strings are looked for in the text
    decoded with special tokens dropped, as the returned text is, so a sampled special token (say `<unk>`)
    never completes the stop string "n"."""
    eos = torch.tensor(list(eos_ids) if eos_ids else [tokenizer.eos_token_id])
    n, width = response_ids.shape
    is_eos = torch.isin(response_ids, eos)
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.float().argmax(dim=1), torch.full((n,), width))
    lengths = torch.where(has_eos, first_eos + 1, torch.full((n,), width))
    ended = has_eos.clone()
    texts = []
    for i in range(n):
        ids = response_ids[i, : int(lengths[i])].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if stop:
            cut = _first_stop(text, stop)
            if cut is not None:
                text = text[:cut]
                lengths[i] = _cut_at_stop(tokenizer, ids, stop) or lengths[i]
                ended[i] = True
        texts.append(text)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return mask, ended, texts


def row_seed(seed: int, prompt_index: int, sample: int) -> int:
    """Seed of the random stream of sample `sample` of prompt `prompt_index`: sha256 of the three, 63 bits."""
    digest = hashlib.sha256(f"{seed}\0{prompt_index}\0{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _uniforms(seeds: Sequence[int], steps: int) -> Tensor:
    """(N, steps) float64 uniforms in [0, 1), row r drawn from a generator seeded with seeds[r]."""
    out = torch.empty(len(seeds), steps, dtype=torch.float64)
    generator = torch.Generator()
    for r, s in enumerate(seeds):
        out[r] = torch.rand(steps, generator=generator.manual_seed(s), dtype=torch.float64)
    return out


def _choose(logits: Tensor, uniforms: Tensor | None, temperature: float, top_p: float) -> Tensor:
    """(B, 1) next tokens: argmax without uniforms, else inverse-CDF sampling of each row from its own uniform
    over the temperature/top-p distribution (the same arithmetic as the app's hf backend, `SeededSampler`)."""
    if uniforms is None:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        # keep a token while the mass before it is below top_p (the first token always stays)
        probs = torch.where(probs.cumsum(-1) - probs < top_p, probs, torch.zeros_like(probs))
    cdf = probs.cumsum(dim=-1)
    pos = torch.searchsorted(cdf, uniforms.to(cdf) * cdf[:, -1:], right=True).clamp(max=cdf.shape[1] - 1)
    return order.gather(-1, pos) if order is not None else pos


def _sample(model: torch.nn.Module, tokenizer: Any, input_ids: Tensor, attention_mask: Tensor, reps: int,
            uniforms: Tensor | None, temperature: float, top_p: float, max_new_tokens: int, eos_ids: Sequence[int],
            stop: Sequence[str] | None) -> tuple[Tensor, Tensor]:
    """Decode with a KV cache: the prompts are read once, their cache repeated `reps` times, then one token per
    row per step until every row has ended (an EOS id, a stop string) or max_new_tokens.

    Returns (response_ids, logits) of shapes (B·reps, T) and (B·reps, T, V): the raw logits each token was
    chosen from. Rows that ended are fed padding, which nothing reads. No generation-config processors
    (repetition penalty, forced tokens) apply: the tokens come from exactly the policy's distribution.
    """
    import inspect

    from transformers import DynamicCache

    cache = DynamicCache(config=getattr(unwrap(model), "config", None))
    # transformers 5 names the argument `cache`; 4.x (and peft's wrapper, through **kwargs) `past_key_values`
    bare = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = "cache" if "cache" in inspect.signature(bare.forward).parameters else "past_key_values"
    positions = position_ids_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                logits_to_keep=1, **{name: cache})
    if reps > 1:
        cache.batch_repeat_interleave(reps)
    mask = attention_mask.repeat_interleave(reps, 0)
    position = positions[:, -1:].repeat_interleave(reps, 0)
    logits = out.logits[:, -1, :].float().repeat_interleave(reps, 0)  # (N, V)
    n = logits.shape[0]
    eos = torch.tensor(list(eos_ids), device=logits.device)
    pad = torch.full((n, 1), tokenizer.pad_token_id, device=logits.device)
    done = torch.zeros(n, dtype=torch.bool, device=logits.device)
    tokens: list[Tensor] = []
    raw: list[Tensor] = []
    text_stop = StopOnText(tokenizer, list(stop), 0) if stop else None
    for t in range(max_new_tokens):
        choice = _choose(logits, uniforms[:, t:t + 1] if uniforms is not None else None, temperature, top_p)
        choice = torch.where(done.unsqueeze(1), pad, choice)
        tokens.append(choice)
        raw.append(logits)
        done = done | torch.isin(choice[:, 0], eos)
        if text_stop is not None:
            done = done | text_stop(torch.cat(tokens, dim=1), None).to(done.device)
        if t + 1 == max_new_tokens or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(choice)], dim=1)
        position = position + 1
        out = model(input_ids=choice, attention_mask=mask, position_ids=position, use_cache=True, **{name: cache})
        logits = out.logits[:, -1, :].float()
    return torch.cat(tokens, dim=1), torch.stack(raw, dim=1)


@torch.no_grad()
def generate_rollouts(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[Prompt], n: int = 1,
                      temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 64,
                      stop: Sequence[str] | None = None, seed: int | None = None, greedy: bool = False,
                      max_prompt_length: int | None = None, server: ServerGenerator | None = None,
                      batch_size: int | None = None, prompt_offset: int = 0) -> Rollouts:
    """Sample `n` responses per prompt; rows [i*n, (i+1)*n) belong to prompt i.

    Decoding runs with a KV cache, each prompt read once for its n samples (`_sample`). Sample j of prompt i
    is drawn from its own random stream, seeded with `row_seed(seed, prompt_offset + i, j)` (inverse-CDF
    sampling over the temperature/top-p distribution, as the app's hf backend does), so a row's tokens do
    not depend on the other prompts of the call or of its batch: data-parallel processes that each take a
    slice of a global prompt batch, passing the slice's start as `prompt_offset`, sample what one process
    sampling the whole batch would. Without a seed, a base seed is drawn from torch's global RNG; with one,
    the global RNG is left alone.

    Old log-probs are those of the sampling distribution (logits / temperature, before top-p),
    taken from the logits that produced each token, so no second forward pass is needed. Any of the
    model's EOS ids ends a response. With a `server`, text comes from the OpenAI-compatible endpoint
    and the local model scores it.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if temperature <= 0 and not greedy:
        raise ValueError(f"temperature must be positive (or use greedy=True), got {temperature}")
    rendered = [render_prompt(tokenizer, p) for p in prompts]
    tokenizer.padding_side = "left"
    truncation = {"truncation": True, "max_length": max_prompt_length} if max_prompt_length else {}
    device = next(model.parameters()).device
    if server is not None:
        return _server_rollouts(server, model, tokenizer, rendered, n, temperature, top_p, max_new_tokens, stop,
                                seed, greedy, truncation, device)
    if seed is None and not greedy:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    base = unwrap(model)
    eos_ids = eos_token_ids(base, tokenizer)
    size = batch_size or len(rendered)
    chunks = []
    for start in range(0, len(rendered), size):
        part = rendered[start:start + size]
        enc = tokenizer(part, return_tensors="pt", padding=True, add_special_tokens=False, **truncation)
        uniforms = None
        if not greedy:
            seeds = [row_seed(seed, prompt_offset + start + i, j) for i in range(len(part)) for j in range(n)]
            uniforms = _uniforms(seeds, max_new_tokens).to(device)
        # greedy decoding gives the same answer n times: decode once, repeat after
        reps = 1 if greedy else n
        response_ids, logits = _sample(base, tokenizer, enc["input_ids"].to(device), enc["attention_mask"].to(device),
                                       reps, uniforms, temperature, top_p, max_new_tokens, eos_ids, stop)
        if not greedy and temperature != 1.0:
            logits = logits / temperature
        old_logp = logits.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        if reps != n:
            response_ids, old_logp = response_ids.repeat_interleave(n, 0), old_logp.repeat_interleave(n, 0)
        chunks.append((enc["input_ids"].to(device).repeat_interleave(n, 0),
                       enc["attention_mask"].to(device).repeat_interleave(n, 0), response_ids, old_logp))
    prompt_ids, prompt_mask = _pad_left([c[0] for c in chunks], [c[1] for c in chunks], tokenizer.pad_token_id)
    response_ids = _pad_right([c[2] for c in chunks], tokenizer.pad_token_id)
    old_logp = _pad_right([c[3] for c in chunks], 0.0)
    response_mask, ended, texts = _finish(tokenizer, response_ids.cpu(), stop, eos_ids)
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


@dataclass
class ServerGenerator:
    """Sampling through an OpenAI-compatible `/v1/completions` endpoint (vLLM, TGI, llama.cpp).

    The server is expected to serve the current policy weights (syncing them is the caller's job);
    old log-probs are recomputed by the local model on our own tokenisation of the returned text,
    since the server's tokens and ours need not line up.
    """

    base_url: str
    """Server root, e.g. http://localhost:8000/v1."""
    model: str
    """Model name the server knows the policy by."""
    api_key: str | None = None
    """Bearer token, if the server wants one."""
    timeout: float = 600.0
    """Seconds to wait for one request."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("model must name the served model")

    def complete(self, prompts: list[str], n: int, temperature: float, top_p: float, max_tokens: int,
                 stop: Sequence[str] | None, seed: int | None) -> list[list[tuple[str, str]]]:
        """Per prompt, `n` (text, finish_reason) pairs."""
        import httpx

        body: dict[str, Any] = {"model": self.model, "prompt": prompts, "n": n, "temperature": temperature,
                                "top_p": top_p, "max_tokens": max_tokens}
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.base_url.rstrip("/") + "/completions"
        # No redirects (one could point inward), and the remote body is never repeated in an error: it may carry
        # whatever the server (or something impersonating it) chose to put there.
        response = httpx.post(url, json=body, headers=headers, timeout=self.timeout, follow_redirects=False)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered HTTP {response.status_code}: remote server error"
                               + (" (redirects are not followed)" if response.is_redirect else ""))
        choices = response.json()["choices"]
        grouped: list[list[tuple[str, str]]] = [[] for _ in prompts]
        for i, choice in enumerate(choices):
            grouped[choice.get("index", i) // n].append((choice["text"], choice.get("finish_reason") or "length"))
        if any(len(g) != n for g in grouped):
            raise RuntimeError(f"{url} returned {len(choices)} choices, expected {n * len(prompts)}")
        return grouped


def _server_rollouts(server: ServerGenerator, model: torch.nn.Module, tokenizer: Any, rendered: list[str], n: int,
                     temperature: float, top_p: float, max_new_tokens: int, stop: Sequence[str] | None,
                     seed: int | None, greedy: bool, truncation: dict[str, Any], device: torch.device) -> Rollouts:
    grouped = server.complete(rendered, n, 0.0 if greedy else temperature, top_p, max_new_tokens, stop, seed)
    enc = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False, **truncation)
    rows, ended, texts = [], [], []
    for group in grouped:
        for text, reason in group:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            finished = reason == "stop"
            if finished and len(ids) < max_new_tokens:
                ids = ids + [tokenizer.eos_token_id]
            rows.append(ids or [tokenizer.eos_token_id])
            ended.append(finished)
            texts.append(text)
    width = max(len(r) for r in rows)
    response_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], device=device)
    response_mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long().to(device)
    prompt_ids = enc["input_ids"].to(device).repeat_interleave(n, 0)
    prompt_mask = enc["attention_mask"].to(device).repeat_interleave(n, 0)
    old_logp = batched_logprobs(model, torch.cat([prompt_ids, response_ids], 1),
                                torch.cat([prompt_mask, response_mask], 1), response_mask,
                                1.0 if greedy else temperature)
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        old_logp=old_logp, ended=torch.tensor(ended, device=device),
        prompt_index=torch.arange(len(rendered), device=device).repeat_interleave(n),
        prompts=[p for p in rendered for _ in range(n)], texts=texts,
    )
