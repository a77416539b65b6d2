"""Held-out evaluation of a policy against its reference: reward, KL, win rate, Pass@K and Maj@K.

`evaluate(...)` is called by the trainers during and after training; `main(argv)` is
`python -m training evaluate`, which compares two model directories and writes OUT/eval.json
and OUT/samples.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.config import field_docs, load_config, setting, setting_factory
from training.data import PromptRow
from training.policy import Reference, Rollouts, batched_logprobs, generate_rollouts
from training.rewards import RewardFunction, compute_rewards, extract_final_number, parse_reference


@dataclass
class EvalConfig:
    """Settings of one held-out evaluation."""

    k: int = setting(4, "Samples per prompt: Pass@K, Maj@K and the sampled accuracy are computed from these K.")
    temperature: float = setting(1.0, "Sampling temperature for the K samples.")
    top_p: float = setting(1.0, "Nucleus sampling threshold for the K samples.")
    max_new_tokens: int = setting(256, "Longest response sampled.")
    max_prompts: int = setting(0, "Evaluate at most this many prompts (0: all).")
    stop: list[str] = setting_factory(list, "Strings that end a response.")
    seed: int = setting(1234, "Sampling seed, so policy and reference are compared on the same random stream.")
    batch_size: int = setting(64, "Prompts per generation call.")
    greedy: bool = setting(True, "Also decode greedily once per prompt and report `greedy_accuracy`.")
    best_of_n: bool = setting(
        False, "Best-of-N: rerank the K samples of every verifiable prompt by majority vote, by the process reward "
        "model (min and product over steps) and by the reward model when given, and report the accuracy of each "
        "pick beside the first sample's and the oracle's (any sample right, Pass@K).")

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.max_prompts < 0:
            raise ValueError(f"max_prompts must be >= 0, got {self.max_prompts}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


def answer_key(text: str) -> Any:
    """What two answers must share to count as the same vote: the final number, else the stripped text."""
    number = extract_final_number(text)
    return number if number is not None else " ".join(text.split()).lower()


def reference_key(reference: str) -> Any:
    number = parse_reference(reference)
    return number if number is not None else " ".join(reference.split()).lower()


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples with c correct: 1 − C(n−c, k) / C(n, k) (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(answers: Sequence[str], reference: str) -> bool:
    """Maj@K: the most common answer (first seen wins a tie) equals the reference."""
    votes = Counter(answer_key(a) for a in answers)
    top, _ = votes.most_common(1)[0]
    return top == reference_key(reference)


def _columns(rows: Sequence[PromptRow], repeat: int) -> dict[str, list[Any]]:
    keys = sorted({k for r in rows for k in r.extra})
    columns: dict[str, list[Any]] = {"reference": [r.reference for r in rows for _ in range(repeat)]}
    for key in keys:
        columns[key] = [r.extra.get(key) for r in rows for _ in range(repeat)]
    return columns


def reward_columns(rows: Sequence[PromptRow], repeat: int) -> dict[str, list[Any]]:
    """Row fields as reward-function keyword arguments, each repeated for the `repeat` samples of its prompt."""
    return _columns(rows, repeat)


def _curves_over_k(texts: list[str], references: dict[int, str], graded: list[int], correct: list[list[bool]],
                   k: int) -> dict[str, dict[str, float]]:
    """Pass@j (unbiased, from all k samples) and Maj@j (a vote over the first j) for j = 1…k: the run page's curves."""
    pass_at = {str(j): sum(pass_at_k(k, sum(c), j) for c in correct) / len(graded) for j in range(1, k + 1)}
    maj_at = {str(j): sum(majority_correct(texts[i * k:i * k + j], references[i]) for i in graded) / len(graded)
              for j in range(1, k + 1)}
    return {"pass_at": pass_at, "maj_at": maj_at}


