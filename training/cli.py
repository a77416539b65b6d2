"""The command line every training method shares: `python -m training METHOD [flags] [--config run.toml] [--set k=v]`.

A method declares its config class, the few flags it takes (each one a config field, e.g. `--train` → `train`) and
how to train; `main` does the rest the same way for all: `--help` lists every config field with its meaning and
default, values come from the TOML file, then the flags, then `--set`, and any error (a bad field, a bad line of
a data file) is one line on stderr naming it, with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from training.config import field_docs, load_config

COMMON_EPILOG = "Values come from --config, then the flags above, then --set (the last wins)."


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one config field."""

    option: str
    """The flag, e.g. "--train"."""
    field: str
    """The config field it sets."""
    help: str
    """What it is, for --help."""
    repeat: bool = False
    """Given several times, it builds a list (e.g. --reward-fn)."""


@dataclass(frozen=True)
class Command:
    """One `python -m training` command."""

    name: str
    config: type[Any]
    description: str
    flags: Sequence[Flag]
    train: Callable[[Any], Any]
    """Runs the config; returns what `summary` turns into the printed JSON line (None on non-main processes)."""
    summary: Callable[[Any], dict[str, Any] | None] = lambda result: result
    check: Callable[[Any], None] = lambda config: None
    """Checks beyond the config's own (e.g. that a reward is given), raising ValueError naming the field."""


def eval_summary(*keys: str) -> Callable[[Any], dict[str, Any] | None]:
    """A command's printed line: these figures of the final evaluation (on the main process only)."""
    def summary(result: Any) -> dict[str, Any] | None:
        if not result.main_process:
            return None
        return {k: result.eval[k] for k in keys if k in result.eval}
    return summary


def data_flags(what: str, model_help: str) -> list[Flag]:
    """The flags of the methods that read a data file: --train, --eval, --model, --out."""
    return [Flag("--train", "train", f"{what}: JSONL, Parquet or a datasets directory"),
            Flag("--eval", "eval", "held-out rows; default: the rows of --train whose split is held-out"),
            Flag("--model", "model", model_help), Flag("--out", "out", "output directory")]


def build_parser(command: Command) -> argparse.ArgumentParser:
    defaults = {f.name: f.default for f in dataclasses.fields(command.config)
                if f.default is not dataclasses.MISSING}
    docs = field_docs(command.config)
    lines = [f"  {name:<26} {doc}" + (f" [default: {defaults[name]!r}]" if name in defaults else "")
             for name, doc in docs.items()]
    parser = argparse.ArgumentParser(prog=f"python -m training {command.name}", description=command.description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="config fields (--set key=value or in the --config TOML file):\n"
                                            + "\n".join(lines) + "\n\n" + COMMON_EPILOG)
    for flag in command.flags:
        parser.add_argument(flag.option, dest=flag.field, help=flag.help,
                            action="append" if flag.repeat else "store", default=None)
    parser.add_argument("--config", help="TOML file of config fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--resume", action="store_true", default=None, help="continue from OUT/checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(command: Command, argv: list[str] | None = None) -> int:
    args = build_parser(command).parse_args(argv)
    values = {flag.field: getattr(args, flag.field) for flag in command.flags}
    try:
        config = load_config(command.config, args.config, args.set, resume=args.resume, **values)
        if args.quiet:
            config = dataclasses.replace(config, progress=False)
        command.check(config)
        result = command.train(config)
    except ValueError as exc:  # DataError too: the file, the line and the field
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = command.summary(result)
    if summary is not None:
        print(json.dumps(summary))
    return 0
