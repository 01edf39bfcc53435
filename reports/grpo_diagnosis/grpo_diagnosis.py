"""Why does a GRPO phase lower held-out quality? One row per candidate cause, scored on the validation split only.

Usage::

    make demo      # once: its warm-start adapter (outputs/demo/warm_start/adapter)
    HF_HUB_OFFLINE=1 .venv/bin/python reports/grpo_diagnosis/grpo_diagnosis.py --rows lr_1e-4,answer_only_lr_1e-4 --seeds 1,2,3 \
        [--curve 20] [--init-adapter ADAPTER] [--output-dir DIR]
    .venv/bin/python reports/grpo_diagnosis/grpo_diagnosis.py --table ws400=DIR/diagnosis.json[,...] [LABEL=...]

Each row is one GRPO phase of ``recipes/configs/demo.yaml`` (tiny Qwen2.5-VL, the generated colour-grid
task), started from the demo's warm-start adapter, with the row's overrides (``ROWS`` below), and then
scored on ``--val-size`` items of the *validation* split (never the test split), greedy and sampled
(``--samples`` completions an item at temperature 1, the mean over them: mean@k). Rows that compare a
setting keep the number of generated completions (prompts x generations x steps) equal. The warm start
itself is the first row. Output: one markdown table on standard output and ``<output-dir>/diagnosis.json``
(a rerun skips the rows it holds). ``--curve N`` also scores the checkpoint of every N steps (the validation
learning curve the notebook draws); ``--table`` prints the mean +/- std over seeds of finished files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]

#: name -> (what it tests, overrides of demo.yaml for the GRPO phase ``p`` = phase_settings.<phase>).
#: The default budget: 8 prompts x 8 generations x 60 steps = 3,840 completions.
BUDGET = {"training.per_device_train_batch_size": 64, "training.num_generations": 8, "p.max_steps": 60}
#: A constant learning rate: no warmup, no decay.
CONSTANT_LR = {"p.lr_scheduler_type": "constant", "p.warmup_steps": 0}
#: Answer-Only with dynamic sampling (max_resample 1). It needs the curriculum sampler (its fresh prompts):
#: 'linear' with equal weights from start to end draws all buckets in the data's own (equal) proportions, as
#: schedule 'none' does.
DYNAMIC_ANSWER_ONLY = {"phase": "answer_only", "p.learning_rate": 1e-4,
                       "phase_settings.answer_only.curriculum.schedule": "linear",
                       "phase_settings.answer_only.curriculum.linear_start": [1.0, 1.0, 1.0],
                       "phase_settings.answer_only.curriculum.linear_end": [1.0, 1.0, 1.0],
                       "phase_settings.answer_only.dynamic_sampling": {"enabled": True, "max_resample": 1}}
ROWS: dict[str, tuple[str, dict[str, object]]] = {
    "baseline": ("CPR, lr 3e-5, 8 prompts x 8, T 1.0", {}),
    "answer_only": ("Answer-Only, same budget", {"phase": "answer_only"}),
    "step_f1_only": ("format + step Match F1 only (no answer term)",
                     {"phase_settings.cpr.rewards": ["format", "step_f1"], "phase_settings.cpr.reward_weights": [1.0, 1.0]}),
    "lr_1e-4": ("CPR, lr 1e-4", {"p.learning_rate": 1e-4}),
    "answer_only_lr_1e-4": ("Answer-Only, lr 1e-4", {"phase": "answer_only", "p.learning_rate": 1e-4}),
    "step_f1_lr_1e-4": ("format + step Match F1 only, lr 1e-4",
                        {"phase_settings.cpr.rewards": ["format", "step_f1"], "phase_settings.cpr.reward_weights": [1.0, 1.0],
                         "p.learning_rate": 1e-4}),
    "lr_3e-4": ("CPR, lr 3e-4", {"p.learning_rate": 3e-4}),
    "answer_only_lr_3e-4": ("Answer-Only, lr 3e-4", {"phase": "answer_only", "p.learning_rate": 3e-4}),
    "lr_3e-4_beta_0.04": ("CPR, lr 3e-4, KL beta 0.04 to the warm start", {"p.learning_rate": 3e-4, "training.beta": 0.04}),
    "credit_step_lr_1e-4": ("CPR with step-level credit (credit: step), lr 1e-4",
                            {"phase_settings.cpr.credit": "step", "p.learning_rate": 1e-4}),
    "credit_step_lr_3e-4": ("CPR with step-level credit, lr 3e-4",
                            {"phase_settings.cpr.credit": "step", "p.learning_rate": 3e-4}),
    "lr_1e-5": ("CPR, lr 1e-5", {"p.learning_rate": 1e-5}),
    "prompts_32x2": ("32 prompts x 2 generations", {"training.num_generations": 2}),
    "prompts_4x16": ("4 prompts x 16 generations", {"training.num_generations": 16}),
    "temp_0.7": ("training temperature 0.7", {"training.temperature": 0.7}),
    "beta_0.04": ("KL beta 0.04 to the warm start", {"training.beta": 0.04}),
    "constant_lr": ("constant learning rate (no warmup, no decay)",
                    CONSTANT_LR),
    "steps_x2": ("twice the completions (120 steps)", {"p.max_steps": 120}),
    "constant_lr_1e-4": ("CPR, lr 1e-4 constant (no warmup, no decay)",
                         {"p.learning_rate": 1e-4, **CONSTANT_LR}),
    # One extra round costs a whole generation batch; 35 steps keep the completions near the 3,840 of 60 steps
    # at Answer-Only's share of zero-variance groups (the row records the completions it generated).
    "answer_only_dyn_lr_1e-4": ("Answer-Only, lr 1e-4, dynamic sampling (max_resample 1), 35 steps",
                                {**DYNAMIC_ANSWER_ONLY, "p.max_steps": 35}),
    # Four times the completions (15,360) at a constant learning rate: with --curve 60 each quarter's
    # checkpoint is the same run stopped at 3,840 x k completions.
    "long_lr_1e-4": ("CPR, lr 1e-4 constant, 240 steps", {"p.learning_rate": 1e-4, "p.max_steps": 240, **CONSTANT_LR}),
    "long_answer_only_lr_1e-4": ("Answer-Only, lr 1e-4 constant, 240 steps",
                                 {"phase": "answer_only", "p.learning_rate": 1e-4, "p.max_steps": 240, **CONSTANT_LR}),
    "long_credit_step_beta": ("CPR, credit: step, KL beta 0.04, lr 2e-4 constant, 240 steps",
                              {"phase_settings.cpr.credit": "step", "training.beta": 0.04, "p.learning_rate": 2e-4,
                               "p.max_steps": 240, **CONSTANT_LR}),
    # Control: the same phase with CPR's rewards shuffled within each group (no signal, the same advantages'
    # sizes): how far the policy drifts from the update's noise alone.
    "shuffled_lr_3e-4": ("CPR rewards shuffled within each group (no signal), lr 3e-4",
                         {"phase_settings.cpr.rewards": ["format", "cpr_shuffled"],
                          "phase_settings.cpr.reward_weights": [1.0, 1.0], "p.learning_rate": 3e-4}),
    "shuffled_lr_1e-4": ("CPR rewards shuffled within each group (no signal), lr 1e-4",
                         {"phase_settings.cpr.rewards": ["format", "cpr_shuffled"],
                          "phase_settings.cpr.reward_weights": [1.0, 1.0], "p.learning_rate": 1e-4}),
    # Less gradient noise per update: 4 x 64 completions an optimizer step (gradient accumulation), 60 steps:
    # the 15,360 completions of the 240-step rows.
    "batch_256_lr_3e-4": ("CPR, 256 completions an optimizer step (32 prompts x 8), lr 3e-4, 60 steps",
                          {"p.learning_rate": 3e-4, "p.gradient_accumulation_steps": 4}),
    # From a warm start where half of Answer-Only's groups have zero variance, nearly every step takes its extra
    # round: 30 steps keep the completions near 3,840.
    "answer_only_dyn30_lr_1e-4": ("Answer-Only, lr 1e-4, dynamic sampling (max_resample 1), 30 steps",
                                  {**DYNAMIC_ANSWER_ONLY, "p.max_steps": 30}),
    # Training temperature below 1: samples closer to the greedy completion (reports/grpo_diagnosis/greedy_vs_samples.py
    # measures how often a sample beats it at each temperature).
    "temp_0.7_lr_1e-4": ("CPR, lr 1e-4, training temperature 0.7", {"p.learning_rate": 1e-4, "training.temperature": 0.7}),
    "temp_0.5_lr_1e-4": ("CPR, lr 1e-4, training temperature 0.5", {"p.learning_rate": 1e-4, "training.temperature": 0.5}),
    "answer_only_temp_0.5_lr_1e-4": ("Answer-Only, lr 1e-4, training temperature 0.5",
                                     {"phase": "answer_only", "p.learning_rate": 1e-4, "training.temperature": 0.5}),
    # The paper's Table 6 sweep point with the step term weighted above the answer (a_w / s_w 0.35 / 0.65).
    "weights_0.35_lr_1e-4": ("CPR a_w / s_w 0.35 / 0.65, lr 1e-4",
                             {"p.learning_rate": 1e-4, "phase_settings.cpr.reward_params.cpr.answer_weight": 0.35,
                              "phase_settings.cpr.reward_params.cpr.step_weight": 0.65}),
    # The greedy completion's reward as the advantage baseline (baseline: greedy, ReMax) instead of the group mean.
    "greedy_baseline_lr_1e-4": ("CPR, lr 1e-4, baseline: greedy", {"p.learning_rate": 1e-4, "phase_settings.cpr.baseline": "greedy"}),
    "long_greedy_baseline_lr_1e-4": ("CPR, lr 1e-4 constant, baseline: greedy, 240 steps",
                                     {"p.learning_rate": 1e-4, "p.max_steps": 240, **CONSTANT_LR,
                                      "phase_settings.cpr.baseline": "greedy"}),
    "greedy_baseline_weights_0.35_lr_1e-4": ("CPR a_w / s_w 0.35 / 0.65, lr 1e-4, baseline: greedy",
                                             {"p.learning_rate": 1e-4, "phase_settings.cpr.baseline": "greedy",
                                              "phase_settings.cpr.reward_params.cpr.answer_weight": 0.35,
                                              "phase_settings.cpr.reward_params.cpr.step_weight": 0.65}),
    "greedy_baseline_step_f1_lr_1e-4": ("format + step Match F1 only, lr 1e-4, baseline: greedy",
                                        {"phase_settings.cpr.rewards": ["format", "step_f1"],
                                         "phase_settings.cpr.reward_weights": [1.0, 1.0], "p.learning_rate": 1e-4,
                                         "phase_settings.cpr.baseline": "greedy"}),
    "greedy_baseline_lr_2e-4": ("CPR, lr 2e-4, baseline: greedy", {"p.learning_rate": 2e-4, "phase_settings.cpr.baseline": "greedy"}),
    "answer_only_greedy_baseline_lr_1e-4": ("Answer-Only, lr 1e-4, baseline: greedy",
                                            {"phase": "answer_only", "p.learning_rate": 1e-4,
                                             "phase_settings.answer_only.baseline": "greedy"}),
    "mastery_lr_1e-4": ("CPR, lr 1e-4, curriculum schedule mastery (threshold 0.7)",
                        {"p.learning_rate": 1e-4, "phase_settings.cpr.curriculum.schedule": "mastery"}),
    # Reference-guided GRPO (phase_settings.cpr.guidance): LUFFY's off-policy member (one completion of each group is
    # the record's reference, its token probabilities shaped p / (p + gamma)), or a prefix of the reference's steps
    # given at the start of the rollout (half of them at first, falling to none over the first half of the phase).
    # The SFT control at the same budget: reports/reference_guidance/sft_continued.py.
    "reference_lr_1e-4": ("CPR, lr 1e-4, guidance: reference (1 member a group, gamma 0.1)",
                          {"p.learning_rate": 1e-4, "phase_settings.cpr.guidance.mode": "reference",
                           "phase_settings.cpr.guidance.members": 1, "phase_settings.cpr.guidance.gamma": 0.1}),
    "prefix_lr_1e-4": ("CPR, lr 1e-4, guidance: prefix (share 0.5, annealed to 0 over half the phase)",
                       {"p.learning_rate": 1e-4, "phase_settings.cpr.guidance.mode": "prefix",
                        "phase_settings.cpr.guidance.prefix_share": 0.5, "phase_settings.cpr.guidance.anneal_share": 0.5}),
}


def register_shuffled_cpr() -> None:
    """Registers ``cpr_shuffled``: CPR's rewards of each group (``group`` consecutive completions, TRL's
    ``num_generations``: 8 here) permuted at random, a seeded control with no learning signal."""
    import random

    from cpr.rewards import REWARD_FUNCTIONS, CPRReward, register_reward_function

    if "cpr_shuffled" in REWARD_FUNCTIONS:
        return

    @register_reward_function
    class ShuffledCPR(CPRReward):
        name = "cpr_shuffled"

        def __init__(self, group: int = 8, seed: int = 0, **settings):
            super().__init__(**settings)
            self.group, self.rng = group, random.Random(seed)

        def score(self, completions, kwargs):
            rewards = super().score(completions, kwargs)
            out = []
            for i in range(0, len(rewards), self.group):
                chunk = rewards[i:i + self.group]
                self.rng.shuffle(chunk)
                out.extend(chunk)
            return out


def phase_overrides(name: str, row: dict[str, object], init_adapter: str, out: Path, seed: int) -> list[str]:
    """``--set`` overrides of demo.yaml for one diagnosis row (one GRPO phase from ``init_adapter``)."""
    settings = {**BUDGET, **row}
    phase = str(settings.pop("phase", "cpr"))
    sets = [f"output_dir={out / name / f'seed{seed}'}", f"seed={seed}", "warm_start.enabled=false",
            f"phases=[{phase}]", "evaluation.final=false", "evaluation.compare=[]", "evaluation.eval_steps=null",
            f"phase_settings.{phase}.init_adapter={init_adapter}", f"phase_settings.{phase}.select_best=false",
            f"phase_settings.{phase}.curriculum.schedule=none", f"phase_settings.{phase}.training.learning_rate=3.0e-5"]
    steps = settings.get("p.max_steps", 60)
    sets.append(f"phase_settings.{phase}.training.save_steps={steps}")
    for key, value in settings.items():
        key = key.replace("p.", f"phase_settings.{phase}.training.", 1) if key.startswith("p.") else key
        sets.append(f"{key}={json.dumps(value)}")
    return sets


def score(adapter: str, model: str, records: list, cfg, samples: int, temperature: float, seed: int) -> dict:
    """Greedy and sampled (mean over ``samples`` seeded passes at ``temperature``) validation metrics."""
    import torch

    from cpr.data import load_templates
    from cpr.evaluation.generation import (
        Generated,
        GenerationSettings,
        TransformersGenerator,
        load_model_for_eval,
    )
    from cpr.evaluation.model_eval import evaluate_model
    from cpr.training.evaluate import scoring_settings

    t0 = time.time()

    net, processor = load_model_for_eval(model, adapter, device="cpu", dtype="float32")
    templates = load_templates(cfg.data.prompts)
    gen = GenerationSettings(max_new_tokens=cfg.evaluation.max_new_tokens, batch_size=32, prompt_mode="train",
                             backend="transformers", progress=False)
    scoring = scoring_settings(cfg, cfg.evaluation.answer_mode)
    keys = ("accuracy", "match_f1", "precision", "recall", "steps", "lucky_guess_rate")

    def pick(m: dict) -> dict:
        return {k: m["overall"][k] for k in keys}

    greedy = pick(evaluate_model(net, processor, "crystal", records, generation=gen, scoring=scoring,
                                 templates=templates))

    class Sampled(TransformersGenerator):
        def __call__(self, batch):
            inputs = self._inputs(batch).to(device="cpu", dtype=net.dtype)
            with torch.no_grad():
                out = net.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=True,
                                   temperature=temperature, top_p=1.0, top_k=0, use_cache=True,
                                   pad_token_id=processor.tokenizer.pad_token_id,
                                   suppress_tokens=[int(net.config.image_token_id)])
            rows = out[:, inputs["input_ids"].shape[1]:].tolist()
            res = []
            for row in rows:
                end = next((k for k, t in enumerate(row) if t in self.eos_ids), None)
                ids = row if end is None else row[: end + 1]
                res.append(Generated(processor.tokenizer.decode(ids, skip_special_tokens=True), len(ids), end is not None))
            return res

    sampled = []
    for k in range(samples):
        torch.manual_seed(seed * 1000 + k)
        sampled.append(pick(evaluate_model(net, processor, "crystal", records, generation=gen, scoring=scoring,
                                           templates=templates, generator=Sampled(net, processor, gen.max_new_tokens))))
    mean = {k: sum(s[k] for s in sampled) / len(sampled) for k in keys}
    return {"greedy": greedy, "sampled": mean, "score_s": round(time.time() - t0)}


def completions(phase: dict, row: dict[str, object]) -> int:
    """Completions the phase generated: one generation batch of ``per_device_train_batch_size`` x
    ``gradient_accumulation_steps`` an optimizer step, plus the extra rounds of dynamic sampling."""
    settings = {**BUDGET, **row}
    ds = phase.get("dynamic_sampling") or {}
    batches = ds.get("generation_batches", phase["steps"]) + ds.get("extra_rounds", 0)
    return int(batches * settings["training.per_device_train_batch_size"] * settings.get("p.gradient_accumulation_steps", 1))


def save_row(results: dict, results_path: Path, key: str, res: dict) -> None:
    """Add row ``key`` to ``results`` and write them all to ``results_path`` (after each run, so that an interrupted
    sweep keeps the rows it finished); prints the row."""
    results[key] = res
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=1))
    print(key, json.dumps(res), flush=True)


def seed_table(specs: list[str]) -> str:
    """Markdown table of ``diagnosis.json`` files, mean +/- sample standard deviation over each row's seeds.

    ``specs``: ``LABEL=PATH[,PATH...]``, the files of one warm start (the label names it in the table); within
    a label, rows with the same name, validation items and extra overrides are one row over their seeds, and
    the warm start's row is taken once. Columns: greedy and sampled accuracy (percent) and Match F1, the
    share of zero-variance groups, completions generated, the median ``step_time`` (seconds an optimizer step,
    from the phase's ``log.jsonl``; the machine's load varied between rows). Raises ``FileNotFoundError`` for
    a missing file and ``ValueError`` for a spec without ``=``."""
    import statistics

    groups: dict[str, list[tuple[dict, Path | None]]] = {}
    for spec in specs:
        label, sep, files = spec.partition("=")
        if not sep:
            raise ValueError(f"--table takes LABEL=PATH[,PATH...], got {spec!r}")
        for path in files.split(","):
            folder = Path(path).parent
            for key, res in json.loads(Path(path).read_text()).items():
                parts = key.split("|")
                if parts[0] == "warm_start":
                    groups.setdefault(f"{label}: warm start", [(res, None)])
                    continue
                name = "|".join([parts[0], *parts[3:]]).rstrip("|")
                groups.setdefault(f"{label}: {name}", []).append((res, folder / parts[0] / parts[1]))

    def stat(values: list[float], fmt: str) -> str:
        if len(values) < 2:
            return format(values[0], fmt)
        return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"

    lines = ["| row | seeds | greedy Acc | greedy Match F1 | sampled Acc | sampled Match F1 | greedy P | greedy R | "
             "greedy Steps | greedy Lucky | zero-std groups | completions | s / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, runs in groups.items():
        cells = [stat([r[m][k] for r, _ in runs], f) for m in ("greedy", "sampled")
                 for k, f in (("accuracy", ".1f"), ("match_f1", ".3f"))]
        cells += [stat([r["greedy"][k] for r, _ in runs], f) if all(k in r["greedy"] for r, _ in runs) else "-"
                  for k, f in (("precision", ".3f"), ("recall", ".3f"), ("steps", ".2f"), ("lucky_guess_rate", ".1f"))]
        zero = [r["zero_std"] for r, _ in runs if r.get("zero_std") is not None]
        made = [r["completions"] for r, _ in runs if r.get("completions")]
        times = []
        for _, folder in runs:
            for log in (folder.glob("*/log.jsonl") if folder else []):
                steps = [json.loads(line).get("step_time") for line in log.read_text().splitlines() if line.strip()]
                steps = [t for t in steps if t is not None]
                if steps:
                    times.append(statistics.median(steps))
        lines.append(f"| {name} | {len(runs)} | {' | '.join(cells)} | {stat(zero, '.3f') if zero else '-'} | "
                     f"{stat(made, '.0f') if made else '-'} | {stat(times, '.2f') if times else '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows of {', '.join(ROWS)}")
    parser.add_argument("--seeds", default="1", help="comma-separated GRPO seeds (default 1)")
    parser.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    parser.add_argument("--init-adapter", default=str(REPO / "outputs/demo/warm_start/adapter"))
    parser.add_argument("--output-dir", default=str(REPO / "outputs/grpo_diagnosis"))
    parser.add_argument("--val-size", type=int, default=270, help="validation items scored (default 270)")
    parser.add_argument("--val-seed", type=int, default=0, help="generator seed of the validation items (default 0)")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions an item (default 4)")
    parser.add_argument("--curve", type=int, default=0,
                        help="also save a checkpoint every N steps and score each (the learning curve; 0: off)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra override for every row")
    parser.add_argument("--table", nargs="+", metavar="DIAGNOSIS_JSON",
                        help="only print the mean +/- std over seeds of these diagnosis.json files, then exit")
    args = parser.parse_args()
    if args.table:
        print(seed_table(args.table))
        return

    import torch

    from cpr.data.synthetic import generate
    from cpr.training.config import load_config

    torch.set_num_threads(1)  # as the runs' torch_threads: one thread is faster on a shared 2-core machine
    from cpr.training.experiment import run_experiment

    register_shuffled_cpr()
    out = Path(args.output_dir)
    records = list(generate(args.val_size, seed=args.val_seed, split="validation"))
    cfg0 = load_config(args.config)
    results_path = out / "diagnosis.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    key0 = f"warm_start|val{args.val_seed}x{args.val_size}"
    if key0 not in results:
        results[key0] = score(args.init_adapter, cfg0.model.name_or_path, records, cfg0, args.samples, 1.0, 0)
    for name in [n for n in args.rows.split(",") if n]:  # --rows "": the warm start's row only
        for seed in [int(s) for s in args.seeds.split(",")]:
            key = f"{name}|seed{seed}|val{args.val_seed}x{args.val_size}|{';'.join(args.extra)}"
            if key in results:
                continue
            sets = phase_overrides(name, ROWS[name][1], args.init_adapter, out, seed) + args.extra
            if args.curve:
                sets.append(f"phase_settings.{ROWS[name][1].get('phase', 'cpr')}.training.save_steps={args.curve}")
            cfg = load_config(args.config, sets)
            t0 = time.time()
            summary = run_experiment(cfg, overwrite=True)
            phase = summary["phases"][0]
            res = score(phase["adapter"], cfg.model.name_or_path, records, cfg, args.samples, 1.0, seed)
            res.update(train_s=round(time.time() - t0), reward=phase["reward_trend"],
                       zero_std=phase["frac_reward_zero_std"], dynamic_sampling=phase.get("dynamic_sampling"),
                       completions=completions(phase, ROWS[name][1]))
            if args.curve:
                folder = Path(phase["adapter"]).parent
                res["curve"] = {c.name.split("-")[1]: score(str(c), cfg.model.name_or_path, records, cfg,
                                                            args.samples, 1.0, seed)
                                for c in sorted(folder.glob("checkpoint-*"), key=lambda c: int(c.name.split("-")[1]))}
            save_row(results, results_path, key, res)
    out.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=1))
    print("| row | greedy Acc / Match F1 | sampled Acc / Match F1 | reward first -> last |")
    print("|---|---|---|---|")
    for key, r in results.items():
        g, s = r["greedy"], r["sampled"]
        trend = r.get("reward")
        t = f"{trend['first']:.2f} -> {trend['last']:.2f}" if trend else "-"
        print(f"| {key} | {g['accuracy']:.1f} / {g['match_f1']:.3f} | {s['accuracy']:.1f} / "
              f"{s['match_f1']:.3f} | {t} |")


if __name__ == "__main__":
    sys.exit(main())
