"""How far the AI judge agrees with humans, and what the gate on AI labels still misses: what a lead decides on."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Constitution, Pair, Project, Prompt, Ranking
from app.platform.errors import Invalid
from app.quality import agreement

CALIBRATION_BINS = 5

# The evidence a lead needs before AI labels may train a model (the server refuses "allow" without it).
GATE_MIN_PROMPTS = 20
"""Prompts both the judge and humans ranked: with fewer, one prompt's pairs move the agreement figure by several
points, too much to decide on."""
GATE_MIN_AGREEMENT = 0.6
"""Pair agreement with the humans' majority: 0.5 is a coin toss; human–human agreement on preference data is
typically 0.65–0.75, so a judge under 0.6 disagrees with people too often to stand in for them."""


def ai_labels_enabled(project: Project) -> bool:
    return bool((project.settings or {}).get("ai_labels_for_training", False))


def gate_missing(n_prompts: int, pair_agreement: float | None) -> list[str]:
    """What the evidence for allowing AI labels still lacks, in words (empty: the lead may decide)."""
    return gate_shortfall(
        n_prompts, pair_agreement,
        too_few=f"the judge and humans have ranked {n_prompts} of the {GATE_MIN_PROMPTS} prompts in common "
                "needed to measure agreement: run the judge on prompts annotators have ranked",
        unmeasured="no agreement with humans measured yet", unit="pairs",
        remedy="revise the constitution or try a stronger judge model")


def gate_shortfall(n_prompts: int, agreement: float | None, *, too_few: str, unmeasured: str, unit: str,
                   remedy: str) -> list[str]:
    """The gate's two tests, on answers or on steps: enough prompts in common, and agreement with the humans at
    GATE_MIN_AGREEMENT or more; each failed one said in the caller's words (empty: the lead may decide)."""
    missing = []
    if n_prompts < GATE_MIN_PROMPTS:
        missing.append(too_few)
    if agreement is None:
        missing.append(unmeasured)
    elif agreement < GATE_MIN_AGREEMENT:
        missing.append(f"the judge agrees with humans on {agreement:.0%} of {unit}, under the "
                       f"{GATE_MIN_AGREEMENT:.0%} needed: {remedy}")
    return missing


@dataclass
class CalibrationBin:
    p_low: float
    p_high: float
    n: int
    human_rate: float | None
    """Share of human votes for the judge's `chosen` among pairs whose p falls in the bin."""
    mean_p: float | None = None
    """The judge's mean p over those pairs."""


@dataclass
class JudgeAgreement:
    n_prompts: int
    n_pairs: int
    pair_agreement: float | None
    kendall_tau: float | None
    calibration: list[CalibrationBin]
    position_flip_rate: float | None
    """Share of judged pairs where the judge picked whichever answer was shown first in both orders."""
    per_principle: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    gold_prompts: int = 0
    gold_accuracy: float | None = None
    """Against the known correct order of gold prompts (e.g. GSM8K correctness)."""
    ai_labels_enabled: bool = False
    gate_missing: list[str] = field(default_factory=list)
    """What the evidence for allowing AI labels still lacks; empty when the lead may allow them."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge_agreement(db: Session, project: Project, *, constitution_version: int | None = None,
                    judge_run_id: int | None = None) -> JudgeAgreement:
    """How the judge's labels compare with the humans' on prompts both ranked, and with gold orders."""
    ai_rankings = _ai_rankings(db, project, constitution_version, judge_run_id)
    humans, gold, pairs_by_ranking = _evidence(db, ai_rankings)
    tally = _JudgeTally()
    for ranking in ai_rankings:
        pairs = pairs_by_ranking[ranking.id]
        tally.count_position_flips(pairs)
        if ranking.prompt_id in gold:
            score = agreement.gold_accuracy(gold[ranking.prompt_id], ranking.tiers)
            if score is not None:
                tally.gold_scores.append(score)
        human = humans.get(ranking.prompt_id)
        if human:
            tally.compare_with_humans(ranking, pairs, human)

    mean = _mean4
    calibration = [CalibrationBin(p_low=i / CALIBRATION_BINS, p_high=(i + 1) / CALIBRATION_BINS, n=len(b),
                                  human_rate=mean(b), mean_p=mean(tally.bin_p[i]))
                   for i, b in enumerate(tally.bins)]
    return JudgeAgreement(
        n_prompts=len(tally.shared_prompts), n_pairs=len(tally.agree), pair_agreement=mean(tally.agree),
        kendall_tau=mean(tally.taus), calibration=calibration,
        position_flip_rate=round(tally.flips / tally.flip_n, 4) if tally.flip_n else None,
        per_principle={k: {"n": len(v), "pair_agreement": mean(v)} for k, v in sorted(tally.per_principle.items())},
        gold_prompts=len(tally.gold_scores), gold_accuracy=mean(tally.gold_scores),
        ai_labels_enabled=ai_labels_enabled(project),
        gate_missing=gate_missing(len(tally.shared_prompts), mean(tally.agree)),
    )


def _mean4(xs: list[float] | list[int]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def _ai_rankings(db: Session, project: Project, constitution_version: int | None,
                 judge_run_id: int | None) -> list[Ranking]:
    """The project's AI rankings, of one judge run and/or one constitution version when given."""
    ai_q = select(Ranking).where(Ranking.project_id == project.id, Ranking.source == "ai")
    if judge_run_id is not None:
        ai_q = ai_q.where(Ranking.judge_run_id == judge_run_id)
    if constitution_version is not None:
        cid = db.scalar(select(Constitution.id).where(Constitution.project_id == project.id,
                                                      Constitution.version == constitution_version))
        if cid is None:
            raise Invalid("no such constitution version", field="constitution_version")
        ai_q = ai_q.where(Ranking.constitution_id == cid)
    return list(db.scalars(ai_q))


