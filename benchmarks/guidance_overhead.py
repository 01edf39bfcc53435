"""Step time of reference-guided GRPO (``guidance: reference`` and ``prefix``) against none, measured in one run.

Usage::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/guidance_overhead.py --steps 18 \
        [--adapter outputs/demo/warm_start/adapter]

One :class:`cpr.training.trainer.CprGRPOTrainer` on the demo config (``recipes/configs/demo.yaml``: its tiny
model, synthetic data, format + CPR rewards, 8 prompts x 8 completions a step) trains ``--steps`` optimizer steps,
cycling the guidance mode none -> reference -> prefix step by step (so drift of a shared CPU hits all alike); each
step generates its own batch of the same size. ``reference``: one completion a group is the record's reference
(gamma 0.1); ``prefix``: hints of half the reference steps, annealed over the whole run. Prints the median and
mean of TRL's ``step_time`` per mode (each mode's first step left out: warm-up) and their ratios to none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
MODES = ("none", "reference", "prefix")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    p.add_argument("--steps", type=int, default=18, help="optimizer steps in all, cycling the modes (18)")
    p.add_argument("--adapter", help="LoRA adapter folder to start from (default: a new adapter)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch
    from transformers import TrainerCallback

    from cpr.data import load_records, load_templates, to_grpo_dataset
    from cpr.training import policy
    from cpr.training.build import build_phase
    from cpr.training.config import load_config
    from cpr.training.config_sections import GuidanceConfig
    from cpr.training.guidance import Guidance
    from cpr.training.trainer import CprGRPOTrainer
    from cpr_tools import tiny_models

    torch.set_num_threads(args.threads)
    tiny_models.build_demo_models(args.config)
    out = tempfile.mkdtemp(prefix="guidance_overhead_")
    cfg = load_config(args.config, ["phases=[cpr]", f"output_dir={out}", "warm_start.enabled=false",
                                    f"phase_settings.cpr.training.max_steps={args.steps}",
                                    f"phase_settings.cpr.training.save_steps={args.steps + 1}",
                                    "phase_settings.cpr.curriculum.schedule=none", "evaluation.compare=[]"])
    spec = build_phase(cfg, "cpr")
    src = cfg.data.train[0]
    records = load_records(src.source, src.path, split=src.split, options=src.options)
    model, processor = policy.load_policy(cfg, cfg.model.name_or_path)
    adapter = Path(args.adapter) if args.adapter else None
    model = policy.with_adapter(model, adapter, cfg, zero3=False, field="--adapter")
    times: dict[str, list[float]] = {m: [] for m in MODES}

    class Cycle(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            trainer.guidance = guidance[MODES[state.global_step % 3]]

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "step_time" in logs:
                times[MODES[(state.global_step - 1) % 3]].append(float(logs["step_time"]))

    trainer = CprGRPOTrainer(
        model=model, reward_funcs=spec.reward_funcs, args=spec.args, processing_class=processor,
        train_dataset=to_grpo_dataset(records, load_templates(cfg.data.prompts), mode="train"),
        peft_config=None if adapter else spec.lora, guards=None, callbacks=[Cycle()],
        guidance=GuidanceConfig(mode="reference"))
    guidance = {m: Guidance(trainer, GuidanceConfig(mode=m, prefix_share=0.5, anneal_share=1.0)) for m in MODES}
    trainer.train()
    med = {m: statistics.median(t[1:]) for m, t in times.items()}
    mean = {m: statistics.mean(t[1:]) for m, t in times.items()}
    for m in MODES:
        print(f"guidance {m:9s}: {len(times[m]) - 1} steps, step_time median {med[m]:.3f} s, mean {mean[m]:.3f} s, "
              f"ratio to none: median {med[m] / med['none']:.3f}, mean {mean[m] / mean['none']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
