"""Active learning on HH-RLHF harmless: how many labels does uncertainty-first order save over random order?

    .venv/bin/python benchmarks/bench_active.py [--seeds 0 1 2] [--seed-labels 32] [--round 32] [--rounds 20]
        [--strategies random uncertainty margin] [--heads 8] [--cache DIR] [--plot FILE.svg]

The HH-RLHF harmless test file (../shared/datasets/hh-rlhf/, 2,312 human chosen/rejected pairs) is replayed as if
annotators answered with the data set's own labels: lines 1–1800 are the pool a project would queue, lines
1801–2312 the 512 held-out pairs that measure the reward model. Each seed starts from `--seed-labels` pairs drawn
at random, then adds `--round` labels per round for `--rounds` rounds, retraining the reward model each round and
choosing the next pairs by the strategy:

- `random`: uniformly from the unlabelled pool (the queue's `random` selection);
- `uncertainty`: the pairs the reward model is least sure about, the spread (standard deviation) of the heads'
  preference probabilities σ(Δ_h) (the ensemble's epistemic uncertainty, query by committee; the app's
  `uncertainty` priority, `RewardModel.compare(...).spread`);
- `margin`: the pairs whose mean preference probability p̄ is nearest 0.5. On HH it does worse than random: the
  pairs nearest 0.5 are mostly the ones whose labels are noise (annotators disagree with any model there).

HH has one label per pair, so the app's `disagreement` (human rankings that disagree) cannot be replayed here.

The reward model of the rounds is an ensemble of `--heads` linear Bradley–Terry heads, each on its own Poisson(1)
bootstrap of the labels, over the **frozen** MiniLM encoder's cached features (mean-pooled, prompt + response,
max length 256, truncated from the left as the trainer does): the `ensemble=N` reward model with the encoder not
fine-tuned, so each round retrains in well under a second and the whole benchmark fits the CPU budget. The
features are computed once and cached (`--cache`, default ~/.cache/preflab/bench_active).

Prints one JSON line per strategy, seed and round (`labels`, `accuracy`), then per strategy the mean curve over
seeds, and last `{"bench": "active", "random_over_uncertainty": x, ...}`: x = the labels random order needs to
reach its own final (mean) accuracy ÷ the labels uncertainty-first needs to reach the same accuracy (linear
interpolation between rounds; null when it never does).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.data import load_pairs  # noqa: E402
from training.reward_model import PairEncoder, collate, default_model_path  # noqa: E402

HH = ROOT.parent / "shared" / "datasets" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
POOL, HELDOUT = (1, 1800), (1801, 2312)
STRATEGIES = ("random", "uncertainty", "margin")


# ----------------------------------------------------------------------------------------------
# frozen features, computed once


def hh_path() -> Path:
    """HH next to the repository, or where PREFLAB_HH points (a worktree lives one level deeper)."""
    for candidate in (Path(os.environ.get("PREFLAB_HH", HH)), Path("/work/shared/datasets/hh-rlhf") / HH.name):
        if candidate.exists():
            return candidate
    raise SystemExit(f"HH-RLHF not found at {HH} (set PREFLAB_HH)")


@torch.no_grad()
def embed(texts_prompt: list[str], texts_response: list[str], max_length: int, batch_size: int = 32) -> torch.Tensor:
    """Mean-pooled last hidden states of the frozen MiniLM encoder for (prompt, response), (N, 384)."""
    from transformers import AutoModel, AutoTokenizer

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    encoder = PairEncoder(tokenizer, max_length)
    ids, _ = encoder.encode(encoder.prompt_texts(texts_prompt), texts_response)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: little padding per batch
    out = torch.empty(len(ids), model.config.hidden_size)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = collate([ids[i] for i in chunk], tokenizer.pad_token_id, torch.device("cpu"))
        hidden = model(**batch).last_hidden_state  # (b, L, d)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        out[torch.tensor(chunk)] = (hidden * mask).sum(1) / mask.sum(1)
    return out


def features(cache: Path, max_length: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(chosen, rejected) features of every HH line, (2312, d) each, from the cache or computed."""
    source = hh_path()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    path = cache / f"minilm-{digest}-{max_length}.pt"
    if path.exists():
        saved = torch.load(path)
        return saved["chosen"], saved["rejected"], {"features": "cached", "feature_seconds": saved["seconds"]}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, gzip.open(source, "rt", encoding="utf-8") as fh:
        plain = Path(tmp) / "hh.jsonl"
        plain.write_text(fh.read(), encoding="utf-8")
        rows = load_pairs(plain)  # the product's reader: the implicit prompt is the shared transcript prefix
    prompts = [r.prompt for r in rows]
    both = embed(prompts * 2, [r.chosen for r in rows] + [r.rejected for r in rows], max_length)
    seconds = time.perf_counter() - started
    cache.mkdir(parents=True, exist_ok=True)
    torch.save({"chosen": both[:len(rows)], "rejected": both[len(rows):], "seconds": seconds}, path)
    return both[:len(rows)], both[len(rows):], {"features": "computed", "feature_seconds": round(seconds, 1)}


