"""`python -m training <command>`: dispatch to the trainer modules, imported lazily so `--help` is fast."""

from __future__ import annotations

import importlib
import sys

from training.methods import METHODS

COMMANDS: dict[str, tuple[str, str]] = {
    method.kind: (method.trainer, method.description) for method in METHODS
} | {"evaluate": ("training.evaluate", "compare a policy with its reference on held-out prompts"),
     "speed": ("training.speed", "measure this machine's speed on a model (what run estimates are priced at)")}
"""Each command's module and its line in `--help`: every training method, then the commands that train nothing."""


def usage() -> str:
    lines = ["usage: python -m training <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `python -m training <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


def _leave_process_group() -> None:
    """Under accelerate/torchrun: destroy the process group before the interpreter exits. Left to exit, gloo's
    threads were torn down while still joinable, and now and then a rank died with SIGABRT ("terminate called
    without an active exception") after its run had finished and saved, failing the whole launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    _leave_process_group()
    sys.exit(code)
