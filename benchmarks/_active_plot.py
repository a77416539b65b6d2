"""The active-learning curves as a small standalone SVG: each order's mean held-out accuracy against labels, with
its 95 % bootstrap band over seeds shaded behind it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

# Colour-blind-safe (Okabe–Ito), one per order in the order given; random first, in black.
COLOURS = ("#000000", "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
W, H, M = 640, 380, 56


def write(path: Path, labels: Sequence[float], curves: dict[str, tuple[list[float], list[float], list[float]]],
          title: str, seeds: int, xlabel: str = "labels") -> None:
    """`curves`: order → (mean, band low, band high) per round, at `labels` (named `xlabel` on the axis)."""
    lows = [v for _, lo, _ in curves.values() for v in lo]
    highs = [v for _, _, hi in curves.values() for v in hi]
    x0, x1 = min(labels), max(labels)
    y0, y1 = min(lows) - 0.005, max(highs) + 0.005

    def at(x: float, y: float) -> tuple[float, float]:
        return M + (x - x0) / (x1 - x0) * (W - 2 * M), H - M - (y - y0) / (y1 - y0) * (H - 2 * M)

    def points(ys: Sequence[float], xs: Sequence[float] = labels) -> str:
        return " ".join("{:.1f},{:.1f}".format(*at(x, y)) for x, y in zip(xs, ys, strict=True))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="12" y="20">{escape(title)}</text>',
             f'<polyline points="{points([y1, y0, y0], [x0, x0, x1])}" fill="none" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 14}" text-anchor="middle">{escape(xlabel)} (mean of {seeds} seeds, '
             'shaded: 95 % bootstrap band over seeds)</text>']
    for i in range(5):
        value = y0 + (y1 - y0) * i / 4
        x, y = at(x0, value)
        parts.append(f'<text x="{x - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{value:.3f}</text>')
    for i in range(5):
        value = x0 + (x1 - x0) * i / 4
        x, y = at(value, y0)
        parts.append(f'<text x="{x:.1f}" y="{y + 16:.1f}" text-anchor="middle">{value:.0f}</text>')
    for i, (name, (mean, lo, hi)) in enumerate(curves.items()):
        colour = COLOURS[i % len(COLOURS)]
        outline = points(list(hi) + list(reversed(lo)), list(labels) + list(reversed(labels)))
        parts.append(f'<polygon points="{outline}" fill="{colour}" fill-opacity="0.12" stroke="none"/>')
        parts.append(f'<polyline points="{points(mean)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{W - M - 110}" y="{H - M - 16 - 16 * (len(curves) - 1 - i)}" fill="{colour}">'
                     f'{escape(name)}</text>')
    path.write_text("\n".join(parts + ["</svg>"]) + "\n", encoding="utf-8")