# ----------------------------------------------------------------------------------------------
# the ensemble of linear Bradley–Terry heads


def train_heads(d: torch.Tensor, heads: int, seed: int, l2: float, steps: int) -> torch.Tensor:
    """H linear heads w_h on pair features d = φ(chosen) − φ(rejected), (n, D): each minimises its bootstrap-weighted
    BT loss −log σ(w_h·d) + l2·|w_h|² by full-batch L-BFGS. Returns W, (H, D)."""
    gen = torch.Generator().manual_seed(seed)
    boot = torch.poisson(torch.ones(heads, len(d)), generator=gen)  # (H, n): each head's resample
    w = (0.01 * torch.randn(heads, d.shape[1], generator=gen)).requires_grad_()
    optimizer = torch.optim.LBFGS([w], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        nll = -torch.nn.functional.logsigmoid(w @ d.T)  # (H, n)
        loss = ((nll * boot).sum(1) / boot.sum(1).clamp(min=1)).sum() + l2 * w.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach()


def preference(w: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean reward margin, p̄, spread) per pair: p_h = σ(w_h·d), p̄ their mean, spread their standard deviation."""
    delta = d @ w.T  # (n, H)
    p_heads = torch.sigmoid(delta)
    return delta.mean(1), p_heads.mean(1), p_heads.std(1, unbiased=False)


def pick(strategy: str, w: torch.Tensor, pool: torch.Tensor, unlabelled: list[int], k: int,
         gen: torch.Generator) -> list[int]:
    """The next k pool indices to label."""
    if strategy == "random":
        order = torch.randperm(len(unlabelled), generator=gen)[:k].tolist()
        return [unlabelled[i] for i in order]
    _, p, spread = preference(w, pool[unlabelled])
    # the chosen/rejected orientation is the label we do not know yet: |p̄ − 0.5| is what the model knows
    score = spread if strategy == "uncertainty" else -(p - 0.5).abs()
    order = torch.argsort(score, descending=True, stable=True)[:k].tolist()
    return [unlabelled[i] for i in order]


def run_curve(strategy: str, seed: int, pool: torch.Tensor, heldout: torch.Tensor, args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    """One strategy and seed: held-out accuracy after each round."""
    gen = torch.Generator().manual_seed(1000 + seed)
    start = torch.randperm(len(pool), generator=gen)[:args.seed_labels].tolist()  # the same seed set per seed
    gen = torch.Generator().manual_seed(2000 + seed)
    labelled = list(start)
    rows = []
    for round_ in range(args.rounds + 1):
        w = train_heads(pool[labelled], args.heads, seed * 7919 + round_, args.l2, args.lbfgs_steps)
        margin, _, _ = preference(w, heldout)
        accuracy = (margin > 0).double().mean().item()  # every held-out pair is oriented chosen − rejected
        rows.append({"bench": "active", "strategy": strategy, "seed": seed, "round": round_,
                     "labels": len(labelled), "accuracy": round(accuracy, 4)})
        if round_ < args.rounds:
            taken = set(labelled)
            labelled += pick(strategy, w, pool, [i for i in range(len(pool)) if i not in taken], args.round, gen)
    return rows


# ----------------------------------------------------------------------------------------------
# the figure of merit


def labels_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The labels at which a (labels, accuracy) curve first reaches `target`, interpolated between rounds."""
    for i, (labels, accuracy) in enumerate(curve):
        if accuracy >= target - 1e-12:
            if i == 0:
                return float(labels)
            prev_labels, prev_accuracy = curve[i - 1]
            return prev_labels + (target - prev_accuracy) / (accuracy - prev_accuracy) * (labels - prev_labels)
    return None


def mean_curve(rows: list[dict[str, Any]], strategy: str) -> list[tuple[int, float]]:
    by_round: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["strategy"] == strategy:
            by_round.setdefault(r["round"], []).append(r)
    return [(group[0]["labels"], sum(r["accuracy"] for r in group) / len(group))
            for _, group in sorted(by_round.items())]


def ratio(rows: list[dict[str, Any]], strategy: str) -> dict[str, Any]:
    """Labels random needs for its own final mean accuracy over the labels `strategy` needs for it."""
    baseline = mean_curve(rows, "random")
    target = baseline[-1][1]
    needed_random = labels_to_reach(baseline, target)
    needed = labels_to_reach(mean_curve(rows, strategy), target)
    return {"target_accuracy": round(target, 4), "labels_random": needed_random,
            f"labels_{strategy}": None if needed is None else round(needed, 1),
            "ratio": None if needed is None or needed_random is None else round(needed_random / needed, 3)}


def write_plot(path: Path, rows: list[dict[str, Any]], strategies: list[str]) -> None:
    """The mean curves as a small standalone SVG (held-out accuracy against labels)."""
    curves = {s: mean_curve(rows, s) for s in strategies}
    xs = [x for c in curves.values() for x, _ in c]
    ys = [y for c in curves.values() for _, y in c]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys) - 0.005, max(ys) + 0.005
    w, h, m = 560, 320, 50

    def at(x: float, y: float) -> str:
        return f"{m + (x - x0) / (x1 - x0) * (w - 2 * m):.1f},{h - m - (y - y0) / (y1 - y0) * (h - 2 * m):.1f}"

    colours = ["#888888", "#1f6fb2", "#c0392b", "#2e8b57"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<polyline points="{at(x0, y1)} {at(x0, y0)} {at(x1, y0)}" fill="none" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">labels (mean of {len({r["seed"] for r in rows})} '
             'seeds)</text>', f'<text x="12" y="{m - 20}">held-out accuracy, HH-RLHF harmless (512 pairs)</text>']
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{m - 6}" y="{at(x0, value).split(",")[1]}" text-anchor="end">{value:.3f}</text>')
    for value in (x0, (x0 + x1) / 2, x1):
        parts.append(f'<text x="{at(value, y0).split(",")[0]}" y="{h - m + 16}" text-anchor="middle">'
                     f'{value:.0f}</text>')
    for i, (name, curve) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        parts.append(f'<polyline points="{" ".join(at(x, y) for x, y in curve)}" fill="none" stroke="{colour}" '
                     'stroke-width="2"/>')
        parts.append(f'<text x="{w - m - 90}" y="{h - m - 52 + 16 * i}" fill="{colour}">{name}</text>')
    path.write_text("\n".join(parts + ["</svg>"]) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seed-labels", type=int, default=32, help="labels drawn at random before round 1")
    parser.add_argument("--round", type=int, default=32, help="labels added per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--heads", type=int, default=8, help="heads of the ensemble")
    parser.add_argument("--l2", type=float, default=0.01, help="L2 penalty per head")
    parser.add_argument("--lbfgs-steps", type=int, default=100)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plot", type=Path, help="write the mean curves as an SVG here")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "preflab" / "bench_active")
    args = parser.parse_args(argv)
    if "random" not in args.strategies:
        parser.error("--strategies: random is the baseline every ratio is taken against")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    chosen, rejected, info = features(args.cache, args.max_length)
    d = chosen - rejected  # (2312, D): a pair is its feature difference, oriented chosen − rejected
    d = d / d[:POOL[1]].std(0).clamp(min=1e-6)  # standardised on the pool (no labels used)
    pool, heldout = d[POOL[0] - 1:POOL[1]], d[HELDOUT[0] - 1:HELDOUT[1]]
    rows: list[dict[str, Any]] = []
    for strategy in args.strategies:
        for seed in args.seeds:
            for row in run_curve(strategy, seed, pool, heldout, args):
                rows.append(row)
                print(json.dumps(row), flush=True)
    for strategy in args.strategies:
        print(json.dumps({"bench": "active", "strategy": strategy, "mean_over_seeds": [
            {"labels": labels, "accuracy": round(accuracy, 4)} for labels, accuracy in mean_curve(rows, strategy)]}))
    if args.plot:
        write_plot(args.plot, rows, args.strategies)
    others = {s: ratio(rows, s) for s in args.strategies if s != "random"}
    summary = {"bench": "active",
               "random_over_uncertainty": others.get("uncertainty", {}).get("ratio"),
               **({"random_over_margin": others["margin"]["ratio"]} if "margin" in others else {}),
               "detail": others, "seeds": args.seeds, "seed_labels": args.seed_labels, "round": args.round,
               "rounds": args.rounds, "heads": args.heads, "heldout_pairs": len(heldout), "pool_pairs": len(pool),
               "model": "frozen all-MiniLM-L6-v2 features + linear BT heads", **info,
               "seconds": round(time.perf_counter() - started, 1), "load_average": list(os.getloadavg())}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
