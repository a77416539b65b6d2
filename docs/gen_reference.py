"""Writes the docs' reference pages from the code itself, so they cannot drift from it (`make docs` runs this).

- `reference/cli.md`: every `preflab` command with its arguments and options, read from the command tree, and every
  `python -m training` command's own `--help`;
- `reference/training-config.md`: every config field of every training method, with its type, default and
  description, read from the config dataclasses (`training/config.py`);
- `reference/openapi.json`: the app's OpenAPI schema, as `/openapi.json` serves it, and `reference/api.md`, a page
  that lists its operations and renders the schema with Swagger UI (from the pinned `mkdocs-swagger-ui-tag` package,
  never a CDN).

    .venv/bin/python docs/gen_reference.py [--out docs]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import logging
import sys
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout: the app and training packages are the tree's
    sys.path.insert(0, str(ROOT))

GENERATED = "<!-- Written by docs/gen_reference.py from the code; edit the code, not this page. -->\n\n"
METHODS = ("sft", "reward", "prm", "dpo", "rft", "grpo", "ppo")


def cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------------------------------------------------- the CLI

def cli_commands() -> Iterator[tuple[str, Any]]:
    """("preflab user add", command) for every leaf command of the `preflab` tree, in the order `--help` lists them."""
    import typer.main

    from app.cli import cli

    def walk(command: Any, name: str) -> Iterator[tuple[str, Any]]:
        children = getattr(command, "commands", None)
        if children:
            for sub_name, sub in children.items():
                yield from walk(sub, f"{name} {sub_name}")
        else:
            yield name, command

    yield from walk(typer.main.get_command(cli), "preflab")


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.human_readable_name}`"
        kind = "argument" + ("" if param.required else ", optional")
    else:
        name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        kind = "flag" if param.is_flag else f"option ({param.type.name})"
    flag = getattr(param, "is_flag", False)
    default = "" if param.required or param.default in (None, "", False) or flag else f"`{param.default}`"
    return f"| {name} | {kind} | {default} | {cell(getattr(param, 'help', None) or '')} |"


def _training_help(name: str) -> str:
    """`python -m training NAME --help` as the command prints it, up to its list of config fields."""
    from training.__main__ import COMMANDS

    module = importlib.import_module(COMMANDS[name][0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main(["--help"])
    text = out.getvalue()
    for marker in ("\nconfig fields (", "\nconfig fields:"):
        text = text.split(marker)[0]
    return text.rstrip()


def cli_page() -> str:
    from training.__main__ import COMMANDS

    lines = [GENERATED, "# Command line", "",
             "Every `preflab` command with its arguments and options, and every `python -m training` command. "
             "`preflab --version` prints the version; `preflab COMMAND --help` prints what is below.", ""]
    for name, command in cli_commands():
        lines += [f"## `{name}`", "", (command.help or "").strip(), ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            lines += ["| name | kind | default | meaning |", "|---|---|---|---|", *map(_param_row, params), ""]
        if name == "preflab train":
            lines += ["Without `--project` the arguments go to `python -m training` (below) unchanged.", ""]
    lines += ["## `python -m training`", "",
              "The trainers' own command line (also `preflab train KIND …` without `--project`). Each command also "
              "takes every config field of its method as `--set key=value` or in a `--config` TOML file: see "
              "[Training configs](training-config.md).", ""]
    for name, (_, description) in COMMANDS.items():
        lines += [f"### `python -m training {name}`", "", description[0].upper() + description[1:] + ".", "",
                  "```text", _training_help(name), "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the training configs

def config_classes() -> dict[str, type]:
    """Each `python -m training` command's config class: the methods', then the evaluation's."""
    from training import config
    from training.evaluate import EvalConfig

    return {"sft": config.SFTConfig, "reward": config.RewardConfig, "prm": config.PRMConfig, "dpo": config.DPOConfig,
            "rft": config.RFTConfig, "grpo": config.GRPOConfig, "ppo": config.PPOConfig, "evaluate": EvalConfig}


def _type_name(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    return text.replace("typing.", "")


def _default(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return "unset" if value is None else f"`{json.dumps(value)}`"


def config_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(field, type, default, description) of every field of `cls` that has a description, in `--help`'s order."""
    from training.config import field_docs

    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return [(name, _type_name(hints.get(name, "")), _default(fields[name]), doc)
            for name, doc in field_docs(cls).items()]


def training_config_page() -> str:
    from training.config import TrainConfig

    shared = {f.name for f in dataclasses.fields(TrainConfig)}
    lines = [GENERATED, "# Training configs", "",
             "Every field each method's config takes, in a `--config` TOML file, as `--set key=value`, or in the app's "
             "training form (which fills in `model`, `out`, `train`, `prompts` and the reward models itself). A bad "
             "value fails before any model loads, with a message naming the field.", "",
             "## Fields every method shares", "", "| field | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{n}` | `{cell(t)}` | {d} | {cell(doc)} |" for n, t, d, doc in config_rows(TrainConfig)]
    for name, cls in config_classes().items():
        title = "evaluation" if name == "evaluate" else f"the `{name}` method"
        lines += ["", f"## `{name}`", "", f"`{cls.__name__}`: the fields of {title}"
                  + ("" if name == "evaluate" else " beyond the shared ones above") + ".", "",
                  "| field | type | default | meaning |", "|---|---|---|---|"]
        own = [row for row in config_rows(cls) if name == "evaluate" or row[0] not in shared]
        lines += [f"| `{n}` | `{cell(t)}` | {d} | {cell(doc)} |" for n, t, d, doc in own]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------- the API

def openapi_spec() -> dict[str, Any]:
    """The schema `/openapi.json` serves, from an app on a throwaway SQLite database."""
    from app.main import create_app
    from app.platform.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        logging.disable(logging.WARNING)  # the empty database's "schema is not current" note
        try:
            app = create_app(Settings(env="dev", database_url=f"sqlite:///{tmp}/docs.db", data_dir=Path(tmp),
                                      secret_key="d" * 48))
            spec = app.openapi()
            app.state.engine.dispose()
        finally:
            logging.disable(logging.NOTSET)
    return spec


def api_page(spec: dict[str, Any]) -> str:
    by_tag: dict[str, list[str]] = {}
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            if isinstance(op, dict) and "responses" in op:
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append(f"| `{method.upper()}` | `{path}` | {cell(op.get('summary', ''))} |")
    lines = [GENERATED, "# HTTP API", "",
             f"preflab {spec['info']['version']}'s JSON API, rendered from the [OpenAPI schema](openapi.json) that "
             "the app serves at `/openapi.json`. How to authenticate, errors, versioning and a generated client: "
             "[Scripts and the Python client](../engineers/client.md).", "",
             "## Operations", ""]
    for tag in sorted(by_tag):
        lines += [f"### {tag.capitalize()}", "", "| method | path | what |", "|---|---|---|", *by_tag[tag], ""]
    lines += ["## The schema", "", '<swagger-ui src="openapi.json"/>', ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------- writing

def pages() -> dict[str, str]:
    """Every generated file, by its path under docs/."""
    spec = openapi_spec()
    return {"reference/cli.md": cli_page(), "reference/training-config.md": training_config_page(),
            "reference/api.md": api_page(spec), "reference/openapi.json": json.dumps(spec, indent=1) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="the docs directory to write into")
    args = parser.parse_args(argv)
    for name, text in pages().items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
