"""The ``cpr`` command line. Each command's module exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (``argparse.Namespace`` -> exit code); only the running command's module is
imported, so ``cpr --help`` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

from cpr.errors import error_exit_code, run_command

__all__ = ["COMMANDS", "build_parser", "error_exit_code", "main", "run_command"]

# command name -> module defining register(subparsers)
COMMANDS: dict[str, str] = {"score": "cpr.scoring", "data": "cpr.data.cli", "train": "cpr.training.cli",
                            "eval": "cpr.eval_cli", "ablate": "cpr.ablation", "audit-reward": "cpr.audit",
                            "export": "cpr.export"}


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
