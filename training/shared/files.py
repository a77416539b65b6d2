"""Files and directories replaced whole or not at all: atomic writes, the directory swap, fsync."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a directory."""
    fd = os.open(path, os.O_RDONLY)  # directories too: on Linux fsync on a directory descriptor persists its entries
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed into place, so a reader never sees half of it.

    Atomic, not durable (no fsync): for files rewritten often whose loss in a power cut costs nothing.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def replace_dir(tmp: Path, path: Path) -> None:
    """Move the finished directory `tmp` to `path`, replacing what is there, durably.

    Everything in `tmp` is fsynced first (a power cut must not leave a renamed directory of empty files), and the
    parent after the rename (the rename itself). A directory cannot be swapped in one rename, so the old one is
    moved aside first; `recover_dir` undoes a kill between the two renames. Used for model directories,
    checkpoints and the app's exports.
    """
    for entry in [*tmp.rglob("*"), tmp]:
        fsync_path(entry)
    if path.exists():
        aside = path.parent / f".{path.name}.old-{os.getpid()}"
        os.replace(path, aside)
        os.replace(tmp, path)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, path)
    fsync_path(path.parent)


def recover_dir(path: str | Path) -> Path:
    """Put back the previous complete `path` when a replace was killed between its two renames."""
    path = Path(path)
    if not path.exists():
        asides = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if asides:
            os.replace(asides[-1], path)
    return path


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path` to write into; on success it replaces `path` by rename.

    A model directory is therefore complete or absent, never half-written: a trainer killed mid-save leaves
    only a `.name.tmp-PID` directory, which the next save of the same path removes.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, path)
