"""The decoding core every local sampler shares: seeded token choice, the KV-cache decode loop, stop strings,
EOS ids, prompt rendering and the context-length guard.

Two callers sit on top of it, so a token is chosen and a response is cut one way everywhere:
- `training.generation.HFGenerator`, the app's "hf" backend (sampling jobs, the AI judge, the closed loop);
- `training.policy.generate_rollouts`, the rollouts of GRPO and PPO and the samples of `training.evaluate`.

Seeded sampling: each row (one sample of one prompt) has its own stream of uniforms drawn on the CPU from
its own seed (`draw_uniforms`), and step t picks its token by inverse-CDF over the temperature/top-p
distribution with the row's t-th uniform (`choose_tokens`). A row's tokens therefore depend on its seed,
its prompt and the model only: not on the other rows of the batch, the batch size or the device's RNG.
How a row's seed is derived is the caller's convention (`row_seed` for rollouts; the app's in
training.generation).

This module imports neither training.generation nor training.policy (both import it). torch and
transformers are imported inside the functions that need them: training.generation, which the web process
imports to validate generator specs, must stay importable without loading torch.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from training.data import render_prompt as _render_text

if TYPE_CHECKING:
    import torch
    from torch import Tensor

Prompt = str | list[dict[str, Any]]

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Config attributes that give a model's number of positions, in the order they are trusted."""


# ------------------------------------------------------------------------------------- model and tokenizer


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


def render_prompt(tokenizer: Any, prompt: Prompt, use_chat_template: bool | None = None) -> str:
    """Text to condition a causal LM on, rendered one way for sampling, judging, rollouts and the prompts of SFT and
    DPO examples, so an instruct model sees the same tokens wherever it meets a prompt.

    Through the tokenizer's chat template, with the generation prompt appended, when it has one (`use_chat_template`
    None) or when asked (True); a plain string is then one user turn. Otherwise (a base model, or False) a string
    is used as it is and chat messages become "role: content" lines. ValueError when asked for a template that the
    tokenizer lacks."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    use = has_template if use_chat_template is None else use_chat_template
    if not use:
        return _render_text(prompt)
    if not has_template:
        raise ValueError("use_chat_template is set but the tokenizer has no chat template")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def choose_chat_template(tokenizer: Any, use_chat_template: bool) -> Any:
    """The tokenizer a training run renders its prompts with: as it is when the run uses the chat template, without
    its template when not (a base model). The trained model is saved with this tokenizer, so sampling from it later
    renders prompts the way it was trained on them."""
    if not use_chat_template:
        tokenizer.chat_template = None
    return tokenizer


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP/accelerate wrappers (`.module`)."""
    import torch

    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens only, as `generate` does for left-padded rows."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


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


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def context_length(model: torch.nn.Module, tokenizer: Any) -> int | None:
    """Positions the model can attend over, from its (text) config, else the tokenizer's `model_max_length`;
    None when neither says (tokenizers without a limit report a huge sentinel, which is not a limit)."""
    config = getattr(unwrap(model), "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # multimodal configs keep the language model's numbers in a sub-config
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if _positive_int(value):
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if _positive_int(limit) and limit < 10**8 else None


def fit_generation_length(context: int | None, longest_prompt: int, max_new_tokens: int,
                          what: str = "max_new_tokens") -> int:
    """`max_new_tokens`, or fewer when the longest prompt plus that many tokens would run past the model's
    `context` positions (a learned position table has no row for them: GPT-2 fails with an IndexError deep in
    the embedding). Clamping warns, naming `what` (the config field to change) and the numbers; a prompt that
    leaves no room for even one token raises ValueError. `context` None means no known limit."""
    if context is None or longest_prompt + max_new_tokens <= context:
        return max_new_tokens
    room = context - longest_prompt
    if room < 1:
        raise ValueError(f"prompts of up to {longest_prompt} tokens leave no room for a new token in the model's "
                         f"{context} positions; shorten the prompts (max_prompt_length) or use a longer-context model")
    warnings.warn(f"{what}={max_new_tokens} does not fit after prompts of up to {longest_prompt} tokens in the "
                  f"model's {context} positions; generating at most {room} new tokens", stacklevel=2)
    return room


def left_pad(rows: Sequence[Sequence[int]], pad: int, device: torch.device | str | None = None
             ) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) of token rows left-padded to the longest, as a left-padding tokenizer gives."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


# ------------------------------------------------------------------------------------------ seeds and choice


