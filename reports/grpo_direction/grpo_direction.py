"""Does a GRPO phase move the policy toward what the reward pays for? A sanity check of the training path.

Usage::

    python recipes/cpr_curriculum.py --config recipes/configs/demo_tabmwp.yaml   # once: its warm start
    HF_HUB_OFFLINE=1 .venv/bin/python reports/grpo_direction/grpo_direction.py [--lr 1e-3] [--steps 16]

Runs one GRPO phase of the TabMWP demo config (tiny Qwen2.5-VL, the bundled TabMWP samples, the same
trainer, curriculum sampler and guards as the demos) with one registered reward function,
``short`` = ``max(0, 1 - characters / 400)``, which pays for short completions, starting from the
demo's warm-start adapter (``outputs/demo_tabmwp/warm_start/adapter``; a new LoRA adapter when absent).
It prints the mean completion length (tokens) of every step and the mean of the first and last
quarter. If GRPO works, the length falls (measured: 65 -> 20 tokens in 16 steps at lr 1e-3). A
length that rises would mean the update has the wrong sign somewhere in the path.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate of the phase (default 1e-3)")
    parser.add_argument("--steps", type=int, default=16, help="GRPO steps (default 16)")
    parser.add_argument("--output-dir", default="outputs/grpo_direction")
    parser.add_argument("--init-adapter", default=str(REPO / "outputs/demo_tabmwp/warm_start/adapter"))
    args = parser.parse_args()

    from cpr.rewards import RewardFunction, register_reward_function
    from cpr.training.config import load_config
    from cpr.training.experiment import run_experiment
    from cpr_tools import tiny_models

    @register_reward_function
    class ShortReward(RewardFunction):
        """``max(0, 1 - characters / 400)`` of the completion text, in [0, 1]."""

        name = "short"

        def score(self, completions, kwargs):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [max(0.0, 1.0 - len(t) / 400.0) for t in texts]

    overrides = [
        f"output_dir={args.output_dir}", "warm_start.enabled=false", "phases=[cpr]", "evaluation.final=false",
        "evaluation.eval_steps=null", "training.report_to=none", "training.logging_steps=1",
        "phase_settings.cpr.rewards=[short]", "phase_settings.cpr.reward_weights=[1.0]",
        "phase_settings.cpr.curriculum.schedule=none", f"phase_settings.cpr.training.learning_rate={args.lr!r}",
        f"phase_settings.cpr.training.max_steps={args.steps}", f"phase_settings.cpr.training.save_steps={args.steps}",
    ]
    init = Path(args.init_adapter)
    if (init / "adapter_config.json").is_file():
        overrides.append(f"phase_settings.cpr.init_adapter={init}")
    else:
        print(f"no warm-start adapter in {init} (run the TabMWP demo first for a policy that writes JSON); "
              "starting from a new LoRA adapter")
    tiny_models.build_demo_models(REPO / "recipes/configs/demo_tabmwp.yaml")  # its tiny model, where missing
    cfg = load_config(REPO / "recipes/configs/demo_tabmwp.yaml", overrides)
    run_experiment(cfg, overwrite=True)  # the benchmark's output is disposable

    rows = [json.loads(line) for line in open(Path(args.output_dir) / "cpr" / "log.jsonl", encoding="utf-8")]
    lengths = [r["completions/mean_length"] for r in rows if "completions/mean_length" in r]
    k = max(1, len(lengths) // 4)
    first, last = sum(lengths[:k]) / k, sum(lengths[-k:]) / k
    print("mean completion length per step:", " ".join(f"{x:.0f}" for x in lengths))
    print(f"first quarter {first:.1f} -> last quarter {last:.1f} tokens: "
          + ("falls, as the reward asks" if last < first else "DOES NOT FALL: check the training path"))


if __name__ == "__main__":
    main()
