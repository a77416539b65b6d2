"""The train job writes the run's config as TOML with tomli-w; the trainer reads back exactly what was resolved."""

from __future__ import annotations

import tomllib

import pytest

from app.runs.train_job import write_toml


def test_the_config_reads_back_with_unset_values_left_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = {"model": 'C:\\models\\"tiny"\nnext', "steps": 8, "lr": 1e-5, "resume": True, "eval_temperature": None,
              "report_to": ["tensorboard"], "stop": [], "reward_kwargs": {"format_regex": {"pattern": "^#+ (.*)$"},
                                                                          "length_penalty": None},
              "reward_weights": [1.0, 0.5]}
    path = tmp_path / "run.toml"
    write_toml(path, config)
    back = tomllib.loads(path.read_text(encoding="utf-8"))
    assert back == {k: v for k, v in config.items() if v is not None} | {
        "reward_kwargs": {"format_regex": {"pattern": "^#+ (.*)$"}}}


def test_a_value_toml_cannot_hold_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        write_toml(tmp_path / "run.toml", {"stop": [None]})
