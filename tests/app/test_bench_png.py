"""benchmarks/_png.py: the pure-Python PNG writer behind the method comparison's curves."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _png import PALETTE, Series, encode_png, line_chart, nice_ticks  # noqa: E402


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        out.append((kind, body))
        at += 12 + length
    return out


def _decode(data: bytes) -> tuple[int, int, list[bytes]]:
    chunks = _chunks(data)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + 3 * width)
    rows = [raw[y * (1 + 3 * width):(y + 1) * (1 + 3 * width)] for y in range(height)]
    assert all(r[0] == 0 for r in rows)  # filter type 0 on every row
    return width, height, [r[1:] for r in rows]


def test_encode_png_writes_signature_header_and_the_pixels() -> None:
    pixels = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90])
    width, height, rows = _decode(encode_png(3, 2, pixels))
    assert (width, height) == (3, 2) and b"".join(rows) == pixels
    with pytest.raises(ValueError, match="a 3×3 image needs 27"):
        encode_png(3, 3, pixels)


def test_line_chart_draws_each_series_in_its_colour(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    data = line_chart([Series("sft", [(0, 0.5), (40, 0.5)]), Series("grpo", [(0, 0.5), (20, 0.8), (40, 0.85)]),
                       Series("empty", [])], path, title="Accuracy by step", x_label="step", y_label="accuracy",
                      width=400, height=300, y_range=(0, 1))
    assert path.read_bytes() == data
    width, height, rows = _decode(data)
    assert (width, height) == (400, 300)
    colours = {bytes(row[i:i + 3]) for row in rows for i in range(0, len(row), 3)}
    assert bytes(PALETTE[0]) in colours and bytes(PALETTE[1]) in colours and bytes((255, 255, 255)) in colours
    assert bytes(PALETTE[2]) not in colours  # the empty series is left out, legend included
    pil = pytest.importorskip("PIL.Image")
    with pil.open(path) as image:
        assert image.size == (400, 300) and image.mode == "RGB"


def test_a_chart_without_points_is_refused_and_ticks_are_round() -> None:
    with pytest.raises(ValueError, match="no series has any points"):
        line_chart([Series("a", [])])
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 40) == [0, 10, 20, 30, 40]
