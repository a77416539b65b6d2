"""From pairwise preference probabilities to a ranking with ties: Bradley–Terry or Copeland.

`p[(i, j)]` is p(i ≻ j). A pair may be given in either orientation (or both, which are averaged as
p(i ≻ j) and 1 − p(j ≻ i)); pairs not given are not compared.

- Bradley–Terry (Bradley & Terry 1952): p(i ≻ j) = π_i / (π_i + π_j). Soft wins w_ij = p(i ≻ j) are
  fitted by the MM iteration of Hunter (2004), π_i ← W_i / Σ_j n_ij / (π_i + π_j), with W_i = Σ_j w_ij
  and n_ij = w_ij + w_ji comparisons. Each compared pair also gets `prior` pseudo-wins in each
  direction, so an item that lost every comparison outright (hard labels) keeps a finite strength.
  Scores are θ_i = log π_i, centred to mean 0 (only differences are identified).
- Copeland: score = wins + ½·ties over compared pairs, where a win is p > ½ + tol and a tie
  |p − ½| ≤ tol. A preference cycle gives every member the same score, so they share a tier.

Tiers are groups of ids whose scores lie within `tol` of the tier's best; the confidence is the
mean, over pairs placed in different tiers, of the judged p(upper ≻ lower): the judge's own belief
that the ranking's order claims are right, on the same ½…1 scale as a pair's p. A ranking that
claims no order (everything tied) has confidence ½.
"""

from __future__ import annotations

import math
from typing import Literal

RankingMethod = Literal["bradley_terry", "copeland"]
METHODS = ("bradley_terry", "copeland")


def pairwise_matrix(ids: list[int], p: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """p(i ≻ j) for both orientations of every compared pair; both given orientations are averaged."""
    known = set(ids)
    sums: dict[tuple[int, int], list[float]] = {}
    for (i, j), value in p.items():
        if i not in known or j not in known:
            raise ValueError(f"p: pair ({i}, {j}) names an id that is not in ids")
        if i == j:
            raise ValueError(f"p: pair ({i}, {j}) compares an item with itself")
        if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
            raise ValueError(f"p: p({i} ≻ {j}) must be a probability in [0, 1], got {value!r}")
        sums.setdefault((i, j), []).append(float(value))
        sums.setdefault((j, i), []).append(1.0 - float(value))
    return {pair: sum(values) / len(values) for pair, values in sums.items()}


def bradley_terry_scores(ids: list[int], p: dict[tuple[int, int], float], prior: float = 0.1,
                         tol: float = 1e-10, max_iter: int = 10_000) -> dict[int, float]:
    """Bradley–Terry strengths θ_i = log π_i from soft wins by Hunter's (2004) MM iteration (module docstring)."""
    if prior < 0:
        raise ValueError(f"prior must be ≥ 0, got {prior}")
    q = pairwise_matrix(ids, p)
    wins = {i: 0.0 for i in ids}                      # W_i = Σ_j w_ij
    games: dict[tuple[int, int], float] = {}          # n_ij = w_ij + w_ji
    for (i, j), value in q.items():
        wins[i] += value + prior
        games[(i, j)] = 1.0 + 2 * prior
    pi = {i: 1.0 for i in ids}
    for _ in range(max_iter):
        new = {}
        for i in ids:
            denom = sum(n / (pi[i] + pi[j]) for (a, j), n in games.items() if a == i)
            # an uncompared item keeps π = 1; W_i = 0 (no prior, lost everything) gives π → 0
            new[i] = wins[i] / denom if denom > 0 else pi[i]
        # normalise by the geometric mean of the positive strengths so the iteration cannot drift
        logs = [math.log(v) for v in new.values() if v > 0]
        g = math.exp(sum(logs) / len(logs)) if logs else 1.0
        new = {i: v / g for i, v in new.items()}
        change = max(abs(new[i] - pi[i]) / max(pi[i], 1e-300) for i in ids)
        pi = new
        if change < tol:
            break
    theta = {i: (math.log(v) if v > 0 else -math.inf) for i, v in pi.items()}
    finite = [t for t in theta.values() if math.isfinite(t)]
    centre = sum(finite) / len(finite) if finite else 0.0
    return {i: t - centre for i, t in theta.items()}


def copeland_scores(ids: list[int], p: dict[tuple[int, int], float], tol: float = 1e-9) -> dict[int, float]:
    """Copeland score: wins + ½·ties over compared pairs (a win is p(i ≻ j) > ½ + tol)."""
    q = pairwise_matrix(ids, p)
    scores = {i: 0.0 for i in ids}
    for (i, _j), value in q.items():
        if value > 0.5 + tol:
            scores[i] += 1.0
        elif abs(value - 0.5) <= tol:
            scores[i] += 0.5
    return scores


def tiers_from_scores(scores: dict[int, float], tol: float) -> list[list[int]]:
    """Ids by descending score; a tier holds the ids within `tol` of its best (ties kept in id order)."""
    order = sorted(scores, key=lambda i: (-scores[i], i))
    tiers: list[list[int]] = []
    for i in order:
        if tiers and (scores[tiers[-1][0]] == scores[i] or scores[tiers[-1][0]] - scores[i] <= tol):
            tiers[-1].append(i)
        else:
            tiers.append([i])
    for tier in tiers:
        tier.sort()
    return tiers


def ranking_confidence(tiers: list[list[int]], p: dict[tuple[int, int], float], ids: list[int]) -> float:
    """Mean judged p(upper ≻ lower) over compared pairs in different tiers; ½ when no order is claimed."""
    q = pairwise_matrix(ids, p)
    level = {i: t for t, tier in enumerate(tiers) for i in tier}
    agree = [value for (i, j), value in q.items() if level[i] < level[j]]
    return sum(agree) / len(agree) if agree else 0.5


def rank_from_pairwise(ids: list[int], p: dict[tuple[int, int], float], method: RankingMethod = "bradley_terry",
                       *, tol: float | None = None, prior: float = 0.1
                       ) -> tuple[list[list[int]], dict[int, float], float]:
    """(tiers, scores, confidence) from pairwise p(i ≻ j) by Bradley–Terry or Copeland (module docstring).

    `tol`: scores within it share a tier (default 1e-6 for Bradley–Terry, 1e-9 for Copeland);
    `prior`: Bradley–Terry pseudo-wins per direction per compared pair.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be distinct")
    if method == "bradley_terry":
        scores = bradley_terry_scores(ids, p, prior=prior)
        tol = 1e-6 if tol is None else tol
    else:
        scores = copeland_scores(ids, p)
        tol = 1e-9 if tol is None else tol
    tiers = tiers_from_scores(scores, tol)
    return tiers, scores, ranking_confidence(tiers, p, ids)
