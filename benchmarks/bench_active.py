"""Active learning on HH-RLHF harmless: how many labels does each queue order save over random order?

    .venv/bin/python benchmarks/bench_active.py [--seeds 0 1 … 19] [--seed-labels 32] [--round 32] [--rounds 20]
        [--strategies random uncertainty [margin bald badge]] [--learner frozen|finetuned] [--heads 8]
        [--threads 1] [--bootstrap 2000] [--cache DIR] [--plot FILE.svg] [--quick]

The HH-RLHF harmless test file (../shared/datasets/hh-rlhf/, 2,312 human chosen/rejected pairs) is replayed as if
annotators answered with the data set's own labels: lines 1–1800 are the pool a project would queue, lines
1801–2312 the 512 held-out pairs that measure the reward model. Each seed starts from `--seed-labels` pairs drawn
at random (the same pairs for every order), then adds `--round` labels per round for `--rounds` rounds, retraining
the reward model each round and choosing the next pairs by the order (benchmarks/_active_select.py):

- `random`: uniformly from the unlabelled pool (the queue's `random` selection), the baseline;
- `uncertainty`: the largest spread (standard deviation) of the heads' preference probabilities σ(Δ_h), query by
  committee (the app's `uncertainty` priority, `RewardModel.compare(...).spread`);
- `margin`: the mean preference p̄ nearest 0.5 (the app's measure for a single-head model);
- `bald`: the heads' mutual information H[p̄] − mean_h H[p_h], which passes over pairs every head calls a coin flip;
- `badge`: a batch spread out by k-means++ over the loss gradients at the guessed labels, so a round does not
  spend its labels on near-duplicates.

`--learner frozen` (the default) is an ensemble of `--heads` linear Bradley–Terry heads, each on its own Poisson(1)
bootstrap of the labels, over the frozen MiniLM encoder's mean-pooled features (prompt + response, max length 256,
truncated from the left as the trainer does); each round retrains in under a second. `--learner finetuned`
fine-tunes the encoder's last layer under the heads each round and scores with dropout on
(benchmarks/_active_finetune.py: `--epochs`, `--ft-lr`, `--batch`, `--mc-samples`; `--candidates` bounds the pairs
it scores per round): some CPU-hours at the frozen learner's sizes, so it is for a machine with more to spare.

**Reproducible.** Deterministic algorithms, a fixed thread count (`--threads`), seeded generators for the starting
sets, the picks, the candidates and the bootstrap; the features are computed once per data, encoder, max length
and library versions (always on 2 threads) and cached (`--cache`), and their sha256 is printed with the library
versions and the CPU, so two runs with the same arguments print the same figures, and two runs that differ say
where. A last-bit difference in the features (another CPU's kernels, another library version) is enough to change
which pairs an uncertainty rule picks from one round on, which is why a figure is read over many seeds.

Prints one JSON line per order, seed and round (`labels`, `accuracy`), then per order the mean curve over seeds
with its 95 % bootstrap band, and last `{"bench": "active", "random_over_uncertainty": x, "ci95": [lo, hi],
"seeds": …, "versions": …, "features_sha256": …, "detail": {order: …}}`: x = the labels random order needs to
reach its own final mean accuracy ÷ the labels uncertainty-first needs to reach it (linear interpolation between
rounds; null when it never does), with a paired bootstrap interval over seeds (benchmarks/_active_stats.py);
`detail` gives the same for every order, with the accuracy gain over random at the last round and over the curve.
`--quick` is a tiny configuration (240 pool pairs, 120 held out, 3 seeds, 4 rounds of 16) for checking the
benchmark itself, not for figures.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _active_plot  # noqa: E402
import _active_stats as stats  # noqa: E402
from _active_select import STRATEGIES, pick  # noqa: E402

from training.data import load_pairs  # noqa: E402
from training.reward_model import PairEncoder, collate, default_model_path  # noqa: E402

HH = ROOT.parent / "shared" / "datasets" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
POOL, HELDOUT = (1, 1800), (1801, 2312)
QUICK_POOL, QUICK_HELDOUT = (1, 240), (1801, 1920)


# ----------------------------------------------------------------------------------------------
# determinism and what a run ran on


def make_deterministic(threads: int) -> None:
    """The same arithmetic on every run: deterministic kernels and a fixed number of threads (a sum split over
    another number of threads rounds differently, and one flipped pick changes every later round)."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already fixed by an earlier call in this process
        pass


def versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": str(torch.__version__),
            "transformers": str(transformers.__version__), "tokenizers": str(tokenizers.__version__),
            "numpy": str(np.__version__), "machine": platform.machine(), "cpu": cpu_model(),
            # the kernels torch picked for this CPU: another instruction set rounds differently
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tensor_sha256(*tensors: torch.Tensor) -> str:
    """sha256 over the tensors' float32 bytes, in order: equal exactly when every feature is bit-for-bit equal."""
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# frozen features, computed once


def hh_path() -> Path:
    """HH next to the repository, or where PREFLAB_HH points (a worktree lives one level deeper)."""
    for candidate in (Path(os.environ.get("PREFLAB_HH", HH)), Path("/work/shared/datasets/hh-rlhf") / HH.name):
        if candidate.exists():
            return candidate
    raise SystemExit(f"HH-RLHF not found at {HH} (set PREFLAB_HH)")


def hh_rows(lines: list[tuple[int, int]]) -> list[Any]:
    """The product's reader over HH (the implicit prompt is the shared transcript prefix), these 1-based line
    ranges only."""
    with tempfile.TemporaryDirectory() as tmp, gzip.open(hh_path(), "rt", encoding="utf-8") as fh:
        plain = Path(tmp) / "hh.jsonl"
        plain.write_text(fh.read(), encoding="utf-8")
        rows = load_pairs(plain)
    return [row for first, last in lines for row in rows[first - 1:last]]


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


FEATURE_THREADS = 2
"""The encoder always runs on this many threads, whatever `--threads` says, so one cache serves every run."""


def cache_key(lines: list[tuple[int, int]], max_length: int) -> dict[str, Any]:
    """Everything the features' bits depend on: the data, the lines, the encoder's weights, the libraries, threads."""
    weights = Path(default_model_path()) / "model.safetensors"
    return {"hh_sha256": file_sha256(hh_path()), "lines": lines, "max_length": max_length,
            "encoder_sha256": file_sha256(weights), "threads": FEATURE_THREADS,
            **{k: v for k, v in versions().items() if k in ("torch", "transformers", "tokenizers", "machine")}}
    # not the CPU: a cache copied to another machine is used as it is, and the sha256 printed says which it was


class encoder_threads:  # noqa: N801 (a context manager read as a phrase: `with encoder_threads():`)
    """Run the encoder on FEATURE_THREADS threads, then give the run its own number back."""

    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        torch.set_num_threads(FEATURE_THREADS)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.before)


