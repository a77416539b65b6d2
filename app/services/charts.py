"""Small server-rendered line charts: metric series → SVG polyline coordinates (no JS, no chart library)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CHART_METRICS = ("loss", "reward_mean", "kl", "beta", "entropy", "clipfrac", "value_loss", "explained_variance",
                 "eval_accuracy", "accuracy", "win_rate", "lr")


@dataclass(frozen=True)
class Chart:
    name: str
    points: str
    """"x,y x,y …" in the SVG's coordinate space; numbers only, so safe to place in an attribute."""
    first: float
    last: float
    low: float
    high: float
    n: int


def line_chart(name: str, xs: list[float], ys: list[float], *, width: int = 300, height: int = 90,
               pad: int = 4) -> Chart | None:
    pts = [(x, y) for x, y in zip(xs, ys, strict=False) if isinstance(y, int | float) and math.isfinite(y)]
    if not pts:
        return None
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    xspan, yspan = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    coords = " ".join(f"{pad + (x - x0) / xspan * (width - 2 * pad):.1f},"
                      f"{height - pad - (y - y0) / yspan * (height - 2 * pad):.1f}" for x, y in pts)
    return Chart(name, coords, pts[0][1], pts[-1][1], y0, y1, len(pts))


def charts_for(metrics: list[dict[str, Any]]) -> list[Chart]:
    """One chart per known metric present in the rows, x = step (or row number)."""
    out = []
    for name in CHART_METRICS:
        rows = [m for m in metrics if isinstance(m.get(name), int | float)]
        if not rows:
            continue
        chart = line_chart(name, [float(m.get("step", i)) for i, m in enumerate(rows)], [float(m[name]) for m in rows])
        if chart is not None:
            out.append(chart)
    return out
