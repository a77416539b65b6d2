"""The documentation a user reads: the generated reference holds every command and config field, the README is short
and every page it links to exists, and the version the command prints is the package's and the changelog's."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    """docs/gen_reference.py, the script `make docs` runs (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands() -> dict[str, list[str]]:
    """Every leaf `preflab` command, read from the command itself, with the names of its arguments and options."""
    import typer.main

    from app.cli import cli

    found: dict[str, list[str]] = {}

    def walk(command, name: str) -> None:  # type: ignore[no-untyped-def]
        if getattr(command, "commands", None):
            for sub_name, sub in command.commands.items():
                walk(sub, f"{name} {sub_name}")
        else:
            found[name] = [p.opts[0] if p.param_type_name == "option" else p.human_readable_name
                           for p in command.params if p.name != "help"]

    walk(typer.main.get_command(cli), "preflab")
    return found


def _section(page: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    start = page.index(f"\n{heading}\n")
    end = page.find(f"\n{level} ", start + len(heading) + 2)
    return page[start:end if end != -1 else None]


def test_the_cli_page_has_every_command_and_option(gen: ModuleType) -> None:
    from training.__main__ import COMMANDS

    page = gen.cli_page()
    commands = _commands()
    assert {"preflab serve", "preflab export push", "preflab user add", "preflab train"} <= set(commands)
    for name, params in commands.items():
        section = _section(page, f"## `{name}`")
        for param in params:
            assert f"`{param}`" in section, f"{name}: {param} is missing from the CLI page"
    for name in COMMANDS:
        section = _section(page, f"### `python -m training {name}`")
        assert f"usage: python -m training {name}" in section


def test_the_config_page_has_every_field_of_every_method(gen: ModuleType) -> None:
    from app.runs import training_runs
    from training.config import TrainConfig
    from training.evaluate import EvalConfig

    page = gen.training_config_page()
    shared = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in shared:
        assert f"| `{name}` |" in _section(page, "## Fields every method shares"), name
    # The app's registry of run kinds, so a method added there without a docs section fails here.
    classes = {kind: training_runs.config_class(kind) for kind in training_runs.KINDS} | {"evaluate": EvalConfig}
    for kind, cls in classes.items():
        section = _section(page, f"## `{kind}`")
        for f in dataclasses.fields(cls):
            if kind == "evaluate" or f.name not in shared:
                assert f"| `{f.name}` |" in section, f"{kind}: the field {f.name} is missing from the config page"


def test_the_api_page_lists_every_operation(gen: ModuleType) -> None:
    spec = gen.openapi_spec()
    page = gen.api_page(spec)
    for path, operations in spec["paths"].items():
        for method in operations:
            assert f"| `{method.upper()}` | `{path}` |" in page
    assert '<swagger-ui src="openapi.json"/>' in page


def test_a_bad_field_description_cannot_break_a_table(gen: ModuleType) -> None:
    assert gen.cell("a | b\n  c") == "a \\| b c"


def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_one_screen_of_what_preflab_is() -> None:
    lines = _readme().splitlines()
    assert len(lines) <= 200
    assert lines[0].startswith("# preflab") and "preference data" in lines[0]
    head = "\n".join(lines[:30])
    # The two set-up commands, as a fresh machine runs them.
    assert "\nmake demo    # " in head and "\nmake test    # " in head
    cells = [cell.strip() for line in lines if line.startswith("|") for cell in line.strip("|").split("|")]
    assert cells and max(map(len, cells)) <= 200


def test_every_file_the_readme_links_to_exists() -> None:
    text = _readme()
    targets = re.findall(r"\]\(([^)]+)\)", text)
    local = [t.split("#")[0] for t in targets if "://" not in t]
    images = [t for t in local if t.endswith(".png")]
    assert len(set(images)) >= 2, "the README shows at least two screenshots"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


def test_the_version_is_one_everywhere() -> None:
    from typer.testing import CliRunner

    from app import __version__
    from app.cli import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"preflab {__version__}"
    with (REPO / "pyproject.toml").open("rb") as fh:
        assert tomllib.load(fh)["project"]["version"] == __version__
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert released and released[0] == __version__, "the changelog's latest release is the package's version"