def features(cache: Path, lines: list[tuple[int, int]], max_length: int
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(chosen, rejected) features of the HH lines, (N, d) each, from the cache or computed, with their sha256."""
    key = cache_key(lines, max_length)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache / f"minilm-{name}.pt"
    if path.exists():
        saved = torch.load(path)
        sha = tensor_sha256(saved["chosen"], saved["rejected"])
        if sha != saved["sha256"]:
            raise SystemExit(f"{path}: the cached features changed on disk (sha256 {sha}); delete the file")
        return saved["chosen"], saved["rejected"], {"features": "cached", "features_sha256": sha,
                                                    "feature_seconds": saved["seconds"]}
    started = time.perf_counter()
    rows = hh_rows(lines)
    prompts = [r.prompt for r in rows]
    with encoder_threads():
        both = embed(prompts * 2, [r.chosen for r in rows] + [r.rejected for r in rows], max_length)
    chosen, rejected = both[:len(rows)], both[len(rows):]
    seconds = round(time.perf_counter() - started, 1)
    sha = tensor_sha256(chosen, rejected)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save({"chosen": chosen, "rejected": rejected, "seconds": seconds, "sha256": sha, "key": key}, path)
    return chosen, rejected, {"features": "computed", "features_sha256": sha, "feature_seconds": seconds}


# ----------------------------------------------------------------------------------------------
# the reward model of the rounds


class Learner(Protocol):
    """A reward model retrained each round on the labelled pool pairs."""

    def fit(self, labelled: list[int], seed: int) -> None: ...

    def accuracy(self) -> float: ...

    def view(self, candidates: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(p_heads (n, H), emb (n, D)) of these pool pairs, oriented chosen − rejected (the rules never use
        the orientation: _active_select.py)."""
        ...


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


@dataclass
class FrozenHeads:
    """`heads` linear BT heads over frozen pair features, each on its own bootstrap (L-BFGS, full batch)."""

    pool: torch.Tensor  # (N, D)
    heldout: torch.Tensor  # (M, D)
    heads: int
    l2: float
    steps: int
    w: torch.Tensor | None = None

    def fit(self, labelled: list[int], seed: int) -> None:
        self.w = train_heads(self.pool[labelled], self.heads, seed, self.l2, self.steps)

    def accuracy(self) -> float:
        assert self.w is not None
        # every held-out pair is oriented chosen − rejected: right when the mean reward margin is positive
        return float(((self.heldout @ self.w.T).mean(1) > 0).double().mean())

    def view(self, candidates: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.w is not None
        d = self.pool[candidates]
        return torch.sigmoid(d @ self.w.T), d


def run_curve(strategy: str, seed: int, learner: Learner, pool_size: int, args: argparse.Namespace) -> list[float]:
    """One order and seed: held-out accuracy after each round."""
    gen = torch.Generator().manual_seed(1000 + seed)
    labelled = torch.randperm(pool_size, generator=gen)[:args.seed_labels].tolist()  # the same per seed
    gen = torch.Generator().manual_seed(2000 + seed)  # the picks
    subsample = torch.Generator().manual_seed(3000 + seed)  # the candidates a costly model scores
    curve = []
    for round_ in range(args.rounds + 1):
        learner.fit(labelled, seed * 7919 + round_)
        curve.append(round(learner.accuracy(), 4))
        print(json.dumps({"bench": "active", "strategy": strategy, "seed": seed, "round": round_,
                          "labels": len(labelled), "accuracy": curve[-1]}), flush=True)
        if round_ == args.rounds:
            break
        taken = set(labelled)
        unlabelled = [i for i in range(pool_size) if i not in taken]
        if strategy == "random":  # never reads the model, so it costs no scoring
            labelled += [unlabelled[i] for i in torch.randperm(len(unlabelled), generator=gen)[:args.round].tolist()]
            continue
        if args.candidates and len(unlabelled) > args.candidates:
            unlabelled = [unlabelled[i] for i in sorted(
                torch.randperm(len(unlabelled), generator=subsample)[:args.candidates].tolist())]
        p_heads, emb = learner.view(unlabelled)
        labelled += [unlabelled[i] for i in pick(strategy, p_heads, emb, args.round, gen)]
    return curve


# ----------------------------------------------------------------------------------------------
# the run


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(20)))
    parser.add_argument("--seed-labels", type=int, default=32, help="labels drawn at random before round 1")
    parser.add_argument("--round", type=int, default=32, help="labels added per round")
    parser.add_argument("--rounds", type=int, default=20)
    # the others are measured once for the record (docs/benchmarks.md); none beat uncertainty
    parser.add_argument("--strategies", nargs="+", default=["random", "uncertainty"], choices=STRATEGIES)
    parser.add_argument("--learner", choices=("frozen", "finetuned"), default="frozen")
    parser.add_argument("--heads", type=int, default=8, help="heads of the ensemble")
    parser.add_argument("--l2", type=float, default=0.01, help="L2 penalty per head (frozen)")
    parser.add_argument("--lbfgs-steps", type=int, default=100)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--candidates", type=int, default=0,
                        help="score a random subset of this many unlabelled pairs per round (0: all of them)")
    parser.add_argument("--epochs", type=int, default=2, help="fine-tuning epochs per round (finetuned)")
    parser.add_argument("--ft-lr", type=float, default=5e-5, help="the layer's learning rate, the heads' ×20 "
                        "(finetuned)")
    parser.add_argument("--batch", type=int, default=16, help="pairs per fine-tuning step (finetuned)")
    parser.add_argument("--mc-samples", type=int, default=4, help="dropout passes when scoring (finetuned)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (part of the result: see above)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the seeds")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="write the curves with their bands as an SVG here")
    parser.add_argument("--features", type=Path,
                        help="a .pt file with `chosen` and `rejected` pair features (pool, then held out) to use "
                             "instead of MiniLM's: for testing the benchmark itself")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "preflab" / "bench_active")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration for checking the benchmark")
    args = parser.parse_args(argv)
    if args.quick:  # its own sizes, where the command line did not name others
        quick = {"seeds": [0, 1, 2], "seed_labels": 16, "round": 16, "rounds": 4, "heads": 4, "bootstrap": 200}
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    if "random" not in args.strategies:
        parser.error("--strategies: random is the baseline every ratio is taken against")
    for name in ("seed_labels", "round", "rounds", "heads", "threads", "bootstrap", "epochs", "batch", "mc_samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    pool = (QUICK_POOL if args.quick else POOL)[1]
    if args.seed_labels + args.round * args.rounds > pool:
        parser.error(f"--rounds: {args.seed_labels} + {args.round} × {args.rounds} labels is more than the pool's "
                     f"{pool} pairs")
    if len(set(args.seeds)) < 2:
        parser.error("--seeds: at least two, for an interval over seeds")
    return args


def load_features(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, Any]]:
    """(chosen, rejected) features of the pool then the held-out pairs, the pool's size, and where they came from."""
    pool_lines, heldout_lines = (QUICK_POOL, QUICK_HELDOUT) if args.quick else (POOL, HELDOUT)
    n_pool = pool_lines[1] - pool_lines[0] + 1
    if args.features:
        saved = torch.load(args.features)
        chosen, rejected = saved["chosen"], saved["rejected"]
        return chosen, rejected, n_pool, {"features": str(args.features.name),
                                          "features_sha256": tensor_sha256(chosen, rejected)}
    chosen, rejected, info = features(args.cache, [pool_lines, heldout_lines], args.max_length)
    return chosen, rejected, n_pool, info


