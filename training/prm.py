"""Process reward model: `PRMConfig`, the trainer, `ProcessRewardModel.load(dir).score_steps(...)`, and the `prm` CLI.

`python -m training prm --train PATH --model DIR --out DIR [--eval PATH] [--set k=v ...]` trains on a steps export
(TRL's stepwise layout: `prompt`, `completions` = the steps, `labels` = one boolean per step). Each step is followed
by the separator (`step_separator`) and a token-classification head scores the step at the separator's last token,
σ(s) being the probability that the step is correct; the loss is binary cross-entropy per labelled step
(`losses.step_bce_loss`), as in PRM800K (Lightman et al. 2023) and Math-Shepherd (Wang et al. 2024). It runs on the
shared loop (training/loop.py: checkpoints, resume, metrics.jsonl, eval.json, accelerate) and writes OUT/model with
`preflab_prm.json`, which keeps the separator and the rule that cuts a rollout into steps, so GRPO and best-of-N
split text exactly as the model was trained.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.cli import Command
from training.config import PRMConfig, check_step_pattern, require
from training.data import StepRow, Text, load_steps, render_prompt, train_and_heldout
from training.loop import BatchMethod, RunResult, run
from training.losses import step_bce_loss
from training.reward_model import (
    collate,
    default_model_path,
    disable_dropout,
    prepare_tokenizer_and_model,
    special_tokens,
)
from training.run_info import write_json
from training.weights import SAFE_LOAD, require_safetensors

META_FILE = "preflab_prm.json"


# ----------------------------------------------------------------------------------------------
# cutting text into steps


def split_steps(text: str, pattern: str = "") -> tuple[list[str], list[int]]:
    """The steps of a completion and the character offset where each ends (exclusive).

    `pattern` empty: one step per non-empty line; otherwise a regular expression whose matches separate steps (the
    app's project separator, `app/annotation/steps.py`, cuts the same way).
    Pieces that are only whitespace are no steps; what lies between two steps (the separator, blank lines) belongs
    to the earlier one, and the last step runs to the end of the text, so the offsets cover the whole completion.
    A text with no step gives ([], []).
    """
    separator = re.compile(pattern or r"\n")
    pieces, start = [], 0
    for match in separator.finditer(text):  # a lookahead matches empty: "(?=Step \d+:)" splits before each step
        pieces.append((start, match.start()))
        start = match.end()
    pieces.append((start, len(text)))
    kept = [(a, b) for a, b in pieces if text[a:b].strip()]
    steps = [text[a:b].strip() for a, b in kept]
    ends = [kept[j + 1][0] for j in range(len(kept) - 1)] + ([len(text)] if kept else [])
    return steps, ends


def separator_ids(tokenizer: Any, separator: str) -> list[int]:
    """The token ids put after every step: the separator's own tokens, or, when the tokenizer turns it into nothing
    (BERT's drops newlines), its separator token ([SEP]), else EOS, else UNK."""
    ids = tokenizer(separator, add_special_tokens=False)["input_ids"]
    if ids:
        return list(ids)
    for token_id in (tokenizer.sep_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id):
        if token_id is not None:
            return [token_id]
    raise ValueError(f"step_separator: {separator!r} is no token for this tokenizer, and it has no [SEP]/EOS token")


# ----------------------------------------------------------------------------------------------
# encoding: prompt, then every step followed by the separator; a label at each separator's last token


@dataclass
class EncodedSteps:
    """One encoded completion: its ids, the position of each step's label token, and how many steps fit."""

    ids: list[int]
    positions: list[int]
    """Index in `ids` of each kept step's scoring token; steps past `len(positions)` did not fit in max_length."""
    truncated: bool


class StepEncoder:
    """Turns (prompt, steps) into model input: the tokenizer's special tokens around the prompt's newest tokens and
    as many whole steps as fit in `max_length`, each step followed by the separator."""

    def __init__(self, tokenizer: Any, max_length: int, separator: str) -> None:
        self.tokenizer = tokenizer
        self.prefix, self.suffix = special_tokens(tokenizer)
        self.budget = max_length - len(self.prefix) - len(self.suffix)
        if self.budget < 2:
            raise ValueError(f"max_length={max_length} leaves no room next to the special tokens")
        self.separator = separator_ids(tokenizer, separator)

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def encode(self, prompts: Sequence[Text], steps: Sequence[Sequence[str]]) -> list[EncodedSteps]:
        """Every (prompt, steps) pair encoded; the oldest prompt tokens go first, then the last steps."""
        prompt_texts = [render_prompt(p, self.tokenizer) for p in prompts]
        unique = list(dict.fromkeys(prompt_texts))
        prompt_ids = dict(zip(unique, self._tokenize(unique), strict=True))
        flat = self._tokenize([s for row in steps for s in row])
        out, k = [], 0
        for prompt, row in zip(prompt_texts, steps, strict=True):
            step_ids = [ids + self.separator for ids in flat[k:k + len(row)]]
            k += len(row)
            out.append(self._one(prompt_ids[prompt], step_ids))
        return out

    def _one(self, prompt: list[int], step_ids: list[list[int]]) -> EncodedSteps:
        kept, used = [], 0
        for ids in step_ids:
            if used + len(ids) > self.budget:
                break
            kept.append(ids)
            used += len(ids)
        room = self.budget - used
        head = prompt[-room:] if room > 0 else []  # the prompt's newest tokens
        ids, positions = self.prefix + head, []
        for step in kept:
            ids = ids + step
            positions.append(len(ids) - 1)
        return EncodedSteps(ids=ids + self.suffix, positions=positions,
                            truncated=len(kept) < len(step_ids) or len(head) < len(prompt))


def _batch(encoded: Sequence[EncodedSteps], pad_token_id: int, device: torch.device) -> dict[str, Tensor]:
    return collate([e.ids for e in encoded], pad_token_id, device)


@torch.no_grad()
def score_encoded(model: Any, encoded: Sequence[EncodedSteps], pad_token_id: int, batch_size: int,
                  device: torch.device) -> list[list[float]]:
    """σ(s) at every kept step of every encoded completion, batched longest first so each batch pads little."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i].ids))
    out: list[list[float]] = [[] for _ in encoded]
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        logits = model(**_batch([encoded[i] for i in chunk], pad_token_id, device)).logits[..., 0].float()  # (b, L)
        probs = torch.sigmoid(logits).cpu()
        for row, i in enumerate(chunk):
            out[i] = probs[row, encoded[i].positions].tolist()
    return out


# ----------------------------------------------------------------------------------------------
# the scoring API used by GRPO and best-of-N


class ProcessRewardModel:
    """A trained PRM: `ProcessRewardModel.load(dir).score_steps(prompts, steps)` → per completion, one score in
    [0, 1] per step (the probability that the step is correct); `score_text` cuts completions into steps first."""

    def __init__(self, model: Any, tokenizer: Any, max_length: int = 512, step_separator: str = "\n",
                 step_pattern: str = "", threshold: float = 0.5, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        prepare_tokenizer_and_model(tokenizer, model)
        self.encoder = StepEncoder(tokenizer, max_length, step_separator)
        self.step_pattern = step_pattern
        self.threshold = threshold

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None) -> ProcessRewardModel:
        """Load a directory written by the `prm` trainer."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        path = Path(path)
        if not (path / META_FILE).is_file():
            raise ValueError(f"process_reward_model: {path} is not a process reward model (no {META_FILE}; train "
                             "one with `python -m training prm`)")
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        require_safetensors(path, "process reward model")
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForTokenClassification.from_pretrained(str(path), num_labels=1, **SAFE_LOAD)
        return cls(model, tokenizer, max_length=int(meta.get("max_length", 512)),
                   step_separator=str(meta.get("step_separator", "\n")), step_pattern=str(meta.get("step_pattern", "")),
                   threshold=float(meta.get("threshold", 0.5)), device=device)

    def split(self, text: str) -> tuple[list[str], list[int]]:
        """The steps of `text` and their end offsets, by the rule the model was trained with."""
        return split_steps(text, self.step_pattern)

    @torch.no_grad()
    def score_steps(self, prompts: Sequence[Text], steps: Sequence[Sequence[str]], batch_size: int = 32
                    ) -> list[list[float]]:
        """Per (prompt, steps), the score of each step; NaN for steps beyond max_length (the model never saw them)."""
        if len(prompts) != len(steps):
            raise ValueError(f"got {len(prompts)} prompts and {len(steps)} step lists")
        encoded = self.encoder.encode(prompts, steps)
        scores = score_encoded(self.model, encoded, self.tokenizer.pad_token_id, batch_size, self.device)
        return [s + [math.nan] * (len(row) - len(s)) for s, row in zip(scores, steps, strict=True)]

    def score_text(self, prompts: Sequence[Text], completions: Sequence[str], batch_size: int = 32
                   ) -> list[list[float]]:
        """Per completion, the score of each of its steps (`split`); a completion without steps gets []."""
        return self.score_steps(prompts, [self.split(c)[0] for c in completions], batch_size=batch_size)


def aggregate(scores: Sequence[float], how: str) -> float:
    """One figure for a whole solution from its step scores: "min" (the weakest step, PRM800K's choice) or "product"
    (the probability that every step is correct); NaN steps are left out; no step at all scores 0."""
    known = [s for s in scores if not math.isnan(s)]
    if not known:
        return 0.0
    if how == "min":
        return min(known)
    if how == "product":
        return math.prod(known)
    raise ValueError(f"aggregate must be 'min' or 'product', got {how!r}")


# ----------------------------------------------------------------------------------------------
# metrics


def first_error(flags: Sequence[bool]) -> int:
    """Index of the first False step, or len(flags) when every step is correct."""
    return next((j for j, ok in enumerate(flags) if not ok), len(flags))


def step_metrics(scores: Sequence[Sequence[float]], labels: Sequence[Sequence[bool]], groups: Sequence[Any],
                 threshold: float = 0.5) -> dict[str, Any]:
    """Held-out figures of a PRM: `step_accuracy` over the scored steps; `first_error_accuracy`, the share of whole
    (untruncated) completions whose first predicted wrong step (score < threshold, or none) is the labelled one;
    `pairs`, the (all-correct, has-an-error) completion pairs of one prompt (`groups`), and `pair_accuracy`, the
    share where the correct one's weakest step outscores the other's (ties half); `loss`, the BCE per step."""
    right = total = whole = first_right = 0
    loss = 0.0
    for s, y in zip(scores, labels, strict=True):
        for p, label in zip(s, y, strict=False):
            right += (p >= threshold) == label
            total += 1
            p = min(max(p, 1e-7), 1 - 1e-7)
            loss -= math.log(p) if label else math.log(1 - p)
        if len(s) == len(y):
            whole += 1
            first_right += first_error([p >= threshold for p in s]) == first_error(y)
    by_group: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(json.dumps(g, sort_keys=True) if not isinstance(g, str) else g, []).append(i)
    pairs, pair_right = 0, 0.0
    for members in by_group.values():
        good = [aggregate(scores[i], "min") for i in members if all(labels[i])]
        bad = [aggregate(scores[i], "min") for i in members if not all(labels[i])]
        for a in good:
            for b in bad:
                pairs += 1
                pair_right += 1.0 if a > b else 0.5 if a == b else 0.0
    return {"step_accuracy": right / total if total else 0.0,
            "first_error_accuracy": first_right / whole if whole else 0.0,
            "pairs": pairs, "pair_accuracy": pair_right / pairs if pairs else None,
            "loss": loss / total if total else 0.0, "labelled_steps": total, "completions": len(scores),
            "correct_step_fraction": sum(map(sum, labels)) / max(sum(map(len, labels)), 1)}


# ----------------------------------------------------------------------------------------------
# the trainer


@dataclass
class EncodedSet:
    """A step-labelled set ready for training or evaluation."""

    rows: list[StepRow]
    encoded: list[EncodedSteps]
    truncated: int = 0
    labelled: list[int] = field(default_factory=list)
    """Steps that fit in max_length, per completion: what the loss and the metrics cover."""


def encode_set(rows: Sequence[StepRow], encoder: StepEncoder) -> EncodedSet:
    encoded = encoder.encode([r.prompt for r in rows], [r.completions for r in rows])
    return EncodedSet(rows=list(rows), encoded=encoded, truncated=sum(e.truncated for e in encoded),
                      labelled=[len(e.positions) for e in encoded])


class PRMTrainer(BatchMethod):
    """The process reward model on the shared loop: a token-classification model with one output, trained with
    binary cross-entropy at each step's separator token."""

    name = "prm"
    config: PRMConfig

    def __init__(self, config: PRMConfig, train_rows: Sequence[StepRow], eval_rows: Sequence[StepRow] | None = None,
                 accelerator: Any = None) -> None:
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        if not train_rows:
            raise ValueError("train: no step-labelled completions")
        super().__init__(config, accelerator)  # seeds: the new head's initialisation repeats
        self.model_path = config.model or default_model_path()
        require_safetensors(self.model_path, "model")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForTokenClassification.from_pretrained(self.model_path, num_labels=1, **SAFE_LOAD)
        prepare_tokenizer_and_model(self.tokenizer, model)
        if config.disable_dropout:
            disable_dropout(model)
        self.encoder = StepEncoder(self.tokenizer, config.max_length, config.step_separator)
        self.pad_id = self.tokenizer.pad_token_id
        self.train = encode_set(train_rows, self.encoder)
        self.heldout = encode_set(eval_rows, self.encoder) if eval_rows else None
        if self.accelerator.is_main_process and self.train.truncated:
            print(f"{self.train.truncated} of {len(self.train.rows)} training completions exceed max_length="
                  f"{config.max_length} tokens: the prompt lost its oldest tokens, steps that did not fit are not "
                  "trained on", file=sys.stderr)
        self.set_lengths([len(e.ids) for e in self.train.encoded])
        self.prepare(model)

    def batch_loss(self, local: list[int], global_batch: list[int]) -> tuple[Tensor, dict[str, float]]:
        device = self.accelerator.device
        encoded = [self.train.encoded[i] for i in local]
        batch = _batch(encoded, self.pad_id, device)
        y = torch.zeros(batch["input_ids"].shape, device=device)
        mask = torch.zeros_like(y)
        for row, i in enumerate(local):
            e = self.train.encoded[i]
            labels = self.train.rows[i].labels[:len(e.positions)]
            y[row, e.positions] = torch.tensor(labels, dtype=torch.float32, device=device)
            mask[row, e.positions] = 1.0
        s = self.model(**batch).logits[..., 0].float()  # (b, L)
        # each process divides by the global step count over the processes: DDP's mean is the global step mean
        steps = sum(self.train.labelled[i] for i in global_batch)
        loss = step_bce_loss(s, y, mask, num_steps=max(steps, 1) / self.accelerator.num_processes)
        correct = (((s >= 0) == (y > 0.5)).float() * mask).sum()
        counts = self.accelerator.reduce(torch.stack([correct.detach(), mask.sum()]), reduction="sum")
        return loss, {"step_accuracy": (counts[0] / counts[1].clamp(min=1)).item()}

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any]:
        """Step, first-error and pair figures on the held-out completions (the training ones when there are none)."""
        from accelerate.utils import gather_object

        data = self.heldout if self.heldout is not None else self.train
        acc = self.accelerator
        local = list(range(acc.process_index, len(data.encoded), acc.num_processes))  # every process scores a shard
        self.model.eval()
        with acc.autocast():
            scores = score_encoded(self.unwrapped(), [data.encoded[i] for i in local], self.pad_id,
                                   self.config.eval_batch_size, acc.device)
        self.model.train()
        gathered = dict(gather_object(list(zip(local, scores, strict=True))))
        ordered = [gathered[i] for i in range(len(data.encoded))]
        result = step_metrics(ordered, [r.labels for r in data.rows], [r.prompt for r in data.rows],
                              self.config.threshold)
        result.update(split="heldout" if self.heldout is not None else "train", truncated=data.truncated,
                      train_completions=len(self.train.rows))
        return result

    def eval_row(self, result: dict[str, Any]) -> dict[str, float]:
        return super().eval_row({k: v for k, v in result.items() if k != "train_completions"})

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        c = self.config
        model: Any = self.unwrapped()  # save_pretrained is the transformers model's own, not nn.Module's
        model.save_pretrained(str(path), state_dict=state_dict)
        self.tokenizer.save_pretrained(str(path))
        write_json(path / META_FILE, {"kind": "prm", "max_length": c.max_length, "step_separator": c.step_separator,
                                      "separator_ids": self.encoder.separator, "step_pattern": c.step_pattern,
                                      "threshold": c.threshold})


def train_prm(config: PRMConfig, train_rows: Sequence[StepRow], eval_rows: Sequence[StepRow] | None = None,
              data_paths: dict[str, Any] | None = None) -> RunResult:
    """Train on `train_rows`, evaluate on `eval_rows` (or the training completions), write OUT (config.out)."""
    require(config, "out")
    if config.step_pattern:
        check_step_pattern(config.step_pattern, "step_pattern")
    return run(PRMTrainer(config, train_rows, eval_rows or None), data=data_paths)


def train(config: PRMConfig) -> RunResult:
    """The `prm` command: completions from `config.train` (its held-out split, or `config.eval`), trained into OUT."""
    require(config, "train", "out")
    train_rows, eval_rows = train_and_heldout(load_steps, config.train, config.eval)
    return train_prm(config, train_rows, eval_rows, data_paths={"train": config.train, "eval": config.eval or None})


COMMAND = Command(
    name="prm", config=PRMConfig, description=__doc__.splitlines()[0], train=train,
    summary=cli.eval_summary("step_accuracy", "first_error_accuracy", "pairs", "pair_accuracy", "loss", "steps"),
    flags=cli.data_flags("steps export (prompt, completions = steps, labels)",
                         "model directory (default: the shipped MiniLM)"))


def main(argv: list[str] | None = None) -> int:
    return cli.main(COMMAND, argv)
