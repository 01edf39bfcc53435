"""The demo config's CPR phase, ready for a step-time benchmark (``benchmarks/credit_overhead.py``,
``benchmarks/guidance_overhead.py``): its tiny model built where missing, a fresh output folder, the warm start
and the closing comparison off, ``--steps`` optimizer steps with no checkpoint, no curriculum."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def benchmark_arguments(description: str, steps: int, cycling: str) -> argparse.Namespace:
    """The command line both benchmarks take: ``--config`` (default the demo's), ``--steps`` (default ``steps``),
    ``--adapter`` (a LoRA adapter folder to start from, default a new adapter) and ``--threads`` (torch's, 1)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    p.add_argument("--steps", type=int, default=steps, help=f"optimizer steps in all, {cycling} the modes ({steps})")
    p.add_argument("--adapter", help="LoRA adapter folder to start from (default: a new adapter)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


@dataclass
class DemoPhase:
    """What a benchmark's :class:`cpr.training.trainer.CprGRPOTrainer` is built from."""

    cfg: Any  # the loaded ExperimentConfig
    spec: Any  # cpr.training.build.PhaseSpec of phase cpr (spec.args: its GRPOConfig)
    model: Any
    processor: Any
    dataset: Any  # the training records as TRL's GRPO dataset (training prompt)
    peft_config: Any  # spec.lora for a new adapter, None when --adapter gave one


def load_demo_phase(args: argparse.Namespace, prefix: str, overrides: tuple[str, ...] = ()) -> DemoPhase:
    """Phase ``cpr`` of ``args.config`` with ``args.steps`` steps and ``overrides`` (``--set`` strings), its
    policy on ``args.threads`` torch threads, output under a new temporary folder named ``prefix...``.

    Raises what :func:`cpr.training.config.load_config` and :func:`cpr.training.policy.with_adapter` raise."""
    import torch

    from cpr.data import load_records, load_templates, to_grpo_dataset
    from cpr.training import policy
    from cpr.training.build import build_phase
    from cpr.training.config import load_config
    from cpr_tools import tiny_models

    torch.set_num_threads(args.threads)
    tiny_models.build_demo_models(args.config)
    out = tempfile.mkdtemp(prefix=prefix)
    cfg = load_config(args.config, ["phases=[cpr]", f"output_dir={out}", "warm_start.enabled=false",
                                    f"phase_settings.cpr.training.max_steps={args.steps}",
                                    f"phase_settings.cpr.training.save_steps={args.steps + 1}",
                                    "phase_settings.cpr.curriculum.schedule=none", "evaluation.compare=[]",
                                    *overrides])
    spec = build_phase(cfg, "cpr")
    src = cfg.data.train[0]
    records = load_records(src.source, src.path, split=src.split, options=src.options)
    model, processor = policy.load_policy(cfg, cfg.model.name_or_path)
    adapter = Path(args.adapter) if args.adapter else None
    model = policy.with_adapter(model, adapter, cfg, zero3=False, field="--adapter")
    dataset = to_grpo_dataset(records, load_templates(cfg.data.prompts), mode="train")
    return DemoPhase(cfg, spec, model, processor, dataset, None if adapter else spec.lora)
