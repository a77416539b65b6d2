"""The active-learning benchmarks' figure of merit and its paired bootstrap over seeds.

A strategy's curves are an array (seeds, rounds + 1) of held-out accuracy at the same label counts as random
order's. x = the labels random order needs to reach its own final mean accuracy ÷ the labels the strategy needs
to reach it (both read off the mean curve over seeds, linear interpolation between rounds). The interval
resamples seeds with replacement, the same seeds for both orders (the orders share each seed's starting labels,
so the pairing removes the starting set's luck from the difference), and recomputes x on each resample; a seeded
generator makes it the same on every run. In the printed figures, null is "never reached within the budget" and
"inf" is "reached with no labels beyond the start" (possible only on a curve that starts at 0, bench_disagreement's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Curves = np.ndarray
"""(seeds, rounds + 1) held-out accuracy per seed and round."""


def labels_to_reach(labels: Sequence[float], accuracy: Sequence[float], target: float) -> float | None:
    """The labels at which a curve first reaches `target`, interpolated between rounds; None if it never does."""
    for i, (n, acc) in enumerate(zip(labels, accuracy, strict=True)):
        if acc >= target - 1e-12:
            if i == 0:
                return float(n)
            n0, acc0 = labels[i - 1], accuracy[i - 1]
            return float(n0 + (target - acc0) / (acc - acc0) * (n - n0))
    return None


def ratio(labels: Sequence[float], random: Curves, other: Curves) -> tuple[float | None, float, float | None]:
    """(x, target accuracy, labels the other order needs): x = labels random needs for its final mean accuracy ÷
    labels `other` needs for it; x and the labels are None when `other`'s mean curve never reaches it."""
    base, mean = random.mean(0), other.mean(0)
    target = float(base[-1])
    needed_random = labels_to_reach(labels, base, target)
    needed = labels_to_reach(labels, mean, target)
    assert needed_random is not None  # random reaches its own final accuracy at the latest on its last round
    if needed is None:
        return None, target, None
    # on a curve that starts at 0 extra labels, an order already there at the start is infinitely ahead
    return (needed_random / needed if needed > 0 else math.inf), target, needed


def resamples(seeds: int, n: int, seed: int) -> np.ndarray:
    """(n, seeds) seed indices drawn with replacement by a generator seeded `seed`: the same draw every run."""
    return np.random.default_rng(seed).integers(0, seeds, size=(n, seeds))


def interval(values: Sequence[float | None], level: float = 0.95, digits: int = 3) -> list[float | str | None]:
    """The percentile interval of bootstrap values. A None (the strategy never reached the target within the
    budget) ranks below every number, so a lower end that falls among them is None: "below the budget"."""
    ranked = sorted(values, key=lambda v: (v is not None, v if v is not None else 0.0))
    lo_at = int(np.floor((1 - level) / 2 * (len(ranked) - 1)))
    hi_at = int(np.ceil((1 + level) / 2 * (len(ranked) - 1)))
    return [_rounded(ranked[lo_at], digits), _rounded(ranked[hi_at], digits)]


def _rounded(value: float | None, digits: int = 3) -> float | str | None:
    """For JSON: None stays null (never reached), infinity is "inf" (reached with no labels beyond the start)."""
    if value is None:
        return None
    return "inf" if math.isinf(value) else round(float(value), digits)


def compare(labels: Sequence[float], random: Curves, other: Curves, draws: np.ndarray) -> dict[str, Any]:
    """x with its paired 95 % interval, and two figures that do not hinge on where a flat curve crosses a line:
    the accuracy gain over random order at the last round and averaged over every round after the first."""
    x, target, needed = ratio(labels, random, other)
    boot = [ratio(labels, random[idx], other[idx])[0] for idx in draws]
    gain_final = other[:, -1] - random[:, -1]  # (seeds,): paired by seed
    gain_mean = (other[:, 1:] - random[:, 1:]).mean(1)
    return {
        "ratio": _rounded(x), "ci95": interval(boot), "target_accuracy": round(target, 4),
        "labels_random": _rounded(labels_to_reach(labels, random.mean(0), target), 1),
        "labels": _rounded(needed, 1),
        "not_reached_share": round(sum(v is None for v in boot) / len(boot), 3),
        "final_gain": round(float(gain_final.mean()), 4),
        "final_gain_ci95": interval([float(gain_final[idx].mean()) for idx in draws], digits=4),
        "mean_gain": round(float(gain_mean.mean()), 4),
        "mean_gain_ci95": interval([float(gain_mean[idx].mean()) for idx in draws], digits=4),
    }


def band(curves: Curves, draws: np.ndarray) -> tuple[list[float], list[float], list[float]]:
    """Per round: the mean over seeds and its 95 % bootstrap band (the same resamples as the ratio's)."""
    means = curves[draws].mean(1)  # (n, rounds + 1)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return ([round(float(v), 4) for v in curves.mean(0)], [round(float(v), 4) for v in lo],
            [round(float(v), 4) for v in hi])
