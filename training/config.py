"""Loading dataclass configs from TOML files and `--set key=value` overrides, with errors that name the field."""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each dataclass field (the house style, inherited fields included), for `--help`
    texts."""
    import ast
    import inspect

    if not dataclasses.is_dataclass(cls):
        return {}
    docs: dict[str, str] = {}
    # base classes first, so a subclass that redeclares a field (say, another default) has the last word
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    # in field order (dataclasses.fields), as --help lists them
    return {f.name: docs[f.name] for f in dataclasses.fields(cls) if f.name in docs}


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    """Turn a TOML value or a `--set` string into the field's declared type, or raise naming the field."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if raw is None or (isinstance(raw, str) and raw.lower() in {"none", "null"}):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, raw, arg)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if errors else f"{name}: cannot parse {raw!r}")
    if annotation is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in {"true", "1", "yes", "on"}:
            return True
        if isinstance(raw, str) and raw.lower() in {"false", "0", "no", "off"}:
            return False
        raise ValueError(f"{name}: expected true or false, got {raw!r}")
    if annotation in (int, float):
        try:
            if annotation is int and isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return annotation(raw) if not isinstance(raw, str) else annotation(raw.strip())
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected {annotation.__name__}, got {raw!r}") from None
    if annotation is str:
        if not isinstance(raw, str | int | float):
            raise ValueError(f"{name}: expected a string, got {raw!r}")
        return str(raw)
    if origin in (list, tuple):
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raw = [part.strip() for part in raw.split(",") if part.strip()]
        if not isinstance(raw, list | tuple):
            raise ValueError(f"{name}: expected a list, got {raw!r}")
        inner = args[0] if args else Any
        items = [_coerce(name, item, inner) if inner is not Any else item for item in raw]
        return items if origin is list else tuple(items)
    if origin is dict:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise ValueError(f"{name}: expected a JSON object, got {raw!r}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{name}: expected a table, got {raw!r}")
        return dict(raw)
    if typing.get_origin(annotation) is typing.Literal:
        if raw not in args:
            raise ValueError(f"{name}: expected one of {', '.join(map(repr, args))}, got {raw!r}")
        return raw
    return raw


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """`["lr=1e-5", "beta=0"]` → `{"lr": "1e-5", "beta": "0"}`; a malformed item raises naming it."""
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def build_config(cls: type[T], *sources: dict[str, Any]) -> T:
    """Merge sources left to right into `cls`, coercing types; unknown keys raise with the known ones listed."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for source in sources:
        for key, raw in source.items():
            if raw is None and key not in values:
                continue
            if key not in fields:
                raise ValueError(f"unknown config field {key!r}; known fields: {', '.join(sorted(fields))}")
            values[key] = _coerce(key, raw, hints[key]) if raw is not None else None
    return cls(**values)


def load_config(cls: type[T], path: str | Path | None = None, sets: list[str] | None = None,
                **overrides: Any) -> T:
    """A config from an optional TOML file, then command-line flags (`overrides`), then `--set` items."""
    file_values: dict[str, Any] = {}
    if path is not None:
        try:
            file_values = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
    return build_config(cls, file_values, {k: v for k, v in overrides.items() if v is not None},
                        parse_sets(sets or []))


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


# ---------------------------------------------------------------------------------------------
# the fields GRPO and PPO share


@dataclasses.dataclass
class RLConfig:
    """Fields every policy-optimisation run shares (GRPOConfig, PPOConfig): data, rewards, optimiser, sampling,
    LoRA, evaluation and bookkeeping. Each trainer adds its own fields and checks after these."""

    prompts: str = ""
    """Prompts export (JSONL, Parquet or a datasets directory); rows with a held-out split are evaluation only."""
    model: str = ""
    """Local directory of the starting policy (any AutoModelForCausalLM), usually the SFT model."""
    out: str = ""
    """Output directory: model/, metrics.jsonl, eval.json, config.json, checkpoint/ (PPO adds value_model/)."""
    reward_fn: list[str] = dataclasses.field(default_factory=list)
    """Reward functions, `module:function` or built-in names (gsm8k_exact_match, format_regex, length_penalty)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default 1 each)."""
    reward_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments bound to reward functions by name, e.g. {format_regex = {pattern = "..."}}."""
    reward_model: str | None = None
    """A preflab reward model directory scoring (prompt, response), added to the reward functions."""
    reward_model_weight: float = 1.0
    """Weight of the reward model's score in the total reward."""

    lr: float = 1e-6
    """AdamW learning rate."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up: none, linear to 0, or cosine to 0 at the last step."""
    warmup_steps: int = 0
    """Linear warm-up steps (counted in steps, i.e. rollout batches)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip over every trained parameter (0 disables)."""
    steps: int = 100
    """Steps: rollout batches, each followed by its optimisation passes."""

    temperature: float = 1.0
    """Sampling temperature of the rollouts (log-probs are taken under the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling threshold of the rollouts."""
    max_new_tokens: int = 256
    """Longest response sampled."""
    max_prompt_length: int = 0
    """Truncate prompts to this many tokens (0: no limit)."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Strings that end a response (the text is cut there; the mask ends on the token completing it)."""
    generation_batch_size: int = 0
    """Prompts per generate call (0: all prompts of the step at once)."""

    lora: bool = False
    """Train a LoRA adapter instead of all weights; the reference is then the adapter-disabled base."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha (scale alpha / r)."""
    lora_dropout: float = 0.0
    """LoRA dropout (keep 0 for RL)."""
    lora_target_modules: list[str] | str = "all-linear"
    """Modules to adapt."""

    eval_every: int = 0
    """Evaluate on the held-out prompts every this many steps (0: only at the end)."""
    eval_k: int = 4
    """Samples per held-out prompt for Pass@K / Maj@K."""
    eval_max_prompts: int = 200
    """Held-out prompts evaluated (0: all)."""
    eval_temperature: float | None = None
    """Sampling temperature of the evaluation (default: the rollout temperature)."""

    seed: int = 0
    """Seed of the prompt order, the sampling and any shuffles; a CPU run with the same seed repeats exactly."""
    save_every: int = 0
    """Write OUT/checkpoint/ every this many steps (0: never) for resume."""
    resume: bool = False
    """Continue from OUT/checkpoint/ when it exists."""
    log_every: int = 1
    """Update the progress line every this many steps (metrics.jsonl gets every step)."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """accelerate mixed precision; "auto" is bf16 on a CUDA device that supports it, else none."""
    tensorboard: bool = False
    """Mirror metrics to OUT/tensorboard when TensorBoard is installed."""

    def __post_init__(self) -> None:
        for name in ("steps", "max_new_tokens", "eval_k", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "max_prompt_length", "generation_batch_size", "eval_every", "eval_max_prompts",
                     "save_every", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant', 'linear' or 'cosine', got {self.lr_schedule!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.eval_temperature is not None and self.eval_temperature <= 0:
            raise ValueError(f"eval_temperature must be positive, got {self.eval_temperature}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_fn):
            raise ValueError(f"reward_weights: {len(self.reward_weights)} weights for "
                             f"{len(self.reward_fn)} reward functions")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}")

    @property
    def lora_settings(self) -> Any:
        """LoraSettings for `load_policy`, or None without LoRA."""
        if not self.lora:
            return None
        from training.policy import LoraSettings

        return LoraSettings(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout,
                            target_modules=self.lora_target_modules)