def standardise(d: torch.Tensor, n_pool: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pool, held out, scale): pair features d = φ(chosen) − φ(rejected) divided by their spread on the pool (no
    labels used)."""
    scale = d[:n_pool].std(0).clamp(min=1e-6)
    d = d / scale
    return d[:n_pool], d[n_pool:], scale


def make_learner(args: argparse.Namespace) -> tuple[Learner, int, int, dict[str, Any]]:
    """The round's reward model, the pool and held-out sizes, and the features' provenance."""
    if args.learner == "frozen":
        chosen, rejected, n_pool, info = load_features(args)
        pool, heldout, _ = standardise(chosen - rejected, n_pool)
        return FrozenHeads(pool, heldout, args.heads, args.l2, args.lbfgs_steps), len(pool), len(heldout), info
    from _active_finetune import FineTunedHeads, load_states  # its cache is large: built only when asked for

    states, chosen, rejected, n_pool, info = load_states(args)
    pool, heldout, scale = standardise(chosen - rejected, n_pool)
    return FineTunedHeads.build(args, states, pool, scale, len(heldout)), len(pool), len(heldout), info


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    make_deterministic(args.threads)
    started = time.perf_counter()
    learner, n_pool, n_heldout, info = make_learner(args)
    # seed by seed, every order for each: a run cut short still holds paired curves
    per_seed = [{s: run_curve(s, seed, learner, n_pool, args) for s in args.strategies} for seed in args.seeds]
    curves = {s: np.array([c[s] for c in per_seed]) for s in args.strategies}
    labels = [args.seed_labels + args.round * r for r in range(args.rounds + 1)]
    draws = stats.resamples(len(args.seeds), args.bootstrap, args.bootstrap_seed)
    bands = {s: stats.band(c, draws) for s, c in curves.items()}
    for s, (mean, lo, hi) in bands.items():
        print(json.dumps({"bench": "active", "strategy": s, "labels": labels, "mean": mean, "band95": [lo, hi]}))
    if args.plot:
        where = "HH-RLHF harmless" + (" (quick)" if args.quick else "")
        _active_plot.write(args.plot, labels, bands, f"held-out accuracy, {where}, {n_heldout} pairs, "
                           f"{args.learner} encoder", len(args.seeds))
    detail = {s: stats.compare(labels, curves["random"], c, draws) for s, c in curves.items() if s != "random"}
    uncertainty = detail.get("uncertainty", {})
    summary = {"bench": "active", "random_over_uncertainty": uncertainty.get("ratio"),
               "ci95": uncertainty.get("ci95"),
               **{f"random_over_{s}": d["ratio"] for s, d in detail.items() if s != "uncertainty"},
               "seeds": args.seeds, "versions": versions(), "features_sha256": info["features_sha256"],
               "detail": detail, "learner": args.learner, "seed_labels": args.seed_labels, "round": args.round,
               "rounds": args.rounds, "heads": args.heads, "candidates": args.candidates, "threads": args.threads,
               "bootstrap": args.bootstrap, "bootstrap_seed": args.bootstrap_seed, "quick": args.quick,
               "heldout_pairs": n_heldout, "pool_pairs": n_pool,
               **({"states_sha256": info["states_sha256"], "epochs": args.epochs, "ft_lr": args.ft_lr,
                   "batch": args.batch, "mc_samples": args.mc_samples, "max_length": args.max_length}
                  if args.learner == "finetuned" else {}),
               "timing": {"features": info["features"], "feature_seconds": info.get("feature_seconds"),
                          "seconds": round(time.perf_counter() - started, 1), "load_average": list(os.getloadavg())}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
