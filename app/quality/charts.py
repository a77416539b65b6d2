"""Server-rendered SVG charts with axes, ticks and a hover value on every point (no JS, no chart library).

Each function turns numbers into a `Chart`: pixel coordinates, tick labels and tooltip texts, all plain numbers
and strings that `templates/_chart.html` draws (autoescaped, so nothing here is trusted markup). A native SVG
`<title>` on each point and bar is the tooltip: it works without scripts and under the strict CSP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Metrics drawn on a run page, in this order, when the trainer logged them.
CHART_METRICS = ("loss", "reward_mean", "kl", "beta", "entropy", "clipfrac", "value_loss", "explained_variance",
                 "eval_accuracy", "accuracy", "win_rate", "lr")

WIDTH, HEIGHT = 340, 190
MAX_DRAWN = 160
"""Points drawn per series at most: a 300-pixel plot shows no more, and each drawn point carries a tooltip (1,000
rows on six charts made a 700 KB page that took 0.3 s to render on every 2 s poll). Above it each bucket of steps
keeps its lowest and highest point, so spikes stay visible."""
# Room for the y tick labels on the left and the x tick labels and axis title below.
LEFT, RIGHT, TOP, BOTTOM = 48, 10, 10, 34


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    tip: str


@dataclass(frozen=True)
class Series:
    name: str
    css: str
    points: tuple[Point, ...]

    @property
    def path(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    css: str
    tip: str


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    x_label: str
    y_label: str
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    series: tuple[Series, ...] = ()
    bars: tuple[Bar, ...] = ()
    # A reference line (e.g. perfect calibration), as "x,y x,y".
    reference: str | None = None
    legend: tuple[tuple[str, str], ...] = ()
    summary: str = ""
    # Said under the chart when not every point is drawn.
    note: str = ""
    width: int = WIDTH
    height: int = HEIGHT
    box: tuple[float, float, float, float] = field(default=(LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM))


def fmt(value: float) -> str:
    """Four significant digits, no trailing noise: 0.1235, 12.5, 3e-05."""
    if value == 0:
        return "0"
    return f"{value:.4g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (Heckbert's "nice numbers"), at most about `count` of them."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high == low:
        high, low = high + (abs(high) or 1) * 0.5, low - (abs(low) or 1) * 0.5
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


@dataclass(frozen=True)
class _Scale:
    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = (self.high - self.low) or 1.0
        return self.start + (value - self.low) / span * (self.end - self.start)


def _axes(xs: Sequence[float], ys: Sequence[float], *, y_range: tuple[float, float] | None = None,
          integer_x: bool = False) -> tuple[_Scale, _Scale, tuple[Tick, ...], tuple[Tick, ...]]:
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    x_values = nice_ticks(min(xs), max(xs))
    if integer_x:
        x_values = [v for v in x_values if float(v).is_integer()] or [min(xs), max(xs)]
    y_values = nice_ticks(*(y_range or (min(ys), max(ys))))
    sx = _Scale(x_values[0], x_values[-1], left, right) if len(x_values) > 1 else _Scale(min(xs) - 1, max(xs) + 1,
                                                                                          left, right)
    sy = _Scale(y_values[0], y_values[-1], bottom, top)
    return (sx, sy, tuple(Tick(sx(v), fmt(v)) for v in x_values if sx.low <= v <= sx.high),
            tuple(Tick(sy(v), fmt(v)) for v in y_values))


def _finite(pairs: Iterable[tuple[Any, Any]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in pairs
            if isinstance(x, int | float) and isinstance(y, int | float) and math.isfinite(x) and math.isfinite(y)]


def line_chart(key: str, title: str, lines: dict[str, list[tuple[Any, Any]]], *, x_label: str = "step",
               y_label: str = "", y_range: tuple[float, float] | None = None, integer_x: bool = True) -> Chart | None:
    """One or more series over a shared x axis; every point is drawn and carries its value as a tooltip."""
    cleaned = {name: _finite(points) for name, points in lines.items()}
    cleaned = {name: points for name, points in cleaned.items() if points}
    if not cleaned:
        return None
    xs = [x for points in cleaned.values() for x, _ in points]
    ys = [y for points in cleaned.values() for _, y in points]
    sx, sy, x_ticks, y_ticks = _axes(xs, ys, y_range=y_range, integer_x=integer_x)
    drawn = {name: thin(pts) for name, pts in cleaned.items()}
    series = tuple(
        Series(name, f"s{i}", tuple(Point(sx(x), sy(y), f"{name} at {x_label} {fmt(x)}: {fmt(y)}") for x, y in pts))
        for i, (name, pts) in enumerate(drawn.items()))
    first = next(iter(cleaned.values()))
    summary = f"{title}: {len(first)} points, from {fmt(first[0][1])} to {fmt(first[-1][1])}"
    legend = tuple((s.name, s.css) for s in series) if len(series) > 1 else ()
    shown, logged = sum(map(len, drawn.values())), sum(map(len, cleaned.values()))
    note = (f"{shown:,} of {logged:,} points drawn: the lowest and highest of each stretch of {x_label}s"
            if shown < logged else "")
    return Chart(key, title, x_label, y_label, x_ticks, y_ticks, series=series, legend=legend, summary=summary,
                 note=note)


def thin(points: list[tuple[float, float]], limit: int = MAX_DRAWN) -> list[tuple[float, float]]:
    """At most about `limit` of `points` (in order): all of them when they fit, else the lowest and the highest of
    each of limit/2 equal runs, and always the first and the last."""
    if len(points) <= limit:
        return points
    buckets = max(1, limit // 2)
    size = len(points) / buckets
    keep = {0, len(points) - 1}
    for b in range(buckets):
        run = range(int(b * size), max(int((b + 1) * size), int(b * size) + 1))
        keep.add(min(run, key=lambda i: points[i][1]))
        keep.add(max(run, key=lambda i: points[i][1]))
    return [points[i] for i in sorted(keep)]


def charts_for(metrics: list[dict[str, Any]]) -> list[Chart]:
    """One chart per known metric the trainer logged, x = its step (or row number), every row a point."""
    out = []
    for name in CHART_METRICS:
        rows = [m for m in metrics if isinstance(m.get(name), int | float)]
        chart = line_chart(name, name, {name: [(m.get("step", i), m[name]) for i, m in enumerate(rows)]},
                           y_label=name)
        if chart is not None:
            out.append(chart)
    return out


def bar_chart(key: str, title: str, bars: list[tuple[str, float | None, str]], *, y_label: str,
              y_range: tuple[float, float] = (0.0, 1.0)) -> Chart | None:
    """Labelled bars (label, value, tooltip detail); a bar without a value is left out but keeps its slot."""
    if not any(v is not None for _, v, _ in bars):
        return None
    left, right = LEFT, WIDTH - RIGHT
    slot = (right - left) / len(bars)
    sy = _Scale(*y_range, HEIGHT - BOTTOM, TOP)
    drawn, x_ticks = [], []
    for i, (label, value, detail) in enumerate(bars):
        x = left + i * slot
        x_ticks.append(Tick(x + slot / 2, label))
        if value is None or not math.isfinite(value):
            continue
        top = sy(min(max(value, y_range[0]), y_range[1]))
        drawn.append(Bar(x + slot * 0.15, top, slot * 0.7, sy(y_range[0]) - top, "s0",
                         f"{label}: {fmt(value)}" + (f" ({detail})" if detail else "")))
    y_ticks = tuple(Tick(sy(v), fmt(v)) for v in nice_ticks(*y_range))
    return Chart(key, title, "", y_label, tuple(x_ticks), y_ticks, bars=tuple(drawn),
                 summary=f"{title}: " + ", ".join(f"{b[0]} {fmt(b[1])}" for b in bars if b[1] is not None))


def reliability_diagram(bins: list[dict[str, Any]]) -> Chart | None:
    """Calibration: accuracy against the model's confidence per bin; the diagonal is a perfectly calibrated model.

    Each bin is {"mean_confidence", "accuracy", "pairs"} (the reward model's held-out evaluation)."""
    found = [(b.get("mean_confidence"), b.get("accuracy"), b.get("pairs", 0)) for b in bins]
    points = [(c, a, n) for c, a, n in found if isinstance(c, int | float) and isinstance(a, int | float) and n]
    if not points:
        return None
    sx, sy = _Scale(0.5, 1.0, LEFT, WIDTH - RIGHT), _Scale(0.0, 1.0, HEIGHT - BOTTOM, TOP)
    series = Series("accuracy", "s0", tuple(
        Point(sx(c), sy(a), f"confidence {fmt(c)}: accuracy {fmt(a)} over {n} pairs") for c, a, n in points))
    reference = f"{sx(0.5):.1f},{sy(0.5):.1f} {sx(1.0):.1f},{sy(1.0):.1f}"
    return Chart("calibration", "Calibration (reliability diagram)", "confidence", "accuracy",
                 tuple(Tick(sx(v), fmt(v)) for v in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),
                 tuple(Tick(sy(v), fmt(v)) for v in (0.0, 0.25, 0.5, 0.75, 1.0)), series=(series,),
                 reference=reference, legend=(("accuracy per bin", "s0"), ("perfect calibration", "ref")),
                 summary="Calibration: " + ", ".join(f"{fmt(c)} → {fmt(a)}" for c, a, _ in points))


def histogram_pair(key: str, title: str, before: list[float], after: list[float], *, bins: int = 12,
                   x_label: str = "reward") -> Chart | None:
    """Two distributions on shared bins (e.g. reward before and after training), as outlined step lines."""
    values = [v for v in (*before, *after) if math.isfinite(v)]
    if not values:
        return None
    low, high = min(values), max(values)
    width = (high - low) / bins or 1.0
    edges = [low + i * width for i in range(bins + 1)]

    def counts(sample: list[float]) -> list[tuple[float, float]]:
        hist = [0] * bins
        for v in sample:
            if math.isfinite(v):
                hist[min(int((v - low) / width), bins - 1)] += 1
        total = max(len(sample), 1)
        return [((edges[i] + edges[i + 1]) / 2, hist[i] / total) for i in range(bins)]

    lines = {name: counts(sample) for name, sample in (("before", before), ("after", after)) if sample}
    return line_chart(key, title, lines, x_label=x_label, y_label="share of samples", integer_x=False)


def _length_bars(rows: list[dict[str, Any]]) -> Chart | None:
    bars = []
    for row in rows:
        lo, hi = (row.get("tokens") or [None, None])[:2]
        bars.append((f"{lo}–{hi}", row.get("accuracy"), f"{row.get('pairs', 0)} pairs"))
    return bar_chart("accuracy_by_length", "Accuracy by length (tokens)", bars, y_label="held-out accuracy")


def _over_k(key: str, title: str, curves: dict[str, Any]) -> Chart | None:
    """Pass@K or Maj@K for K = 1…k, per model ("policy", "reference"): {model: {K: value}}."""
    lines = {model: sorted((int(k), v) for k, v in by_k.items() if str(k).isdigit())
             for model, by_k in curves.items() if isinstance(by_k, dict)}
    return line_chart(key, title, lines, x_label="K", y_label=title, y_range=(0.0, 1.0))


def _sample_rewards(samples: list[dict[str, Any]], model: str) -> list[float]:
    return [float(s["reward"]) for s in samples
            if s.get("model", "policy") == model and isinstance(s.get("reward"), int | float)]


def eval_charts(evaluation: dict[str, Any] | None, samples: list[dict[str, Any]] | None = None) -> list[Chart]:
    """The evaluation drawn for people: calibration, accuracy by length, Pass@K and Maj@K over K, and the reward of
    the evaluation's samples before (reference) and after (policy) training."""
    evaluation = evaluation or {}
    curves = evaluation.get("curves") or {}
    candidates = [
        reliability_diagram(evaluation.get("calibration") or []),
        _length_bars(evaluation.get("accuracy_by_length") or []),
        _over_k("pass_at", "Pass@K", curves.get("pass_at") or {}),
        _over_k("maj_at", "Maj@K", curves.get("maj_at") or {}),
    ]
    if samples:
        after, before = _sample_rewards(samples, "policy"), _sample_rewards(samples, "reference")
        if before and after:
            candidates.append(histogram_pair("reward_before_after", "Reward of held-out samples, before and after",
                                             before, after))
    return [c for c in candidates if c is not None]


def eval_table(evaluation: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The evaluation's single figures as rows (name, policy or value, reference), lists and curves left out."""
    rows = []
    for name, value in (evaluation or {}).items():
        if name in ("policy", "reference", "curves") or isinstance(value, list):
            continue
        if isinstance(value, dict):
            policy, reference = value.get("policy"), value.get("reference")
            if isinstance(policy, int | float):
                rows.append((name, fmt(policy), fmt(reference) if isinstance(reference, int | float) else ""))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            rows.append((name, fmt(value), ""))
    return rows
