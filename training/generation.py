"""Sampling completions from a model: one interface over a local transformers model ("hf") and any
OpenAI-compatible server ("openai"), plus cheap diversity measures over the samples of one prompt.

The app's sampling jobs, the AI judge and the closed loop all call `generate(prompts, n, params)` on
what `make_generator(spec)` returns, so "how a completion was produced" is recorded one way:
`generator.describe(params)` for the generator and its parameters, `Sample.seed` for the sample.
GRPO rollouts from a vLLM server go through the same interface (`training.policy.rollout_server` makes
an `OpenAIGenerator` on the completions API). The hf backend decodes with the shared core in
training.sampling, the same loop and token choice as RL rollouts; this module never imports
training.policy, and imports torch only when a model is loaded.

Seeds (hf): sample i of a prompt has seed `params.seed + i` (recorded in `Sample.seed`) and is drawn
from its own random stream, seeded by that seed and the prompt's rendered text (so sample 0 of two
different prompts is not drawn from the same numbers). Sample i of a prompt is therefore the same
whatever else is in the call or the batch, and on either device's RNG (the uniforms come from a CPU
generator); only floating-point noise from padding or another device's kernels could change a token,
and that needs a uniform draw to land on a probability boundary.
`generate([prompt], 1, replace(params, seed=sample.seed))` reproduces a recorded sample. Without a
seed, a random base seed is drawn and still recorded, so every hf sample is reproducible.

Seeds (openai): one request covers samples [a, b) of a prompt and carries `seed + a`; every sample of
that request records that seed. Servers that honour `seed` (vLLM, llama.cpp, TGI) then return the same
texts for the same request; OpenAI itself only tries. No seed is sent when none is given.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import email.utils
import hashlib
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from training.sampling import (
    context_length,
    decode,
    draw_uniforms,
    eos_token_ids,
    finish_row,
    left_pad,
    prepare_tokenizer,
    render_prompt,
)
from training.shared.net import AddressCheck, AddressRefused, checked_transport
from training.weights import SAFE_LOAD, UnsafeWeights, require_safetensors

Prompt = str | list[dict[str, Any]]
Progress = Callable[[int, int], None]
ShouldStop = Callable[[], bool]

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json",
                   "pytorch_model.bin.index.json")
DEFAULT_MAX_K = 256
"""Most samples per prompt a generator accepts unless configured otherwise; a guard against typos."""
_LOAD_LOCK = threading.Lock()
"""transformers' loading (meta-device init) is not thread-safe: two generators in one process load in turn."""


class GenerationError(Exception):
    """Generation failed for a reason a user can act on. The message is safe to show: it never
    contains a remote server's response body or an API key."""


class ContextLengthError(GenerationError, ValueError):
    """A prompt, with the tokens it asks for, longer than the model's context: the same on every attempt (a job
    fails at once; a ValueError, as bad input is)."""


class SpecError(GenerationError, ValueError):
    """A generator spec or generation parameter is invalid; `field` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class GenerationCancelled(Exception):  # noqa: N818 - a cancel is not an error
    """`should_stop()` returned True. `completed` maps prompt index → its n samples for every prompt
    finished before the stop, so a worker can keep them and resume with the rest."""

    def __init__(self, completed: dict[int, list[Sample]]) -> None:
        super().__init__(f"generation stopped with {len(completed)} prompts complete")
        self.completed = completed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)) and math.isfinite(value)


@dataclass
class GenerationParams:
    """How to sample; stored with every completion (see `describe`)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (every sample is the argmax continuation)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; 1 keeps all."""
    max_new_tokens: int = 256
    """Most tokens generated per sample; a sample that hits it has finish_reason "length"."""
    seed: int | None = None
    """Base seed; see the module docstring for how samples derive theirs."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a sample; the text is cut before the first one (OpenAI semantics)."""

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or self.temperature < 0:
            raise SpecError("temperature", f"must be a number ≥ 0 (0 = greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise SpecError("top_p", f"must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SpecError("max_new_tokens", f"must be an integer ≥ 1, got {self.max_new_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise SpecError("seed", f"must be an integer in [0, 2**63) or null, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]  # OpenAI accepts a bare string; so do we
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SpecError("stop", "must be a list of non-empty strings")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """One completion of one prompt."""

    text: str
    """The completion, cut before a stop string, special tokens dropped."""
    finish_reason: str
    """"stop" (EOS or a stop string) or "length" (ran into max_new_tokens)."""
    prompt_tokens: int | None
    """Prompt length in the model's tokens, when known."""
    completion_tokens: int | None
    """Tokens generated, EOS or the token completing a stop string included; None when the server
    reports only a total over several samples."""
    seed: int | None
    """The seed this sample was drawn with (see the module docstring); None when unknown."""


class SampleGenerator(Protocol):
    """Anything that gives `n` samples per prompt: both backends, and what `generate_rollouts(server=...)` takes."""

    def generate(self, prompts: Sequence[Prompt], n: int, params: GenerationParams) -> list[list[Sample]]: ...


# ---------------------------------------------------------------------------------------------- helpers


def _check_prompts(prompts: Sequence[Prompt]) -> None:
    if isinstance(prompts, str):
        raise GenerationError("prompts must be a list of prompts, not one string")
    for j, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        ok = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)
        if not ok:
            raise GenerationError(f"prompt {j} must be a string or a non-empty list of "
                                  '{"role": str, "content": str} messages')


