"""Screenshots of what the browser tests saw, for people to look at: set PREFLAB_SCREENSHOTS to a folder and each
test that calls `shoot` leaves its pages there (full length); unset, nothing is written."""

from __future__ import annotations

import os
from pathlib import Path


def shoot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    folder = os.environ.get("PREFLAB_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        width = page.viewport_size["width"] if page.viewport_size else 0
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
