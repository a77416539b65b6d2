"""A line chart as a PNG, in pure Python (zlib and struct): the benchmarks need one plot, not matplotlib.

`line_chart(series, path, ...)` draws each series (a name, an RGB colour and (x, y) points) as a polyline over
axes with ticks, a 5×7 bitmap font for the tick labels, the title and the legend, and writes an 8-bit RGB PNG.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RGB = tuple[int, int, int]
WHITE: RGB = (255, 255, 255)
BLACK: RGB = (0, 0, 0)
GREY: RGB = (220, 220, 220)
# Colour-blind-safe (Okabe–Ito), one per series in order.
PALETTE: tuple[RGB, ...] = ((0, 0, 0), (230, 159, 0), (86, 180, 233), (0, 158, 115), (213, 94, 0),
                            (0, 114, 178), (204, 121, 167), (240, 228, 66))

# 5×7 glyphs, one string of 7 rows of 5 bits per character (what the labels use: digits, letters, a few signs).
_GLYPHS = {
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11110 00001 00001 01110 00001 00001 11110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    ".": "00000 00000 00000 00000 00000 01100 01100", "-": "00000 00000 00000 11111 00000 00000 00000",
    "_": "00000 00000 00000 00000 00000 00000 11111", "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000", ",": "00000 00000 00000 00000 01100 00100 01000",
    ":": "00000 01100 01100 00000 01100 01100 00000", "=": "00000 00000 11111 00000 11111 00000 00000",
    "+": "00000 00100 00100 11111 00100 00100 00000", "/": "00001 00010 00010 00100 01000 01000 10000",
    "%": "11001 11010 00010 00100 01000 01011 10011", "@": "01110 10001 10111 10101 10110 10000 01110",
    " ": "00000 00000 00000 00000 00000 00000 00000",
    "a": "00000 00000 01110 00001 01111 10001 01111", "b": "10000 10000 11110 10001 10001 10001 11110",
    "c": "00000 00000 01110 10000 10000 10001 01110", "d": "00001 00001 01111 10001 10001 10001 01111",
    "e": "00000 00000 01110 10001 11111 10000 01110", "f": "00110 01001 01000 11100 01000 01000 01000",
    "g": "00000 01111 10001 10001 01111 00001 01110", "h": "10000 10000 10110 11001 10001 10001 10001",
    "i": "00100 00000 01100 00100 00100 00100 01110", "j": "00010 00000 00110 00010 00010 10010 01100",
    "k": "10000 10000 10010 10100 11000 10100 10010", "l": "01100 00100 00100 00100 00100 00100 01110",
    "m": "00000 00000 11010 10101 10101 10001 10001", "n": "00000 00000 10110 11001 10001 10001 10001",
    "o": "00000 00000 01110 10001 10001 10001 01110", "p": "00000 00000 11110 10001 11110 10000 10000",
    "q": "00000 00000 01111 10001 01111 00001 00001", "r": "00000 00000 10110 11001 10000 10000 10000",
    "s": "00000 00000 01111 10000 01110 00001 11110", "t": "01000 01000 11100 01000 01000 01001 00110",
    "u": "00000 00000 10001 10001 10001 10011 01101", "v": "00000 00000 10001 10001 10001 01010 00100",
    "w": "00000 00000 10001 10001 10101 10101 01010", "x": "00000 00000 10001 01010 00100 01010 10001",
    "y": "00000 00000 10001 10001 01111 00001 01110", "z": "00000 00000 11111 00010 00100 01000 11111",
}
_UPPER = {
    "A": "01110 10001 10001 11111 10001 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11100 10010 10001 10001 10001 10010 11100",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "K": "10001 10010 10100 11000 10100 10010 10001",
    "L": "10000 10000 10000 10000 10000 10000 11111", "M": "10001 11011 10101 10101 10001 10001 10001",
    "N": "10001 10001 11001 10101 10011 10001 10001", "O": "01110 10001 10001 10001 10001 10001 01110",
    "P": "11110 10001 10001 11110 10000 10000 10000", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "W": "10001 10001 10001 10101 10101 10101 01010",
}
_GLYPHS |= _UPPER


@dataclass
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    colour: RGB | None = None


class Canvas:
    """An RGB raster, (0, 0) at the top left."""

    def __init__(self, width: int, height: int, background: RGB = WHITE) -> None:
        if width < 1 or height < 1:
            raise ValueError(f"a canvas needs a positive size, got {width}×{height}")
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, colour: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = 3 * (y * self.width + x)
            self.pixels[at:at + 3] = bytes(colour)

    def rect(self, x0: int, y0: int, x1: int, y1: int, colour: RGB) -> None:
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.set(x, y, colour)

    def line(self, x0: float, y0: float, x1: float, y1: float, colour: RGB, thickness: int = 1) -> None:
        steps = max(1, int(math.ceil(max(abs(x1 - x0), abs(y1 - y0)))))
        half = thickness // 2
        for i in range(steps + 1):
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            self.rect(x - half, y - half, x - half + thickness - 1, y - half + thickness - 1, colour)

    def text(self, x: int, y: int, text: str, colour: RGB = BLACK, scale: int = 1) -> None:
        """Draw `text` with its top-left corner at (x, y); unknown characters draw as blanks."""
        for n, char in enumerate(text):
            rows = _GLYPHS.get(char, _GLYPHS.get(char.lower(), _GLYPHS[" "])).split()
            for r, bits in enumerate(rows):
                for c, bit in enumerate(bits):
                    if bit == "1":
                        left, top = x + (6 * n + c) * scale, y + r * scale
                        self.rect(left, top, left + scale - 1, top + scale - 1, colour)

    def png(self) -> bytes:
        return encode_png(self.width, self.height, bytes(self.pixels))


def text_width(text: str, scale: int = 1) -> int:
    return 6 * len(text) * scale


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit truecolour PNG of `rgb` (rows top to bottom, 3 bytes a pixel), each row with filter 0."""
    if len(rgb) != 3 * width * height:
        raise ValueError(f"rgb has {len(rgb)} bytes, a {width}×{height} image needs {3 * width * height}")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = 3 * width
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if high <= low:
        high = low + 1
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{value:.2f}".rstrip("0").rstrip(".")


