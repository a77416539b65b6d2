"""Process vs outcome supervision on running-sum chains: GRPO with the outcome reward against GRPO with step rewards
under each process credit form, from one SFT checkpoint per seed, on CPU.

**Task.** A chain of length L is a prompt "a0+a1+…+aL=" (operands 0–4) answered in L lines, line k being
"s_{k-1}+a_k=s_k" with s_0 = a0; the last line's sum is the answer. Runs train on one L ∈ {2, 4, 8} each and are
also scored at L = 12, a length the policy never trained on (out of distribution).

**Starting point.** A tiny GPT-2 is fitted by SFT to careless chains of every length 1–8: a seeded fifth of the
(s, a) pairs are "hard" and written s+a+1 (carried on) in 60 % of the SFT lines that meet them, every other pair
slips in 5 %. The fitted policy's per-line accuracy is about 0.8 and its greedy answer is wrong wherever a chain
meets a hard pair, so success at L = 8 starts low (sparse outcome reward) and RL has real per-line habits to fix.
The checkpoint is cached per seed (`--cache`), and every arm of a seed starts from it.

**Arms**, each with the same G, lr, β, prompt order and sampling seeds: `outcome` (exact match of the final number);
`sum`, `mean`, `min`, `first_error`, `progress` (the step rewards plus the outcome, credited by
`GRPOConfig.process_credit`, the forms of training/losses.py); `sum_clip` (the sum form with every token's
advantage clipped to ±`--clip`, the advantage-scale control: the sum's size grows with the steps left); `mixA`
(outcome advantage + A·the first_error process advantage, `process_outcome_mix`; `mixA:FORM` picks another form).
Step rewards are `checker` (each line's exact label, 1 right / 0 wrong given the sum the previous line wrote, the
upper bound) or `prm`: a process reward model (`training.prm`) trained on a steps export made through the app
(benchmarks/_step_project.py, in-process on a fresh SQLite database): `--prm-k` distinct SFT samples of each of
`--prm-prompts` training prompts per L are imported into a project with step labels on and the right sum as each
prompt's reference, the app's Monte-Carlo job labels every step (hard estimate, `--mc-n` continuations per step from
the SFT checkpoint as its policy), and a steps export whose source filter names `mc`, every labelled step kept, is
what the PRM trains on (every fifth prompt its held-out split). Its report, `prm` on each process arm's line, gives
step accuracy on the held-out split, the export's id and rows, and the rows trained on.

**Measures**, per run: final greedy accuracy on held-out chains at L (`accuracy`) and at L = 12 (`accuracy_ood`);
Pass@K and Maj@K (K = 8, 16, from 16 samples at temperature 1); `trace_error`, the share of those samples with a
right final answer and a wrong line; `kl`, the k3 KL to the SFT reference (mean over the last 5 updates); `lines`
per sampled answer; `zero_var`, the share of groups whose outcome reward does not vary; `adv_rms`, the advantage's
root mean square; `curve`, [update, greedy accuracy at L, sampled tokens so far]; `auc`, the curve's mean height;
`updates_to_target` and `tokens_to_target`, the first curve point at which the arm reaches the outcome arm's final
accuracy (same seed and L; null if never). The summary gives per arm and L the mean over seeds and a 95 % bootstrap
interval (seeds resampled), and the paired difference against `outcome` with its interval.

Prints one JSON line per run, `{"bench": "process", "arm", "L", "seed", "step_rewards", "accuracy", ...}`, then
`{"bench": "process", "summary": true, "by_arm": {...}}`, a Markdown table and, with `--plot`, a PNG per L of greedy
accuracy against updates (mean over seeds; PATH gets `-L2`, `-L8` … before its suffix).

    .venv/bin/python benchmarks/process_supervision.py [--lengths 2 4 8] [--seeds 0 1 2 3 4]
        [--arms outcome sum mean min first_error progress mix0.1 mix0.3] [--step-rewards checker|prm] [--quick]
        [--plot PATH] [--prm-k K] [--mc-n N]

**Cost.** A run costs about `updates` × (sampling G × prompts_per_step chains + one optimisation pass) plus a greedy
curve point every `--curve-every` updates, so it grows with L. How the defaults were sized: a slice of 10 updates
per arm at L = 8 was timed on one thread (4–5 s wall per arm, curve points and final evaluation included) and the
SFT fit on its own (about 80 s per seed); full runs of 80 updates then took about 5 s of CPU at L = 2 and 20 s at
L = 8 (less for an arm whose answers shrink), so with about 10 s at L = 4 the defaults cost about
9 arms × 35 s × 5 seeds + 5 × 80 s ≈ 33 min of CPU on one idle core, under the 90 minutes allowed for 2 idle cores
even at twice these figures. Two worker processes with the seeds split between them (`--seeds 0 1 2` and
`--seeds 3 4`, each to a file, then `--from-lines FILE FILE` to summarise both) use both cores.
With `--step-rewards prm`, each seed first makes its PRM through the app: at L = 8 (48 prompts, K = 2, N = 4: 2,704
continuations, 772 step labels, 8 epochs) about 17 s of CPU on one thread, cached like the SFT checkpoint.
`--quick` is a one-seed, L = 2, two-arm, six-update version for CI (about a minute, its SFT fit included).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "benchmarks"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import torch  # noqa: E402
from _png import Series, line_chart  # noqa: E402

from tests.training.tiny import char_tokenizer, save_tiny, sft, tiny_gpt2  # noqa: E402
from training.config import GRPOConfig, PRMConfig  # noqa: E402
from training.data import PromptRow  # noqa: E402
from training.evaluate import answer_key, pass_at_k, reference_key  # noqa: E402
from training.grpo import GRPOTrainer  # noqa: E402
from training.policy import generate_rollouts, load_policy, prepare_tokenizer  # noqa: E402
from training.rewards import (  # noqa: E402
    RewardFunction,
    build_reward_functions,
    process_reward_model_fn,
    split_steps,
)

ARMS = ("outcome", "sum", "sum_clip", "mean", "min", "first_error", "progress", "mix0.1", "mix0.3")
DEFAULT_ARMS = ("outcome", "sum", "mean", "min", "first_error", "progress", "mix0.1", "mix0.3", "sum_clip")
OOD_L = 12
HIGH = 4
LINE = re.compile(r"^(\d+)\+(\d+)=(\d+)$")
CACHE = Path(tempfile.gettempdir()) / "preflab-process-supervision"


# --- the task ---------------------------------------------------------------------------------------


def chains(seed: int, length: int, n: int) -> list[tuple[int, ...]]:
    """`n` distinct chains of `length` lines (length + 1 operands in [0, HIGH]) in a seeded order."""
    rng = random.Random(seed * 7919 + length)
    seen: dict[tuple[int, ...], None] = {}
    limit = (HIGH + 1) ** (length + 1)
    while len(seen) < min(n, limit):
        seen.setdefault(tuple(rng.randint(0, HIGH) for _ in range(length + 1)), None)
    return list(seen)


def prompt_of(chain: Sequence[int]) -> str:
    return "+".join(map(str, chain)) + "="


def operands(prompt: str) -> list[int]:
    return [int(x) for x in prompt.rstrip("=").split("+")]


def hard(seed: int, s: int, a: int) -> bool:
    """The seeded fifth of (s, a) pairs the SFT data mostly gets wrong."""
    return random.Random(f"{seed}:{s}:{a}").random() < 0.2


def careless_solution(chain: Sequence[int], rng: random.Random, seed: int) -> str:
    lines, s = [], chain[0]
    for a in chain[1:]:
        slip = rng.random() < (0.6 if hard(seed, s, a) else 0.05)
        t = s + a + (1 if slip else 0)
        lines.append(f"{s}+{a}={t}")
        s = t
    return "\n".join(lines)


def sft_set(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed + 17)
    out = []
    for _ in range(n):
        chain = [rng.randint(0, HIGH) for _ in range(rng.randint(1, 8) + 1)]
        out.append((prompt_of(chain), careless_solution(chain, rng, seed)))
    return out


def line_labels(prompt: str, completion: str) -> list[bool]:
    """Each newline-separated line judged given the sum the line before it wrote (PRM800K's rule); lines past the
    chain's length, or not of the form "s+a=t", are wrong."""
    ops = operands(prompt)
    labels, carried = [], ops[0]
    ends = split_steps(completion)
    for j, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        line = completion[start:end]
        m = LINE.match(line.strip())
        if m is None or j + 1 >= len(ops):
            labels.append(False)
            continue
        x, y, z = (int(g) for g in m.groups())
        labels.append(x == carried and y == ops[j + 1] and z == x + y)
        carried = z
    return labels


def line_checker(prompts: Sequence[Any], completions: Sequence[str], **row: Any) -> list[list[float]]:
    """The checker's step rewards: 1.0 per right line, 0.0 per wrong one (split as `training.rewards.split_steps`)."""
    return [[float(ok) for ok in line_labels(p, c)] for p, c in zip(prompts, completions, strict=True)]


def final_right(prompt: str, text: str) -> bool:
    return answer_key(text) == reference_key(str(sum(operands(prompt))))


def rows_of(items: Sequence[tuple[int, ...]]) -> list[PromptRow]:
    return [PromptRow(prompt=prompt_of(c), reference=str(sum(c))) for c in items]


def max_tokens(length: int) -> int:
    return 8 * length + 4


# --- the SFT checkpoint and the PRM -----------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every arm of a seed shares."""

    tok: Any
    sft_path: Path
    train: dict[int, list[PromptRow]]
    heldout: dict[int, list[PromptRow]]
    prm: Path | None


def sft_checkpoint(args: argparse.Namespace, seed: int, tok: Any) -> Path:
    key = f"seed{seed}-n{args.sft_examples}-s{args.sft_steps}-e{args.n_embd}"
    path = args.cache / key
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    model = tiny_gpt2(tok, seed=seed, n_embd=args.n_embd, n_layer=2, n_positions=160)
    sft(model, tok, sft_set(seed, args.sft_examples), steps=args.sft_steps, seed=seed, batch_size=32)
    tmp = args.cache / f"{key}.tmp{id(model)}"
    save_tiny(model, tok, tmp)
    tmp.rename(path) if not path.exists() else None
    return path


def distinct_samples(sft_path: Path, tok: Any, prompts: list[str], k: int, seed: int, rounds: int = 3
                     ) -> dict[str, list[str]]:
    """K distinct non-empty SFT samples per prompt, in the order sampled (4·K a round, up to `rounds` rounds for a
    prompt still short of K); a prompt that never gets K is left out."""
    model, _ = load_policy(sft_path)
    longest = max(len(operands(p)) - 1 for p in prompts)
    pool: dict[str, dict[str, None]] = {p: {} for p in prompts}
    for attempt in range(rounds):
        todo = [p for p in prompts if len(pool[p]) < k]
        if not todo:
            break
        out = generate_rollouts(model, tok, todo, n=4 * k, max_new_tokens=max_tokens(longest),
                                seed=seed + 5 + 1000 * attempt)
        for i, text in enumerate(out.texts):
            if text.strip():  # the project stores a completion's steps, and an empty one has none
                pool[todo[i // (4 * k)]].setdefault(text.strip(), None)
    return {p: list(texts)[:k] for p, texts in pool.items() if len(texts) >= k}


def mc_step_prm(args: argparse.Namespace, seed: int, setup_tok: Any, sft_path: Path, rows: list[PromptRow]) -> Path:
    """A PRM trained on a steps export made through the app: K distinct SFT samples of each training prompt are
    imported into a project with its right sum as the reference, the app's Monte-Carlo job labels every step (hard
    estimate, `--mc-n` continuations from the SFT policy), and the PRM trains on the export of those labels (every
    step; every fifth prompt kept is its held-out split). Cached by everything that makes it."""
    from _step_project import Item, mc_label_through_project  # the app only here: the task's tests stay off it

    from training.data import load_steps
    from training.prm import train_prm

    lengths = "-".join(map(str, sorted(set(args.lengths))))
    path = args.cache / (f"prm-app-seed{seed}-L{lengths}-p{args.prm_prompts}-k{args.prm_k}-mc{args.mc_n}"
                         f"-e{args.prm_epochs}-{sft_path.name}")
    if (path / "model" / "mc_labels.json").exists():
        return path / "model"
    prompts = [str(r.prompt) for r in rows]
    picked = distinct_samples(sft_path, setup_tok, prompts, args.prm_k, seed)
    references = {str(r.prompt): str(r.reference) for r in rows}
    kept = [p for p in prompts if p in picked]
    if len(kept) < 2:
        raise RuntimeError(f"only {len(kept)} of {len(prompts)} prompts got {args.prm_k} distinct SFT samples: "
                           "too few to train and score a PRM")
    items = [Item(prompt=p, completions=picked[p], split="heldout" if i % 5 == 0 else "train",
                  reference=references[p]) for i, p in enumerate(kept)]
    longest = max(len(operands(p)) - 1 for p in kept)
    labelled = mc_label_through_project(items, args.prm_k, sft_path, args.mc_n, "hard", seed=seed + 9,
                                        max_new_tokens=max_tokens(longest), workdir=path / "project")
    step_rows = load_steps(labelled.path)
    train = [r for r in step_rows if r.split == "train"]
    heldout = [r for r in step_rows if r.split == "heldout"]
    result = train_prm(PRMConfig(model=str(sft_path), out=str(path), epochs=args.prm_epochs, batch_size=32, lr=3e-3,
                                 max_length=160, eval_every=0, seed=seed, progress=False), train, heldout)
    report = {k: result.eval.get(k) for k in ("step_accuracy", "first_error_accuracy")}
    report |= {"train_rows": len(train), "heldout_rows": len(heldout),
               "wrong_step_share": statistics.fmean(1 - statistics.fmean(r.labels) for r in step_rows),
               "export_id": labelled.export_id, "export_rows": labelled.rows, "mc_run_id": labelled.mc_run_id,
               "step_labels": labelled.step_labels, "continuations": labelled.continuations,
               "prompts": len(kept), "prompts_left_out": len(prompts) - len(kept)}
    (path / "model" / "mc_labels.json").write_text(json.dumps(report), encoding="utf-8")
    return path / "model"


def prepare(args: argparse.Namespace, seed: int) -> Setup:
    tok = prepare_tokenizer(char_tokenizer())
    args.cache.mkdir(parents=True, exist_ok=True)
    path = sft_checkpoint(args, seed, tok)
    train, heldout = {}, {}
    for length in sorted({*args.lengths, OOD_L}):
        items = chains(seed, length, args.train_prompts + args.heldout_prompts)
        cut = len(items) - min(args.heldout_prompts, len(items) // 3)
        train[length], heldout[length] = rows_of(items[:cut]), rows_of(items[cut:])
    prm = None
    if args.step_rewards == "prm" and any(a != "outcome" for a in args.arms):
        prm = mc_step_prm(args, seed, tok, path, [r for n in args.lengths for r in train[n][:args.prm_prompts]])
    return Setup(tok, path, train, heldout, prm)


# --- the arms ---------------------------------------------------------------------------------------


def arm_settings(arm: str, clip: float) -> dict[str, Any]:
    """GRPOConfig fields of an arm (outcome: none; the process reward is added by `reward_functions`)."""
    if arm == "outcome":
        return {}
    if arm == "sum_clip":
        return {"process_credit": "sum", "advantage_clip": clip}
    if arm.startswith("mix"):
        alpha, _, form = arm[3:].partition(":")
        return {"process_credit": form or "first_error", "process_outcome_mix": float(alpha)}
    return {"process_credit": arm}


def check_arm(arm: str) -> str:
    """argparse type: a known arm, or mixA / mixA:FORM."""
    if arm in ARMS:
        return arm
    m = re.fullmatch(r"mix(\d+(?:\.\d+)?)(?::(sum|mean|min|first_error|progress))?", arm)
    if m is None:
        raise argparse.ArgumentTypeError(f"--arms: unknown arm {arm!r} (one of {', '.join(ARMS)}, or mixA[:FORM])")
    return arm


def reward_functions(arm: str, setup: Setup) -> list[RewardFunction]:
    outcome = build_reward_functions(["gsm8k_exact_match"])
    if arm == "outcome":
        return outcome
    if setup.prm is not None:
        fn, split = process_reward_model_fn(setup.prm)  # scores in [0, 1], the checker's scale
        return outcome + [RewardFunction(name="process_reward_model", fn=fn, step_split=split)]
    return outcome + [RewardFunction(name="line_checker", fn=line_checker)]


def greedy_accuracy(policy: Any, tok: Any, rows: list[PromptRow], length: int) -> float:
    out = generate_rollouts(policy, tok, [str(r.prompt) for r in rows], n=1, greedy=True,
                            max_new_tokens=max_tokens(length))
    return sum(final_right(str(r.prompt), t) for r, t in zip(rows, out.texts, strict=True)) / len(rows)


def sampled_measures(policy: Any, tok: Any, rows: list[PromptRow], length: int, k: int) -> dict[str, Any]:
    """Pass@K and Maj@K at K = 8 and k, trace error and lines per answer, from k samples per prompt."""
    out = generate_rollouts(policy, tok, [str(r.prompt) for r in rows], n=k, max_new_tokens=max_tokens(length),
                            seed=4242)
    passes: dict[str, list[float]] = {str(x): [] for x in (8, k)}
    majs: dict[str, list[float]] = {str(x): [] for x in (8, k)}
    right_total = right_with_error = 0
    lines = []
    for i, row in enumerate(rows):
        prompt = str(row.prompt)
        texts = out.texts[i * k:(i + 1) * k]
        right = [final_right(prompt, t) for t in texts]
        for t, ok in zip(texts, right, strict=True):
            lines.append(len([x for x in t.split("\n") if x.strip()]))
            if ok:
                right_total += 1
                right_with_error += not all(line_labels(prompt, t))
        for x in (8, k):
            passes[str(x)].append(pass_at_k(k, sum(right), x))
            votes: dict[Any, int] = {}
            for t in texts[:x]:
                votes[answer_key(t)] = votes.get(answer_key(t), 0) + 1
            top = max(votes, key=votes.__getitem__)  # first seen wins a tie (dicts keep insertion order)
            majs[str(x)].append(float(top == reference_key(str(row.reference))))
    return {"pass_at_k": {x: statistics.fmean(v) for x, v in passes.items()},
            "maj_at_k": {x: statistics.fmean(v) for x, v in majs.items()},
            "trace_error": right_with_error / right_total if right_total else None,
            "lines": statistics.fmean(lines)}


def run_arm(args: argparse.Namespace, setup: Setup, seed: int, length: int, arm: str) -> dict[str, Any]:
    tok = setup.tok
    model, _ = load_policy(setup.sft_path)
    config = GRPOConfig(group_size=args.group, prompts_per_step=args.prompts_per_step, lr=args.lr, beta=args.beta,
                        max_new_tokens=max_tokens(length), steps=args.updates, seed=seed, progress=False,
                        reward_fn=["gsm8k_exact_match"], **arm_settings(arm, args.clip))
    trainer = GRPOTrainer(config, model, tok, reward_functions(arm, setup), setup.train[length])
    heldout = setup.heldout[length]
    started = time.process_time()
    tokens = 0.0
    curve = [[0, greedy_accuracy(trainer.policy, tok, heldout, length), 0]]
    kl, zero_var, adv_rms = [], [], []
    for update in range(1, args.updates + 1):
        metrics = trainer.step()
        tokens += metrics["response_length"] * args.group * args.prompts_per_step
        kl.append(metrics.get("kl", 0.0))
        zero_var.append(metrics.get("outcome_zero_std_frac", metrics["zero_std_frac"]))
        adv_rms.append(metrics["adv_rms"])
        if update == args.updates or update % args.curve_every == 0:
            curve.append([update, greedy_accuracy(trainer.policy, tok, heldout, length), int(tokens)])
    policy = trainer.policy
    changed = any(not torch.equal(a, b) for a, b in zip(policy.state_dict().values(),
                                                         load_policy(setup.sft_path)[0].state_dict().values(),
                                                         strict=True))
    result = {"bench": "process", "arm": arm, "L": length, "seed": seed, "step_rewards": args.step_rewards,
              "accuracy": curve[-1][1],
              "accuracy_ood": greedy_accuracy(policy, tok, setup.heldout[OOD_L], OOD_L),
              **sampled_measures(policy, tok, heldout, length, args.k),
              "kl": statistics.fmean(kl[-5:]), "zero_var": statistics.fmean(zero_var),
              "adv_rms": statistics.fmean(adv_rms), "updates": args.updates,
              "auc": statistics.fmean(c[1] for c in curve), "changed": changed,
              "cpu_s": round(time.process_time() - started, 1), "curve": curve}
    if setup.prm is not None and arm != "outcome":
        result["prm"] = json.loads((setup.prm / "mc_labels.json").read_text(encoding="utf-8"))
    return result


def reach(run: dict[str, Any], target: float) -> tuple[int | None, int | None]:
    """The first curve point (update, sampled tokens) at which the run's greedy accuracy reaches `target`."""
    for update, acc, tokens in run["curve"]:
        if acc >= target - 1e-9:
            return update, tokens
    return None, None


def with_target(run: dict[str, Any], outcome: dict[str, Any] | None) -> dict[str, Any]:
    target = None if outcome is None else outcome["accuracy"]
    updates, tokens = (None, None) if target is None else reach(run, target)
    return run | {"updates_to_target": updates, "tokens_to_target": tokens}


def retarget(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run's updates and tokens to target, from the outcome run of its seed, L and step rewards."""
    outcome = {(r["seed"], r["L"], r["step_rewards"]): r for r in lines if r["arm"] == "outcome"}
    return [with_target(r, outcome.get((r["seed"], r["L"], r["step_rewards"]))) for r in lines]


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    setup = prepare(args, seed)
    lines = []
    for length in args.lengths:
        outcome = None
        for arm in sorted(args.arms, key=lambda a: a != "outcome"):
            run = run_arm(args, setup, seed, length, arm)
            outcome = run if arm == "outcome" else outcome
            run = with_target(run, outcome)
            lines.append(run)
            print(json.dumps(run), flush=True)
    return lines


# --- the summary ------------------------------------------------------------------------------------


def bootstrap(values: Sequence[float], draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, 2.5 %, 97.5 %) of the mean over `values`, resampled with replacement."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(draws))
    return mean, means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


MEASURES = ("accuracy", "accuracy_ood", "auc", "trace_error", "kl", "lines", "zero_var", "adv_rms",
            "updates_to_target")


def value(run: dict[str, Any], key: str) -> float | None:
    v = run.get(key)
    if key == "updates_to_target" and v is None:
        return math.inf  # never reached: counts as worse than any budget
    return None if v is None else float(v)


def summarise(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm, per L: mean and 95 % interval of each measure over seeds, and the paired difference to outcome."""
    by_arm: dict[str, Any] = {}
    for arm in dict.fromkeys(r["arm"] for r in lines):
        by_arm[arm] = {}
        for length in sorted({r["L"] for r in lines if r["arm"] == arm}):
            runs = {r["seed"]: r for r in lines if r["arm"] == arm and r["L"] == length}
            base = {r["seed"]: r for r in lines if r["arm"] == "outcome" and r["L"] == length}
            cell: dict[str, Any] = {"seeds": sorted(runs)}
            for key in MEASURES:
                values = [v for r in runs.values() if (v := value(r, key)) is not None]
                finite = [v for v in values if math.isfinite(v)]
                if key == "updates_to_target":
                    cell["reached"] = f"{len(finite)}/{len(values)}"
                    values = finite
                if values:
                    cell[key] = [round(x, 4) for x in bootstrap(values)]
                paired = [a - b for s, r in runs.items() if s in base
                          and (a := value(r, key)) is not None and (b := value(base[s], key)) is not None
                          and math.isfinite(a) and math.isfinite(b)]
                if arm != "outcome" and paired and key in ("accuracy", "accuracy_ood", "auc", "trace_error"):
                    cell[f"{key}_vs_outcome"] = [round(x, 4) for x in bootstrap(paired)]
            for k in ("8", "16"):
                for name in ("pass_at_k", "maj_at_k"):
                    got = statistics.fmean(r[name].get(k, math.nan) for r in runs.values())
                    cell[f"{name[:-1]}{k}"] = round(got, 4)
            by_arm[arm][str(length)] = cell
    return by_arm


def interval(cell: dict[str, Any], key: str, digits: int = 3) -> str:
    if key not in cell:
        return "–"
    mean, lo, hi = cell[key]
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(by_arm: dict[str, Any]) -> str:
    out = ["| L | arm | accuracy | Δ vs outcome | L=12 acc. | updates to target (reached) | AUC | trace error | "
           "Maj@16 | Pass@16 | KL | lines | zero-var groups | adv RMS |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lengths = sorted({int(n) for cells in by_arm.values() for n in cells})
    for length in lengths:
        for arm, cells in by_arm.items():
            cell = cells.get(str(length))
            if cell is None:
                continue
            out.append(f"| {length} | {arm} | {interval(cell, 'accuracy')} | {interval(cell, 'accuracy_vs_outcome')} | "
                       f"{interval(cell, 'accuracy_ood')} | {interval(cell, 'updates_to_target', 0)} "
                       f"({cell['reached']}) | {interval(cell, 'auc')} | {interval(cell, 'trace_error')} | "
                       f"{cell['maj_at_16']:.3f} | {cell['pass_at_16']:.3f} | {cell['kl'][0]:.3f} | "
                       f"{cell['lines'][0]:.1f} | {cell['zero_var'][0]:.2f} | {cell['adv_rms'][0]:.2f} |")
    return "\n".join(out)


def plot(lines: list[dict[str, Any]], path: Path) -> list[Path]:
    written = []
    for length in sorted({r["L"] for r in lines}):
        series = []
        for arm in dict.fromkeys(r["arm"] for r in lines):
            curves = [{c[0]: c[1] for c in r["curve"]} for r in lines if r["arm"] == arm and r["L"] == length]
            if not curves:
                continue
            points = sorted(set.intersection(*(set(c) for c in curves)))
            series.append(Series(arm, [(float(u), statistics.fmean(c[u] for c in curves)) for u in points]))
        seeds = len({r["seed"] for r in lines if r["L"] == length})
        target = path.with_name(f"{path.stem}-L{length}{path.suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        line_chart(series, target, title=f"Greedy accuracy, chains of {length} lines", x_label="GRPO updates",
                   y_label=f"held-out greedy accuracy, mean of {seeds} seeds", y_range=(0.0, 1.0))
        written.append(target)
    return written


# --- the command ------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2, 4, 8], help="chain lengths to train on (≤ 8)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--arms", type=check_arm, nargs="+", default=list(DEFAULT_ARMS),
                        help=f"arms ({', '.join(ARMS)}, or mixA[:FORM] for outcome + A·process)")
    parser.add_argument("--step-rewards", choices=("checker", "prm"), default="checker")
    parser.add_argument("--quick", action="store_true", help="a small version for CI: one seed, L = 2, two arms")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path; one chart per L (PATH-L2.png, …)")
    parser.add_argument("--updates", type=int, default=80, help="GRPO updates per run")
    parser.add_argument("--group", type=int, default=8, help="G, samples per prompt")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--clip", type=float, default=1.0, help="sum_clip's per-token advantage clip")
    parser.add_argument("--curve-every", type=int, default=5, help="greedy curve point every this many updates")
    parser.add_argument("--k", type=int, default=16, help="samples per prompt for Pass@K, Maj@K, trace error")
    parser.add_argument("--train-prompts", type=int, default=256)
    parser.add_argument("--heldout-prompts", type=int, default=48)
    parser.add_argument("--sft-examples", type=int, default=4000)
    parser.add_argument("--sft-steps", type=int, default=1500)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--mc-n", type=int, default=4, help="prm: continuations per step for the Monte-Carlo labels")
    parser.add_argument("--prm-prompts", type=int, default=48, help="prm: training prompts per L sampled for labels")
    parser.add_argument("--prm-k", type=int, default=2,
                        help="prm: distinct SFT samples per prompt imported into the project (K, at least 2)")
    parser.add_argument("--prm-epochs", type=int, default=8)
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the SFT checkpoints (and PRMs) are kept")
    parser.add_argument("--from-lines", type=Path, nargs="+", default=None,
                        help="summarise the run lines in these files (earlier output) instead of running")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.seeds, args.updates, args.curve_every = [2], args.seeds[:1], 6, 3
        args.arms = [a for a in args.arms if a in ("outcome", "min")] or ["outcome", "min"]
        args.sft_steps, args.sft_examples, args.train_prompts, args.heldout_prompts = 300, 1000, 64, 16
        args.prompts_per_step, args.mc_n, args.prm_prompts, args.prm_epochs = 4, 2, 8, 2
    if any(n < 1 or n > 8 for n in args.lengths):
        parser.error("--lengths: each must be in 1..8 (L = 12 is the out-of-distribution length)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args.from_lines:
        lines = [json.loads(x) for p in args.from_lines for x in p.read_text(encoding="utf-8").splitlines()
                 if x.startswith('{"bench": "process", "arm"')]
        lines = retarget(lines)
    else:
        lines = [line for seed in args.seeds for line in run_seed(args, seed)]
    by_arm = summarise(lines)
    print(json.dumps({"bench": "process", "summary": True, "step_rewards": args.step_rewards, "by_arm": by_arm}))
    print()
    print(table(by_arm))
    if args.plot is not None:
        for path in plot(lines, args.plot):
            print(f"wrote {path}")
    print(f"\n{time.perf_counter() - started:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
