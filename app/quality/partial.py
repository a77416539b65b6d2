"""The agreement figures as sums of per-group partial states: what one (prompt, round) adds to each total, and the
report read back from the totals. Pure: no database.

Every figure of the agreement report is a sum over (prompt, round) groups, or is computed from such sums:

- pairwise agreement is Σ matches/pairs over comparisons: kept as, per denominator d = C(shared items, 2), the sum of
  the matches (`agree.<d>`), so the sum is of integers and a group taken out leaves no rounding behind;
- Kendall's τ-b is Σ (n_c − n_d)/√D: kept as Σ (n_c − n_d) per D (`tau.<D>`);
- Krippendorff's α comes from the coincidence matrix o_ck = Σ_u (c–k pairs in u)/(m_u − 1): kept as integer counts
  per (c, k, m_u − 1) (`o.<c>|<k>|<m_u − 1>`);
- position bias's expectation Σ |top tier|/|shown| is kept as Σ |top tier| per |shown| (`pos_exp.<|shown|>`);
- counts (rankings, skips, ties, comparisons, gold pairs, …) are counts;
- prompts at overlap: one group per (prompt, round) with `done` non-skipped rankings adds 1 to `at.<round>|<done>`, so
  the prompts of the current round with at least `overlap` are a sum over the `at` entries;
- the trend is the same sums per hour, day and week (calendar buckets, UTC; weeks from Monday).

Three figures are not sums, and are kept another way:

- the medians of seconds spent: each total's seconds are kept as a histogram of tenths of a second (a sum), the
  median read off it where it changed (app.quality.upkeep). The figure is the median of the times rounded to the
  tenth, the precision the page shows;
- shared prompts and gold prompts ranked count distinct prompts, not groups: a group says whether it has a
  comparison (`shared`) or a ranked gold order (`gold_ranked`), and the drain adds a prompt when its first group
  says so and takes it away with its last (`shared` and `gold_ranked` in the project's total);
- the trend's unit (hour, day or week) follows the span between the first and last hour with rankings.

Every number in a state is an integer, so totals kept by adding and subtracting states equal a recomputation exactly;
the figures are then computed from the totals in floating point.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from itertools import combinations
from typing import Any

from app.quality.agreement import alpha_from_coincidences, gold_score, has_tie, mid_ranks, tier_index
from app.quality.buckets import periods, tenth

Part = dict[str, int]
"""What a group adds to one total: integer counts by name ("n", "cmp", …) and, for the maps, by name and key in one
flat dict ("agree.3", "tau.9", "pos_exp.4", "o.1.5|2.0|1", "at.1|3", and "s.235": the seconds histogram, tenth →
rankings), so adding two parts is one loop."""
State = dict[str, Part]
"""Totals key ("p"; "a:<user id>"; "h:<hour>", "d:<day>", "w:<week>") → what the group adds there."""

def _inc(part: Part, name: str, by: int = 1) -> None:
    part[name] = part.get(name, 0) + by


def _inc_in(part: Part, name: str, key: Any, by: int = 1) -> None:
    entry = f"{name}.{key}"
    part[entry] = part.get(entry, 0) + by


@dataclass
class GroupState:
    """One (prompt, round)'s partial state in one scope."""

    parts: State
    agreement: float | None
    """Mean pairwise agreement of its comparisons, as the disagreements page orders groups."""
    shared: bool
    gold_ranked: bool
    folded: dict[str, Any] | None = None
    """What folding more rankings into the state needs (see `extend`): the content hashes of the rankings in it
    ("h"), the gold order's hash ("g"), rankings not skipped ("r"), and each completion's mid-ranks as counts
    ("u": completion → mid-rank → rankings); None: unknown, the next change recomputes the group."""

    @property
    def rankings(self) -> int:
        return int(self.parts.get("p", {}).get("n", 0))


class _Ranked:
    __slots__ = ("annotator_id", "tiers", "at")

    def __init__(self, annotator_id: int, tiers: list[list[int]], at: datetime | None) -> None:
        self.annotator_id, self.tiers, self.at = annotator_id, tiers, at


def content_hash(r: Any) -> int:
    """A ranking's id and everything its state depends on, hashed (52 bits: exact in any JSON reader): a ranking
    resubmitted with other tiers, or a removed ranking's id reused by another, hashes differently."""
    at = r.created_at.replace(tzinfo=None).isoformat() if r.created_at is not None else None
    text = json.dumps([r.id, r.annotator_id, r.tiers, r.display_order, bool(r.skipped), r.seconds_spent, at,
                       r.rubric_version], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()) >> 12


def gold_hash(gold: Any | None) -> str | None:
    return hashlib.blake2b(json.dumps(gold).encode(), digest_size=8).hexdigest() if gold else None


