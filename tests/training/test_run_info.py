"""Model directories are written whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.run_info import atomic_dir


def test_a_save_that_dies_half_way_leaves_the_previous_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    with atomic_dir(model) as out:
        (out / "model.safetensors").write_text("v1")
    with pytest.raises(RuntimeError), atomic_dir(model) as out:
        (out / "model.safetensors").write_text("v2, half")
        raise RuntimeError("killed mid-save")
    assert (model / "model.safetensors").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp directory left behind


def test_a_leftover_from_a_killed_process_is_cleared_by_the_next_save(tmp_path: Path) -> None:
    (tmp_path / ".model.tmp-99999").mkdir()  # what SIGKILL during a save leaves
    with atomic_dir(tmp_path / "model") as out:
        (out / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (tmp_path / "model" / "config.json").exists()
