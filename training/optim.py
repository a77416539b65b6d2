"""What every trainer in `training/` sets up the same way: the accelerator, the learning-rate schedule.

GRPO, PPO and the reward model import these instead of each other's private helpers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch


class Schedule(Protocol):
    """The config fields a learning-rate schedule reads (GRPOConfig and PPOConfig have them)."""

    warmup_steps: int
    lr_schedule: str
    steps: int


def lr_lambda(config: Schedule) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up over `warmup_steps`, then constant, linear to 0 or cosine to 0 at `steps`."""
    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_schedule == "constant":
            return 1.0
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        if config.lr_schedule == "linear":
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


def make_accelerator(precision: str) -> Any:
    """The Accelerator of a run: data-parallel under `accelerate launch` (gloo on CPU, NCCL on GPUs)."""
    from accelerate import Accelerator

    return Accelerator(mixed_precision=mixed_precision(precision), cpu=cpu_processes())