def group_state(rows: Sequence[Any], gold: Any | None) -> GroupState:
    """The partial state of one (prompt, round)'s human rankings in one scope (rows with the columns of
    agreement.human_rankings and an id), the prompt's gold order being `gold` (None: not a gold task). A function of
    the set of rankings: their order does not matter."""
    parts: State = defaultdict(dict)
    folded: dict[str, Any] = {"h": [], "g": gold_hash(gold), "r": 0, "u": {}}
    return _fold(parts, folded, [], rows, gold, rows[0].round if rows else 0, False)


def extend(old: GroupState, rows: Sequence[Any], gold: Any | None) -> GroupState | None:
    """`old` with the rankings of `rows` it does not hold folded in (each compared with the ones it holds): equal to
    group_state(rows, gold) when `rows` are old's rankings and more; None when they are not (a ranking removed or
    changed, another gold order, no record of what old holds), and the group must be computed anew."""
    folded = old.folded
    if folded is None or folded.get("g") != gold_hash(gold):
        return None
    held = set(folded["h"])
    hashes = [content_hash(r) for r in rows]
    mine = [r for r, h in zip(rows, hashes, strict=True) if h in held]
    if len(mine) != len(held):
        return None
    new = [r for r, h in zip(rows, hashes, strict=True) if h not in held]
    if not new:
        return old
    parts: State = defaultdict(dict, {k: dict(v) for k, v in old.parts.items()})
    project = parts["p"]
    for name in [k for k in project if k.startswith(("at.", "o.")) or k == "disagree"]:
        del project[name]  # the group's own figures, computed again below from all its rankings
    copy = {"h": list(folded["h"]), "g": folded["g"], "r": folded["r"],
            "u": {item: dict(ranks) for item, ranks in folded["u"].items()}}
    before = [_Ranked(r.annotator_id, r.tiers, r.created_at) for r in mine if not r.skipped and r.tiers]
    return _fold(parts, copy, before, new, gold, rows[0].round, old.gold_ranked)


def _fold(parts: State, folded: dict[str, Any], before: list[_Ranked], rows: Sequence[Any], gold: Any | None,
          round_: int, gold_ranked: bool) -> GroupState:
    """`rows` added to a group's parts, which hold the rankings `before` (their per-group figures taken out)."""
    project = parts["p"]
    ranked = list(before)
    for r in rows:
        folded["h"].append(content_hash(r))
        one = _one(parts, r, gold)
        if one is None:
            continue
        gold_ranked |= bool(gold)
        _compare(parts, ranked, one)
        ranked.append(one)
        for item, rank in mid_ranks(r.tiers).items():
            units = folded["u"].setdefault(str(item), {})
            units[repr(rank)] = units.get(repr(rank), 0) + 1
    folded["r"] += len(ranked) - len(before)
    if folded["r"]:
        _inc_in(project, "at", f"{round_}|{folded['r']}")
    agreement = _mean_agreement(project)
    if agreement is not None and agreement < 1:
        _inc(project, "disagree")
    _coincidences(project, folded["u"])
    folded["h"].sort()
    return GroupState({k: v for k, v in parts.items() if v}, agreement, agreement is not None, gold_ranked, folded)


def _one(parts: State, r: Any, gold: Any | None) -> _Ranked | None:
    """What one ranking adds by itself (counts, seconds, habits, gold); the ranking to compare, unless skipped."""
    project, person = parts["p"], parts[f"a:{r.annotator_id}"]
    buckets = [parts[k] for k in periods(r.created_at)]
    for part in (project, person, *buckets):
        _inc(part, "n")
    if r.skipped or not r.tiers:
        _inc(project, "skipped")
        _inc(person, "skipped")
        return None
    if r.seconds_spent is not None:
        t = tenth(r.seconds_spent)
        for part in (project, person, *buckets):
            _inc_in(part, "s", t)
            _inc(part, "sn")
    _ranking_habits(person, r.tiers, r.display_order or [])
    if gold:
        score = gold_score(gold, r.tiers, r.display_order)
        _inc(person, "gold_seen")
        for part in (project, person, *buckets):
            _inc(part, "gold_agreed", score.agreed)
            _inc(part, "gold_pairs", score.total)
    return _Ranked(r.annotator_id, r.tiers, r.created_at)


def _mean_agreement(project: Part) -> float | None:
    """Mean agreement of the group's comparisons, Σ matches/pairs ÷ comparisons, summed exactly (the same float
    however the comparisons were added up)."""
    n = project.get("cmp", 0)
    if not n:
        return None
    return float(sum((Fraction(m, int(d)) for d, m in entries(project, "agree")), Fraction(0)) / n)


def _ranking_habits(person: Part, tiers: list[list[int]], shown: list[int]) -> None:
    """Ties and position bias (as agreement.position_bias counts them): what one non-skipped ranking says of its
    annotator."""
    _inc(person, "ties", int(has_tie(tiers)))
    if shown and tiers[0]:
        _inc(person, "pos_n")
        _inc(person, "pos_hits", int(shown[0] in tiers[0]))
        _inc_in(person, "pos_exp", len(shown), len(tiers[0]))


