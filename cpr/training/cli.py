"""``cpr train``: run an experiment from its YAML config (same as ``recipes/cpr_curriculum.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from cpr.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser, *, default_config: str | None = None) -> None:
    """The arguments shared by ``cpr train`` and the recipe."""
    from cpr.training.check import add_check_arguments

    parser.add_argument("--config", default=default_config, required=default_config is None,
                        help="experiment YAML (recipes/configs/)" + (f"; default {default_config}" if default_config else ""))
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in output_dir: skip finished phases, resume the current one")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete a previous run in output_dir and start over (without it or --resume it is refused)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value (YAML), e.g. --set phases=[cpr] --set 'data.train[0].limit=8'")
    parser.add_argument("--output-dir", help="shortcut for --set output_dir=...")
    parser.add_argument("--phases", help="comma-separated phases to run, e.g. cpr (shortcut for --set phases=[...])")
    add_check_arguments(parser)


def experiment_config(args: argparse.Namespace) -> Any:
    """The validated config a training run's arguments name, loaded before any model. Raises ``ConfigError``: an
    option of ``--check`` without ``--check``, ``--resume`` with ``--overwrite``, or an invalid config."""
    from cpr.training.config import config_from_args

    for option in ("num_processes", "gpu_memory", "accelerate_config", "skip_data"):
        if getattr(args, option):
            name = "--" + option.replace("_", "-")
            raise ConfigError(f"{name} belongs to --check (the launcher sets the processes of a training run)", field=name)
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the run in output_dir, --overwrite deletes it: pass one", field="--overwrite")
    return config_from_args(args)


def run(args: argparse.Namespace) -> int:
    """Validate the config, then run the experiment (``--check``: only check it); exit code 0 when it finished."""
    if args.check:
        from cpr.training.check import run_check

        return run_check(args)
    from cpr.training.experiment import run_experiment

    summary = run_experiment(experiment_config(args), resume=args.resume, overwrite=args.overwrite)
    return 0 if summary.get("status") == "finished" else 1


def register(subparsers: Any) -> None:
    """Add ``cpr train`` to the ``cpr`` command line."""
    p = subparsers.add_parser(
        "train", help="train a model with GRPO (CPR-Curriculum) from a YAML config",
        description="Run an experiment from its YAML config as recipes/cpr_curriculum.py does: the optional "
        "supervised warm start, the GRPO phases, checkpoint selection and the final evaluation. Exit code 0 finished, "
        "2 an error, 3 a divergence guard stopped it. --check: validate the run and estimate its per-GPU memory "
        "without a GPU (exit 1: it does not fit).",
    )
    add_arguments(p)
    p.set_defaults(func=run)
