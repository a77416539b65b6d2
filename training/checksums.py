"""`python -m training.checksums FILE SHA256 [FILE SHA256 …]`: check an export's files where the run will read them.

A run sent to a cluster reads its export over a shared path; this runs on the node before the trainer, so a file
the node sees differently from the one the app wrote (another copy, a partial sync, a stale cache) stops the run
at once with the file named, instead of training on other data. Exit 0 when every file matches, 1 otherwise.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mismatches(expected: dict[str, str]) -> list[str]:
    """One line per file that is missing or differs from its expected sha256."""
    found = []
    for name, sha in expected.items():
        try:
            actual = sha256_of(Path(name))
        except OSError as exc:
            found.append(f"{name}: cannot be read on this node ({exc.strerror})")
            continue
        if actual != sha:
            found.append(f"{name}: sha256 {actual}, the export's card says {sha}")
    return found


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or len(args) % 2:
        print("usage: python -m training.checksums FILE SHA256 [FILE SHA256 ...]", file=sys.stderr)
        return 2
    bad = mismatches(dict(zip(args[::2], args[1::2], strict=True)))
    for line in bad:
        print(f"error: the export is not the one the app wrote: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
