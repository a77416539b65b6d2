"""The registry of training methods is the one list: a method added in one place only (a config class, a trainer,
a CLI command, the API's `kind`, the app's run kinds, the database check) fails here, naming the place."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from training import config, methods
from training.methods import KINDS, METHODS, Method

TRAINING = Path(methods.__file__).parent


def test_reading_the_registry_imports_no_torch_nor_a_config() -> None:
    # The web process reads it on every start; a config or trainer is imported only when a run asks for it.
    code = ("import sys\n"
            "from training import methods\n"
            "assert methods.KINDS and methods.POLICY_KINDS\n"
            "loaded = {'torch', 'transformers', 'training.config'} & set(sys.modules)\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_method_config_in_training_config_has_an_entry() -> None:
    # The method configs are the leaves under TrainConfig: the bases (TrainConfig, OfflineConfig, RLConfig) are not.
    defined = [cls for cls in vars(config).values()
               if inspect.isclass(cls) and cls.__module__ == config.__name__ and dataclasses.is_dataclass(cls)
               and issubclass(cls, config.TrainConfig)]
    leaves = {cls for cls in defined if not any(other is not cls and issubclass(other, cls) for other in defined)}
    assert {m.config_class() for m in METHODS} == leaves
    assert len({m.config for m in METHODS}) == len(METHODS), "two methods share a config class"


@pytest.mark.parametrize("entry", METHODS, ids=KINDS)
def test_each_method_reads_its_export_into_a_field_of_its_config(entry: Method) -> None:
    fields = {f.name for f in dataclasses.fields(entry.config_class())}
    assert entry.data_field in fields
    assert ("reward_model" in fields) == entry.online, "online methods, and only they, take a reward model"
    assert ("process_reward_model" in fields) == entry.process_rewards


def _trainer_modules() -> set[str]:
    """Modules of training/ that declare a method's command (`COMMAND = Command(...)` at the top level)."""
    found = set()
    for path in sorted(TRAINING.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMMAND"]
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Command"):
                found.add(f"training.{path.stem}")
    return found


def test_every_trainer_module_is_a_method_and_says_so_in_its_command() -> None:
    assert _trainer_modules() == {m.trainer for m in METHODS}
    for entry in METHODS:
        module = importlib.import_module(entry.trainer)
        assert module.COMMAND.name == entry.kind, entry.trainer
        assert module.COMMAND.config is entry.config_class(), entry.trainer
        assert callable(module.main), entry.trainer


def test_the_cli_offers_every_method_with_its_line_in_help() -> None:
    from training import __main__ as cli_main

    assert tuple(k for k in cli_main.COMMANDS if k not in ("evaluate", "speed")) == KINDS  # those train nothing
    for entry in METHODS:
        assert cli_main.COMMANDS[entry.kind] == (entry.trainer, entry.description)
        assert f"  {entry.kind:<10} {entry.description}" in cli_main.usage().splitlines()


def test_the_api_schema_accepts_exactly_the_methods() -> None:
    from app.schemas import TrainingRunIn

    assert get_args(TrainingRunIn.model_fields["kind"].annotation) == KINDS


def test_the_apps_run_kinds_are_the_registrys() -> None:
    from app.models import RUN_KINDS, TrainingRun
    from app.platform.formats import EXPORT_KINDS
    from app.runs import training_runs

    assert RUN_KINDS == KINDS
    assert tuple(training_runs.KINDS) == KINDS
    assert {kind: export for kind, (export, _) in training_runs.KINDS.items()} == training_runs.EXPORT_KIND
    assert set(training_runs.POLICY_KINDS) == {m.kind for m in METHODS if m.trains_policy}
    assert set(training_runs.ONLINE_KINDS) == {m.kind for m in METHODS if m.online}
    assert set(training_runs.PROCESS_REWARD_KINDS) == {m.kind for m in METHODS if m.process_rewards}
    assert set(training_runs.ITERATING_KINDS) == {m.kind for m in METHODS if m.iterates}
    assert {m.export_kind for m in METHODS} <= set(EXPORT_KINDS)
    for entry in METHODS:
        assert training_runs.config_class(entry.kind) is entry.config_class()
    check = next(c for c in TrainingRun.__table__.constraints if c.name == "ck_training_runs_kind")
    assert tuple(re.findall(r"'([^']+)'", str(check.sqltext))) == KINDS


def test_an_entry_that_contradicts_itself_is_refused() -> None:
    fields = dict(kind="x", config="training.config.SFTConfig", trainer="training.sft", export_kind="pairs",
                  trains_policy=True, online=False, takes_reward_run=False, process_rewards=False, iterates=False,
                  description="x")
    with pytest.raises(ValueError, match="export_kind"):
        Method(**fields | {"export_kind": "rankings"})
    with pytest.raises(ValueError, match="online"):
        Method(**fields | {"online": True})  # sampling needs a reward run to score it
    with pytest.raises(ValueError, match="online method"):
        Method(**fields | {"iterates": True})