def _check_n(n: int, max_k: int) -> None:
    if not _is_int(n) or n < 1:
        raise GenerationError(f"n must be an integer ≥ 1, got {n!r}")
    if n > max_k:
        raise GenerationError(f"n={n} samples per prompt is more than this backend allows (max_k={max_k})")


def _spec_int(spec: dict[str, Any], key: str, default: int, low: int) -> int:
    value = spec.get(key, default)
    if not _is_int(value) or value < low:
        raise SpecError(key, f"must be an integer ≥ {low}, got {value!r}")
    return value


def _spec_float(spec: dict[str, Any], key: str, default: float, low: float) -> float:
    value = spec.get(key, default)
    if not _is_number(value) or value <= low:
        raise SpecError(key, f"must be a number > {low}, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------------- hf backend


def _stream_seed(seed: int, prompt_text: str) -> int:
    """Seed of one sample's random stream: its recorded seed mixed with the prompt it answers."""
    digest = hashlib.sha256(f"{seed}\0{prompt_text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # torch seeds must fit in a signed 64-bit int


def _weights_fingerprint(path: Path) -> str:
    """Cheap identity of a model directory: config.json and the names and sizes of its weight files."""
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for pattern in WEIGHT_PATTERNS:
        for file in sorted(path.glob(pattern)):
            digest.update(f"{file.name}:{file.stat().st_size}".encode())
    return digest.hexdigest()[:16]


class HFGenerator:
    """Backend "hf": a causal LM in a local directory, loaded with transformers on first use.

    Prompts are strings or chat messages. With `use_chat_template` None (auto), a tokenizer that has
    a chat template formats both (a string becomes one user turn); without one, strings are used as
    they are and messages become "role: content" lines. Rows (prompt × sample) are batched
    `batch_size` at a time in prompt order; each row has its own seeded random stream, so results do
    not depend on batching (see the module docstring). Decoding is `training.sampling.decode`: exactly
    the model's distribution under temperature/top-p, with no generation-config processors (repetition
    penalty, forced tokens). CUDA is used when present unless `device` says otherwise.
    """

    backend = "hf"

    def __init__(self, model: str | Path, *, device: str = "auto", dtype: str = "auto", batch_size: int = 32,
                 use_chat_template: bool | None = None, max_k: int = DEFAULT_MAX_K) -> None:
        self.path = Path(model).expanduser()
        self.device_option = device
        """As given: "auto" (CUDA when present, else the CPU) or a torch device; resolved on first load."""
        self.dtype_option = dtype
        """As given: "auto" (float32 on the CPU, the checkpoint's own dtype on a GPU) or a torch dtype's name such as
        "bfloat16"."""
        self.batch_size = batch_size
        self.use_chat_template = use_chat_template
        self.max_k = max_k
        self.name = f"hf:{self.path.name}"
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HFGenerator({str(self.path)!r})"

    def check(self, connect: bool = False) -> None:
        """The directory exists and holds a config and weights (`connect` is accepted for symmetry)."""
        if not self.path.exists():
            raise GenerationError(f"model directory {self.path} does not exist")
        if not self.path.is_dir():
            raise GenerationError(f"model path {self.path} is not a directory")
        if not (self.path / "config.json").is_file():
            raise GenerationError(f"model directory {self.path} has no config.json")
        try:
            require_safetensors(self.path, "model")
        except UnsafeWeights as exc:  # pickle weights are refused before anything is read
            raise GenerationError(str(exc)) from None

    def describe(self, params: GenerationParams | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": "hf", "name": self.name, "model": str(self.path.resolve()),
                               "device": self.device_option, "dtype": self.dtype_option,
                               "use_chat_template": self.use_chat_template}
        if self.path.is_dir():
            out["fingerprint"] = _weights_fingerprint(self.path)
        if params is not None:
            out["params"] = params.to_dict()
        return out

    def _load(self) -> None:
        if self._model is not None:
            return
        self.check()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.device_option == "auto":
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            try:
                device = torch.device(self.device_option)
            except RuntimeError as exc:
                raise SpecError("device", f"not a torch device: {self.device_option!r}") from exc
        if self.dtype_option == "auto":
            # float32 on CPU (half precision is slow there); the checkpoint's own dtype on GPU
            dtype: Any = torch.float32 if device.type == "cpu" else "auto"
        else:
            dtype = getattr(torch, self.dtype_option)
        try:
            with _LOAD_LOCK:
                tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=dtype,
                                                             **SAFE_LOAD)
        except Exception as exc:  # corrupt weights, unknown architecture, missing tokenizer: the user's to fix
            raise GenerationError(f"could not load a causal LM from {self.path}: {type(exc).__name__}") from exc
        try:
            tokenizer = prepare_tokenizer(tokenizer)
        except ValueError as exc:
            raise GenerationError(f"tokenizer in {self.path}: {exc}") from exc
        # transformers wraps `to` with functools.wraps(nn.Module.to), whose type takes self as the first argument
        model.to(device)  # type: ignore[arg-type]
        model.eval()
        self._model, self._tokenizer, self._device = model, tokenizer, device

    def close(self) -> None:
        """Free the model (and its GPU memory)."""
        with self._lock:
            had_model = self._model is not None
            self._model = self._tokenizer = None
            if had_model:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    def context_length(self) -> int | None:
        """Positions the model can attend over, from its config (or the tokenizer), if it says."""
        self._load()
        return context_length(self._model, self._tokenizer)

    def render(self, prompt: Prompt) -> tuple[str, bool]:
        """Prompt text and whether it came from the chat template (then no special tokens are added)."""
        self._load()
        try:
            text = render_prompt(self._tokenizer, prompt, self.use_chat_template)
        except ValueError:
            raise GenerationError(f"use_chat_template is set but the tokenizer in {self.path} has no chat "
                                  "template") from None
        has_template = bool(getattr(self._tokenizer, "chat_template", None))
        return text, has_template if self.use_chat_template is None else self.use_chat_template

    def generate(self, prompts: Sequence[Prompt], n: int, params: GenerationParams, *,
                 progress: Progress | None = None, should_stop: ShouldStop | None = None,
                 prefixes: Sequence[str] | None = None) -> list[list[Sample]]:
        """`n` samples per prompt, in prompt order. `progress(done, total)` counts samples after every
        batch; `should_stop` is checked before every batch and raises GenerationCancelled.

        `prefixes`, one per prompt: the start of the answer, written after the rendered prompt (inside the
        assistant's turn of a chat template), which every sample continues; a sample's text is the continuation
        only. Monte-Carlo step estimation samples from a solution's first steps this way."""
        _check_prompts(prompts)
        _check_n(n, self.max_k)
        if prefixes is not None and (isinstance(prefixes, str) or len(prefixes) != len(prompts)
                                     or not all(isinstance(p, str) for p in prefixes)):
            raise GenerationError(f"prefixes must be a list of one string per prompt ({len(prompts)})")
        with self._lock:
            self._load()
            return self._generate(list(prompts), n, params, progress, should_stop, prefixes)

    def _generate(self, prompts: list[Prompt], n: int, params: GenerationParams, progress: Progress | None,
                  should_stop: ShouldStop | None, prefixes: Sequence[str] | None = None) -> list[list[Sample]]:
        import torch

        tokenizer = self._tokenizer
        encoded: list[list[int]] = []
        rendered: list[str] = []
        for j, (text, templated) in enumerate(self.render(p) for p in prompts):
            text += prefixes[j] if prefixes is not None else ""
            rendered.append(text)
            encoded.append(tokenizer(text, add_special_tokens=not templated)["input_ids"])
        context = self.context_length()
        for j, ids in enumerate(encoded):
            if not ids:
                raise GenerationError(f"prompt {j} is empty after tokenisation")
            if context is not None and len(ids) + params.max_new_tokens > context:
                raise ContextLengthError(
                    f"prompt {j} is {len(ids)} tokens; with max_new_tokens={params.max_new_tokens} it needs "
                    f"{len(ids) + params.max_new_tokens} positions but the model context is {context}")
        base_seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**31)
        rows = [(j, i) for j in range(len(prompts)) for i in range(n)]
        results: list[list[Sample | None]] = [[None] * n for _ in prompts]
        done_prompts: dict[int, list[Sample]] = {}
        eos_ids = self._eos_ids()
        total = len(rows)
        for start in range(0, total, self.batch_size):
            if should_stop is not None and should_stop():
                raise GenerationCancelled(done_prompts)
            batch = rows[start:start + self.batch_size]
            try:
                streams = [_stream_seed(base_seed + i, rendered[j]) for j, i in batch]
                texts = self._generate_batch([encoded[j] for j, _ in batch], streams, params, eos_ids)
            except torch.cuda.OutOfMemoryError as exc:
                raise GenerationError(f"out of GPU memory with batch_size={self.batch_size}; lower it") from exc
            for (j, i), (text, reason, length) in zip(batch, texts, strict=True):
                results[j][i] = Sample(text=text, finish_reason=reason, prompt_tokens=len(encoded[j]),
                                       completion_tokens=length, seed=base_seed + i)
                if i == n - 1:
                    done_prompts[j] = results[j]  # type: ignore[assignment]
            if progress is not None:
                progress(min(start + len(batch), total), total)
        return results  # type: ignore[return-value]

    def _eos_ids(self) -> set[int]:
        # the model's generation config may list several (Llama 3: <|end_of_text|> and <|eot_id|>)
        return set(eos_token_ids(self._model, self._tokenizer))

    def _generate_batch(self, encoded: list[list[int]], seeds: list[int], params: GenerationParams,
                        eos_ids: set[int]) -> list[tuple[str, str, int]]:
        """(text, finish_reason, completion tokens) per row; row r samples from the stream seeded `seeds[r]`."""
        import torch

        tokenizer = self._tokenizer
        input_ids, attention_mask = left_pad(encoded, tokenizer.pad_token_id, self._device)
        steps = params.max_new_tokens
        uniforms = draw_uniforms(seeds, steps).to(self._device) if params.temperature > 0 else None  # 0: greedy
        with torch.no_grad():
            tokens, _ = decode(self._model, tokenizer, input_ids, attention_mask, max_new_tokens=steps,
                               eos_ids=sorted(eos_ids), uniforms=uniforms, temperature=params.temperature,
                               top_p=params.top_p, stop=params.stop)
        rows = [finish_row(tokenizer, row, params.stop, sorted(eos_ids)) for row in tokens.cpu().tolist()]
        return [(r.text, "stop" if r.ended else "length", r.length) for r in rows]


