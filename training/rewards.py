"""Reward functions for RL: loading them by import path, built-ins, weighted combination, process rewards.

A reward function is `fn(prompts, completions, **row) -> list[float]`, where every keyword argument
is a column of the prompts export aligned with `completions` (`reference`, and any extra fields).
It may return `None` for a completion it has no opinion on (it then counts 0 in the weighted
sum), or, for process supervision, a list of per-step scores per completion, steps being the
newline-separated lines of the completion, or the steps of a process reward model (`process_reward_model_fn`),
which cuts completions the way it was trained.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

RewardFn = Callable[..., list[Any]]

# ---------------------------------------------------------------------------------------------
# built-ins

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"


def _normalise_number(text: str) -> Decimal | None:
    """'1,234.50' → Decimal('1234.5'); '$42.' → 42; anything unparsable → None."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def parse_reference(reference: str | float | int | None) -> Decimal | None:
    """The answer of a GSM8K-style reference: after `####`, after `A:`/`Answer:`, else its last number."""
    if reference is None:
        return None
    if isinstance(reference, int | float):
        return _normalise_number(str(reference))
    text = str(reference)
    for pattern in (rf"####\s*({_NUMBER})", rf"(?:^|\n)\s*(?:A|Answer)\s*:\s*({_NUMBER})"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            return _normalise_number(found[-1])
    return extract_final_number(text)


def extract_final_number(completion: str) -> Decimal | None:
    """The final answer of a free-form solution: the `#### x` line, "the answer is x", `A: x`, `\\boxed{x}`,
    else the last number in the text."""
    for pattern in (rf"####\s*({_NUMBER})", rf"answer\s+is\s*:?\s*({_NUMBER})",
                    rf"(?:^|\n)\s*(?:A|Answer)\s*:\s*({_NUMBER})", rf"\\boxed\{{\s*({_NUMBER})\s*\}}"):
        found = re.findall(pattern, completion, flags=re.IGNORECASE)
        if found:
            return _normalise_number(found[-1])
    numbers = re.findall(_NUMBER, completion)
    return _normalise_number(numbers[-1]) if numbers else None


def gsm8k_exact_match(prompts: Sequence[Any], completions: Sequence[str], reference: Sequence[Any] | None = None,
                      **row: Any) -> list[float | None]:
    """1.0 when the completion's final number equals the reference answer, else 0.0; None without a reference."""
    if reference is None:
        return [None] * len(completions)
    scores: list[float | None] = []
    for completion, ref in zip(completions, reference, strict=True):
        expected = parse_reference(ref)
        if expected is None:
            scores.append(None)
            continue
        got = extract_final_number(completion)
        scores.append(1.0 if got is not None and got == expected else 0.0)
    return scores


DEFAULT_FORMAT = r"(?s).*####\s*-?[\d,.]+\s*$"


def format_regex(prompts: Sequence[Any], completions: Sequence[str], pattern: str = DEFAULT_FORMAT,
                 **row: Any) -> list[float]:
    """1.0 when the whole completion matches `pattern` (default: ends with a `#### number` line), else 0.0."""
    compiled = re.compile(pattern)
    return [1.0 if compiled.fullmatch(c.strip()) else 0.0 for c in completions]


def length_penalty(prompts: Sequence[Any], completions: Sequence[str], max_length: int = 1024, cache: int = 256,
                   **row: Any) -> list[float]:
    """DAPO's soft overlong punishment in characters (Yu et al. 2025): 0 up to max_length − cache,
    then falling linearly to −1 at max_length, −1 beyond."""
    if not 0 <= cache <= max_length:
        raise ValueError(f"length_penalty: cache must be in [0, max_length={max_length}], got {cache}")
    scores = []
    for completion in completions:
        n = len(completion)
        if n <= max_length - cache:
            scores.append(0.0)
        elif n <= max_length and cache > 0:
            scores.append((max_length - cache - n) / cache)
        else:
            scores.append(-1.0)
    return scores


BUILTINS: dict[str, RewardFn] = {
    "gsm8k_exact_match": gsm8k_exact_match,
    "format_regex": format_regex,
    "length_penalty": length_penalty,
}

# ---------------------------------------------------------------------------------------------
# loading and combining


def load_reward_fn(spec: str) -> RewardFn:
    """`module:function`, `path/to/file.py:function`, or a built-in name (`gsm8k_exact_match`)."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward_fn {spec!r}: expected module:function or one of {', '.join(BUILTINS)}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ValueError(f"reward_fn {spec!r}: no file {path}")
            module_spec = importlib.util.spec_from_file_location(f"preflab_reward_{path.stem}", path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward_fn {spec!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward_fn {spec!r}: {module_name} has no function {attr!r}")
    return fn


def reward_model_fn(path: str | Path, batch_size: int = 32, device: str | torch.device | None = None) -> RewardFn:
    """A reward function scoring (prompt, completion) with a preflab reward model directory."""
    from training.reward_model import RewardModel

    model = RewardModel.load(path, device=device)

    def score(prompts: Sequence[Any], completions: Sequence[str], **row: Any) -> list[float]:
        return [float(s) for s in model.score(list(prompts), list(completions), batch_size=batch_size)]

    score.__name__ = "reward_model"
    return score


def process_reward_model_fn(path: str | Path, batch_size: int = 32, device: str | torch.device | None = None
                            ) -> tuple[RewardFn, Callable[[str], list[int]]]:
    """A process reward function scoring every step of a completion with a preflab PRM directory, and the step
    splitter it scores by (the rule the PRM was trained with, from its `preflab_prm.json`).

    A completion without a step is one empty step scored 0; a step past the PRM's max_length takes the score of the
    last step it saw (0 if none)."""
    from training.prm import ProcessRewardModel

    model = ProcessRewardModel.load(path, device=device)

    def ends(completion: str) -> list[int]:
        return model.split(completion)[1] or [len(completion)]

    def score(prompts: Sequence[Any], completions: Sequence[str], **row: Any) -> list[list[float]]:
        scored = model.score_text(list(prompts), list(completions), batch_size=batch_size)
        out = []
        for steps in scored:
            filled, last = [], 0.0
            for value in steps:
                last = last if math.isnan(value) else value
                filled.append(last)
            out.append(filled or [0.0])
        return out

    score.__name__ = "process_reward_model"
    return score, ends


@dataclass
class RewardFunction:
    """One weighted term of the total reward."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    step_split: Callable[[str], list[int]] | None = None
    """For a process reward: how it cuts a completion into steps (end offsets); None: newline-separated steps."""


def build_reward_functions(specs: Sequence[str] = (), weights: Sequence[float] | None = None,
                           kwargs: dict[str, dict[str, Any]] | None = None, reward_model: str | Path | None = None,
                           reward_model_weight: float = 1.0, process_reward_model: str | Path | None = None,
                           process_reward_weight: float = 1.0) -> list[RewardFunction]:
    """Load reward functions by spec, bind per-function keyword arguments (`kwargs[name]`), attach weights; a
    reward model and a process reward model (per-step scores) join them when given."""
    if weights is not None and len(weights) != len(specs):
        raise ValueError(f"reward_weights: {len(weights)} weights for {len(specs)} reward functions")
    kwargs = kwargs or {}
    out = []
    for i, spec in enumerate(specs):
        fn = load_reward_fn(spec)
        name = spec.rpartition(":")[2] or spec
        bound = kwargs.get(spec) or kwargs.get(name)
        if bound:
            fn = functools.partial(fn, **bound)
        out.append(RewardFunction(name=name, fn=fn, weight=1.0 if weights is None else float(weights[i])))
    if reward_model is not None:
        out.append(RewardFunction(name="reward_model", fn=reward_model_fn(reward_model), weight=reward_model_weight))
    if process_reward_model is not None:
        fn, split = process_reward_model_fn(process_reward_model)
        out.append(RewardFunction(name="process_reward_model", fn=fn, weight=process_reward_weight, step_split=split))
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ValueError(f"reward functions must have distinct names, got {names}")
    if not out:
        raise ValueError("no reward: give at least one reward_fn, a reward_model or a process_reward_model")
    return out


@dataclass
class RewardResult:
    """Scores of a batch of completions."""

    total: Tensor
    """(N,) weighted sum of outcome scores (per-step scores summed), the sequence reward."""
    per_function: dict[str, Tensor]
    """name → (N,) raw score of each function, NaN where it returned None."""
    steps: list[list[float]] | None = None
    """Per completion, the weighted reward of each step when a function returned per-step scores."""
    step_ends: list[list[int]] | None = field(default=None)
    """Per completion, the character offset where each step ends (exclusive)."""
    outcome: Tensor | None = field(default=None)
    """(N,) weighted sum of the functions that score whole answers (one number each), beside per-step scores; None
    when every function scored steps, or none did."""
    process_steps: list[list[float]] | None = field(default=None)
    """Per completion, the weighted per-step scores of the process functions alone (`steps` less the outcome)."""


def split_steps(completion: str) -> list[int]:
    """End offsets of the newline-separated steps of a completion (the last step runs to the end)."""
    ends = [m.end() for m in re.finditer(r"\n", completion)]
    if not ends or ends[-1] < len(completion):
        ends.append(len(completion))
    return ends


def compute_rewards(functions: Sequence[RewardFunction], prompts: Sequence[Any], completions: Sequence[str],
                    columns: Mapping[str, Sequence[Any]] | None = None) -> RewardResult:
    """Call every reward function on the batch and combine: total = Σ_f w_f · r_f (None counts 0).

    When any function returns per-step lists, the outcome scores are put on each completion's last
    step, so `steps` carries every function's contribution for process advantages; `process_steps` and `outcome`
    keep the two apart for the credit forms that read them separately.
    """
    columns = columns or {}
    n = len(completions)
    per_function: dict[str, Tensor] = {}
    total = torch.zeros(n, dtype=torch.float64)
    step_lists: list[list[float]] | None = None
    outcome = torch.zeros(n, dtype=torch.float64)  # the functions that scored whole answers
    outcomes = 0
    splitters = {f.step_split for f in functions if f.step_split is not None}
    if len(splitters) > 1:
        raise ValueError("process rewards that cut completions into steps differently cannot be combined")
    splitter = splitters.pop() if splitters else split_steps
    step_ends = [splitter(c) for c in completions]
    what = "newline-separated steps" if splitter is split_steps else "steps (as its process reward model cuts them)"
    for f in functions:
        raw = f.fn(list(prompts), list(completions), **{k: list(v) for k, v in columns.items()})
        if len(raw) != n:
            raise ValueError(f"reward function {f.name} returned {len(raw)} scores for {n} completions")
        is_process = any(isinstance(r, list | tuple) for r in raw)
        if is_process:
            if step_lists is None:
                step_lists = [[0.0] * len(e) for e in step_ends]
            sums = []
            for i, r in enumerate(raw):
                steps = [float(x) for x in (r or [])]
                if len(steps) != len(step_ends[i]):
                    raise ValueError(f"reward function {f.name} gave {len(steps)} step scores for completion {i}, "
                                     f"which has {len(step_ends[i])} {what}")
                for j, s in enumerate(steps):
                    step_lists[i][j] += f.weight * s
                sums.append(sum(steps))
            scores = torch.tensor(sums, dtype=torch.float64)
        else:
            scores = torch.tensor([math.nan if r is None else float(r) for r in raw], dtype=torch.float64)
            outcomes += 1
            outcome += f.weight * torch.nan_to_num(scores, nan=0.0)
        per_function[f.name] = scores
        total += f.weight * torch.nan_to_num(scores, nan=0.0)
    if step_lists is None:
        return RewardResult(total=total.float(), per_function={k: v.float() for k, v in per_function.items()})
    process_only = [list(steps) for steps in step_lists]
    # outcome functions score the whole answer: their weighted part of the total lands on the last step
    for i in range(n):
        step_lists[i][-1] += float(outcome[i])
    return RewardResult(total=total.float(), per_function={k: v.float() for k, v in per_function.items()},
                        steps=step_lists, step_ends=step_ends, outcome=outcome.float() if outcomes else None,
                        process_steps=process_only)