def _compare(parts: State, ranked: list[_Ranked], rb: _Ranked) -> None:
    """`rb` compared with every other annotator's ranking of the group, as agreement.compare_annotators compares
    them, added to the project's, both annotators' and (at the later ranking's time) the trend's totals."""
    ib = tier_index(rb.tiers)
    for ra in ranked:
        if ra.annotator_id == rb.annotator_id:
            continue
        ia = tier_index(ra.tiers)
        shared = sorted(ia.keys() & ib.keys())
        pairs = len(shared) * (len(shared) - 1) // 2
        if not pairs:
            continue
        relations = [(_sign(ia[y] - ia[x]), _sign(ib[y] - ib[x])) for x, y in combinations(shared, 2)]
        matches = sum(1 for a, b in relations if a == b)
        concordant = sum(1 for a, b in relations if a * b > 0) - sum(1 for a, b in relations if a * b < 0)
        ties_a, ties_b = sum(1 for a, _ in relations if a == 0), sum(1 for _, b in relations if b == 0)
        denominator = (pairs - ties_a) * (pairs - ties_b)
        people = [parts[f"a:{ra.annotator_id}"], parts[f"a:{rb.annotator_id}"]]
        for part in (parts["p"], *people):
            _inc(part, "cmp")
            _inc_in(part, "agree", pairs, matches)
            if denominator:
                _inc(part, "taus")
                _inc_in(part, "tau", denominator, concordant)
        if ra.at is not None and rb.at is not None:
            for key in periods(max(ra.at, rb.at)):
                _inc(parts[key], "cmp")
                _inc_in(parts[key], "agree", pairs, matches)


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _coincidences(project: Part, units: dict[str, dict[str, int]]) -> None:
    """α's coincidences of the group's units (one per completion ranked), from each unit's mid-ranks as counts:
    c–k pairs counted per m_u − 1 (values c ≠ k pair n_c·n_k times, c with itself n_c·(n_c − 1) times)."""
    for ranks in units.values():
        m = sum(ranks.values())
        if m < 2:
            continue
        for c, n_c in ranks.items():
            for k, n_k in ranks.items():
                pairs = n_c * (n_c - 1) if c == k else n_c * n_k
                if pairs:
                    _inc_in(project, "o", f"{c}|{k}|{m - 1}", pairs)


# --- adding and taking away ----------------------------------------------------------------------------------


def add(total: Part, part: Part, sign: int = 1) -> None:
    """total += sign × part, in place; entries that reach zero are dropped (every number is an integer)."""
    for name, value in part.items():
        left = total.get(name, 0) + sign * value
        if left:
            total[name] = left
        else:
            total.pop(name, None)


def difference(new: Iterable[GroupState], old: Iterable[GroupState]) -> State:
    """Σ new − Σ old, per totals key: what replacing the old states by the new ones changes."""
    delta: State = defaultdict(dict)
    for sign, states in ((1, new), (-1, old)):
        for state in states:
            for key, part in state.parts.items():
                add(delta[key], part, sign)
    return {key: part for key, part in delta.items() if part}


# --- figures from totals -------------------------------------------------------------------------------------


def entries(part: Mapping[str, int], name: str) -> Iterator[tuple[str, int]]:
    """(key, count) of one map kept in a part ("agree" → ("3", 7), …)."""
    prefix = name + "."
    return ((key[len(prefix):], n) for key, n in part.items() if key.startswith(prefix))


def rational_sum(part: Mapping[str, int], name: str) -> float:
    """Σ numerator/denominator over a map of {denominator: Σ numerators}."""
    return sum(n / int(d) for d, n in entries(part, name))


def tau_sum(part: Mapping[str, int], name: str = "tau") -> float:
    """Σ (n_c − n_d)/√D over {D: Σ (n_c − n_d)}."""
    return sum(n / math.sqrt(int(d)) for d, n in entries(part, name))


def alpha(project: Mapping[str, int]) -> float | None:
    """Krippendorff's α from the kept coincidence counts."""
    coincidence: dict[tuple[float, float], float] = defaultdict(float)
    for key, count in entries(project, "o"):
        c, k, d = key.split("|")
        coincidence[(float(c), float(k))] += count / int(d)
    return alpha_from_coincidences(coincidence)


def prompts_at_overlap(project: Mapping[str, int], current_round: int, overlap: int) -> int:
    """Groups of the current round with at least `overlap` non-skipped rankings."""
    out = 0
    for key, count in entries(project, "at"):
        round_, done = key.split("|")
        if int(round_) == current_round and int(done) >= overlap:
            out += count
    return out


def mean(part: Mapping[str, int], name: str, counts: str) -> float | None:
    n = part.get(counts, 0)
    return rational_sum(part, name) / n if n else None
