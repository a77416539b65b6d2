"""What a lead must act on in the agreement report: the thresholds, in one place, and the flags they raise.

A flag is raised only on enough evidence to mean something about a person (or the project); figures that are
fine, or too few to tell, raise nothing and stay neutral on the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.quality.report import AgreementReport, AnnotatorStats, Flag


@dataclass(frozen=True)
class Thresholds:
    min_rankings: int = 5
    """Fewer non-skipped rankings than this say nothing about a person's habits: no speed or position flag."""
    too_fast_ratio: float = 0.25
    """A median under a quarter of the project's median: far quicker than colleagues reading the same tasks."""
    too_fast_seconds: float = 3.0
    """A median under 3 s per ranking is too fast whatever the project does: K answers cannot be read that quickly
    (a ranking of four short answers takes a careful reader 20 s or more)."""
    position_excess: float = 0.15
    """First-shown ranked top at least 15 points above the position-blind rate (1/K without ties) …"""
    position_z: float = 2.0
    """… and more than 2 standard errors above it (binomial, √(p(1 − p)/n)), so a short run of luck is not bias."""
    gold_min_pairs: int = 4
    """Fewer gold pairs than this (one K=4 gold prompt with two right answers gives 4) is too little to judge."""
    gold_min_accuracy: float = 0.7
    """A random order gets about 0.5 of gold pairs right; under 0.7 is closer to guessing than to reading."""
    alpha_floor: float = 0.0
    """Krippendorff's α below 0: annotators disagree more than chance would, i.e. they read the rubric in
    opposite ways (or some rank in reverse). Meaningful only over several comparisons:"""
    alpha_min_comparisons: int = 5


THRESHOLDS = Thresholds()


def _too_fast(a: AnnotatorStats, project_median: float | None, t: Thresholds) -> Flag | None:
    ranked = a.rankings - a.skipped
    if a.median_seconds is None or ranked < t.min_rankings:
        return None
    relative = project_median is not None and a.median_seconds < t.too_fast_ratio * project_median
    if not (relative or a.median_seconds < t.too_fast_seconds):
        return None
    compared = f", against {project_median:.1f} s for the project" if project_median is not None else ""
    return Flag("too_fast", "Too fast",
                f"A median of {a.median_seconds:.1f} s per ranking{compared}: too little time to read "
                "every answer, so these rankings may be guesses.",
                "Open their rankings, check a few against the rubric, and talk to them before using their labels.")


def _position_biased(a: AnnotatorStats, t: Thresholds) -> Flag | None:
    n, rate, p0 = a.position_rankings, a.position_rate, a.position_expected
    if rate is None or p0 is None or n < t.min_rankings:
        return None
    se = math.sqrt(max(p0 * (1 - p0), 1e-9) / n)
    if rate - p0 < t.position_excess or rate - p0 < t.position_z * se:
        return None
    return Flag("position_bias", "Position-biased",
                f"Ranks the answer shown first on top in {rate:.0%} of {n} rankings, where reading alone would give "
                f"about {p0:.0%}: the order of the cards decides, not the answers.",
                "Look at their rankings; remind them that the cards are shuffled and every answer must be read.")


def _low_gold(a: AnnotatorStats, t: Thresholds) -> Flag | None:
    if a.gold_accuracy is None or a.gold_pairs < t.gold_min_pairs or a.gold_accuracy >= t.gold_min_accuracy:
        return None
    return Flag("low_gold", "Low gold accuracy",
                f"Orders {a.gold_accuracy:.0%} of {a.gold_pairs} known-correct gold pairs the right way; "
                f"guessing gives about 50%, careful work {t.gold_min_accuracy:.0%} or more.",
                "Open their gold misses to see which answers they get wrong; retrain on the rubric or drop "
                "their labels from exports.")


def annotator_flags(a: AnnotatorStats, project_median: float | None, t: Thresholds = THRESHOLDS) -> list[Flag]:
    found = (_too_fast(a, project_median, t), _position_biased(a, t), _low_gold(a, t))
    return [f for f in found if f is not None]


def project_flags(report: AgreementReport, t: Thresholds = THRESHOLDS) -> list[Flag]:
    alpha = report.krippendorff_alpha
    if alpha is None or alpha >= t.alpha_floor or report.comparisons < t.alpha_min_comparisons:
        return []
    return [Flag("negative_alpha", "Negative agreement (α < 0)",
                 f"Krippendorff's α is {alpha:.2f}: annotators disagree more than if they ranked at random, "
                 "so they read the rubric in different ways or some rank in reverse.",
                 "Open the prompts they disagree on most, make the rubric say which answer wins there, and "
                 "check the flagged annotators below.")]


def flagged(report: AgreementReport, t: Thresholds = THRESHOLDS) -> AgreementReport:
    """The report with every flag filled in."""
    annotators = [replace(a, flags=annotator_flags(a, report.median_seconds, t)) for a in report.annotators]
    return replace(report, annotators=annotators, flags=project_flags(report, t))