StepScorer = Callable[[list[Any], list[str]], list[list[float]]]
"""(prompts, completions) → per completion, one score per step (a process reward model)."""
Scorer = Callable[[list[Any], list[str]], list[float]]
"""(prompts, completions) → one score per completion (an outcome reward model)."""


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the earliest sample wins a tie (NaN never wins)."""
    best = 0
    for j, v in enumerate(values):
        if v > values[best] or (math.isnan(values[best]) and not math.isnan(v)):
            best = j
    return best


def best_of_n(rows: Sequence[PromptRow], texts: Sequence[str], k: int, prm: StepScorer | None = None,
              orm: Scorer | None = None) -> dict[str, Any]:
    """Accuracy of the answer each reranker picks from the K samples of every prompt with a reference.

    `texts` holds K samples per row, row by row. "first": the first sample (no reranking); "majority": the most
    common final answer (Maj@K); "prm_min" / "prm_product": the sample whose steps' minimum / product of PRM scores
    is highest (Lightman et al. 2023 rerank by product, PRM800K also reports min); "orm": the highest outcome reward;
    "oracle": any sample right (Pass@K), the ceiling every reranker is under."""
    from training.prm import aggregate

    references = {i: r.reference for i, r in enumerate(rows) if r.reference is not None}
    graded = list(references)
    if not graded:
        return {"n": k, "prompts": 0, "accuracy": {}}
    prompts = [rows[i].prompt for i in graded for _ in range(k)]
    samples = [texts[i * k + j] for i in graded for j in range(k)]
    right = [answer_key(texts[i * k + j]) == reference_key(references[i])
             for i in graded for j in range(k)]
    picks: dict[str, list[int]] = {"first": [0] * len(graded)}
    if prm is not None:
        steps = prm(prompts, samples)
        for how in ("min", "product"):
            scores = [aggregate(s, how) for s in steps]
            picks[f"prm_{how}"] = [_argmax(scores[g * k:(g + 1) * k]) for g in range(len(graded))]
    if orm is not None:
        scores = [float(x) for x in orm(prompts, samples)]
        picks["orm"] = [_argmax(scores[g * k:(g + 1) * k]) for g in range(len(graded))]
    accuracy = {name: sum(right[g * k + j] for g, j in enumerate(chosen)) / len(graded)
                for name, chosen in picks.items()}
    accuracy["majority"] = sum(majority_correct(samples[g * k:(g + 1) * k], references[i])
                               for g, i in enumerate(graded)) / len(graded)
    accuracy["oracle"] = sum(any(right[g * k:(g + 1) * k]) for g in range(len(graded))) / len(graded)
    return {"n": k, "prompts": len(graded), "accuracy": accuracy}


def prm_step_scorer(path: str | Path, batch_size: int = 32) -> StepScorer:
    """A StepScorer from a preflab process reward model directory."""
    from training.prm import ProcessRewardModel

    model = ProcessRewardModel.load(path)
    return lambda prompts, completions: model.score_text(prompts, completions, batch_size=batch_size)


def orm_scorer(path: str | Path, batch_size: int = 32) -> Scorer:
    """A Scorer from a preflab reward model directory."""
    from training.reward_model import RewardModel

    model = RewardModel.load(path)
    return lambda prompts, completions: model.score(prompts, completions, batch_size=batch_size).tolist()


def _side(model: torch.nn.Module, tokenizer: Any, rows: Sequence[PromptRow], functions: Sequence[RewardFunction],
          config: EvalConfig) -> tuple[dict[str, Any], Rollouts, torch.Tensor, list[str]]:
    """Sample K answers per prompt from one model and score them."""
    k = config.k
    parts = []
    for start in range(0, len(rows), config.batch_size):
        chunk = rows[start:start + config.batch_size]
        parts.append(generate_rollouts(model, tokenizer, [r.prompt for r in chunk], n=k,
                                       temperature=config.temperature, top_p=config.top_p,
                                       max_new_tokens=config.max_new_tokens, stop=config.stop or None,
                                       seed=config.seed, prompt_offset=start))
    texts = [t for p in parts for t in p.texts]
    rewards = compute_rewards(functions, [r.prompt for r in rows for _ in range(k)], texts, reward_columns(rows, k))
    lengths = torch.cat([p.lengths.float().cpu() for p in parts])
    summary: dict[str, Any] = {
        "reward_mean": rewards.total.mean().item(),
        "reward_std": rewards.total.std().item() if len(texts) > 1 else 0.0,
        "response_length": lengths.mean().item(),
        "ended_fraction": torch.cat([p.ended.float().cpu() for p in parts]).mean().item(),
    }
    for name, scores in rewards.per_function.items():
        if len(functions) > 1:
            summary[f"reward/{name}"] = torch.nanmean(scores).item()
    references = {i: r.reference for i, r in enumerate(rows) if r.reference is not None}
    graded = list(references)
    if graded:
        correct = [[answer_key(texts[i * k + j]) == reference_key(references[i]) for j in range(k)]
                   for i in graded]
        summary["accuracy"] = sum(map(sum, correct)) / (len(graded) * k)
        summary["pass_at_k"] = sum(pass_at_k(k, sum(c), k) for c in correct) / len(graded)
        summary["maj_at_k"] = sum(majority_correct(texts[i * k:(i + 1) * k], references[i])
                                  for i in graded) / len(graded)
        summary.update(_curves_over_k(texts, references, graded, correct, k))
        if config.greedy:
            greedy = generate_rollouts(model, tokenizer, [rows[i].prompt for i in graded], n=1, greedy=True,
                                       max_new_tokens=config.max_new_tokens, stop=config.stop or None)
            summary["greedy_accuracy"] = sum(answer_key(t) == reference_key(references[i])
                                             for t, i in zip(greedy.texts, graded, strict=True)) / len(graded)
    rollouts = parts[0] if len(parts) == 1 else _concat(parts)
    return summary, rollouts, rewards.total, texts


def _concat(parts: list[Rollouts]) -> Rollouts:
    from torch.nn.functional import pad

    pw = max(p.prompt_ids.shape[1] for p in parts)
    rw = max(p.response_ids.shape[1] for p in parts)
    offset, index = 0, []
    for p in parts:
        index.append(p.prompt_index + offset)
        offset += int(p.prompt_index.max().item()) + 1
    return Rollouts(
        prompt_ids=torch.cat([pad(p.prompt_ids, (pw - p.prompt_ids.shape[1], 0)) for p in parts]),
        prompt_mask=torch.cat([pad(p.prompt_mask, (pw - p.prompt_mask.shape[1], 0)) for p in parts]),
        response_ids=torch.cat([pad(p.response_ids, (0, rw - p.response_ids.shape[1])) for p in parts]),
        response_mask=torch.cat([pad(p.response_mask, (0, rw - p.response_mask.shape[1])) for p in parts]),
        old_logp=torch.cat([pad(p.old_logp, (0, rw - p.old_logp.shape[1])) for p in parts]),
        ended=torch.cat([p.ended for p in parts]), prompt_index=torch.cat(index),
        prompts=[x for p in parts for x in p.prompts], texts=[x for p in parts for x in p.texts],
    )


@torch.no_grad()
def evaluate(policy: torch.nn.Module, tokenizer: Any, rows: Sequence[PromptRow], functions: Sequence[RewardFunction],
             reference: Reference | None = None, config: EvalConfig | None = None,
             samples_path: str | Path | None = None, reference_summary: dict[str, Any] | None = None,
             prm: StepScorer | None = None, orm: Scorer | None = None) -> dict[str, Any]:
    """Sample K answers per held-out prompt from the policy (and the reference), score them, compare.

    Returns {"prompts", "k", "policy": {...}, "reference": {...}, "reward_mean": {policy, reference},
    "kl", "kl_k3", "win_rate", "pass_at_k", "maj_at_k", "seconds"}. KL is the sequence-level
    estimate E_y~π[Σ_t log π − log π_ref] on the policy's own samples. The win rate counts, sample
    by sample, how often the policy's answer out-scores the reference's answer on the same prompt
    (ties count half). Passing `reference_summary` reuses a reference evaluation already made. With
    `config.best_of_n`, "best_of_n" reranks the policy's K samples (majority, `prm`, `orm`; see `best_of_n`).
    """
    config = config or EvalConfig()
    rows = list(rows)[: config.max_prompts or None]
    if not rows:
        raise ValueError("evaluate: no prompts to evaluate")
    started = time.perf_counter()
    was_training = policy.training
    policy.eval()
    policy_summary, rollouts, policy_rewards, policy_texts = _side(policy, tokenizer, rows, functions, config)
    result: dict[str, Any] = {"prompts": len(rows), "k": config.k, "policy": policy_summary}
    if config.best_of_n:
        result["best_of_n"] = best_of_n(rows, policy_texts, config.k, prm=prm, orm=orm)
    ref_texts: list[str] | None = None
    if reference is not None:
        args = (rollouts.input_ids, rollouts.attention_mask, rollouts.response_mask)
        logp = batched_logprobs(policy, *args, temperature=config.temperature, batch_size=config.batch_size * config.k)
        ref_logp = reference.logprobs(*args, temperature=config.temperature, batch_size=config.batch_size * config.k)
        mask = rollouts.response_mask.float()
        from training.losses import kl_k1, kl_k3, masked_mean, masked_sum

        result["kl"] = masked_sum(kl_k1(logp, ref_logp), mask, dim=-1).mean().item()
        result["kl_k3"] = masked_mean(kl_k3(logp, ref_logp), mask).item()
        if reference_summary is None:
            with reference.active() as ref_model:
                ref_summary, _, ref_rewards, ref_texts = _side(ref_model, tokenizer, rows, functions, config)
            ref_summary["_rewards"] = ref_rewards.tolist()
        else:
            ref_summary = reference_summary
        ref_rewards = torch.tensor(ref_summary["_rewards"])
        wins = (policy_rewards > ref_rewards).float() + 0.5 * (policy_rewards == ref_rewards).float()
        result["win_rate"] = wins.mean().item()
        result["reference"] = ref_summary
    result["reward_mean"] = {"policy": policy_summary["reward_mean"]}
    for key in ("pass_at_k", "maj_at_k", "accuracy"):
        if key in policy_summary:
            result[key] = {"policy": policy_summary[key]}
    if "reference" in result:
        for key in ("reward_mean", "pass_at_k", "maj_at_k", "accuracy"):
            if key in result and key in result["reference"]:
                result[key]["reference"] = result["reference"][key]
    curves = {name: {side: result[side][name] for side in ("policy", "reference") if name in result.get(side, {})}
              for name in ("pass_at", "maj_at")}
    if any(curves.values()):
        result["curves"] = curves
    result["seconds"] = time.perf_counter() - started
    if samples_path is not None:
        _write_samples(samples_path, rows, config.k, policy_texts, policy_rewards, ref_texts,
                       torch.tensor(result["reference"]["_rewards"]) if "reference" in result else None)
    if was_training:
        policy.train()
    return result


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The result without the private per-sample reward list kept for reuse."""
    out = dict(result)
    if "reference" in out:
        out["reference"] = {k: v for k, v in out["reference"].items() if not k.startswith("_")}
    return out


def eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The flat `eval_*` metrics of an evaluation (policy side), for a trainer's metrics.jsonl row."""
    out = {"eval_reward_mean": result["policy"]["reward_mean"]}
    for key in ("accuracy", "pass_at_k", "maj_at_k"):
        if key in result["policy"]:
            out[f"eval_{key}"] = result["policy"][key]
    for key in ("kl", "win_rate"):
        if key in result:
            out[f"eval_{key}"] = result[key]
    return out


def _write_samples(path: str | Path, rows: Sequence[PromptRow], k: int, texts: list[str], rewards: torch.Tensor,
                   ref_texts: list[str] | None, ref_rewards: torch.Tensor | None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for i, row in enumerate(rows):
            for j in range(k):
                n = i * k + j
                record = {"prompt": row.prompt, "reference": row.reference, "model": "policy", "sample": j,
                          "answer": texts[n], "reward": rewards[n].item()}
                if row.reference is not None:
                    record["correct"] = answer_key(texts[n]) == reference_key(row.reference)
                fh.write(json.dumps(record) + "\n")
                if ref_texts is not None and ref_rewards is not None:
                    record = {**record, "model": "reference", "answer": ref_texts[n], "reward": ref_rewards[n].item()}
                    if row.reference is not None:
                        record["correct"] = answer_key(ref_texts[n]) == reference_key(row.reference)
                    fh.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m training evaluate --policy DIR --reference DIR --prompts PATH (--reward-fn F ... | --reward-model DIR)
    --k K --out DIR [--best-of-n [--process-reward-model DIR]] [--config run.toml] [--set key=value ...]`."""
    from training.data import load_prompts, split_train_heldout
    from training.policy import load_policy
    from training.rewards import build_reward_functions
    from training.run_info import write_json, write_run_config

    docs = field_docs(EvalConfig)
    parser = argparse.ArgumentParser(prog="python -m training evaluate", description=__doc__.splitlines()[0],
                                     epilog="config fields: " + "; ".join(f"{k}: {v}" for k, v in docs.items()))
    parser.add_argument("--policy", required=True, help="model directory of the trained policy")
    parser.add_argument("--reference", help="model directory of the reference (the policy's starting point)")
    parser.add_argument("--prompts", required=True, help="prompts export; its held-out split when it has one")
    parser.add_argument("--reward-fn", action="append", default=[], help="module:function or a built-in name")
    parser.add_argument("--reward-model", help="preflab reward model directory (a reward, and best-of-N's ORM)")
    parser.add_argument("--process-reward-model", help="preflab process reward model directory (best-of-N's PRM)")
    parser.add_argument("--best-of-n", action="store_true", default=None,
                        help="rerank the K samples by majority vote, PRM (min, product) and ORM; report accuracy")
    parser.add_argument("--k", type=int, help="samples per prompt")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--config", help="TOML file with EvalConfig fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    args = parser.parse_args(argv)
    try:
        config = load_config(EvalConfig, args.config, args.set, k=args.k, best_of_n=args.best_of_n)
        functions = build_reward_functions(args.reward_fn, reward_model=args.reward_model)
        rows = load_prompts(args.prompts)
        prm = prm_step_scorer(args.process_reward_model) if args.process_reward_model else None
    except ValueError as exc:
        parser.error(str(exc))
    orm = orm_scorer(args.reward_model) if args.reward_model and config.best_of_n else None
    _, heldout = split_train_heldout(rows)
    rows = heldout or rows
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy, tokenizer = load_policy(args.policy, device=device)
    reference = None
    if args.reference:
        ref_model, _ = load_policy(args.reference, device=device)
        reference = Reference(policy, model=ref_model)
    out = Path(args.out)
    result = evaluate(policy, tokenizer, rows, functions, reference, config, samples_path=out / "samples.jsonl",
                      prm=prm, orm=orm)
    write_json(out / "eval.json", public(result))
    write_run_config(out, config, data={"prompts": args.prompts},
                     extra={"policy": args.policy, "reference": args.reference, "reward_fn": args.reward_fn,
                            "reward_model": args.reward_model, "process_reward_model": args.process_reward_model})
    summary: dict[str, Any] = {k: result[k] for k in ("reward_mean", "kl", "win_rate", "pass_at_k", "maj_at_k")
                               if k in result}
    if "best_of_n" in result:
        summary["best_of_n"] = result["best_of_n"]["accuracy"]
    print(json.dumps(summary))
    return 0