def line_chart(series: Sequence[Series], path: str | Path | None = None, *, title: str = "", x_label: str = "",
               y_label: str = "", width: int = 720, height: int = 440, y_range: tuple[float, float] | None = None
               ) -> bytes:
    """The chart's PNG bytes (also written to `path` when given). Series without points are left out."""
    drawn = [s for s in series if s.points]
    if not drawn:
        raise ValueError("line_chart: no series has any points")
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(*(y_range or (min(ys), max(ys))))
    x_lo, x_hi, y_lo, y_hi = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    left, right, top, bottom = 60, width - 170, 56, height - 50
    canvas = Canvas(width, height)

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top)

    for y in y_ticks:
        canvas.line(left, py(y), right, py(y), GREY)
        canvas.text(left - 6 - text_width(_label(y)), round(py(y)) - 3, _label(y))
    for x in x_ticks:
        canvas.line(px(x), bottom, px(x), bottom + 4, BLACK)
        canvas.text(round(px(x)) - text_width(_label(x)) // 2, bottom + 8, _label(x))
    canvas.line(left, top, left, bottom, BLACK)
    canvas.line(left, bottom, right, bottom, BLACK)
    canvas.text((width - text_width(title, 2)) // 2, 8, title, scale=2)
    canvas.text((left + right - text_width(x_label)) // 2, bottom + 26, x_label)
    canvas.text(8, top - 18, y_label)
    for n, s in enumerate(drawn):
        colour = s.colour or PALETTE[n % len(PALETTE)]
        points = sorted(s.points)
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            canvas.line(px(x0), py(y0), px(x1), py(y1), colour, thickness=2)
        for x, y in points:
            canvas.rect(round(px(x)) - 2, round(py(y)) - 2, round(px(x)) + 2, round(py(y)) + 2, colour)
        key_y = top + 10 + 18 * n
        canvas.rect(right + 16, key_y, right + 36, key_y + 3, colour)
        canvas.text(right + 42, key_y - 2, s.name)
    data = canvas.png()
    if path is not None:
        Path(path).write_bytes(data)
    return data
