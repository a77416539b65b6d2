"""Which unlabelled pairs an active learner asks for next: one function per acquisition rule.

Every rule reads the reward model's view of the candidate pairs: `p_heads` (n, H), each head's (or dropout
sample's) probability that the first response is preferred, σ(r_h(first) − r_h(second)); and, for the batch-diverse
rule, `emb` (n, D), the pair as the heads read it, φ(first) − φ(second). Which response is "first" is the label we
do not know yet, so every rule gives the same answer with the two swapped (p → 1 − p, emb → −emb).
"""

from __future__ import annotations

import torch
from torch import Tensor

STRATEGIES = ("random", "uncertainty", "margin", "bald", "badge")
"""`random` is the baseline every ratio is taken against; the others rank or spread the candidates."""


def spread(p_heads: Tensor) -> Tensor:
    """Query by committee: the heads' standard deviation of p, (n,) (the app's `uncertainty`, measure `spread`)."""
    return p_heads.std(1, unbiased=False)


def margin(p_heads: Tensor) -> Tensor:
    """Least confidence: −|p̄ − 0.5|, highest for the mean preference nearest a coin flip, (n,)."""
    return -(p_heads.mean(1) - 0.5).abs()


def entropy(p: Tensor) -> Tensor:
    """Binary entropy H(p) = −p log p − (1 − p) log(1 − p) in nats, elementwise."""
    p = p.clamp(1e-7, 1 - 1e-7)
    return -(p * p.log() + (1 - p) * (1 - p).log())


def bald(p_heads: Tensor) -> Tensor:
    """BALD, I(y; θ) = H[p̄] − mean_h H[p_h] (Houlsby et al. 2011; Gal et al. 2017 with dropout samples as θ), (n,):
    high where the heads are each sure but disagree, low where all of them call the pair a coin flip (label noise
    no model can learn)."""
    return entropy(p_heads.mean(1)) - entropy(p_heads).mean(1)


SCORES = {"uncertainty": spread, "margin": margin, "bald": bald}


def top(score: Tensor, k: int) -> list[int]:
    """The k highest scores' positions, ties by position (a stable sort: the same answer every run)."""
    return torch.argsort(score, descending=True, stable=True)[:k].tolist()


def gradient_embedding(p_heads: Tensor, emb: Tensor) -> Tensor:
    """BADGE's embedding (Ash et al. 2020) for a Bradley–Terry head: the loss gradient at the label the model would
    guess, ∂/∂w −log σ(w·emb) with y = 1[p̄ ≥ 0.5], = (p̄ − y)·emb, (n, D). Its length is the model's doubt times the
    pair's size; its direction says what the pair would teach."""
    p = p_heads.mean(1, keepdim=True)  # (n, 1)
    return (p - (p >= 0.5).to(p.dtype)) * emb


def kmeans_pp(points: Tensor, k: int, gen: torch.Generator) -> list[int]:
    """k-means++ seeding: the longest point first, then each next drawn with probability ∝ its squared distance to
    the nearest one drawn so far, so one batch does not spend its labels on near-duplicates."""
    k = min(k, len(points))
    chosen = [int(points.norm(dim=1).argmax())]
    nearest = (points - points[chosen[0]]).square().sum(1)  # (n,)
    while len(chosen) < k:
        if float(nearest.sum()) <= 0:  # every point sits on a chosen one: fill up in order
            chosen += [i for i in range(len(points)) if i not in set(chosen)][:k - len(chosen)]
            break
        nxt = int(torch.multinomial(nearest / nearest.sum(), 1, generator=gen))
        chosen.append(nxt)
        nearest = torch.minimum(nearest, (points - points[nxt]).square().sum(1))
    return chosen


def pick(strategy: str, p_heads: Tensor, emb: Tensor, k: int, gen: torch.Generator) -> list[int]:
    """The positions (into the candidates) of the next k pairs to label."""
    if strategy == "random":
        return torch.randperm(len(p_heads), generator=gen)[:k].tolist()
    if strategy == "badge":
        return kmeans_pp(gradient_embedding(p_heads, emb), k, gen)
    return top(SCORES[strategy](p_heads), k)
