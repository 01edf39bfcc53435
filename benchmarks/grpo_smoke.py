"""GRPO smoke benchmark: a few GRPOTrainer steps with LoRA on a tiny model, on CPU.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/grpo_smoke.py --kind qwen2_5_vl --steps 3
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/grpo_smoke.py --kind internvl --steps 3

Prints the time to build the tiny model (first use) and to load it, the parameter counts,
and the wall time of each training step (``step_time``).  The dataset is 4 conversational
prompts with one image each (MATH-Vision images of ``data/samples``; generated PIL images
when more than its 100 are asked for); the reward is the number of distinct characters / 100.

``--threads`` (default 1) sets torch's CPU threads: on a shared 2-core machine, 2 threads made
steps 10-100x slower and erratic (0.1 s -> 2-20 s) through OpenMP oversubscription.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def distinct_chars_reward(completions, **kwargs):
    """Reward = number of distinct characters of the completion text / 100."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(set(t)) / 100 for t in texts]


def make_dataset(n: int = 4):
    from datasets import Dataset
    from PIL import Image

    folder = Path(__file__).resolve().parents[1] / "data" / "samples" / "mathvision" / "images"
    files = sorted(folder.glob("*.jpg"))[:n]
    if len(files) == n:
        images = [Image.open(f).convert("RGB") for f in files]
    else:
        images = [Image.new("RGB", (64 + 16 * i, 48), (40 * i, 100, 200)) for i in range(n)]
    questions = ["How many squares are there?", "What is the area?", "Which option is correct?", "Find x."]
    prompt = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": questions[i % 4]}]}]
        for i in range(n)
    ]
    return Dataset.from_dict({"prompt": prompt, "images": [[im] for im in images]})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", default="qwen2_5_vl", choices=["qwen2_5_vl", "internvl"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is steadiest on a shared machine)"
    )
    args = parser.parse_args()

    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from tiny_models import ensure_tiny_model

    from cpr.models import build_lora_config, load_model_and_processor

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = ensure_tiny_model(args.kind, Path(tmp) / "cache")
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model, processor = load_model_and_processor(folder, device="cpu")
        load_s = time.perf_counter() - t0
        n_params = sum(p.numel() for p in model.parameters())

        class Timer(TrainerCallback):
            def __init__(self):
                self.times: list[float] = []

            def on_step_begin(self, *a, **k):
                self._t = time.perf_counter()

            def on_step_end(self, *a, **k):
                self.times.append(time.perf_counter() - self._t)

        timer = Timer()
        config = GRPOConfig(
            output_dir=str(Path(tmp) / "out"),
            max_steps=args.steps,
            per_device_train_batch_size=args.num_generations,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            learning_rate=1e-3,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            gradient_checkpointing=not args.no_gradient_checkpointing,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=distinct_chars_reward,
            args=config,
            train_dataset=make_dataset(),
            processing_class=processor,
            peft_config=build_lora_config(args.kind, r=8, alpha=16, dropout=0.0),
            callbacks=[timer],
        )
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        trainer.train()
        print(
            f"kind={args.kind} build_s={build_s:.2f} load_s={load_s:.2f} params={n_params} lora_params={trainable}"
        )
        print("step_time_s=" + ", ".join(f"{t:.2f}" for t in timer.times))
        for rec in trainer.state.log_history:
            if "reward" in rec:
                print({k: round(v, 4) for k, v in rec.items() if isinstance(v, float)})


if __name__ == "__main__":
    main()
