"""`make screenshots` still works: docs/screenshots.py seeds the demo, trains a small reward model, drives Chromium
over the pages and writes the PNGs the README and the docs show (here into a temporary directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_the_screenshot_script_writes_every_picture_the_docs_show(chromium, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Its own process: the script serves the demo and runs a worker, as `make screenshots` does.
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "docs" / "screenshots.py"), "--out", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    shown = {p.name for p in (REPO / "docs" / "img").glob("*.png") if p.name != "method_comparison.png"}
    written = {p.name for p in tmp_path.glob("*.png")}
    assert shown and written == shown
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and 5_000 < len(data) < 400_000, name
