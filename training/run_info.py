"""What a run writes next to its outputs: `metrics.jsonl`, `run.json` (config, versions, git commit, data sha256)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training.data import sha256_of
from training.shared.files import replace_dir, write_text_atomic

PACKAGES = ("preflab", "torch", "transformers", "accelerate", "peft", "datasets", "safetensors", "tokenizers", "trl")


def package_versions() -> dict[str, str]:
    """Versions of Python and of the installed packages a run depends on (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository holding this code (suffix "-dirty" when tracked files changed), or None."""
    cwd = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # 0-dim tensors and numpy scalars
        return value.item()
    return value


@contextmanager
def staged_dir(path: str | Path, accelerator: Any = None) -> Iterator[Path]:
    """A checkpoint written whole or not at all, by every process of a distributed run.

    All processes write into one staging directory beside `path` (sharded optimiser states need each
    rank's files); only once every rank is done does the main process rename it over `path`. A run killed
    mid-save therefore resumes from the previous checkpoint, never from a mix of two.
    """
    path = Path(path)
    stage = path.parent / f".{path.name}.staging"
    main = accelerator is None or accelerator.is_main_process
    if main:
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    yield stage
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if main:
        replace_dir(stage, path)
    if accelerator is not None:
        accelerator.wait_for_everyone()


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")
    return path


def write_run_config(out_dir: str | Path, config: Any, data: dict[str, str | Path | None] | None = None,
                     extra: dict[str, Any] | None = None) -> Path:
    """OUT/run.json: the resolved config, package versions, git commit, command line and data sha256s."""
    record: dict[str, Any] = {
        "config": config,
        "versions": package_versions(),
        "git_commit": git_commit(),
        "command": sys.argv,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "data": {name: {"path": str(p), "sha256": sha256_of(p)} for name, p in (data or {}).items() if p},
    }
    record.update(extra or {})
    return write_json(Path(out_dir) / "run.json", record)


class MetricsWriter:
    """Appends one JSON object per call to `metrics.jsonl` (flushed, so a crashed run keeps its history),
    and mirrors scalars to TensorBoard when it is installed and `tensorboard_dir` is given."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None, append: bool = False,
                 resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append and resume_step is not None and self.path.exists():
            truncate_after(self.path, resume_step)
        self._fh = open(self.path, "a" if append else "w", encoding="utf-8")  # closed in close()
        self._tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:  # TensorBoard is optional
                self._tb = None

    def log(self, step: int, **metrics: Any) -> None:
        row = {"step": step, **_jsonable(metrics)}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def truncate_after(path: Path, step: int) -> None:
    """Drop the rows a killed run logged after its last checkpoint (the resumed run logs those steps again)
    and a last line cut mid-write, so the history has each step once."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if line.endswith("\n") and row.get("step", 0) <= step:
            kept.append(line)
    write_text_atomic(path, "".join(kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
