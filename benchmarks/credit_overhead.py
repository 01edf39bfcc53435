"""Step time of ``credit: step`` against ``credit: completion``, measured in one run.

Usage::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/credit_overhead.py --steps 16
    # with the demo's warm-start adapter (completions that parse, so every step is mapped):
    ... benchmarks/credit_overhead.py --adapter outputs/demo/warm_start/adapter

One :class:`cpr.training.trainer.CprGRPOTrainer` on the demo config (``recipes/configs/demo.yaml``: its tiny
model, synthetic data, rewards and ``training`` section; format + CPR rewards) trains ``--steps`` optimizer steps,
switching ``credit`` between ``completion`` and ``step`` every step (so drift of a shared CPU hits both alike);
each step generates its own batch. Prints the median and mean of TRL's ``step_time`` per mode (the first step of
each left out: warm-up), their ratio, the time spent in the token advantages (mapping, normalisation) per
generation batch, and the mean ``credit/fallback_rate`` (share of completions that did not
parse or map, which cost the mapping nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    p.add_argument("--steps", type=int, default=16, help="optimizer steps in all, alternating the modes (16)")
    p.add_argument("--adapter", help="LoRA adapter folder to start from (default: a new adapter)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch
    from transformers import TrainerCallback

    from cpr.data import load_records, load_templates, to_grpo_dataset
    from cpr.training import policy
    from cpr.training.build import build_phase
    from cpr.training.config import load_config
    from cpr.training.trainer import CprGRPOTrainer

    torch.set_num_threads(args.threads)
    from cpr_tools import tiny_models

    tiny_models.build_demo_models(args.config)
    out = tempfile.mkdtemp(prefix="credit_overhead_")
    cfg = load_config(args.config, ["phases=[cpr]", f"output_dir={out}", "warm_start.enabled=false",
                                    f"phase_settings.cpr.training.max_steps={args.steps}",
                                    f"phase_settings.cpr.training.save_steps={args.steps + 1}",
                                    "phase_settings.cpr.curriculum.schedule=none", "phase_settings.cpr.credit=step",
                                    "evaluation.compare=[]"])
    spec = build_phase(cfg, "cpr")
    phase, grpo, funcs = spec.phase, spec.args, spec.reward_funcs
    src = cfg.data.train[0]
    records = load_records(src.source, src.path, split=src.split, options=src.options)
    model, processor = policy.load_policy(cfg, cfg.model.name_or_path)
    adapter = Path(args.adapter) if args.adapter else None
    model = policy.with_adapter(model, adapter, cfg, zero3=False, field="--adapter")

    times: dict[str, list[float]] = {"completion": [], "step": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            trainer.credit = ("completion", "step")[state.global_step % 2]

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "step_time" in logs:
                times[("completion", "step")[(state.global_step - 1) % 2]].append(float(logs["step_time"]))

    trainer = CprGRPOTrainer(
        model=model, reward_funcs=funcs, args=grpo, processing_class=processor,
        train_dataset=to_grpo_dataset(records, load_templates(cfg.data.prompts), mode="train"),
        peft_config=None if adapter else spec.lora,
        guards=None, credit="step", credit_weight=phase.credit_weight, callbacks=[Alternate()])
    spent: list[float] = []
    inner = trainer.token_advantages

    def timed(batch):
        t0 = time.perf_counter()
        out = inner(batch)
        if out is not None:
            spent.append(time.perf_counter() - t0)
        return out

    trainer.token_advantages = timed
    trainer.train()
    fallback = [r["credit/fallback_rate"] for r in trainer.state.log_history if "credit/fallback_rate" in r]
    med = {m: statistics.median(t[1:]) for m, t in times.items()}
    mean = {m: statistics.mean(t[1:]) for m, t in times.items()}
    for m in times:
        print(f"credit {m:10s}: {len(times[m]) - 1} steps, step_time median {med[m]:.3f} s, mean {mean[m]:.3f} s")
    print(f"ratio step / completion: median {med['step'] / med['completion']:.3f}, "
          f"mean {mean['step'] / mean['completion']:.3f}")
    print(f"token advantages (credit: step only): {statistics.mean(spent) * 1000:.1f} ms per generation batch, "
          f"{statistics.mean(spent) / mean['step']:.1%} of the mean step time")
    print(f"credit/fallback_rate (completions with completion-level advantage only): "
          f"{statistics.mean(fallback) if fallback else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
