"""What every trainer in `training/` sets up the same way: the accelerator and the learning-rate schedule."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def lr_lambda(warmup_steps: int, schedule: str, total_steps: int) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up over `warmup_steps`, then constant, linear to 0 or cosine to 0 at
    `total_steps`."""
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def mixed_precision(choice: str) -> str:
    """accelerate's mixed_precision for a config value; "auto" is bf16 on a CUDA device that supports it, else no."""
    if choice != "auto":
        return choice
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def cpu_processes() -> bool:
    """True for a multi-process launch on a machine without CUDA: accelerate then needs cpu=True to use gloo
    instead of silently running every process alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > 1 and not torch.cuda.is_available()


def make_accelerator(precision: str, report_to: Sequence[str] = (), project_dir: str | Path | None = None) -> Any:
    """The Accelerator of a run: data-parallel under `accelerate launch` (gloo on CPU, NCCL on GPUs), logging to
    the experiment trackers in `report_to` (their files under `project_dir`)."""
    from accelerate import Accelerator

    return Accelerator(mixed_precision=mixed_precision(precision), cpu=cpu_processes(),
                       log_with=list(report_to) or None, project_dir=str(project_dir) if project_dir else None)