def row_seed(seed: int, prompt_index: int, sample: int) -> int:
    """Seed of the random stream of sample `sample` of prompt `prompt_index` in rollouts: sha256 of the
    three, 63 bits (torch seeds must fit in a signed 64-bit int)."""
    digest = hashlib.sha256(f"{seed}\0{prompt_index}\0{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def draw_uniforms(seeds: Sequence[int], steps: int) -> Tensor:
    """(N, steps) float64 uniforms in [0, 1) on the CPU, row r drawn from a generator seeded with seeds[r]:
    the same numbers on every machine and device, and the global RNG is left alone."""
    import torch

    out = torch.empty(len(seeds), steps, dtype=torch.float64)
    generator = torch.Generator()
    for r, s in enumerate(seeds):
        out[r] = torch.rand(steps, generator=generator.manual_seed(s), dtype=torch.float64)
    return out


def choose_tokens(logits: Tensor, uniforms: Tensor | None, temperature: float, top_p: float) -> Tensor:
    """(B, 1) next tokens from (B, V) logits: argmax without uniforms or at temperature 0, else inverse-CDF
    sampling of each row with its own uniform (B, 1) over the temperature/top-p distribution."""
    import torch

    if uniforms is None or temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        # keep a token while the mass before it is below top_p (the first token always stays)
        probs = torch.where(probs.cumsum(-1) - probs < top_p, probs, torch.zeros_like(probs))
    cdf = probs.cumsum(dim=-1)
    # scaling the uniform by the kept mass samples the renormalised distribution without dividing
    pos = torch.searchsorted(cdf, uniforms.to(cdf) * cdf[:, -1:], right=True).clamp(max=cdf.shape[1] - 1)
    return order.gather(-1, pos) if order is not None else pos


# ----------------------------------------------------------------------------------------------- stopping


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


class StopOnText:
    """A row is done once its decoded text (special tokens skipped, as in the returned text) contains a stop
    string. transformers' StopStringCriteria matches raw token strings, so a sampled special token such as
    "<unk>" would end a sample on the stop string "n". Only a tail window is decoded: a new occurrence must
    end in the newest token. Callable as a transformers stopping criterion; `start` is the first generated
    column of `input_ids`."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], start: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.start = start
        self.window = max(len(s) for s in self.stop) + 8  # tokens; every text token decodes to ≥ 1 character

    def __call__(self, input_ids: Tensor, scores: Tensor | None = None, **kwargs: Any) -> Tensor:
        import torch

        begin = max(self.start, input_ids.shape[1] - self.window)
        tails = self.tokenizer.batch_decode(input_ids[:, begin:].tolist(), skip_special_tokens=True)
        return torch.tensor([first_stop(t, self.stop) is not None for t in tails], device=input_ids.device)


@dataclass
class Finished:
    """One decoded row, cut where it ended."""

    text: str
    """The response decoded with special tokens dropped, cut before the first stop string."""
    length: int
    """Tokens of the response: through the first EOS id or the token completing a stop string, else all."""
    ended: bool
    """It ended (EOS or stop string) rather than running out of tokens."""


def _cut_at_stop(tokenizer: Any, ids: Sequence[int], stop: Sequence[str]) -> int:
    """Fewest leading tokens whose decoding contains a stop string (binary search: containment only grows);
    the caller has checked that all of `ids` contain one."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(tokenizer.decode(list(ids[:mid]), skip_special_tokens=True), stop) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def finish_row(tokenizer: Any, ids: Sequence[int], stop: Sequence[str] | None, eos_ids: Sequence[int]) -> Finished:
    """Where a generated row ends and what it says. Any of `eos_ids` ends it (the EOS counts as a response
    token; its text, when it is not a special token, stays in the text). Stop strings are looked for in the
    text decoded with special tokens dropped, as the returned text is, so a sampled special token (say
    `<unk>`) never completes the stop string "n"; the text is cut before the stop string, and the length
    counts the tokens up to the one completing it. Padding after the end is ignored."""
    eos = set(eos_ids)
    end = next((k for k, tok in enumerate(ids) if tok in eos), None)
    length = len(ids) if end is None else end + 1
    text = tokenizer.decode(list(ids[:length]), skip_special_tokens=True)
    cut = first_stop(text, stop) if stop else None
    if cut is None:
        return Finished(text=text, length=length, ended=end is not None)
    assert stop  # a stop string was found
    return Finished(text=text[:cut], length=_cut_at_stop(tokenizer, ids[:length], stop), ended=True)


def finish_rows(tokenizer: Any, response_ids: Tensor, stop: Sequence[str] | None,
                eos_ids: Sequence[int] | None = None) -> tuple[Tensor, Tensor, list[str]]:
    """`finish_row` over a (N, T) batch: response mask (N, T) through each row's end, ended flags (N,) and
    texts. `eos_ids` defaults to the tokenizer's EOS."""
    import torch

    eos = list(eos_ids) if eos_ids else [tokenizer.eos_token_id]
    rows = [finish_row(tokenizer, ids, stop, eos) for ids in response_ids.tolist()]
    lengths = torch.tensor([r.length for r in rows], dtype=torch.long).reshape(-1)
    mask = (torch.arange(response_ids.shape[1])[None, :] < lengths[:, None]).long()
    return mask, torch.tensor([r.ended for r in rows], dtype=torch.bool), [r.text for r in rows]


# ------------------------------------------------------------------------------------------------ decoding


def _cache_argument(model: torch.nn.Module) -> str:
    """The forward argument that takes the KV cache: `cache` in transformers 5, `past_key_values` in 4.x
    (peft's wrapper passes either through **kwargs, so its base model's signature decides)."""
    get_base_model = getattr(model, "get_base_model", None)
    bare = get_base_model() if get_base_model is not None else model
    return "cache" if "cache" in inspect.signature(bare.forward).parameters else "past_key_values"


def decode(model: torch.nn.Module, tokenizer: Any, input_ids: Tensor, attention_mask: Tensor, *,
           max_new_tokens: int, eos_ids: Sequence[int], uniforms: Tensor | None = None, temperature: float = 1.0,
           top_p: float = 1.0, stop: Sequence[str] | None = None, reps: int = 1,
           with_logprobs: bool = False) -> tuple[Tensor, Tensor | None]:
    """Decode left-padded prompts with a KV cache: the prompts are read once, their cache repeated `reps` times
    (rows r·reps … r·reps + reps − 1 continue prompt r), then one token per row per step until every row has
    ended (an EOS id, a stop string) or `max_new_tokens`.

    `uniforms` (rows, max_new_tokens) makes step t of row r sample with `uniforms[r, t]` (`choose_tokens`);
    without them, or at temperature 0, decoding is greedy. Returns (tokens, logp): tokens (rows, T) with
    padding after a row ended, and with `with_logprobs` the (rows, T) log-prob of each token under the
    distribution it was drawn from (logits / temperature when sampling, raw logits when greedy, before top-p),
    else None. Rows that ended are fed padding, which nothing reads. No generation-config processors
    (repetition penalty, forced tokens) apply: the tokens come from exactly the model's distribution.
    """
    import torch
    from transformers import DynamicCache

    model = unwrap(model)
    name = _cache_argument(model)
    cache = DynamicCache(config=getattr(model, "config", None))
    positions = position_ids_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                logits_to_keep=1, **{name: cache})
    if reps > 1:
        cache.batch_repeat_interleave(reps)
    mask = attention_mask.repeat_interleave(reps, 0)
    position = positions[:, -1:].repeat_interleave(reps, 0)
    logits = out.logits[:, -1, :].float().repeat_interleave(reps, 0)  # (rows, V)
    sampling = uniforms is not None and temperature > 0
    scale = temperature if sampling else 1.0
    eos = torch.tensor(list(eos_ids), device=logits.device)
    pad = torch.full((logits.shape[0], 1), tokenizer.pad_token_id, device=logits.device)
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    text_stop = StopOnText(tokenizer, stop) if stop else None
    tokens: list[Tensor] = []
    logps: list[Tensor] = []
    for t in range(max_new_tokens):
        choice = choose_tokens(logits, uniforms[:, t:t + 1] if sampling and uniforms is not None else None,
                               temperature, top_p)
        choice = torch.where(done.unsqueeze(1), pad, choice)
        tokens.append(choice)
        if with_logprobs:
            scaled = logits / scale if scale != 1.0 else logits
            logps.append(scaled.gather(-1, choice).squeeze(-1) - torch.logsumexp(scaled, dim=-1))
        done = done | torch.isin(choice[:, 0], eos)
        if text_stop is not None:
            done = done | text_stop(torch.cat(tokens, dim=1)).to(done.device)
        if t + 1 == max_new_tokens or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(choice)], dim=1)
        position = position + 1
        out = model(input_ids=choice, attention_mask=mask, position_ids=position, use_cache=True, **{name: cache})
        logits = out.logits[:, -1, :].float()
    return torch.cat(tokens, dim=1), torch.stack(logps, dim=1) if with_logprobs else None
