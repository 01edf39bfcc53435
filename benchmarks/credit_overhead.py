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

import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    from transformers import TrainerCallback

    from cpr.training.trainer import CprGRPOTrainer
    from cpr_tools.demo_phase import benchmark_arguments, load_demo_phase

    args = benchmark_arguments(__doc__, 16, "alternating")
    d = load_demo_phase(args, "credit_overhead_", ("phase_settings.cpr.credit=step",))
    times: dict[str, list[float]] = {"completion": [], "step": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            trainer.credit = ("completion", "step")[state.global_step % 2]

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "step_time" in logs:
                times[("completion", "step")[(state.global_step - 1) % 2]].append(float(logs["step_time"]))

    trainer = CprGRPOTrainer(
        model=d.model, reward_funcs=d.spec.reward_funcs, args=d.spec.args, processing_class=d.processor,
        train_dataset=d.dataset, peft_config=d.peft_config, guards=None, credit="step",
        credit_weight=d.spec.phase.credit_weight, callbacks=[Alternate()])
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