# --------------------------------------------------------------------------------------- openai backend


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


class OpenAIGenerator:
    """Backend "openai": any OpenAI-compatible server (vLLM, TGI, llama.cpp, Ollama, OpenAI).

    `base_url` is the API root including `/v1` (a bare host gets `/v1` appended). Each request asks
    for up to `max_n` samples of one prompt; n above that is split over several requests. A server that
    answers fewer choices than asked (one that caps `n`, or ignores it, like transformers' `serve` and
    Ollama) is detected on the first request asking for more than one, which is sent alone: its choices
    are kept, and from then on each request asks for at most what it answered (`n_cap`; `max_n=1` skips
    the check). At most `concurrency` requests are in flight.
    429, 5xx, timeouts and connection errors are retried `max_retries` times with exponential backoff
    and full jitter (`backoff_s · 2^attempt`, capped at `max_backoff_s`), or after Retry-After when the
    server sends one (capped the same way). `api="completions"` takes string prompts only.
    """

    backend = "openai"

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, api: str = "chat",
                 timeout_s: float = 120.0, max_retries: int = 4, concurrency: int = 8, max_n: int = 16,
                 max_k: int = DEFAULT_MAX_K, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 address_check: AddressCheck | None = None) -> None:
        if not isinstance(base_url, str) or not base_url:
            raise SpecError("base_url", "must be a URL such as http://localhost:8000/v1")
        if not isinstance(model, str) or not model:
            raise SpecError("model", "must name the model the server serves")
        if api not in ("chat", "completions"):
            raise SpecError("api", f'must be "chat" or "completions", got {api!r}')
        if api_key is not None and not isinstance(api_key, str):
            raise SpecError("api_key", "must be a string")
        base = base_url.rstrip("/")
        if urlsplit(base).path == "":
            base += "/v1"
        self.base_url = base
        self.model = model
        self.api = api
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.max_n = max_n
        self.max_k = max_k
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.name = f"openai:{model}"
        self.__api_key = api_key or None  # name-mangled and left out of repr/describe on purpose
        self.address_check = address_check
        self.n_cap: int | None = None
        """The most choices the server answered for one request, once it answered fewer than asked."""
        self.n_cap_seen: tuple[int, int] | None = None
        """(n asked, choices answered) of the request that revealed `n_cap`, for the job log."""
        self._n_checked = False  # a request asking for more than one sample has been answered
        self._client: Any = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAIGenerator({self.base_url!r}, {self.model!r}, api={self.api!r})"

    def check(self, connect: bool = False) -> None:
        """The URL is well formed; with `connect`, the server answers `/models` and lists the model."""
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https"):
            raise SpecError("base_url", "must start with http:// or https://")
        if not parts.hostname:
            raise SpecError("base_url", "has no host")
        if parts.username or parts.password:
            raise SpecError("base_url", "must not contain credentials; use api_key")
        if parts.query or parts.fragment:
            raise SpecError("base_url", "must not have a query string or fragment")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise SpecError("base_url", "has an invalid port") from exc
        if connect:
            data = self._request("GET", "/models", None, None)
            listed = data.get("data") if isinstance(data, dict) else None
            if not isinstance(listed, list):
                raise GenerationError(f"{self.base_url}/models gave a malformed answer (no model list)")
            ids = {m.get("id") for m in listed if isinstance(m, dict)}
            if self.model not in ids:
                raise GenerationError(f"the server at {self.base_url} does not list model {self.model!r} "
                                      f"({len(ids)} models listed)")

    def describe(self, params: GenerationParams | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": "openai", "name": self.name, "base_url": self.base_url,
                               "model": self.model, "api": self.api, "max_n": self.max_n}
        if params is not None:
            out["params"] = params.to_dict()
        return out

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _http(self) -> Any:
        import httpx

        with self._client_lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}
                # Never follow redirects: the base URL was checked, a Location header pointing inward was not.
                transport = (None if self.address_check is None
                             else checked_transport(self.address_check, self.concurrency))
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), headers=headers,
                                            limits=httpx.Limits(max_connections=self.concurrency),
                                            follow_redirects=False, transport=transport)
            return self._client

    def _sleep(self, seconds: float, should_stop: ShouldStop | None) -> None:
        """Sleep, waking every 0.2 s to honour a cancel."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if should_stop is not None and should_stop():
                raise _Stopped
            time.sleep(min(left, 0.2))

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 should_stop: ShouldStop | None) -> Any:
        """One API call with retries; returns the decoded JSON or raises GenerationError."""
        import httpx

        url = self.base_url + path
        client = self._http()
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            wait: float | None = None
            try:
                response = client.request(method, url, json=body)
            except AddressRefused as exc:  # the address check said no: retrying cannot change that
                raise GenerationError(str(exc)) from exc
            except httpx.TimeoutException as exc:
                if last:
                    raise GenerationError(f"{url} timed out after {self.timeout_s:g} s "
                                          f"({attempt + 1} attempts)") from exc
            except httpx.TransportError as exc:
                if last:
                    raise GenerationError(f"could not reach {url} ({type(exc).__name__}, "
                                          f"{attempt + 1} attempts)") from exc
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise GenerationError(f"{url} answered with something that is not JSON") from exc
                # Errors name the status only: a remote body is never repeated into a job error or a page.
                if 300 <= status < 400:
                    raise GenerationError(f"{url} answered HTTP {status}, a redirect, which is not followed; "
                                          "point base_url at the final address")
                if status != 429 and status < 500:
                    raise GenerationError(f"{url} answered HTTP {status}{_status_hint(status)}")
                if last:
                    raise GenerationError(f"{url} answered HTTP {status} ({attempt + 1} attempts): "
                                          "remote server error")
                wait = _retry_after(response.headers.get("retry-after"))
            if wait is None:
                wait = random.uniform(0, self.backoff_s * 2**attempt)  # full jitter
            self._sleep(min(wait, self.max_backoff_s), should_stop)
        raise AssertionError("unreachable")

    def _body(self, prompt: Prompt, n: int, params: GenerationParams, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "n": n, "temperature": params.temperature,
                                "top_p": params.top_p, "max_tokens": params.max_new_tokens}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        else:
            body["prompt"] = prompt
        if params.stop:
            body["stop"] = params.stop
        if seed is not None:
            body["seed"] = seed
        return body

    def _parse(self, data: Any, n: int, seed: int | None) -> list[Sample]:
        """The 1..n samples the answer holds (fewer than n when the server caps n), or GenerationError."""
        url = self.base_url + ("/chat/completions" if self.api == "chat" else "/completions")
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list):
            raise GenerationError(f"{url} gave a malformed answer: no choices list")
        if not choices or len(choices) > n:
            raise GenerationError(f"{url} returned {len(choices)} choices for n={n}")
        n = len(choices)  # fewer than asked: a server that caps or ignores n (the caller asks again for the rest)
        indexed: dict[int, dict[str, Any]] = {}
        for k, choice in enumerate(choices):
            if not isinstance(choice, dict):
                raise GenerationError(f"{url} gave a malformed answer: choice {k} is not an object")
            index = choice.get("index", k)
            if not _is_int(index) or not 0 <= index < n or index in indexed:
                raise GenerationError(f"{url} gave a malformed answer: bad or repeated choice index")
            indexed[index] = choice
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = usage.get("prompt_tokens") if _is_int(usage.get("prompt_tokens")) else None
        completion_tokens = usage.get("completion_tokens") if n == 1 and _is_int(
            usage.get("completion_tokens")) else None
        samples = []
        for k in range(n):
            choice = indexed[k]
            if self.api == "chat":
                message = choice.get("message")
                text = message.get("content") if isinstance(message, dict) else None
                if message is None or not isinstance(text, str | None):
                    raise GenerationError(f"{url} gave a malformed answer: choice {k} has no message")
                text = text or ""  # content is null for refusals / tool calls
            else:
                text = choice.get("text")
                if not isinstance(text, str):
                    raise GenerationError(f"{url} gave a malformed answer: choice {k} has no text")
            reason = "length" if choice.get("finish_reason") in ("length", "max_tokens") else "stop"
            samples.append(Sample(text=text, finish_reason=reason, prompt_tokens=prompt_tokens,
                                  completion_tokens=completion_tokens, seed=seed))
        return samples

    def generate(self, prompts: Sequence[Prompt], n: int, params: GenerationParams, *,
                 progress: Progress | None = None, should_stop: ShouldStop | None = None) -> list[list[Sample]]:
        """`n` samples per prompt, in prompt order; requests run `concurrency` at a time.
        `progress(done, total)` counts samples after every request; `should_stop` is checked before each
        request is sent and while waiting to retry, then in-flight requests finish and
        GenerationCancelled is raised."""
        _check_prompts(prompts)
        _check_n(n, self.max_k)
        if self.api == "completions" and any(not isinstance(p, str) for p in prompts):
            raise GenerationError('chat-message prompts need api="chat"')
        path = "/chat/completions" if self.api == "chat" else "/completions"
        # one job per (prompt, chunk of ≤ max_n samples); a chunk is cut smaller once the server's cap is known
        jobs = collections.deque((j, a, min(self.max_n, n - a)) for j in range(len(prompts))
                                 for a in range(0, n, self.max_n))
        total = len(prompts) * n
        results: list[list[Sample | None]] = [[None] * n for _ in prompts]
        remaining = [n] * len(prompts)
        done = 0
        failure: BaseException | None = None

        def run(j: int, a: int, size: int) -> list[Sample]:
            seed = params.seed + a if params.seed is not None else None
            data = self._request("POST", path, self._body(prompts[j], size, params, seed), should_stop)
            return self._parse(data, size, seed)

        def completed() -> dict[int, list[Sample]]:
            return {j: results[j] for j in range(len(prompts)) if remaining[j] == 0}  # type: ignore[misc]

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            pending: dict[concurrent.futures.Future[list[Sample]], tuple[int, int, int]] = {}
            stopped = False
            while True:
                while not stopped and failure is None and jobs and len(pending) < self._in_flight_limit(jobs):
                    if should_stop is not None and should_stop():
                        stopped = True
                        break
                    job = self._next_chunk(jobs)
                    pending[pool.submit(run, *job)] = job
                if not pending:
                    break
                finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    j, a, size = pending.pop(future)
                    try:
                        samples = future.result()
                    except _Stopped:
                        stopped = True
                        continue
                    except BaseException as exc:  # first failure wins; let in-flight requests end
                        failure = failure or exc
                        continue
                    got = len(samples)
                    self._note_answer(size, got)
                    if got < size:  # the rest of this chunk, asked again (each its own seed: s + position)
                        jobs.appendleft((j, a + got, size - got))
                    results[j][a:a + got] = samples
                    remaining[j] -= got
                    done += got
                    if progress is not None:
                        progress(done, total)
            if failure is not None:
                raise failure
            if stopped:
                raise GenerationCancelled(completed())
        finally:
            pool.shutdown(wait=True)
        return results  # type: ignore[return-value]


    def _in_flight_limit(self, jobs: collections.deque[tuple[int, int, int]]) -> int:
        """One request alone until the server has answered one asking for several samples (its cap on n is
        learnt from it); `concurrency` after that."""
        if self._n_checked or all(size == 1 for _, _, size in jobs):
            return self.concurrency
        return 1

    def _next_chunk(self, jobs: collections.deque[tuple[int, int, int]]) -> tuple[int, int, int]:
        """The next (prompt, offset, size) to request, cut to the server's cap when one is known."""
        j, a, size = jobs.popleft()
        cap = min(self.max_n, self.n_cap or self.max_n)
        if size > cap:
            jobs.appendleft((j, a + cap, size - cap))
            size = cap
        return j, a, size

    def _note_answer(self, asked: int, got: int) -> None:
        if asked > 1:
            self._n_checked = True
        if got < asked and (self.n_cap is None or got < self.n_cap):
            self.n_cap = got
            self.n_cap_seen = (asked, got)


