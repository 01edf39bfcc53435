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

import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
MODES = ("none", "reference", "prefix")


def main() -> int:
    from transformers import TrainerCallback

    from cpr.training.config_sections import GuidanceConfig
    from cpr.training.guidance import Guidance
    from cpr.training.trainer import CprGRPOTrainer
    from cpr_tools.demo_phase import benchmark_arguments, load_demo_phase

    args = benchmark_arguments(__doc__, 18, "cycling")
    d = load_demo_phase(args, "guidance_overhead_")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    class Cycle(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            trainer.guidance = guidance[MODES[state.global_step % 3]]

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "step_time" in logs:
                times[MODES[(state.global_step - 1) % 3]].append(float(logs["step_time"]))

    trainer = CprGRPOTrainer(
        model=d.model, reward_funcs=d.spec.reward_funcs, args=d.spec.args, processing_class=d.processor,
        train_dataset=d.dataset, peft_config=d.peft_config, guards=None, callbacks=[Cycle()],
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
