"""Warm-start probe: how much supervised LoRA training makes a tiny model emit the JSON format.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/warm_start_probe.py --limit 16 --steps 150 --lr 5e-3 \
        --rank 16 --scheduler linear --warmup-ratio 0.05

What it does: builds a tiny model (``tools/tiny_models.py``, tokenizer trained on the
default corpus plus the TabMWP samples' system prompt, questions and target JSON), trains a
LoRA adapter with :func:`cpr.training.sft.run_sft` on the 114 embedded TabMWP samples
(``data/samples/tabmwp``), then generates for the same prompts (the GRPO training prompts of
the offline demo):

* greedy decoding: rate of completions that parse as valid JSON
  (``cpr.steps.parse_completion(text).json_valid``) and strict accuracy
  (``cpr.answers.check_answer(parsed.answer, record.answer, options=..., mode="strict")``);
* sampling as GRPO samples (temperature ``--temperature``, top_k 0, top_p 1), ``--group``
  completions per prompt: the same rates, and the share of groups whose rewards (format +
  accuracy, GRPO phase 1) are not all equal, i.e. groups with a non-zero advantage.

Prints one JSON object (recipe, warm-start seconds, loss first/last, the rates) and writes it
to ``--out`` when given.

Measured on the shared 2-core CPU, 1 thread, tiny Qwen2.5-VL (hidden 128, 4 layers), batch 8,
max length 512, linear schedule with 5% warmup, LoRA on the language model (alpha 2r, no dropout),
sampling 4 completions a prompt at temperature 1 (json / acc = valid-JSON rate / strict accuracy;
var = share of groups of 4 with unequal format + accuracy rewards):

records  steps  lr    rank  norm  seconds  loss first->last  greedy json/acc  T=1 json/acc/var
16       150    5e-3  16    x1    63       6.7 -> 4.8         0 / 0            0 / 0 / 0
16       150    5e-3  16    x8    67       6.4 -> 0.009       1.0 / 1.0        .56 / .59 / .81
16       150    3e-3  16    x8    64       6.7 -> 0.010       1.0 / 1.0        .64 / .64 / .81
16       150    5e-3  32    x8    68       5.9 -> 0.005       1.0 / 1.0        .78 / .77 / .75
16       150    5e-3  16    x16   64       8.6 -> 0.003       1.0 / 1.0        .94 / .94 / .31
16       100    5e-3  16    x8    44       7.0 -> 0.056       1.0 / 1.0        .06 / .06 / .31
24       150    5e-3  16    x8    71       6.6 -> 0.037       1.0 / 1.0        .19 / .20 / .63
114      150    5e-3  16    x8    84       7.4 -> 2.0         .08 / 0          .03 / .00 / .10
114      300    5e-3  16    x8    346 *    6.4 -> 1.0         .37 / .03        .02 / .00 / .09
32 h256  150    5e-3  16    x8    138      6.9 -> 0.016       1.0 / 1.0        .76 / .73 / .78
(* machine busier; "h256": --hidden-size 256)

"norm" x8 in the table is what the builder now does by itself (OUTPUT_SCALE); ``--norm-scale`` is an extra factor on top of the builder's OUTPUT_SCALE (8): at x1/8 no logit can exceed ~2.6, the loss
stalls near 5 nats and nothing parses. ``--threads`` (default 1) sets torch's CPU threads (2 threads on a
shared 2-core machine made tiny-model steps slower and erratic, see grpo_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
TABMWP = REPO / "data" / "samples" / "tabmwp" / "problems_test1k_subset.json"
sys.path.insert(0, str(REPO / "tools"))  # tiny_models: the tiny model builder


def tokenizer_texts(records, templates) -> list[str]:
    """Tokenizer corpus: the default corpus + system prompt, user texts and target JSON of the records."""
    from tiny_models import default_corpus

    from cpr.data import render_target, user_text

    return (
        default_corpus()
        + [templates.system]
        + [user_text(r, templates) for r in records]
        + [render_target(r) for r in records]
    )


def generate(model, processor, records, templates, *, do_sample: bool, n: int, temperature: float,
             max_new_tokens: int, batch_size: int, seed: int) -> list[list[str]]:
    """Completions (``n`` per record) for the records' training prompts, decoded without special tokens."""
    import torch

    from cpr.data import build_messages

    torch.manual_seed(seed)
    out: list[list[str]] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        messages = [build_messages(r, templates, mode="train", include_images=True) for r in chunk]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
            processor_kwargs={"padding": True},
        )
        kwargs = {"do_sample": do_sample, "max_new_tokens": max_new_tokens, "num_return_sequences": n}
        if do_sample:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        with torch.no_grad():
            ids = model.generate(**inputs, **kwargs)
        texts = processor.batch_decode(ids[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        out.extend(texts[i * n : (i + 1) * n] for i in range(len(chunk)))
    return out


def score(records, completions: list[list[str]]) -> dict:
    """Valid-JSON rate, strict accuracy and the share of groups with unequal (format + accuracy) rewards."""
    from cpr.answers import check_answer
    from cpr.steps import parse_completion

    valid = correct = total = varied = 0
    for record, group in zip(records, completions, strict=True):
        rewards = []
        for text in group:
            parsed = parse_completion(text)
            ok = check_answer(parsed.answer, record.answer, options=record.options, question=record.question,
                              mode="strict").correct
            valid += parsed.json_valid
            correct += ok
            total += 1
            rewards.append(float(parsed.json_valid) + float(ok))
        varied += len(set(rewards)) > 1
    return {
        "valid_json": round(valid / total, 3),
        "accuracy": round(correct / total, 3),
        "groups_with_reward_variance": round(varied / len(records), 3) if len(completions[0]) > 1 else None,
        "completions": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="qwen2_5_vl", choices=["qwen2_5_vl", "internvl"])
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--scheduler", default="constant")
    parser.add_argument("--warmup-ratio", type=float, default=0.0)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=None, help="LoRA alpha (default 2 * rank)")
    parser.add_argument("--train-norm", action="store_true",
                        help="also train the language model's final RMSNorm (PEFT modules_to_save)")
    parser.add_argument("--norm-scale", type=float, default=1.0,
                        help="multiply the base model's final RMSNorm weight by this before training (a frozen base "
                        "change that simulates a tiny model built with a larger output-logit scale)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--limit", type=int, default=None, help="train and evaluate on the first N records only")
    parser.add_argument("--eval", default="greedy,sample", help="greedy, sample, or both (comma-separated)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--group", type=int, default=4, help="sampled completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--gen-batch", type=int, default=38)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="tiny model cache (default: a temporary folder)")
    parser.add_argument("--show", type=int, default=2, help="print this many completions of each kind")
    parser.add_argument("--out", default=None, help="write the JSON summary here")
    args = parser.parse_args()

    import torch
    from tiny_models import ensure_tiny_model
    from transformers import TrainerCallback

    from cpr.data import load_records, load_templates
    from cpr.models import build_lora_config, load_model_and_processor
    from cpr.training.sft import SFTSettings, run_sft

    torch.set_num_threads(args.threads)
    records = load_records("tabmwp", TABMWP, limit=args.limit)
    templates = load_templates()
    alpha = args.alpha if args.alpha is not None else 2 * args.rank

    class LossLog(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
        path = ensure_tiny_model(args.kind, cache, texts=tokenizer_texts(records, templates),
                                 hidden_size=args.hidden_size, num_layers=args.num_layers)
        model, processor = load_model_and_processor(str(path), device="cpu")
        if args.norm_scale != 1.0:
            with torch.no_grad():
                model.model.language_model.norm.weight.mul_(args.norm_scale)
        lora = build_lora_config(args.kind, r=args.rank, alpha=alpha, dropout=0.0)
        if args.train_norm:
            lora.modules_to_save = ["language_model.norm"]
        settings = SFTSettings(
            max_steps=args.steps, learning_rate=args.lr, per_device_train_batch_size=args.batch,
            max_length=args.max_length, lr_scheduler_type=args.scheduler, warmup_ratio=args.warmup_ratio,
            logging_steps=max(1, args.steps // 10), seed=args.seed,
            extra={"disable_tqdm": True},
        )
        log = LossLog()
        t0 = time.perf_counter()
        run_sft(model, processor, records, templates, settings, Path(tmp) / "sft", peft_config=lora, callbacks=[log])
        warm_s = time.perf_counter() - t0
        summary: dict = {
            "recipe": {
                "kind": args.kind, "hidden_size": args.hidden_size, "num_layers": args.num_layers,
                "steps": args.steps, "lr": args.lr, "scheduler": args.scheduler, "rank": args.rank, "alpha": alpha,
                "train_norm": args.train_norm, "norm_scale": args.norm_scale, "batch": args.batch, "max_length": args.max_length,
                "records": len(records),
            },
            "warm_start_seconds": round(warm_s, 1),
            "loss_first": log.losses[0] if log.losses else None,
            "loss_last": log.losses[-1] if log.losses else None,
            "losses": [round(x, 3) for x in log.losses],
        }
        modes = [m.strip() for m in args.eval.split(",") if m.strip()]
        for mode in modes:
            sample = mode == "sample"
            t0 = time.perf_counter()
            completions = generate(
                model, processor, records, templates, do_sample=sample, n=args.group if sample else 1,
                temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
                seed=args.seed,
            )
            key = f"sample_t{args.temperature:g}" if sample else "greedy"
            summary[key] = score(records, completions)
            summary[key]["seconds"] = round(time.perf_counter() - t0, 1)
            for text in [g[0] for g in completions[: args.show]]:
                print(f"--- {key}: {text[:300]!r}")
    print(json.dumps(summary, indent=1))
    if args.out:
        from cpr.io import atomic_write_json

        atomic_write_json(args.out, summary, indent=1)


if __name__ == "__main__":
    main()