class _Stopped(Exception):  # noqa: N818 - internal signal from a retry wait
    pass


def _status_hint(status: int) -> str:
    hints = {400: " (the server rejected the request: a parameter out of range, or a prompt too long for "
                  "the model context)",
             401: " (check api_key)", 403: " (check api_key and its permissions)",
             404: " (check base_url, api and model)", 413: " (request too large)",
             422: " (the server rejected a parameter)"}
    return hints.get(status, "")


# ---------------------------------------------------------------------------------------------- specs

PARAM_KEYS = {"temperature", "top_p", "max_new_tokens", "seed", "stop"}
HF_KEYS = {"backend", "model", "device", "dtype", "batch_size", "use_chat_template", "max_k"}
OPENAI_KEYS = {"backend", "base_url", "model", "api_key", "api", "timeout_s", "max_retries", "concurrency",
               "max_n", "max_k", "backoff_s"}
DTYPES = ("auto", "float32", "float16", "bfloat16")

Generator = HFGenerator | OpenAIGenerator


def params_from_spec(spec: dict[str, Any]) -> GenerationParams:
    """The GenerationParams in a spec (keys temperature, top_p, max_new_tokens, seed, stop; the OpenAI
    name max_tokens is accepted for max_new_tokens). Raises SpecError naming the bad field."""
    if not isinstance(spec, dict):
        raise SpecError("generator", "must be an object")
    values = {k: spec[k] for k in PARAM_KEYS if k in spec}
    if "max_tokens" in spec:
        if "max_new_tokens" in spec:
            raise SpecError("max_tokens", "give max_new_tokens or max_tokens, not both")
        values["max_new_tokens"] = spec["max_tokens"]
    if values.get("stop") is None:
        values.pop("stop", None)
    return GenerationParams(**values)


