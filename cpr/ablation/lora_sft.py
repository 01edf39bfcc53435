"""The LoRA fine-tuning baseline of the M3CoT paper (``recipes/sft_lora.py``): an experiment that trains no
GRPO phase, only its ``warm_start`` section (TRL's ``SFTTrainer`` on the reference steps and answer in the
output JSON format, :mod:`cpr.training.warm_start`), then scores the adapter like every GRPO run. Any
experiment config serves (its phases are left out); the adapter lands in ``<output_dir>/warm_start/adapter``.

The M3CoT baseline (arXiv 2405.16473) uses a batch of 2, 4 or 8 (``per_device_train_batch_size x
gradient_accumulation_steps x processes``), a learning rate in [1e-6, 8e-5] and 512 tokens at most.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError

__all__ = ["check_m3cot_ranges", "load_sft_config", "main", "run_sft_baseline"]

logger = logging.getLogger("cpr.ablation")

M3COT_BATCH_SIZES, M3COT_LEARNING_RATES, M3COT_MAX_LENGTH = (2, 4, 8), (1e-6, 8e-5), 512
SFT_OVERRIDES = ("phases=[]", "warm_start.enabled=true")


def check_m3cot_ranges(settings: Any, *, mode: str = "error", world_size: int = 1) -> list[str]:
    """Compare :class:`cpr.training.sft.SFTSettings` with the M3CoT baseline's ranges: one message per
    setting outside them (``mode="warn"`` logs each; ``"error"`` raises ConfigError naming ``warm_start.<key>``)."""
    if mode not in ("error", "warn"):
        raise ConfigError(f"must be error or warn, got {mode!r}", field="--ranges")
    s, (low, high) = settings, M3COT_LEARNING_RATES
    batch = s.per_device_train_batch_size * s.gradient_accumulation_steps * world_size
    problems = [(key, msg) for key, msg, bad in (
        ("per_device_train_batch_size",
         f"batch size {batch} (per_device_train_batch_size {s.per_device_train_batch_size} x gradient_accumulation_steps "
         f"{s.gradient_accumulation_steps} x {world_size} processes) is not one of the M3CoT baseline's "
         f"{list(M3COT_BATCH_SIZES)}", batch not in M3COT_BATCH_SIZES),
        ("learning_rate", f"learning rate {s.learning_rate:g} is outside the M3CoT baseline's range [{low:g}, {high:g}]",
         not low <= s.learning_rate <= high),
        ("max_length", f"max_length {s.max_length} is not the M3CoT baseline's {M3COT_MAX_LENGTH}",
         s.max_length != M3COT_MAX_LENGTH),
    ) if bad]
    if problems and mode == "error":
        raise ConfigError(problems[0][1] + " (pass --ranges warn to run anyway)", field=f"warm_start.{problems[0][0]}")
    for _, message in problems:
        logger.warning("SFT baseline: %s", message)
    return [m for _, m in problems]


def load_sft_config(path: str | Path, overrides: Sequence[str] = (), *, warn_dropped: bool = True) -> Any:
    """The experiment config of an SFT baseline: ``path`` with ``overrides``, no GRPO phase, the warm start on
    (``warn_dropped``: :func:`cpr.training.config.load_config`'s)."""
    from cpr.training.config import load_config

    return load_config(path, [*overrides, *SFT_OVERRIDES], warn_dropped=warn_dropped)


def run_sft_baseline(cfg: Any, *, ranges: str = "error", resume: bool = False, overwrite: bool = False) -> dict:
    """Check the M3CoT ranges (:func:`check_m3cot_ranges`), then train and score the baseline; the summary."""
    from cpr.training.config_checks import num_processes
    from cpr.training.experiment import run_experiment
    from cpr.training.warm_start import warm_start_settings

    check_m3cot_ranges(warm_start_settings(cfg), mode=ranges, world_size=num_processes())
    return run_experiment(cfg, resume=resume, overwrite=overwrite)


def main(argv: Sequence[str] | None = None) -> int:
    """``recipes/sft_lora.py``: exit code 0 when the baseline finished, 2 on an error."""
    from cpr.errors import run_command

    parser = argparse.ArgumentParser(prog="sft_lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="experiment YAML (e.g. recipes/configs/sft_lora_demo.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set warm_start.learning_rate=5e-5 (repeatable)")
    parser.add_argument("--output-dir", help="shortcut for --set output_dir=...")
    parser.add_argument("--ranges", default="error", choices=["error", "warn"], help="settings outside the M3CoT ranges")
    parser.add_argument("--resume", action="store_true", help="reuse a trained adapter and a partial evaluation")
    parser.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir first")

    def run(args: argparse.Namespace) -> None:  # run_experiment prints the summary
        overrides = [*args.overrides, *([f"output_dir={args.output_dir}"] if args.output_dir else [])]
        run_sft_baseline(load_sft_config(args.config, overrides), ranges=args.ranges, resume=args.resume,
                         overwrite=args.overwrite)

    return run_command("sft_lora", run, parser.parse_args(argv))
