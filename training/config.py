"""Every trainer's config, torch-free (the web app validates runs without importing torch), and how configs load:
TOML files and `--set key=value` overrides, with errors that name the field and old field names kept working.

`TrainConfig` holds what every method shares (model, output, the step budget `steps`, the optimiser, logging,
checkpoints, trackers); `OfflineConfig` adds batches over a data file (reward, prm, sft, dpo), `RLConfig` rollouts
from prompts (grpo, ppo, rft). Each method's config adds only its own fields.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

T = TypeVar("T")


DOC = "doc"
"""The key of a field's description in its dataclass metadata."""


def setting(default: Any, doc: str) -> Any:
    """A config field with its default and its description, kept as data: `--help`, the docs and the app's training
    form read it through `field_docs`."""
    return dataclasses.field(default=default, metadata={DOC: doc})


def setting_factory(factory: Callable[[], Any], doc: str) -> Any:
    """`setting` for a field whose default is made fresh for each config (a list, a table)."""
    return dataclasses.field(default_factory=factory, metadata={DOC: doc})


def field_docs(cls: type) -> dict[str, str]:
    """Each field's description (inherited ones included), in field order as `--help` lists them."""
    if not dataclasses.is_dataclass(cls):
        return {}
    docs: dict[str, str] = {}
    # base classes first: a subclass that redeclares a field (another default) and describes it has the last word,
    # one that does not keeps the base's description
    for klass in reversed(cls.__mro__):
        for name, f in getattr(klass, "__dataclass_fields__", {}).items():
            if f.metadata.get(DOC):
                docs[name] = " ".join(f.metadata[DOC].split())
    return {f.name: docs[f.name] for f in dataclasses.fields(cls) if f.name in docs}


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    """Turn a TOML value or a `--set` string into the field's declared type (pydantic's lax rules: "3" → 3,
    "true" → True, 3.0 → 3, but never 3.5 → 3), or raise ValueError naming the field."""
    hints = _alternatives(annotation)
    if isinstance(raw, str):
        if raw.strip().lower() in {"none", "null"} and type(None) in hints:
            return None
        raw = _parse_text(raw, hints)
    try:
        return TypeAdapter(annotation, config=ConfigDict(coerce_numbers_to_str=True)).validate_python(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "".join(f"[{p}]" for p in error["loc"] if not isinstance(p, str))  # an item of a list, say
        raise ValueError(f"{name}{where}: {error['msg'].lower()}, got {raw!r}") from None


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    """The types a field accepts: the members of a union, or the type itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _parse_text(raw: str, hints: tuple[Any, ...]) -> Any:
    """A `--set` string for a list or table field: JSON (`["a", "b"]`, `{"k": 1}`), or for a list that cannot be
    plain text, comma-separated items. Text for any other field is left to the validator."""
    origins = {typing.get_origin(h) or h for h in hints}
    if not origins & {list, tuple, dict}:
        return raw
    if raw.lstrip().startswith(("[", "{")):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    if str in origins or dict in origins:
        return raw
    return [part.strip() for part in raw.split(",") if part.strip()]


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """`["lr=1e-5", "beta=0"]` → `{"lr": "1e-5", "beta": "0"}`; a malformed item raises naming it."""
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def renamed(**old: str | tuple[str, Callable[[Any], Any]]) -> Callable[[type[T]], type[T]]:
    """Class decorator: old field names keep working, with a DeprecationWarning naming the new one.

    `renamed(max_steps="steps")` maps `max_steps=…` to `steps`; a (new name, convert) tuple also converts the
    value, e.g. `tensorboard=("report_to", lambda on: ["tensorboard"] if on else [])`. Works for direct
    construction, TOML files, `--set` and the app's run configs alike.
    """
    def wrap(cls: type[T]) -> type[T]:
        own = {k: (v if isinstance(v, tuple) else (v, None)) for k, v in old.items()}
        table = {**getattr(cls, "RENAMED", {}), **own}
        init = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **translate(cls, kwargs))

        cls.RENAMED = table  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls
    return wrap


def translate(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with deprecated field names replaced by their new ones (warning once per name)."""
    table: dict[str, tuple[str, Callable[[Any], Any] | None]] = getattr(cls, "RENAMED", {})
    if not table or not any(k in table for k in values):
        return values
    out = dict(values)
    for key, (new, convert) in table.items():
        if key not in out:
            continue
        value = out.pop(key)
        warnings.warn(f"config field {key!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=4)
        if new in out and out[new] is not None:
            continue  # the new name, given too, wins
        out[new] = convert(value) if convert is not None else value
    return out


def known_fields(cls: type) -> set[str]:
    """Field names a config accepts: its fields and the deprecated names still mapped to them."""
    return {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "RENAMED", {}))


def build_config(cls: type[T], *sources: dict[str, Any]) -> T:
    """Merge sources left to right into `cls`, coercing types; unknown keys raise with the known ones listed."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    renames: dict[str, tuple[str, Any]] = getattr(cls, "RENAMED", {})
    values: dict[str, Any] = {}
    for source in sources:
        for key, raw in source.items():
            if raw is None and key not in values:
                continue
            if key in renames:
                values[key] = raw  # translated (and warned about) when the config is built
                continue
            if key not in fields:
                raise ValueError(f"unknown config field {key!r}; known fields: {', '.join(sorted(fields))}")
            values[key] = _coerce(key, raw, hints[key]) if raw is not None else None
    translated = translate(cls, values)
    for key in set(translated) - set(values):  # a value given under an old name, coerced to the new field's type
        if translated[key] is not None:
            translated[key] = _coerce(key, translated[key], hints[key])
    return cls(**translated)


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


# ---------------------------------------------------------------------------------------------
# what every method shares


def at_least(config: Any, minimum: int, *names: str) -> None:
    """ValueError naming the first field of `names` below `minimum` (the configs' shared bound check)."""
    for name in names:
        if getattr(config, name) < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {getattr(config, name)}")


def require(config: Any, *names: str) -> None:
    """ValueError naming the first of `names` left empty (paths a run cannot start without)."""
    for name in names:
        if not getattr(config, name):
            raise ValueError(f"{name}: required (--{name.replace('_', '-')} or --set {name}=...)")


def one_of(config: Any, name: str, choices: tuple[str, ...]) -> None:
    """ValueError naming the field when its value is not one of `choices`."""
    if getattr(config, name) not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {getattr(config, name)!r}")


TRACKERS = ("tensorboard", "mlflow", "wandb")
PROCESS_CREDITS = ("sum", "mean", "min", "first_error", "progress")
"""GRPO's process credit forms (`GRPOConfig.process_credit`, `training.losses`)."""
PRECISIONS = ("auto", "no", "bf16", "fp16")
SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass
class TrainConfig:
    """Fields every training method shares: where from and to, the step budget, the optimiser and its schedule,
    logging, checkpoints and trackers. Each method's config adds its own fields after these."""

    model: str = setting("", "Local directory of the starting model (safetensors).")
    out: str = setting(
        "", "Output directory: model/, checkpoint/, metrics.jsonl, eval.json and run.json (config, versions, data).")
    steps: int = setting(
        0, "Optimisation steps to run; 0 means `epochs` passes over the data (methods that read a data file).")
    lr: float = setting(2e-5, "AdamW peak learning rate.")
    lr_schedule: Literal["constant", "linear", "cosine"] = setting(
        "linear", "Decay after warm-up: none, linear to 0, or cosine to 0 at the last step.")
    warmup_steps: int = setting(0, "Linear warm-up steps from 0 to `lr`.")
    warmup_ratio: float = setting(0.0, "Warm-up as a fraction of all steps (used when warmup_steps is 0).")
    weight_decay: float = setting(0.0, "AdamW decoupled weight decay (not applied to biases and norms).")
    max_grad_norm: float = setting(1.0, "Clip the global gradient norm to this value; 0 disables clipping.")
    seed: int = setting(
        0, "Seeds initialisation, the data order, sampling and dropout, so a CPU run with the same seed repeats "
        "exactly.")
    eval_every: int = setting(
        0, "Evaluate on the held-out data every this many steps (and always at the end); 0: only at the end.")
    save_every: int = setting(
        0, "Write a resumable checkpoint (model, optimiser, schedule, RNG, data position) to OUT/checkpoint every "
        "this many steps; 0: never.")
    resume: bool = setting(False, "Continue from OUT/checkpoint when it exists.")
    log_every: int = setting(
        0, "Write a metrics.jsonl row every this many steps; 0: every step up to 1,000 steps, then about 1,000 rows.")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = setting(
        "auto", '"auto" (bf16 on a GPU that supports it, else full precision), "no", "bf16" or "fp16".')
    report_to: list[str] = setting_factory(
        list, "Experiment trackers beside metrics.jsonl: any of \"tensorboard\", \"mlflow\", \"wandb\" (accelerate's "
        "trackers, writing under OUT; set MLFLOW_TRACKING_URI or WANDB_* for a server). Empty: none.")
    run_name: str = setting("", "Name of the run in the trackers (default: the output directory's name).")
    progress: bool = setting(True, "Show a progress bar on the main process.")

    def __post_init__(self) -> None:
        at_least(self, 0, "steps", "warmup_steps", "weight_decay", "max_grad_norm", "eval_every", "save_every",
                 "log_every")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        one_of(self, "lr_schedule", SCHEDULES)
        one_of(self, "mixed_precision", PRECISIONS)
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        unknown = [t for t in self.report_to if t not in TRACKERS]
        if unknown:
            raise ValueError(f"report_to: unknown tracker {unknown[0]!r}; choose from {', '.join(TRACKERS)}")

    def warmup(self, total_steps: int) -> int:
        """Warm-up steps of a run of `total_steps`: warmup_steps, else warmup_ratio of the run."""
        return self.warmup_steps or int(self.warmup_ratio * total_steps)

    def log_interval(self, total_steps: int) -> int:
        """Steps between metrics.jsonl rows: log_every, else every step for short runs and ~1,000 rows for long."""
        return self.log_every or max(1, total_steps // 1000)


@dataclasses.dataclass
class ChatTemplateFields:
    """How the methods that train a causal LM (sft, dpo, grpo, ppo, rft) render their prompts. Mixed in like
    LoraFields."""

    use_chat_template: bool = setting(
        True, "Render prompts through the tokenizer's chat template when it has one (a plain-text prompt becomes "
        "one user turn), in rollouts, evaluation and the loss alike. False for a base model: prompts as they are, "
        "chat messages as \"role: content\" lines; the trained model is then saved without a template, so sampling "
        "from it renders prompts the same way.")


@dataclasses.dataclass
class LoraFields:
    """LoRA fields of the methods that train a causal LM (sft, dpo, grpo, ppo, rft). Mixed in first
    (`class SFTConfig(LoraFields, OfflineConfig)`), so these fields come after the base's in `--help`."""

    lora: bool = setting(
        False, "Train a LoRA adapter instead of all weights; the reference (dpo, grpo, ppo) is then the "
        "adapter-disabled base.")
    lora_r: int = setting(16, "LoRA rank.")
    lora_alpha: int = setting(32, "LoRA alpha (scale alpha / r).")
    lora_dropout: float = setting(0.0, "LoRA dropout (keep 0 for RL, so sampling and training log-probs agree).")
    lora_target_modules: list[str] | str = setting("all-linear", "Modules to adapt.")

    def __post_init__(self) -> None:
        getattr(super(), "__post_init__", lambda: None)()  # the base config's checks first
        if self.lora:
            at_least(self, 1, "lora_r", "lora_alpha")
            if not 0 <= self.lora_dropout < 1:
                raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")

    @property
    def lora_settings(self) -> Any:
        """LoraSettings for `load_policy`, or None without LoRA."""
        if not self.lora:
            return None
        from training.policy import LoraSettings

        return LoraSettings(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout,
                            target_modules=self.lora_target_modules)


@dataclasses.dataclass
class OfflineConfig(TrainConfig):
    """Methods that learn from a data file in batches (reward, sft, dpo): the data, batches and epochs, early
    stopping on the held-out loss."""

    train: str = setting("", "Training data: an export file (JSONL, Parquet) or a datasets directory.")
    eval: str = setting("", "Held-out data; empty: the rows of `train` whose split is held-out.")
    batch_size: int = setting(
        16, "Examples per optimisation step, across all processes (each process takes batch_size / processes).")
    eval_batch_size: int = setting(64, "Examples per forward pass when evaluating.")
    epochs: float = setting(1.0, "Passes over the training data (fractions allowed); ignored when `steps` is set.")
    max_length: int = setting(
        512, "Tokens per example, prompt and response together; longer examples lose their oldest (leftmost) tokens.")
    group_by_length: bool = setting(
        True, "Batch examples of similar length together (within shuffled mega-batches) to cut padding.")
    megabatch_factor: int = setting(
        50, "Mega-batch size in batches for length grouping; larger groups tighter but shuffle less.")
    disable_dropout: bool = setting(
        True, "Set every dropout probability to 0 (pairwise losses compare forward passes, and dropout makes them "
        "noisy).")
    early_stopping_patience: int = setting(
        0, "Stop after this many evaluations without a lower held-out loss, keeping the best model; 0 disables.")
    early_stopping_min_delta: float = setting(
        0.0, "A held-out loss must drop by more than this to count as an improvement.")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "batch_size", "eval_batch_size", "megabatch_factor")
        at_least(self, 0, "early_stopping_patience", "early_stopping_min_delta")
        if self.max_length < 8:
            raise ValueError(f"max_length must be at least 8 tokens, got {self.max_length}")
        if self.steps == 0 and not self.epochs > 0:
            raise ValueError(f"epochs must be positive when steps is 0, got {self.epochs}")


# Old names of the reward model's fields, from before every method shared one vocabulary.
REWARD_RENAMES: dict[str, Any] = {
    "max_steps": "steps", "learning_rate": "lr", "lr_scheduler": "lr_schedule", "checkpoint_every": "save_every",
    "tensorboard": ("report_to", lambda on: ["tensorboard"] if on else []),
}


@renamed(**REWARD_RENAMES)
@dataclasses.dataclass
class RewardConfig(OfflineConfig):
    """Training a Bradley–Terry reward model on chosen/rejected pairs."""

    model: str = setting(
        "", "Local directory of an AutoModelForSequenceClassification-compatible model; empty: the shipped MiniLM.")
    eval_every: int = setting(
        100, "Evaluate on the held-out pairs every this many steps (and always at the end); 0: only at the end.")
    use_soft_labels: bool = setting(
        True, "Use the export's `p` column (soft label) when present; otherwise every pair is a hard label.")
    use_margin: bool = setting(
        True, "Subtract the export's `margin` column inside the loss, −log σ(r_c − r_r − margin).")
    margin_scale: float = setting(1.0, "Multiplier on the margin column (tiers apart are not reward units).")
    use_weights: bool = setting(True, "Weight pairs by the export's `weight` column.")
    center_rewards_coef: float = setting(
        0.0, "c in the reward-centering term c·(r_c + r_r)²; 0 turns it off (Eisenstein et al. use 0.01).")
    calibration_bins: int = setting(
        5, "Bins of predicted confidence max(σ(Δ), 1 − σ(Δ)) over [0.5, 1] for the calibration table.")
    length_buckets: int = setting(4, "Quantile buckets of pair length (tokens) for accuracy by length.")
    ensemble: int = setting(
        1, "Reward heads on one shared encoder (one encoder forward pass serves all of them); above 1, "
        "`score` gives the mean reward and `compare` each pair's preference probability with its spread across "
        "heads, and eval.json reports accuracy by uncertainty.")
    bootstrap: bool = setting(
        True, "With ensemble > 1, each head weights each training pair by its own Poisson(1) draw (the online "
        "bootstrap), so the heads see different data; false: the heads differ only by their initialisation.")
    uncertainty_quantiles: int = setting(
        4, "Quantile buckets of the heads' spread for held-out accuracy by uncertainty (ensemble > 1).")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "calibration_bins", "length_buckets", "ensemble", "uncertainty_quantiles")
        at_least(self, 0, "center_rewards_coef")


@dataclasses.dataclass
class PRMConfig(OfflineConfig):
    """Training a process reward model on step-labelled completions (the steps export, TRL's stepwise layout): a
    token-classification head scores each step at its separator token, with binary cross-entropy per step."""

    model: str = setting(
        "", "Local directory of an AutoModelForTokenClassification-compatible model (an encoder or a causal LM); "
        "empty: the shipped MiniLM.")
    eval_every: int = setting(
        50, "Evaluate on the held-out steps every this many steps (and always at the end); 0: only at the end.")
    step_separator: str = setting(
        "\n", "Text put after every step; the step is scored at the separator's last token. A tokenizer that turns "
        "it into nothing (BERT's drops newlines) gets its own separator token ([SEP], else EOS) instead.")
    step_pattern: str = setting(
        "", "How a rollout is cut into steps when the model scores it (GRPO, best-of-N): empty = one step per "
        "non-empty line; else a regular expression whose matches separate steps. Saved with the model.")
    threshold: float = setting(
        0.5, "A step counts as predicted correct when its score σ(s) is at least this (step_accuracy, "
        "first_error_accuracy).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if not self.step_separator:
            raise ValueError("step_separator must not be empty")
        if self.step_pattern:
            check_step_pattern(self.step_pattern, "step_pattern")


def check_step_pattern(pattern: str, name: str) -> None:
    """ValueError naming `name` unless `pattern` is a regular expression that cannot match the empty string."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{name}: not a regular expression ({exc})") from None
    if compiled.fullmatch(""):
        raise ValueError(f"{name}: {pattern!r} matches the empty string, so it cannot separate steps")


@renamed(tensorboard=("report_to", lambda on: ["tensorboard"] if on else []))
@dataclasses.dataclass
class SFTConfig(LoraFields, ChatTemplateFields, OfflineConfig):
    """Supervised fine-tuning of a causal LM on (prompt, completion) rows or chat `messages` (the SFT export)."""

    max_length: int = setting(
        1024, "Tokens per example; a longer prompt loses its oldest tokens first, then the completion its last ones.")
    packing: bool = setting(
        False, "Pack several examples into each row of `max_length` tokens (attention kept within each example).")
    completion_only: bool = setting(
        True, "Loss on completion tokens only (the prompt is context); false: on every token.")
    eval_every: int = setting(
        0, "Evaluate held-out loss and perplexity every this many steps (and always at the end); 0: only at the end.")


@dataclasses.dataclass
class DPOConfig(LoraFields, ChatTemplateFields, OfflineConfig):
    """Direct preference optimisation of a causal LM on chosen/rejected pairs (the pairs export)."""

    lr: float = setting(
        5e-7, "AdamW peak learning rate (DPO wants a small one: Rafailov et al. used 1e-6 with batch 64).")
    beta: float = setting(0.1, "β: strength of the implicit KL constraint; the implicit reward is β·log π/π_ref.")
    loss_type: Literal["sigmoid", "ipo"] = setting(
        "sigmoid", "\"sigmoid\": DPO (Rafailov et al. 2023); \"ipo\": IPO's squared loss towards margin 1/(2β) "
        "(Azar et al. 2023).")
    reference: str = setting(
        "", "Reference model directory; empty: a frozen copy of `model` (under LoRA, the adapter-disabled base).")
    precompute_ref_logps: bool = setting(
        False, "Score every pair under the reference once before training, then free the reference model.")
    label_smoothing: float = setting(0.0, "ε of conservative DPO: every hard label is trusted with probability 1 − ε.")
    rpo_alpha: float = setting(
        0.0, "α of RPO (Pang et al. 2024): add α × the NLL of the chosen responses, so DPO cannot satisfy the "
        "preference by making the chosen answers less likely too (it often does on small data); 0 is plain DPO.")
    use_soft_labels: bool = setting(
        True, "Use the export's `p` column (AI judges' soft labels) as the pair's own label smoothing 1 − p.")
    use_weights: bool = setting(True, "Weight pairs by the export's `weight` column.")
    use_margin: bool = setting(
        False, "Subtract the export's `margin` column (× margin_scale) inside the sigmoid, as in the reward model.")
    margin_scale: float = setting(1.0, "Multiplier on the margin column.")
    max_prompt_length: int = setting(
        0, "Tokens kept of each prompt (its newest ones); 0: as many as max_length allows.")

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_type", ("sigmoid", "ipo"))
        if not self.beta > 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        at_least(self, 0, "max_prompt_length", "rpo_alpha")


@renamed(tensorboard=("report_to", lambda on: ["tensorboard"] if on else []))
@dataclasses.dataclass
class RLConfig(LoraFields, ChatTemplateFields, TrainConfig):
    """Fields every method that samples from the policy shares (GRPO, PPO, RFT): prompts, rewards, sampling and
    evaluation. Each trainer adds its own fields and checks after these."""

    prompts: str = setting(
        "", "Prompts export (JSONL, Parquet or a datasets directory); rows with a held-out split are evaluation only.")
    model: str = setting(
        "", "Local directory of the starting policy (any AutoModelForCausalLM), usually the SFT model.")
    out: str = setting(
        "", "Output directory: model/, metrics.jsonl, eval.json, run.json, checkpoint/ (PPO adds value_model/).")
    reward_fn: list[str] = setting_factory(
        list, "Reward functions, `module:function` or built-in names (gsm8k_exact_match, format_regex, "
        "length_penalty).")
    reward_weights: list[float] | None = setting(None, "One weight per reward function (default 1 each).")
    reward_kwargs: dict[str, Any] = setting_factory(
        dict, 'Keyword arguments bound to reward functions by name, e.g. {format_regex = {pattern = "..."}}.')
    reward_model: str | None = setting(
        None, "A preflab reward model directory scoring (prompt, response), added to the reward functions.")
    reward_model_weight: float = setting(1.0, "Weight of the reward model's score in the total reward.")

    lr: float = setting(1e-6, "AdamW learning rate.")
    lr_schedule: Literal["constant", "linear", "cosine"] = setting(
        "constant", "Decay after warm-up: none, linear to 0, or cosine to 0 at the last step.")
    steps: int = setting(100, "Steps: rollout batches, each followed by its optimisation passes.")

    temperature: float = setting(
        1.0, "Sampling temperature of the rollouts (log-probs are taken under the same temperature).")
    top_p: float = setting(1.0, "Nucleus sampling threshold of the rollouts.")
    max_new_tokens: int = setting(
        256, "Longest response sampled (clamped, with a warning, to what the model's positions leave after the "
        "prompt).")
    max_prompt_length: int = setting(0, "Truncate prompts to this many tokens (0: no limit).")
    stop: list[str] = setting_factory(
        list, "Strings that end a response (the text is cut there; the mask ends on the token completing it).")
    generation_batch_size: int = setting(0, "Prompts per generate call (0: all prompts of the step at once).")

    eval_k: int = setting(4, "Samples per held-out prompt for Pass@K / Maj@K.")
    eval_max_prompts: int = setting(200, "Held-out prompts evaluated (0: all).")
    eval_temperature: float | None = setting(
        None, "Sampling temperature of the evaluation (default: the rollout temperature).")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "steps", "max_new_tokens", "eval_k")
        at_least(self, 0, "max_prompt_length", "generation_batch_size", "eval_max_prompts")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.eval_temperature is not None and self.eval_temperature <= 0:
            raise ValueError(f"eval_temperature must be positive, got {self.eval_temperature}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_fn):
            raise ValueError(f"reward_weights: {len(self.reward_weights)} weights for "
                             f"{len(self.reward_fn)} reward functions")

    def check_reward(self) -> None:
        """ValueError unless a reward is configured (the CLI and `train` check it; a config alone may lack one)."""
        if not self.reward_fn and not self.reward_model:
            raise ValueError("reward_fn: give --reward-fn and/or --reward-model")


@dataclasses.dataclass
class GRPOConfig(RLConfig):
    """Everything a GRPO/GSPO run needs: the shared fields of RLConfig (data, rewards, optimiser, sampling, LoRA,
    evaluation) and these; `python -m training grpo --help` lists them all."""

    loss_type: Literal["grpo", "gspo"] = setting(
        "grpo", '"grpo": token-level ratio and clipping (DeepSeekMath); "gspo": sequence-level ratio and clipping '
        "(Qwen).")
    group_size: int = setting(8, "G: completions sampled per prompt; advantages are normalised within each group.")
    prompts_per_step: int = setting(
        8, "Prompts per step across all processes; the rollout batch is prompts_per_step × group_size.")
    mu: int = setting(1, "μ: optimisation passes over each rollout batch (1 = on-policy, the ratio is then exactly 1).")
    micro_batch_size: int = setting(
        0, "Rows per forward/backward (gradient accumulation inside a pass); 0 = the whole batch at once.")
    beta: float = setting(
        0.04, "Weight of the k3 KL term against the reference policy (DeepSeekMath used 0.04; 0 drops the term).")
    clip_eps: float | None = setting(
        None, "ε of the clipped ratio; default 0.2 for grpo, 3e-4 for gspo (GSPO's sequence ratios are near 1).")
    clip_eps_high: float | None = setting(
        None, 'Upper clip ε_high ("clip-higher", DAPO); default ε for grpo, 4e-4 for gspo.')
    aggregation: Literal["sequence", "token", "dr_grpo"] = setting(
        "sequence", "GRPO loss aggregation: per-response mean then batch mean, token mean (DAPO), or constant "
        "normaliser.")
    scale_rewards: Literal["group", "batch", "none"] = setting(
        "group", "Advantage scaling: divide by the group std, by the batch std, or not at all (Dr. GRPO).")
    advantage_eps: float = setting(1e-4, "Added to the std before dividing advantages.")
    mask_truncated: bool = setting(
        False, "Leave responses that hit max_new_tokens without ending out of the loss (DAPO's overlong filtering).")

    server_base_url: str | None = setting(
        None, "Sample from an OpenAI-compatible server (vLLM, TGI) at this URL instead of the local model.")
    server_model: str | None = setting(None, "Model name on that server.")

    ref_reset_steps: int = setting(
        0, "Iterative GRPO: set π_ref ← π_θ every this many steps (0: the reference stays the starting model).")
    kl_metric: bool = setting(True, "Compute reference log-probs for the logged KL even when beta is 0.")

    process_reward_model: str | None = setting(
        None, "A preflab process reward model directory (`python -m training prm`): each rollout is cut into steps "
        "the way the model was trained and every step's score feeds process advantages (DeepSeekMath §4.1.3).")
    process_reward_weight: float = setting(
        1.0, "Weight of the process reward model's step scores; outcome rewards (reward_fn, reward_model) are added "
        "on each rollout's last step with their own weights.")
    process_credit: Literal["sum", "mean", "min", "first_error", "progress"] = setting(
        "sum", "How step rewards become each step's advantage when a reward scores steps: \"sum\", the normalised "
        "rewards of every step from it on (DeepSeekMath §4.1.3; its size grows with the steps left); \"mean\", that "
        "sum divided by the steps left; \"min\", the worst step reward from it on (PURE, Cheng et al. 2025); "
        "\"first_error\", credit for the verified prefix and a penalty from the first step scored below "
        "process_threshold on; \"progress\", the change in the estimated chance of success across the step "
        "(Setlur et al. 2024), reading step rewards as success probabilities. sum, mean and min add outcome rewards "
        "to the last step's reward; first_error and progress read the outcome as the last step's verdict and value.")
    process_outcome_mix: float | None = setting(
        None, "α: when set, the advantage is A_outcome + α·A_process, each rescaled to unit spread over its group, and "
        "outcome rewards stay out of the step rewards (needs an outcome reward, reward_fn or reward_model, beside the "
        "process one). Unset: outcome rewards enter the step rewards as process_credit says.")
    process_threshold: float = setting(
        0.5, "process_credit first_error: a step whose reward is below this is wrong (0.5 suits a process reward "
        "model's probabilities and 0/1 labels); the outcome counts as the last step's verdict on the same scale.")
    advantage_clip: float | None = setting(
        None, "Clip every token's advantage to [-c, c], outcome and process alike (unset: no clip): a control for "
        "the sum form, whose size grows with the steps left.")

    def check_reward(self) -> None:
        """ValueError unless a reward is configured: reward functions, a reward model or a process reward model."""
        if not self.reward_fn and not self.reward_model and not self.process_reward_model:
            raise ValueError("reward_fn: give --reward-fn, --reward-model and/or --process-reward-model")
        if self.process_outcome_mix is not None and not self.reward_fn and not self.reward_model:
            raise ValueError("process_outcome_mix: mixes an outcome reward in; give --reward-fn or --reward-model "
                             "beside the process reward")

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_type", ("grpo", "gspo"))
        if self.process_reward_weight < 0:
            raise ValueError(f"process_reward_weight must be >= 0, got {self.process_reward_weight}")
        one_of(self, "process_credit", PROCESS_CREDITS)
        if self.process_outcome_mix is not None and self.process_outcome_mix < 0:
            raise ValueError(f"process_outcome_mix must be >= 0, got {self.process_outcome_mix}")
        if self.advantage_clip is not None and self.advantage_clip <= 0:
            raise ValueError(f"advantage_clip must be positive, got {self.advantage_clip}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 to compare answers, got {self.group_size}")
        at_least(self, 1, "prompts_per_step", "mu")
        at_least(self, 0, "micro_batch_size", "ref_reset_steps")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.clip_eps is None:
            self.clip_eps = 0.2 if self.loss_type == "grpo" else 3e-4
        if self.clip_eps_high is None and self.loss_type == "gspo":
            self.clip_eps_high = 4e-4
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError(f"clip_eps_high must be positive, got {self.clip_eps_high}")
        one_of(self, "aggregation", ("sequence", "token", "dr_grpo"))
        one_of(self, "scale_rewards", ("group", "batch", "none"))
        if (self.server_base_url is None) != (self.server_model is None):
            raise ValueError("server_model must be given together with server_base_url")


@dataclasses.dataclass
class PPOConfig(RLConfig):
    """Everything a PPO run needs: the shared fields of RLConfig (data, rewards, optimiser, sampling, LoRA,
    evaluation) and these; `python -m training ppo --help` lists them all."""

    reward_model: str | None = setting(
        None, "A preflab reward model directory scoring (prompt, response): the RM score put on the last token.")
    critic: str | None = setting(
        None, "Separate critic: a causal-LM directory whose decoder carries the value head. None: the head sits on "
        "the policy's own hidden states (one forward, no second model; see training/value_head.py for the memory "
        "cost).")

    prompts_per_step: int = setting(64, "Prompts per step across all processes.")
    samples_per_prompt: int = setting(
        1, "Responses sampled per prompt; the rollout batch is prompts_per_step × samples_per_prompt.")
    minibatch_size: int = setting(
        16, "Responses per optimiser step (per process); the rollout batch is shuffled and cut into minibatches.")
    ppo_epochs: int = setting(4, "Passes over each rollout batch.")
    clip_eps: float = setting(0.2, "ε of the clipped policy ratio.")
    clip_value: float | None = setting(
        0.2, "ε of the clipped value loss (values stay within ±ε of the rollout values); None: unclipped.")
    vf_coef: float = setting(0.1, "c_v: weight of the value loss in L = L_policy + c_v·L_value − c_e·H.")
    ent_coef: float = setting(0.0, "c_e: weight of the entropy bonus.")
    gamma: float = setting(1.0, "γ: discount of GAE (1: the score at the end counts fully for every token).")
    lam: float = setting(0.95, "λ: GAE bias/variance trade-off (1: Monte-Carlo returns minus values; 0: one-step TD).")
    whiten_advantages: bool = setting(
        True, "Whiten the advantages over the batch's response tokens before the policy loss.")
    target_kl: float = setting(
        0.0, "Stop the epoch loop after the minibatch whose approx-KL to the rollout policy exceeds this (0: never).")

    kl_control: Literal["fixed", "adaptive"] = setting(
        "fixed", "β schedule: fixed, or adaptive towards kl_target (Ziegler et al. 2019).")
    beta: float = setting(
        0.05, "β: per-token KL penalty −β·(log π − log π_ref); the initial value under adaptive control (0: no "
        "penalty).")
    kl_target: float = setting(6.0, "Adaptive control: target sequence KL in nats (Ziegler et al. used 6).")
    kl_horizon: int = setting(
        10000, "Adaptive control: responses over which β moves by at most ±20% per target-relative error.")
    reward_clip: float = setting(0.0, "Clip the score to [−c, c] after normalisation (0: no clipping).")
    normalize_reward: bool = setting(
        False, "Divide the score by a running std and subtract a running mean (statistics of all scores so far).")
    missing_eos_penalty: float = setting(
        0.0, "Subtracted from the score of responses that run out of tokens without ending (EOS or stop string).")

    lr: float = setting(1e-5, "AdamW learning rate (policy and value model).")

    max_new_tokens: int = setting(128, "Longest response sampled.")

    hack_kl_threshold: float = setting(
        10.0, "Reward-hacking watch: warn when the score keeps rising while the sequence KL is above this (nats).")
    hack_window: int = setting(
        10, 'Steps over which "the score keeps rising" is judged (mean of the later half above the earlier half).')
    sample_every: int = setting(
        10, "Append a few rollouts (prompt, response, score, KL) to OUT/rollout_samples.jsonl every this many steps "
        "(0: never).")
    sample_rows: int = setting(4, "Rollouts written each time.")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "prompts_per_step", "samples_per_prompt", "minibatch_size", "ppo_epochs", "kl_horizon",
                 "hack_window", "sample_rows")
        at_least(self, 0, "sample_every", "beta", "ent_coef", "target_kl", "reward_clip", "missing_eos_penalty",
                 "reward_model_weight")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_value is not None and self.clip_value <= 0:
            raise ValueError(f"clip_value must be positive or None, got {self.clip_value}")
        if self.vf_coef <= 0:
            raise ValueError(f"vf_coef must be positive (the value model must learn), got {self.vf_coef}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        one_of(self, "kl_control", ("fixed", "adaptive"))
        if self.kl_control == "adaptive" and (self.kl_target <= 0 or self.beta <= 0):
            raise ValueError(f"kl_target and beta must be positive for adaptive KL control, got kl_target="
                             f"{self.kl_target}, beta={self.beta}")


@dataclasses.dataclass
class RFTConfig(RLConfig):
    """Rejection-sampling fine-tuning: sample N answers per prompt, keep the ones the reward accepts, fine-tune on
    them (SFT on the kept set). Offline, the samples come once from the starting model; online (DeepSeekMath's online
    RFT), every round resamples from the current policy. Both sample the same number of answers in all."""

    lr: float = setting(1e-5, "AdamW learning rate of the fine-tuning steps.")
    steps: int = setting(100, "Fine-tuning steps (batches of kept samples) in all.")
    samples_per_prompt: int = setting(8, "N: answers sampled per prompt.")
    prompts_per_round: int = setting(16, "Prompts sampled per round; a run has ceil(steps / steps_per_round) rounds.")
    steps_per_round: int = setting(
        10, "Fine-tuning steps between two rounds of sampling (online); offline, all rounds are sampled up front.")
    online: bool = setting(
        False, "Resample every round from the current policy (online RFT); false: sample every round's prompts once, "
        "from the starting model, before training (offline RFT).")
    keep: Literal["threshold", "top_k"] = setting(
        "threshold", "Which samples to keep: reward at least `threshold`, or the best `top_k` of each prompt.")
    threshold: float = setting(
        1.0, 'Smallest reward a kept sample has (keep = "threshold"); 1.0 keeps exact matches of a 0/1 reward.')
    top_k: int = setting(1, 'Samples kept per prompt (keep = "top_k"), the best first; ties broken by sampling order.')
    distinct: bool = setting(
        True, "Keep each distinct answer of a prompt once (identical samples would weigh that answer twice).")
    batch_size: int = setting(16, "Kept samples per fine-tuning step, across all processes.")
    max_length: int = setting(512, "Tokens per fine-tuning example (prompt + answer).")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "samples_per_prompt", "prompts_per_round", "steps_per_round", "top_k", "batch_size")
        one_of(self, "keep", ("threshold", "top_k"))
        if self.max_length < 8:
            raise ValueError(f"max_length must be at least 8 tokens, got {self.max_length}")

    def rounds(self) -> int:
        """Rounds of sampling in the run."""
        return -(-self.steps // self.steps_per_round)
