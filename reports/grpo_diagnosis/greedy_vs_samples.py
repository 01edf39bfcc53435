"""Where does a GRPO group push the policy? Each training prompt's greedy completion against its sampled group.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python reports/grpo_diagnosis/greedy_vs_samples.py --config recipes/configs/demo.yaml \
        --adapter outputs/ws800k50/warm_start/adapter [--phase cpr] [--prompts 96] [--generations 8] \
        [--temperatures 1.0,0.7,0.5] [--set KEY=VALUE ...] [--output FILE.json]

For ``--prompts`` items of the config's training split (the generated task, ``data.train[0]``'s options), the
adapter's greedy completion and a group of ``--generations`` completions sampled at each temperature (as TRL's
GRPO generation: ``top_k`` 0, ``top_p`` 1) are scored with the phase's reward functions and weights (TRL's
total reward: the weighted sum). GRPO's advantage of a completion is its reward minus the group mean over the
group's standard deviation (TRL's ``scale_rewards: group``), so its update raises the probability of what is
above the group mean. The table tells whether that is the greedy completion itself (the update then makes the
sampled policy more like the greedy one and leaves the greedy one as it is: sharpening) or completions better
than the greedy one (the update can then change what greedy decoding says). Columns, over prompts:

- ``greedy R`` / ``sampled R``: mean total reward of the greedy completion / of the samples;
- ``> greedy`` / ``= greedy`` / ``< greedy``: share of samples whose reward is above / equal to (1e-6) / below
  their prompt's greedy completion's;
- ``greedy above mean``: share of groups (with reward variance) whose greedy completion's reward is above the
  group mean, so that GRPO would push toward it;
- ``greedy text``: share of samples identical to the greedy completion (the mode's probability mass);
- ``steps greedy`` / ``steps > greedy``: mean reasoning steps of the greedy completions / of the samples that
  beat them.

Output: a markdown table and, with ``--output``, the numbers as JSON. No training, no validation or test item.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]


def reward_rows(records) -> list[dict]:
    """The reward columns of each record (those of ``cpr.data.grpo.to_grpo_dataset`` the reward functions read)."""
    return [{"answer": r.answer, "reference_steps": list(r.reference_steps), "options": list(r.options),
             "question": r.question, "id": r.id} for r in records]


def group_stats(greedy_r: list[float], groups_r: list[list[float]], greedy_t: list[str], groups_t: list[list[str]],
                greedy_steps: list[int], groups_steps: list[list[int]]) -> dict[str, float]:
    """The table's columns (module docstring) of per-prompt greedy and sampled rewards, texts and step counts."""
    above = equal = below = same = 0
    n = 0
    greedy_up = varied = 0
    beat_steps: list[int] = []
    for g, rs, gt, ts, ss in zip(greedy_r, groups_r, greedy_t, groups_t, groups_steps, strict=True):
        for r, t, s in zip(rs, ts, ss, strict=True):
            n += 1
            same += t == gt
            if r > g + 1e-6:
                above += 1
                beat_steps.append(s)
            elif r < g - 1e-6:
                below += 1
            else:
                equal += 1
        if max(rs) - min(rs) > 1e-6:
            varied += 1
            greedy_up += g > statistics.mean(rs) + 1e-6
    return {"greedy_reward": statistics.mean(greedy_r), "sampled_reward": statistics.mean(r for rs in groups_r for r in rs),
            "above": above / n, "equal": equal / n, "below": below / n,
            "greedy_above_mean": greedy_up / varied if varied else float("nan"), "greedy_text": same / n,
            "steps_greedy": statistics.mean(greedy_steps),
            "steps_beating": statistics.mean(beat_steps) if beat_steps else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--phase", default="cpr")
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--temperatures", default="1.0,0.7,0.5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a config override (KEY=VALUE)")
    args = parser.parse_args()

    import torch

    from cpr.data import load_templates
    from cpr.data.prompts import build_messages
    from cpr.data.synthetic import generate
    from cpr.evaluation.generation import DecodingSettings, TransformersGenerator, load_model_for_eval
    from cpr.steps import parse_completion
    from cpr.training.build import build_phase
    from cpr.training.config import load_config
    from cpr.training.greedy_baseline import total_rewards

    torch.set_num_threads(1)
    cfg = load_config(args.config, args.sets)
    spec = build_phase(cfg, args.phase)
    options = cfg.data.train[0].options
    records = list(generate(args.prompts, seed=int(options.get("seed", 0)), split="train"))
    templates = load_templates(cfg.data.prompts)
    net, processor = load_model_for_eval(cfg.model.name_or_path, args.adapter, device="cpu", dtype="float32")
    gen = TransformersGenerator(net, processor, cfg.evaluation.max_new_tokens)

    def steps(text: str) -> int:
        return len(parse_completion(text).steps)

    batch = 16
    conversations = [build_messages(r, templates, include_images=True) for r in records]
    rows = reward_rows(records)
    greedy_t: list[str] = []
    for i in range(0, len(records), batch):
        greedy_t += [g.text for g in gen(conversations[i:i + batch])]
    greedy_r = total_rewards(spec.reward_funcs, spec.reward_weights, rows, greedy_t)
    results = {}
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        decoding = DecodingSettings(mode="sampled", temperature=temperature, samples=args.generations, seed=args.seed)
        groups_t: list[list[str]] = []
        for i in range(0, len(records), batch):
            groups_t += [[g.text for g in group]
                         for group in gen.sample(conversations[i:i + batch], decoding, seed=args.seed * 1000 + i)]
        flat_rows = [row for row in rows for _ in range(args.generations)]
        flat = total_rewards(spec.reward_funcs, spec.reward_weights, flat_rows, [t for ts in groups_t for t in ts])
        groups_r = [flat[k * args.generations:(k + 1) * args.generations] for k in range(len(records))]
        results[str(temperature)] = group_stats(greedy_r, groups_r, greedy_t, groups_t, [steps(t) for t in greedy_t],
                                                [[steps(t) for t in ts] for ts in groups_t])
    print(f"adapter {args.adapter}, phase {args.phase} rewards, {len(records)} training prompts x {args.generations}")
    print("| temperature | greedy R | sampled R | > greedy | = greedy | < greedy | greedy above mean | greedy text | "
          "steps greedy | steps > greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t, s in results.items():
        print(f"| {t} | {s['greedy_reward']:.3f} | {s['sampled_reward']:.3f} | {s['above']:.2f} | {s['equal']:.2f} | "
              f"{s['below']:.2f} | {s['greedy_above_mean']:.2f} | {s['greedy_text']:.2f} | {s['steps_greedy']:.2f} | "
              f"{s['steps_beating']:.2f} |")
    if args.output:
        Path(args.output).write_text(json.dumps({"adapter": args.adapter, "phase": args.phase, "results": results},
                                                indent=1))


if __name__ == "__main__":
    sys.exit(main())
