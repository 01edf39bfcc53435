"""The ``cpr`` command line. Each command's module exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (``argparse.Namespace`` -> exit code); only the running command's module is
imported, so ``cpr --help`` stays fast."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from cpr.errors import INTERRUPTED_EXIT_CODE, CprError, RunInterrupted

# command name -> module defining register(subparsers)
COMMANDS: dict[str, str] = {
    "score": "cpr.scoring",
    "data": "cpr.data.cli",
    "train": "cpr.training.cli",
    "eval": "cpr.evaluation.cli",
    "ablate": "cpr.ablation",
    "audit-reward": "cpr.audit",
    "export": "cpr.export",
}


def error_exit_code(error: CprError) -> int:
    """The process exit code for ``error``: its class's ``exit_code`` where it sets one
    (:class:`cpr.training.guards.TrainingDivergedError`: 3), else 2."""
    return int(getattr(error, "exit_code", 2))


def run_command(prog: str, func: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a command's ``func(args)`` and return its exit code (``None`` counts as 0). A
    :class:`~cpr.errors.CprError` is printed as one line ``"<prog>: error: <message>"`` on standard
    error and gives :func:`error_exit_code`; Ctrl-C (``KeyboardInterrupt``) gives exit code 130 and, unless the run
    already said so (:class:`~cpr.errors.RunInterrupted`), the line ``"<prog>: interrupted"``, no traceback.
    Used by ``cpr`` and the recipes."""
    try:
        return int(func(args) or 0)
    except CprError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return error_exit_code(e)
    except KeyboardInterrupt as e:
        if not isinstance(e, RunInterrupted):
            print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except BrokenPipeError:  # output piped into a command that stopped reading (`| head`): not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser; with ``only``, import just that command's module."""
    parser = argparse.ArgumentParser(prog="cpr", description="cpr: GRPO training of vision-language models on process rewards (CRYSTAL Match F1, CPR).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, add_help=False)
            continue
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cpr`` console script. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(f"cpr {args.command}", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
