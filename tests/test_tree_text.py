"""The tree speaks of the product alone: no text tells how it was developed.

A reader has no way to know what a numbered work period, "the last" one or a tracker's issue number meant, so such
text fails here, in every tracked (or new, not ignored) `*.py`, `*.md`, `*.html` and `*.toml` file. Another project's issue is cited by
its URL, which a reader can follow, and the URL does not match.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".html", ".toml")
# Used when git is not at hand: the folders .gitignore keeps out, plus the built docs site.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "site", "build", "dist", "__pycache__", ".pytest_cache",
                ".ruff_cache"}

DIARY = [
    # numbered work periods, one or a range of them
    ("a numbered work period", re.compile(r"\b(?:sessions?|work periods?)\s+\d+", re.IGNORECASE)),
    # relative ones; a database or browser session is "the session", "a session", "the same session"
    ("a work period", re.compile(r"\b(?:this|last|next|previous|earlier|later|another|other)\s+sessions?\b",
                                 re.IGNORECASE)),
    ("a numbered turn", re.compile(r"\bturns?\s+\d+\b", re.IGNORECASE)),
    # tracker numbers: an issue, ticket or pull request by number, or a bare number after "#" in brackets
    ("a tracker number", re.compile(r"\b(?:issues?|tickets?|PRs?|pull requests?)\s*#?\d+\b|\(#\d+\)",
                                    re.IGNORECASE)),
    ("a tracker number", re.compile(r"(?<![\w&/#])#\d{1,5}(?![\w-])")),
]


def diary_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what it is, the line) for every line of `text` that tells how the tree was developed."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in DIARY:
            if pattern.search(line):
                found.append((number, what, line.strip()))
                break
    return found


def tree_files(root: Path = REPO) -> list[Path]:
    """The files the check reads: git's tracked and new (not ignored) ones, else a walk that skips build output."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, text=True, check=True).stdout.splitlines()
        paths = [root / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*") if not SKIPPED_DIRS & set(p.relative_to(root).parts)]
    return sorted(p for p in paths if p.suffix in SUFFIXES and p.is_file())


# The planted lines are put together at run time, so this file holds none of them whole.
SESSION, ISSUE, TURN, HASH = "sess" + "ion", "iss" + "ue", "tu" + "rn", "#"


@pytest.mark.parametrize("planted", [
    f'    """Batch the statements ({SESSION} 16: 10.6 → 7.6 per ranking)."""',
    f"# measured in the last {SESSION}, with another job beside it",
    f"| annotation | measured for {ISSUE} {HASH}25 on its machine |",
    f"The figures of {TURN} 3 stand.",
    f"See the fix ({HASH}412).",
    f"The earlier table ({SESSION}s 10–16) is in RESULTS.md.",
])
def test_a_planted_diary_line_is_found(planted: str) -> None:
    text = f'"""A module."""\n\n{planted}\n'
    assert [number for number, _, _ in diary_lines(text)] == [3]


@pytest.mark.parametrize("product", [
    "Services take a session and never commit; the request owns the transaction.",
    "Every session was revoked with the password change.",
    "A chat prompt's opening turns and a multi-turn response keep their turns.",
    "openapi-python-client 0.29 (https://github.com/openapi-generators/openapi-python-client/issues/1417)",
    'assert rendered == "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;"',
    'colours = ["#888888", "#1f6fb2"]',
    "## Step labels",
])
def test_product_text_passes(product: str) -> None:
    assert diary_lines(product) == []


def test_the_tree_speaks_of_the_product_alone() -> None:
    found = [f"{path.relative_to(REPO)}:{number}: {what}: {line[:160]}"
             for path in tree_files() for number, what, line in diary_lines(path.read_text(encoding="utf-8"))]
    assert not found, ("text about how the tree was developed (say what the product does, cite another project's "
                       "issue by its URL):\n" + "\n".join(found))
