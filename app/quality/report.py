"""The agreement report's shape: a project's figures, each annotator's, the trend over time, and the flags raised."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flag:
    """Something a lead must act on, said for people: what is wrong, why it matters, and what to do."""

    kind: str
    """too_fast | position_bias | low_gold | negative_alpha"""
    title: str
    why: str
    action: str


@dataclass(frozen=True)
class AnnotatorStats:
    user_id: int
    email: str
    name: str
    rankings: int
    """Human rankings submitted, skips included."""
    skipped: int
    skip_share: float | None
    """skipped / rankings."""
    median_seconds: float | None
    """Median seconds spent per ranking that was not a skip (skips are quick and would flatter the figure)."""
    agreement: float | None
    """Mean pairwise agreement with every other annotator's ranking of the same prompt."""
    comparisons: int
    """Ranking pairs behind `agreement`."""
    kendall_tau: float | None
    """Mean Kendall τ_b over the same comparisons (where defined)."""
    tie_share: float | None
    """Share of non-skipped rankings with at least one tier of more than one item."""
    position_rate: float | None
    """Share of rankings whose first-shown item is in the top tier."""
    position_expected: float | None
    """What a position-blind annotator would score: mean |top tier| / items shown (1/K without ties)."""
    gold_seen: int
    """Non-skipped rankings of gold prompts."""
    gold_pairs: int
    gold_agreed: int
    gold_accuracy: float | None
    """gold_agreed / gold_pairs: pooled over every gold pair the annotator was shown."""
    position_rankings: int = 0
    """Rankings behind `position_rate` (those with a display order)."""
    flags: list[Flag] = field(default_factory=list)
    """What a lead should look at for this annotator (app.quality.flags decides)."""


@dataclass(frozen=True)
class TrendPoint:
    """The project's figures over one stretch of time (or one rubric version)."""

    label: str
    """The bucket's start (UTC, e.g. "2025-03-01 14:00") or "v2" for a rubric version."""
    x: float
    """Position on the chart's x axis: hours/days/weeks since the first ranking, or the version number."""
    rankings: int
    agreement: float | None
    gold_accuracy: float | None
    median_seconds: float | None


@dataclass(frozen=True)
class AgreementReport:
    project_id: int
    rubric_version: int | None
    """The rubric version the figures are filtered to, or None for all versions."""
    rubric_versions: list[int]
    """Every rubric version of the project, oldest first (for the selector)."""
    overlap: int
    total_prompts: int
    prompts_at_overlap: int
    """Prompts with at least `overlap` non-skipped human rankings in the project's current round."""
    human_rankings: int
    skipped: int
    shared_prompts: int
    """Prompts ranked (not skipped) by two or more annotators."""
    comparisons: int
    """Pairs of rankings of the same prompt by two different annotators."""
    mean_agreement: float | None
    mean_kendall_tau: float | None
    krippendorff_alpha: float | None
    gold_prompts: int
    """Prompts marked as gold tasks (whether or not anyone has ranked them yet)."""
    annotators: list[AnnotatorStats] = field(default_factory=list)
    gold_prompts_ranked: int = 0
    """Gold prompts that at least one annotator has ranked (not skipped)."""
    median_seconds: float | None = None
    """The project's median seconds per non-skipped ranking: what "too fast" is measured against."""
    flags: list[Flag] = field(default_factory=list)
    """What a lead should look at for the project as a whole."""
    trend_unit: str = "day"
    """hour | day | week: the width of each point of `trend`."""
    trend: list[TrendPoint] = field(default_factory=list)
    """Agreement, gold accuracy and speed per stretch of time, oldest first."""
    by_rubric_version: list[TrendPoint] = field(default_factory=list)
    """The same figures per rubric version (always every version, whatever `rubric_version` filters)."""
