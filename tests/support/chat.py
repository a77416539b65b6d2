"""Chat turns for tests that import or export conversations."""

from __future__ import annotations


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}
