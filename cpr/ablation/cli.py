"""Command lines: ``cpr ablate`` / ``recipes/reward_ablation.py`` and ``recipes/sft_lora.py``.

``cpr ablate --config ABLATION.yaml`` runs every run of an ablation in this process, then writes
the table and figures. Other modes::

    --only NAME [--only NAME ...]   run just these runs (or shared_start); the table covers all
    --resume                        continue unfinished runs (passed to the runs)
    --list                          print one command line per run, for your own scheduler
    --evaluate-only                 score finished runs that lack the table's evaluation, build the table
    --table-only                    build the table and figures from whatever has finished
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["add_arguments", "main", "register", "run", "sft_main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``cpr ablate`` and ``recipes/reward_ablation.py``."""
    parser.add_argument("--config", required=True, help="ablation YAML (recipes/configs/ablation_*.yaml)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this run (repeatable, or comma-separated); 'shared_start' runs the shared start")
    parser.add_argument("--resume", action="store_true", help="continue unfinished runs from their last checkpoint")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true",
                      help="print one recipe command line per run (to launch them with your own scheduler) and exit")
    mode.add_argument("--evaluate-only", action="store_true",
                      help="train nothing: score finished runs not yet scored on the table's split, then build the table")
    mode.add_argument("--table-only", action="store_true",
                      help="train and score nothing: build the table and figures from whatever has finished")


def _names(values: Sequence[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def run(args: argparse.Namespace) -> int:
    """Run the ablation the parsed arguments describe; exit code 0 on success."""
    from cpr.ablation.plan import plan_ablation, validate_run
    from cpr.ablation.runner import run_ablation
    from cpr.ablation.spec import load_ablation_config

    cfg = load_ablation_config(args.config)
    only = _names(args.only)
    if args.list:
        plan = plan_ablation(cfg)
        for name in only:
            plan.get(name)
        for r in plan.runs:  # the listed commands are known to build valid configs
            validate_run(plan, r)
        lines = plan.commands(args.config)
        if only:
            keep = {plan.command(plan.get(n), args.config) for n in only}
            lines = [ln for ln in lines if ln.startswith("#") or ln in keep]
        print("\n".join(lines))
        return 0
    result = run_ablation(cfg, only=only, resume=args.resume, evaluate_only=args.evaluate_only,
                          table_only=args.table_only)
    md = result["outputs"].get("markdown")
    if md:
        with open(md, encoding="utf-8") as f:
            print("\n" + f.read())
    print(json.dumps({k: result[k] for k in ("ran", "skipped", "diverged", "evaluated", "statuses", "wall_time_s")}, indent=1))
    return 0


def register(subparsers: Any) -> None:
    """Add ``cpr ablate`` to the ``cpr`` command line."""
    p = subparsers.add_parser(
        "ablate",
        help="reward-weight ablation or strategy comparison: run the set of runs, build the table and figures",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


_SFT_HELP = """The LoRA fine-tuning baseline (M3CoT paper): supervised LoRA on the reference steps and
answers in the output JSON format, then scored on the test split like the GRPO runs.
See cpr/ablation/sft_baseline.py for the config (an experiment config plus an sft: section)."""


def _entry(prog: str, build: Any, argv: Sequence[str] | None, description: str) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cpr.cli import run_command

    parser = argparse.ArgumentParser(prog=prog, description=description.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    func = build(parser)
    return run_command(prog, func, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``recipes/reward_ablation.py``."""

    def build(parser: argparse.ArgumentParser) -> Any:
        add_arguments(parser)
        return run

    return _entry("reward_ablation", build, argv, __doc__)


def _sft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="SFT baseline YAML (e.g. recipes/configs/sft_lora_demo.yaml)")
    parser.add_argument("--resume", action="store_true", help="reuse a trained adapter and a partial evaluation")
    parser.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir and start over")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set sft.learning_rate=5e-5 (repeatable; YAML values)")
    parser.add_argument("--output-dir", help="shortcut for --set output_dir=...")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads (default: torch's); 1 is the robust choice for tiny models on a busy CPU")


def _sft_run(args: argparse.Namespace) -> int:
    from cpr.ablation.sft_baseline import load_sft_baseline_config, run_sft_baseline

    overrides = list(args.overrides) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
    cfg = load_sft_baseline_config(args.config, overrides)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    summary = run_sft_baseline(cfg, resume=args.resume, overwrite=args.overwrite)
    print(json.dumps({k: summary[k] for k in ("run_name", "adapter", "final_eval", "training", "wall_time_s")}, indent=1))
    return 0 if summary.get("status") == "finished" else 1


def sft_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``recipes/sft_lora.py``."""

    def build(parser: argparse.ArgumentParser) -> Any:
        _sft_arguments(parser)
        return _sft_run

    return _entry("sft_lora", build, argv, _SFT_HELP)
