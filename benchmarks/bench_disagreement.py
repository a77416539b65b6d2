"""The queue's `disagreement` order replayed on GSM8K with simulated annotators of different accuracy: do the extra
rankings it gives contested prompts buy better labels than as many extra rankings given to prompts at random?

    .venv/bin/python benchmarks/bench_disagreement.py [--seeds 0 1 … 11] [--accuracy 0.95 0.9 0.85 0.8 0.75 0.7]
        [--overlap 2] [--extra 2] [--threshold 0.2] [--round 8] [--rounds 8] [--demo] [--plot FILE.svg]

Items: the GSM8K test questions with one to three correct solutions among their four real model solutions (731 of
1,319 in ../shared/datasets/gsm8k; `--demo`: the 80 such items the demo project ships), whose true preference is
every correct solution over every incorrect one. Annotator j judges each solution right or wrong, correctly with
probability a_j (`--accuracy`, one per annotator), and ranks the solutions it judged right above those it judged
wrong: two tiers with ties inside, so a ranking that puts all four in one tier gives no pair, as in the app.

Every item first gets `--overlap` rankings. Then the `disagreement` priorities job's rule, with the app's own
share (`app.annotation.selection.disagreement_share`: a prompt's pair votes against each pair's majority) gives
every item above `--threshold` `--extra` more rankings, the most contested first; it gives nothing more after that
(the app caps a prompt at overlap + extra). The comparison, `random`, gives as many extra rankings to items drawn
at random, `--extra` each. Each seed draws every (item, annotator) judgment once, and the order in which
annotators come to each item, so both orders read the same annotators' same answers and differ only in where the
extra rankings go: a paired comparison.

The figure of merit is the accuracy of the labels a project would train on: the majority vote of every true
(correct, incorrect) pair of every item, a pair without a majority counted as a coin flip (0.5), after every
`--round` extra rankings. x = the extra rankings random order needs to reach its own final mean accuracy ÷ those
`disagreement` needs (benchmarks/_active_stats.py, with the paired 95 % bootstrap interval over seeds; "inf" where a
resample's `disagreement` was there before any extra ranking), and `saved_share_of_all_rankings` the same saving as
a share of every ranking the replay paid for, the overlap included. Prints one
JSON line per order and seed (its curve), the mean curves with their bands, and last `{"bench": "disagreement",
"random_over_disagreement": x, "ci95": [lo, hi], "seeds": …, "versions": …, "items_sha256": …, …}`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _active_plot  # noqa: E402
import _active_stats as stats  # noqa: E402

from app.annotation.selection import EXTRA_DEFAULT, THRESHOLD_DEFAULT, disagreement_share  # noqa: E402

GSM8K = ROOT.parent / "shared" / "datasets" / "gsm8k" / "example_model_solutions.jsonl"
DEMO = ROOT / "app" / "demo" / "gsm8k_demo.jsonl"
SOLVERS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
PAIRS = list(combinations(range(4), 2))


def gsm8k_path() -> Path:
    for candidate in (GSM8K, Path("/work/shared/datasets/gsm8k") / GSM8K.name):
        if candidate.exists():
            return candidate
    raise SystemExit(f"GSM8K model solutions not found at {GSM8K}")


def load_items(demo: bool) -> tuple[np.ndarray, str]:
    """(items, 4) bool: which of each item's four solutions is correct, for items with one to three correct; and
    the sha256 of the file read."""
    path = DEMO if demo else gsm8k_path()
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if demo:
        flags = [r["metadata"]["is_correct"] for r in rows]
    else:
        flags = [[r[s]["is_correct"] for s in SOLVERS] for r in rows]
    correct = np.array([f for f in flags if 0 < sum(f) < 4], dtype=bool)
    return correct, hashlib.sha256(path.read_bytes()).hexdigest()


def judgments(correct: np.ndarray, accuracy: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(items, annotators, 4) bool: what each annotator would call right, drawn once per seed."""
    slip = rng.random((len(correct), len(accuracy), 4)) >= accuracy[None, :, None]
    return correct[:, None, :] ^ slip