def make_generator(spec: dict[str, Any], *, address_check: AddressCheck | None = None) -> Generator:
    """A generator from a spec such as `{"backend": "hf", "model": "/path"}` or
    `{"backend": "openai", "base_url": "http://host:8000/v1", "model": "name", "api_key"?, "api"?}`.

    Generation parameter keys (see `params_from_spec`) may sit in the same dict and are ignored
    here; any other unknown key is an error. Raises `SpecError` (a ValueError and a
    GenerationError) whose `field` names the bad key. Nothing is loaded or contacted: call
    `check()` for the cheap up-front validation. `address_check` vets every address an openai backend
    connects to (see `training.shared.net.checked_transport`).
    """
    if not isinstance(spec, dict):
        raise SpecError("generator", "must be an object")
    backend = spec.get("backend")
    allowed = {"hf": HF_KEYS, "openai": OPENAI_KEYS}.get(backend) if isinstance(backend, str) else None
    if allowed is None:
        raise SpecError("backend", f'must be "hf" or "openai", got {backend!r}')
    unknown = sorted(set(spec) - allowed - PARAM_KEYS - {"max_tokens"})
    if unknown:
        raise SpecError(unknown[0], f"unknown field for backend {backend!r}")
    model = spec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SpecError("model", "must be a model directory" if backend == "hf" else "must name the served model")
    max_k = _spec_int(spec, "max_k", DEFAULT_MAX_K, 1)
    if backend == "hf":
        device = spec.get("device", "auto")
        if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device):
            raise SpecError("device", f'must be "auto", "cpu", "cuda", "cuda:N" or "mps", got {device!r}')
        dtype = spec.get("dtype", "auto")
        if dtype not in DTYPES:
            raise SpecError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        template = spec.get("use_chat_template")
        if template is not None and not isinstance(template, bool):
            raise SpecError("use_chat_template", "must be true, false or null (auto)")
        return HFGenerator(model, device=device, dtype=dtype, batch_size=_spec_int(spec, "batch_size", 32, 1),
                           use_chat_template=template, max_k=max_k)
    base_url = spec.get("base_url")
    if not isinstance(base_url, str) or not base_url:
        raise SpecError("base_url", "must be a URL such as http://localhost:8000/v1")
    api_key = spec.get("api_key")
    if api_key is not None and not isinstance(api_key, str):
        raise SpecError("api_key", "must be a string")
    return OpenAIGenerator(
        base_url, model, api_key=api_key or None, api=spec.get("api", "chat"),
        timeout_s=_spec_float(spec, "timeout_s", 120.0, 0), max_retries=_spec_int(spec, "max_retries", 4, 0),
        concurrency=_spec_int(spec, "concurrency", 8, 1), max_n=_spec_int(spec, "max_n", 16, 1), max_k=max_k,
        backoff_s=_spec_float(spec, "backoff_s", 0.5, 0), address_check=address_check,
    )


