"""How long a run will take, before it starts: the work its config implies (tokens decoded, read and trained on,
optimiser steps, evaluation), priced at this machine's measured speed on the run's model (`training.speed`).

Torch-free, so the web app prices a run while its form is being filled in. The work is counted as the trainers do
it (`training/grpo.py`, `ppo.py`, `rft.py`, `loop.py`, `evaluate.py`): decoding runs to `max_new_tokens` (a batch
stops only when every row has ended, and with a few rows one rarely has not), training passes read prompt and
response padded to the batch's longest, and an RL run's last evaluation samples the reference as well as the
policy. What the figures leave out (a slower disk, a machine busy with other work) the estimate cannot know.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

EVAL_BATCH_PROMPTS = 64
"""Held-out prompts per generation call of an evaluation (training.evaluate.EvalConfig.batch_size)."""
RESPONSE_TOKENS = 200
"""Tokens assumed of a response when an export holds none to count (a pairs or SFT file that could not be read)."""
PROMPT_TOKENS = 100
"""Tokens assumed of a prompt when the export's prompts could not be read."""


@dataclass(frozen=True)
class Speed:
    """This machine's measured unit costs on one model, in seconds (`python -m training speed`)."""

    start_s: float
    """Start a trainer: import torch and transformers, load the model."""
    forward_token_s: float
    """A token of a forward pass without gradients (reference log-probs, evaluation, prompts read before decoding)."""
    train_token_s: float
    """A token of a forward and backward pass."""
    optimizer_s: float
    """One AdamW step over every weight."""
    decode_step_s: float
    """A decoding step's fixed cost, however many rows it decodes."""
    decode_row_s: float
    """Each row's share of a decoding step."""
    save_s: float
    """Writing the trained model."""
    chars_per_token: float = 4.0
    """Characters of ordinary text per token of this model's tokenizer."""
    template_tokens: float = 0.0
    """Tokens the chat template adds around a prompt."""

    @classmethod
    def from_dict(cls, figures: Mapping[str, Any]) -> Speed:
        """The figures `training.speed` wrote; ValueError naming a missing or unusable one."""
        values: dict[str, float] = {}
        for f in fields(cls):
            if f.name not in figures:
                if f.default is not MISSING:  # a figure that files from before it was measured lack
                    continue
                raise ValueError(f"{f.name}: missing from the speed figures")
            value = figures[f.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{f.name}: must be a non-negative number, got {value!r}")
            values[f.name] = float(value)
        return cls(**values)


@dataclass(frozen=True)
class Data:
    """What the estimate needs of a run's export."""

    train_rows: int
    """Rows a run trains on (pairs, SFT rows, prompts, step-labelled answers)."""
    heldout_rows: int
    """Rows held out for evaluation."""
    prompt_chars: float = PROMPT_TOKENS * 4.0
    """Mean characters of a row's prompt."""
    response_chars: float = RESPONSE_TOKENS * 4.0
    """Mean characters of a row's response (each of a pair's two); unused by methods that sample their own."""


@dataclass(frozen=True)
class Phase:
    """One part of a run: its name, its seconds, and how they were counted, in words."""

    name: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Estimate:
    """A run's time, part by part."""

    steps: int
    phases: tuple[Phase, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


class _Price:
    """The unit costs, applied to a run's shapes."""

    def __init__(self, speed: Speed, data: Data, config: Mapping[str, Any]) -> None:
        self.speed = speed
        limit = int(config.get("max_prompt_length") or 0)
        prompt = data.prompt_chars / speed.chars_per_token + speed.template_tokens
        self.prompt = min(prompt, limit) if limit else prompt
        self.response = data.response_chars / speed.chars_per_token

    def forward(self, tokens: float) -> float:
        return tokens * self.speed.forward_token_s

    def train(self, tokens: float) -> float:
        return tokens * self.speed.train_token_s

    def decode(self, prompts: int, rows: int, new_tokens: int) -> float:
        """Read `prompts` prompts once, then decode `new_tokens` steps of `rows` rows."""
        steps = new_tokens * (self.speed.decode_step_s + rows * self.speed.decode_row_s)
        return self.forward(prompts * self.prompt) + steps


def _rl_evaluation(price: _Price, config: Mapping[str, Any], data: Data, steps: int) -> Phase | None:
    """The held-out evaluation of a method that samples: K answers and a greedy one per prompt from the policy, the
    KL between policy and reference on the policy's answers, and once, the same answers from the reference."""
    prompts = data.heldout_rows
    if config.get("eval_max_prompts"):
        prompts = min(prompts, int(config["eval_max_prompts"]))
    if prompts <= 0:
        return None
    k, new = int(config.get("eval_k") or 4), int(config["max_new_tokens"])
    side = price.decode(prompts, prompts, new)  # the greedy answer
    for start in range(0, prompts, EVAL_BATCH_PROMPTS):
        chunk = min(EVAL_BATCH_PROMPTS, prompts - start)
        side += price.decode(chunk, chunk * k, new)
    kl = 2 * price.forward(prompts * k * (price.prompt + new))
    every = int(config.get("eval_every") or 0)
    evaluations = 1 + ((steps - 1) // every if every else 0)
    seconds = evaluations * (side + kl) + side  # the reference side once: it does not change
    times = f"{evaluations} evaluations" if evaluations > 1 else "one evaluation"
    return Phase("evaluation", seconds, f"{times} on {prompts} held-out prompts: {k} sampled and one greedy answer "
                                        f"each, from the policy and (once) the reference")


def _grpo(price: _Price, config: Mapping[str, Any], data: Data) -> tuple[int, list[Phase]]:
    steps = int(config["steps"])
    prompts, group, new = int(config["prompts_per_step"]), int(config["group_size"]), int(config["max_new_tokens"])
    rows, length = prompts * group, price.prompt + new
    sample = price.decode(prompts, rows, new)
    update = int(config.get("mu") or 1) * (price.train(rows * length) + price.speed.optimizer_s)
    if float(config.get("beta") or 0) > 0 or config.get("kl_metric", True):
        update += price.forward(rows * length)  # the reference's log-probs
    detail = (f"{steps} steps × {sample + update:.0f} s: {prompts} prompts × {group} answers of up to {new} tokens "
              f"({sample:.0f} s), then the update ({update:.0f} s)")
    return steps, [Phase("training", steps * (sample + update), detail)]


def _ppo(price: _Price, config: Mapping[str, Any], data: Data) -> tuple[int, list[Phase]]:
    steps = int(config["steps"])
    prompts, new = int(config["prompts_per_step"]), int(config["max_new_tokens"])
    rows, length = prompts * int(config.get("samples_per_prompt") or 1), price.prompt + new
    sample = price.decode(prompts, rows, new) + 2 * price.forward(rows * length)  # then reference and values
    minibatches = math.ceil(rows / max(1, int(config.get("minibatch_size") or rows)))
    epochs = int(config.get("ppo_epochs") or 1)
    update = epochs * (price.train(rows * length) + minibatches * price.speed.optimizer_s)
    detail = (f"{steps} steps × {sample + update:.0f} s: {rows} answers of up to {new} tokens ({sample:.0f} s), "
              f"then {epochs} passes over them ({update:.0f} s)")
    return steps, [Phase("training", steps * (sample + update), detail)]


def _rft(price: _Price, config: Mapping[str, Any], data: Data) -> tuple[int, list[Phase]]:
    steps = int(config["steps"])
    rounds = -(-steps // max(1, int(config.get("steps_per_round") or steps)))
    prompts, new = int(config["prompts_per_round"]), int(config["max_new_tokens"])
    rows = prompts * int(config["samples_per_prompt"])
    sample = rounds * price.decode(prompts, rows, new)
    length = min(price.prompt + new, int(config.get("max_length") or 512))
    tune = steps * (price.train(int(config["batch_size"]) * length) + price.speed.optimizer_s)
    return steps, [Phase("sampling", sample, f"{rounds} rounds × {rows} answers of up to {new} tokens"),
                   Phase("training", tune, f"{steps} fine-tuning steps of {config['batch_size']} kept answers")]


def _offline(kind: str, price: _Price, config: Mapping[str, Any], data: Data) -> tuple[int, list[Phase]]:
    """Reward, PRM, SFT and DPO: batches over the export's rows, epochs of them unless `steps` is set, and the
    held-out loss at the end (and every `eval_every` steps)."""
    batch = int(config.get("batch_size") or 16)
    steps = int(config.get("steps") or 0) or max(1, math.ceil(float(config.get("epochs") or 1) * data.train_rows
                                                              / batch))
    texts = 2 if kind in ("reward", "dpo") else 1  # a pair's chosen and rejected answers
    length = min(price.prompt + price.response, int(config.get("max_length") or 512))
    per_step = price.train(batch * texts * length) + price.speed.optimizer_s
    if kind == "dpo":
        per_step += price.forward(batch * texts * length)  # the reference's log-probs
    every = int(config.get("eval_every") or 0)
    evaluations = 1 + ((steps - 1) // every if every else 0)
    evaluation = evaluations * price.forward(data.heldout_rows * texts * length) * (2 if kind == "dpo" else 1)
    phases = [Phase("training", steps * per_step, f"{steps} steps × {per_step:.1f} s: {batch} rows of about "
                                                  f"{length:.0f} tokens" + (" (two answers each)" if texts == 2
                                                                            else ""))]
    if data.heldout_rows:
        phases.append(Phase("evaluation", evaluation, f"the held-out loss on {data.heldout_rows} rows"
                                                      + (f", {evaluations} times" if evaluations > 1 else "")))
    return steps, phases


def estimate(kind: str, config: Mapping[str, Any], data: Data, speed: Speed) -> Estimate:
    """The run's seconds, part by part: starting (imports, loading the model), training, evaluation, saving.

    `config` is the run's resolved config as a mapping (every field, defaults filled in); `speed` the figures
    measured on the run's own model."""
    price = _Price(speed, data, config)
    if kind == "grpo":
        steps, work = _grpo(price, config, data)
    elif kind == "ppo":
        steps, work = _ppo(price, config, data)
    elif kind == "rft":
        steps, work = _rft(price, config, data)
    elif kind in ("reward", "prm", "sft", "dpo"):
        steps, work = _offline(kind, price, config, data)
    else:
        raise ValueError(f"kind: no estimate for {kind!r}")
    if kind in ("grpo", "ppo", "rft"):
        evaluation = _rl_evaluation(price, config, data, steps)
        work += [evaluation] if evaluation is not None else []
    start = Phase("start", speed.start_s, "loading the libraries and the model")
    return Estimate(steps=steps, phases=(start, *work, Phase("saving", speed.save_s, "writing the trained model")))