def votes(judged: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """(items, 6, 2) votes per unordered pair (a, b) of the four solutions: [a over b, b over a], from the rankings
    given so far (`seen`: (items, annotators) bool). An annotator prefers a to b when it judged a right, b wrong."""
    out = np.zeros((len(judged), len(PAIRS), 2), dtype=np.int64)
    for k, (a, b) in enumerate(PAIRS):
        ja, jb = judged[:, :, a], judged[:, :, b]
        out[:, k, 0] = (ja & ~jb & seen).sum(1)
        out[:, k, 1] = (jb & ~ja & seen).sum(1)
    return out


def label_accuracy(correct: np.ndarray, v: np.ndarray) -> float:
    """The majority label's accuracy over every true (correct, incorrect) pair; no majority counts 0.5."""
    hits, total = 0.0, 0
    for k, (a, b) in enumerate(PAIRS):
        true_order = correct[:, a] != correct[:, b]  # only pairs with a known preference count
        for_a, for_b = v[:, k, 0], v[:, k, 1]
        right = np.where(correct[:, a], for_a > for_b, for_b > for_a)
        tie = for_a == for_b
        hits += float((right & true_order).sum() + 0.5 * (tie & true_order).sum())
        total += int(true_order.sum())
    return hits / total


def extra_queue(order: str, judged: np.ndarray, seen: np.ndarray, threshold: float, rng: np.random.Generator
                ) -> list[int]:
    """The items the extra rankings go to, in serving order: `disagreement`, the contested ones by share (highest
    first, ties by position, as the priorities job stores them); `random`, every item in a random order."""
    if order == "random":
        return rng.permutation(len(judged)).tolist()
    shares = [disagreement_share(pairs.tolist()) for pairs in votes(judged, seen)]
    contested = [i for i, share in enumerate(shares) if share > threshold]
    return sorted(contested, key=lambda i: -shares[i])


def run_curve(order: str, correct: np.ndarray, judged: np.ndarray, arrival: np.ndarray, args: argparse.Namespace,
              seed: int) -> tuple[list[float], int]:
    """One order and seed: label accuracy after the overlap and after every round of extra rankings; and how many
    items the order gave extra rankings."""
    seen = np.zeros(arrival.shape, dtype=bool)  # (items, annotators)
    rows = np.arange(len(correct))
    for slot in range(args.overlap):
        seen[rows, arrival[:, slot]] = True
    queue = extra_queue(order, judged, seen, args.threshold, np.random.default_rng([seed, 1]))
    served = [(item, args.overlap + e) for item in queue for e in range(args.extra)]  # one ranking each
    curve = [label_accuracy(correct, votes(judged, seen))]
    for round_ in range(args.rounds):
        for item, slot in served[round_ * args.round:(round_ + 1) * args.round]:
            seen[item, arrival[item, slot]] = True
        curve.append(label_accuracy(correct, votes(judged, seen)))
    return [round(a, 4) for a in curve], len(queue)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(12)))
    parser.add_argument("--accuracy", type=float, nargs="+", default=[0.95, 0.9, 0.85, 0.8, 0.75, 0.7],
                        help="per annotator: the chance of judging one solution right or wrong correctly")
    parser.add_argument("--overlap", type=int, default=2, help="rankings every item gets first (the demo's 2)")
    parser.add_argument("--extra", type=int, default=EXTRA_DEFAULT, help="disagreement_extra")
    parser.add_argument("--threshold", type=float, default=THRESHOLD_DEFAULT, help="disagreement_threshold")
    parser.add_argument("--round", type=int, default=8, help="extra rankings per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--demo", action="store_true", help="the demo project's 80 items instead of all 731")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="write the curves with their bands as an SVG here")
    args = parser.parse_args(argv)
    if not all(0.5 <= a <= 1 for a in args.accuracy):
        parser.error("--accuracy: each annotator's accuracy must be from 0.5 to 1")
    if args.overlap < 2 or args.overlap + args.extra > len(args.accuracy):
        parser.error(f"--overlap: at least 2 (one ranking cannot disagree), and overlap + extra at most the "
                     f"{len(args.accuracy)} annotators")
    if len(set(args.seeds)) < 2:
        parser.error("--seeds: at least two, for an interval over seeds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    correct, sha = load_items(args.demo)
    accuracy = np.array(args.accuracy)
    curves: dict[str, list[list[float]]] = {"random": [], "disagreement": []}
    contested = []
    for seed in args.seeds:
        rng = np.random.default_rng([seed, 0])
        judged = judgments(correct, accuracy, rng)
        arrival = np.argsort(rng.random((len(correct), len(accuracy))), axis=1)  # who comes to each item, in order
        for order in curves:
            curve, given = run_curve(order, correct, judged, arrival, args, seed)
            curves[order].append(curve)
            contested += [given] if order == "disagreement" else []
            print(json.dumps({"bench": "disagreement", "order": order, "seed": seed, "accuracy": curve}), flush=True)
    extras = [args.round * r for r in range(args.rounds + 1)]
    arrays = {order: np.array(c) for order, c in curves.items()}
    draws = stats.resamples(len(args.seeds), args.bootstrap, args.bootstrap_seed)
    bands = {order: stats.band(c, draws) for order, c in arrays.items()}
    for order, (mean, lo, hi) in bands.items():
        print(json.dumps({"bench": "disagreement", "order": order, "extra_rankings": extras, "mean": mean,
                          "band95": [lo, hi]}))
    if args.plot:
        _active_plot.write(args.plot, extras, bands, f"majority-label accuracy, GSM8K ({len(correct)} items, "
                           f"overlap {args.overlap})", len(args.seeds), xlabel="extra rankings")
    detail = stats.compare(extras, arrays["random"], arrays["disagreement"], draws)
    # the same saving against every ranking the project paid for, the overlap included
    all_rankings = args.overlap * len(correct) + extras[-1]
    saved = None if detail["labels"] is None else (detail["labels_random"] - detail["labels"]) / all_rankings
    print(json.dumps({
        "bench": "disagreement", "random_over_disagreement": detail["ratio"], "ci95": detail["ci95"],
        "saved_share_of_all_rankings": None if saved is None else round(saved, 4),
        "seeds": args.seeds, "detail": detail, "items": len(correct),
        "contested_items": {"min": min(contested), "max": max(contested)},
        "accuracy": args.accuracy, "overlap": args.overlap, "extra": args.extra, "threshold": args.threshold,
        "round": args.round, "rounds": args.rounds, "bootstrap": args.bootstrap,
        "versions": {"python": platform.python_version(), "numpy": np.__version__}, "items_sha256": sha}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