def _evidence(db: Session, ai_rankings: list[Ranking]
              ) -> tuple[dict[int, list[list[list[int]]]], dict[int, Any], dict[int, list[Pair]]]:
    """What the judge's rankings are held against: per prompt the humans' tiers (skips aside) and the gold order,
    and per AI ranking its pairs."""
    prompt_ids = {r.prompt_id for r in ai_rankings}
    humans: dict[int, list[list[list[int]]]] = defaultdict(list)
    if prompt_ids:
        for r in db.scalars(select(Ranking).where(Ranking.prompt_id.in_(prompt_ids), Ranking.source == "human",
                                                  Ranking.skipped.is_(False))):
            humans[r.prompt_id].append(r.tiers)
    gold = dict(db.execute(select(Prompt.id, Prompt.gold_tiers).where(Prompt.id.in_(prompt_ids),
                                                                      Prompt.gold_tiers.is_not(None))).all()) \
        if prompt_ids else {}
    pairs_by_ranking: dict[int, list[Pair]] = defaultdict(list)
    if ai_rankings:
        for p in db.scalars(select(Pair).where(Pair.ranking_id.in_([r.id for r in ai_rankings]))):
            pairs_by_ranking[p.ranking_id].append(p)
    return humans, gold, pairs_by_ranking


@dataclass
class _JudgeTally:
    agree: list[int] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    flips: int = 0
    flip_n: int = 0
    bins: list[list[float]] = field(default_factory=lambda: [[] for _ in range(CALIBRATION_BINS)])
    bin_p: list[list[float]] = field(default_factory=lambda: [[] for _ in range(CALIBRATION_BINS)])
    per_principle: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    gold_scores: list[float] = field(default_factory=list)
    shared_prompts: set[int] = field(default_factory=set)

    def count_position_flips(self, pairs: list[Pair]) -> None:
        """Pairs whose verdict changed when the two answers swapped places."""
        for pair in pairs:
            meta = pair.meta or {}
            if "position_flip" in meta:
                self.flip_n += 1
                self.flips += bool(meta["position_flip"])

    def compare_with_humans(self, ranking: Ranking, pairs: list[Pair], human: list[list[list[int]]]) -> None:
        """Kendall's τ-b against each human ranking; per pair the humans' vote, for calibration and agreement."""
        self.shared_prompts.add(ranking.prompt_id)
        for h in human:
            tau = agreement.kendall_tau_b(ranking.tiers, h)
            if tau is not None:
                self.taus.append(tau)
        for pair in pairs:
            votes_for, votes_against = _human_votes(pair, human)
            if votes_for + votes_against == 0:
                continue
            rate = votes_for / (votes_for + votes_against)
            b = min(CALIBRATION_BINS - 1, int(pair.p * CALIBRATION_BINS))
            self.bins[b].append(rate)
            self.bin_p[b].append(pair.p)
            if votes_for != votes_against:
                hit = int((pair.p >= 0.5) == (votes_for > votes_against))
                self.agree.append(hit)
                for name in (pair.meta or {}).get("principles", []):
                    self.per_principle[name].append(hit)


def _human_votes(pair: Pair, human: list[list[list[int]]]) -> tuple[int, int]:
    """(humans who put chosen above rejected, humans who put it below); a tie or a missing answer is no vote."""
    votes_for = votes_against = 0
    for h in human:
        idx = agreement.tier_index(h)
        if pair.chosen_id in idx and pair.rejected_id in idx and idx[pair.chosen_id] != idx[pair.rejected_id]:
            if idx[pair.chosen_id] < idx[pair.rejected_id]:
                votes_for += 1
            else:
                votes_against += 1
    return votes_for, votes_against


def reliability_bins(calibration: list[CalibrationBin]) -> list[dict[str, Any]]:
    """The judge's calibration as `charts.reliability_diagram` draws it: per bin the judge's confidence in the
    side it favours, max(p, 1 − p), against the share of humans on that side, pairs as weights. A bin under
    p = 0.5 favours `rejected`, so it is folded over: confidence 1 − p, accuracy 1 − human rate; bins that fold
    onto the same confidence are merged."""
    merged: dict[float, list[float]] = {}
    for b in calibration:
        if not b.n or b.human_rate is None:
            continue
        p = b.mean_p if b.mean_p is not None else (b.p_low + b.p_high) / 2
        confidence, accuracy = (p, b.human_rate) if p >= 0.5 else (1 - p, 1 - b.human_rate)
        key = round((b.p_low + b.p_high) / 2 if p >= 0.5 else 1 - (b.p_low + b.p_high) / 2, 6)
        acc = merged.setdefault(key, [0.0, 0.0, 0.0])  # Σ n·confidence, Σ n·accuracy, Σ n
        acc[0] += b.n * confidence
        acc[1] += b.n * accuracy
        acc[2] += b.n
    return [{"mean_confidence": c / n, "accuracy": a / n, "pairs": int(n)}
            for _, (c, a, n) in sorted(merged.items())]
