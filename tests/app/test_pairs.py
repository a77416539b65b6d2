"""Tiers → pairs, by example and by property (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.annotation.pairs import expand_tiers


def test_k4_without_ties_gives_six_pairs_with_tier_distance_margins() -> None:
    assert expand_tiers([[1], [2], [3], [4]]) == [(1, 2, 1), (1, 3, 2), (1, 4, 3), (2, 3, 1), (2, 4, 2), (3, 4, 1)]


def test_ties_produce_no_pair_and_partial_rankings_only_cover_ranked_items() -> None:
    assert expand_tiers([[1, 2], [3]]) == [(1, 3, 1), (2, 3, 1)]
    assert expand_tiers([[1, 2, 3]]) == []


@st.composite
def tier_lists(draw):  # type: ignore[no-untyped-def]
    ids = draw(st.lists(st.integers(1, 10_000), min_size=0, max_size=12, unique=True))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=max(0, len(ids) - 1))))
    bounds = [0, *[c for c in cuts if c < len(ids)], len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if ids[a:b]]


@given(tier_lists())
def test_expansion_properties(tiers: list[list[int]]) -> None:
    pairs = expand_tiers(tiers)
    keys = [(p.chosen, p.rejected) for p in pairs]
    rank = {cid: i for i, tier in enumerate(tiers) for cid in tier}
    assert all(c != r for c, r in keys)  # no self pairs
    assert len(set(keys)) == len(keys)  # no duplicates
    assert not any((r, c) in set(keys) for c, r in keys)  # antisymmetric
    expected = sum(len(tiers[i]) * len(tiers[j]) for i in range(len(tiers)) for j in range(i + 1, len(tiers)))
    assert len(pairs) == expected
    assert all(p.margin == rank[p.rejected] - rank[p.chosen] > 0 for p in pairs)
    assert expand_tiers(tiers) == pairs  # deterministic
