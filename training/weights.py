"""Model weights are read from safetensors only: a pickled checkpoint (`pytorch_model.bin`, `*.pt`) can run code
the moment it is unpickled, so a model directory that offers only pickled weights is refused before any load.

Every loader in `training/` calls `require_safetensors` on the directory and passes `SAFE_LOAD` to
`from_pretrained`, which makes transformers itself refuse any `.bin` fallback. Optimizer and trainer state
(`trainer.pt`) is read with `torch.load(..., weights_only=True)`, which refuses pickled objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAFE_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
SAFE_LOAD: dict[str, Any] = {"use_safetensors": True}
"""Keyword arguments for every `from_pretrained` of weights: transformers then never falls back to a `.bin`."""


class UnsafeWeights(ValueError):
    """The directory has no safetensors weights (perhaps pickled ones, which are never loaded)."""


def require_safetensors(path: str | Path, what: str = "model") -> Path:
    """`path` if it holds safetensors weights (single file or sharded index); UnsafeWeights saying why otherwise."""
    path = Path(path)
    if any((path / name).is_file() for name in SAFE_FILES):
        return path
    pickles = sorted({p.name for pattern in PICKLE_PATTERNS for p in path.glob(pattern)})
    if pickles:
        raise UnsafeWeights(
            f"{what}: {path} holds only pickled weights ({', '.join(pickles[:3])}), which preflab refuses to load "
            "because unpickling can run arbitrary code; convert the checkpoint to safetensors in a trusted sandbox "
            "(load it there, then `model.save_pretrained(dir, safe_serialization=True)`)")
    raise UnsafeWeights(f"{what}: {path} has no weights (no model.safetensors or model.safetensors.index.json)")
