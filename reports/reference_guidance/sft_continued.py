"""The control of reference-guided GRPO: the same budget spent on more supervised steps on the full reference.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python reports/reference_guidance/sft_continued.py \
        --init-adapter outputs/demo/warm_start/adapter --seeds 1,2,3 --output-dir DIR [--steps 480]
    .venv/bin/python reports/grpo_diagnosis/grpo_diagnosis.py --table A=DIR/diagnosis.json

Continues the warm-start adapter ``--init-adapter`` (loaded trainable) with supervised LoRA training
(:func:`cpr.training.sft.run_sft`) on the training split of ``--config`` (``recipes/configs/demo.yaml``) with
its prompts, the target being the full reference (:func:`cpr.data.render_target`, no ``step_keep``
teacher), for ``--steps`` steps of the warm start's schedule (``warm_start``: learning rate, warmup share,
batch size, ``max_length``; 480 steps of 8 = 3,840 training sequences, the completions of a
``grpo_diagnosis.py`` row), seeded by each of ``--seeds``. Then scores the adapter on the validation split
with ``grpo_diagnosis.score`` (greedy and mean@``--samples``) and adds the row ``sft_continued|seedN|...``
(``--learning-rate``, when given, named in its last field as ``grpo_diagnosis.py`` names ``--set``) and the
warm start's row (once) to ``<output-dir>/diagnosis.json``, the format ``grpo_diagnosis.py --table`` reads; a
rerun skips the rows the file holds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]


def _load_grpo_diagnosis():
    """reports/grpo_diagnosis/grpo_diagnosis.py as a module (its rows' scoring and table), loaded from its file."""
    spec = importlib.util.spec_from_file_location("grpo_diagnosis", REPO / "reports/grpo_diagnosis/grpo_diagnosis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


grpo_diagnosis = _load_grpo_diagnosis()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init-adapter", required=True, help="the warm-start adapter to continue")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds (default 1)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--config", default=str(REPO / "recipes/configs/demo.yaml"))
    parser.add_argument("--steps", type=int, default=480, help="supervised steps (default 480: 3,840 sequences of 8)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the config's warm_start.learning_rate")
    parser.add_argument("--val-size", type=int, default=270, help="validation items scored (default 270)")
    parser.add_argument("--val-seed", type=int, default=0, help="generator seed of the validation items (default 0)")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions an item (default 4)")
    args = parser.parse_args()

    import dataclasses

    import torch
    from peft import PeftModel

    from cpr.data.synthetic import generate
    from cpr.training import policy
    from cpr.training.config import load_config
    from cpr.training.config_checks import warm_start_settings
    from cpr.training.sft import run_sft
    from cpr.training.splits import load_run_data

    torch.set_num_threads(1)  # as grpo_diagnosis.py and the runs' torch_threads
    out = Path(args.output_dir)
    records = list(generate(args.val_size, seed=args.val_seed, split="validation"))
    results_path = out / "diagnosis.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    cfg0 = load_config(args.config)
    key0 = f"warm_start|val{args.val_seed}x{args.val_size}"
    if key0 not in results:
        results[key0] = grpo_diagnosis.score(args.init_adapter, cfg0.model.name_or_path, records, cfg0, args.samples, 1.0, 0)
    for seed in [int(s) for s in args.seeds.split(",")]:
        extra = [f"warm_start.learning_rate={args.learning_rate:g}"] if args.learning_rate is not None else []
        key = f"sft_continued|seed{seed}|val{args.val_seed}x{args.val_size}|{';'.join(extra)}"
        if key in results:
            continue
        sets = [f"seed={seed}", f"warm_start.max_steps={args.steps}", "warm_start.step_keep=1.0", *extra]
        cfg = load_config(args.config, sets)
        settings = dataclasses.replace(warm_start_settings(cfg), save_strategy="no")
        splits, templates = load_run_data(cfg)
        t0 = time.time()
        model, processor = policy.load_policy(cfg, cfg.model.name_or_path)
        model = PeftModel.from_pretrained(model, args.init_adapter, is_trainable=True)
        adapter = run_sft(model, processor, splits.train, templates, settings, out / "sft_continued" / f"seed{seed}",
                          prefix="warm_start")
        del model
        policy.free_memory()
        res = grpo_diagnosis.score(str(adapter), cfg.model.name_or_path, records, cfg, args.samples, 1.0, seed)
        res.update(train_s=round(time.time() - t0), reward=None, zero_std=None,
                   completions=settings.max_steps * settings.per_device_train_batch_size * settings.gradient_accumulation_steps,
                   sft={"steps": settings.max_steps, "learning_rate": settings.learning_rate,
                        "warmup_ratio": settings.warmup_ratio, "batch": settings.per_device_train_batch_size,
                        "max_length": settings.max_length, "records": len(splits.train)})
        grpo_diagnosis.save_row(results, results_path, key, res)
    out.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
