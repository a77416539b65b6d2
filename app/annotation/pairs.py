"""Rankings → pairs: every completion in a better tier is chosen over every completion in each worse tier."""

from __future__ import annotations

from typing import NamedTuple


class PairSpec(NamedTuple):
    chosen: int
    rejected: int
    margin: int
    """Tier distance: 1 for neighbouring tiers."""


def expand_tiers(tiers: list[list[int]]) -> list[PairSpec]:
    """Pairs in a deterministic order (tier by tier, then by position); ties produce no pair.

    Count = Σ_{i<j} |T_i|·|T_j|: K=4 without ties gives 6 pairs.
    """
    out: list[PairSpec] = []
    for i, better in enumerate(tiers):
        for j in range(i + 1, len(tiers)):
            for chosen in better:
                for rejected in tiers[j]:
                    out.append(PairSpec(chosen, rejected, j - i))
    return out