def from_spec(spec: dict[str, Any]) -> tuple[Generator, GenerationParams]:
    """`make_generator(spec)` and `params_from_spec(spec)` in one call."""
    return make_generator(spec), params_from_spec(spec)


# ------------------------------------------------------------------------------------------- diversity

_WORD = re.compile(r"\w+")


def _tokens(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _normal(text: str) -> str:
    return " ".join(text.split())


def jaccard(a: str, b: str) -> float:
    """|A ∩ B| / |A ∪ B| over lowercase word tokens; two texts without words count as identical (1.0)."""
    x, y = _tokens(a), _tokens(b)
    if not x and not y:
        return 1.0
    return len(x & y) / len(x | y)


def diversity(texts: Sequence[str]) -> dict[str, Any]:
    """How different the samples of one prompt are.

    `distinct`: number of different texts after collapsing whitespace; `mean_jaccard` / `max_jaccard`:
    mean and max token Jaccard similarity over all pairs (0.0 with fewer than two texts).
    """
    distinct = len({_normal(t) for t in texts})
    sims = [jaccard(texts[i], texts[j]) for i in range(len(texts)) for j in range(i + 1, len(texts))]
    return {"distinct": distinct, "mean_jaccard": sum(sims) / len(sims) if sims else 0.0,
            "max_jaccard": max(sims) if sims else 0.0}


def near_duplicates(texts: Sequence[str], threshold: float = 0.9) -> list[int]:
    """Indices of texts that repeat an earlier one: the same after collapsing whitespace, or with token
    Jaccard ≥ threshold. The first of each group is kept, so resampling the returned indices suffices."""
    if not _is_number(threshold) or not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    out = []
    for i in range(len(texts)):
        if any(_normal(texts[i]) == _normal(texts[j]) or jaccard(texts[i], texts[j]) >= threshold
               for j in range(i)):
            out.append(i)
    return out
