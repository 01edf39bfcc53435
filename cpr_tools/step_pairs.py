"""Prediction / reference step pairs built from the real samples in data/samples.

Used by tests/test_matching_parity.py, tests/test_guard.py and benchmarks/match_f1_throughput.py.
References are real dataset text:

* MATH-V ``solution`` split into sentences with pysbd (``[asy]...[/asy]`` figure code removed:
  it is drawing code, not reasoning);
* TabMWP ``solution`` split on blank lines;
* CRYSTAL gallery ``reference_steps`` as given.

Pairs cycle through the references (gallery, TabMWP, MATH-V order) when more are asked for,
each round with new perturbations.

Predictions are made deterministically (seeded ``random.Random``) from the references by
dropping, reordering, duplicating and swapping in steps of other samples. With
``reword=True`` every predicted step is then rewritten into a new string (numbers changed,
words dropped, swapped or taken from other samples, a lead-in added), as a policy's
completions are: no predicted step is a copy of any reference step, so a scorer cannot
save work by recognising strings it has already encoded.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

_ASY = re.compile(r"\[asy\].*?\[/asy\]", flags=re.S)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LEAD_INS = ("So", "Then", "Next,", "Now", "First,", "We see that", "This means", "Here", "Thus", "Clearly,")


def load_references(
    samples_dir: str | Path, *, every: int = 1, max_steps: int | None = None
) -> list[tuple[str, list[str]]]:
    """``(sample id, reference steps)`` of the CRYSTAL gallery, TabMWP and MATH-V records, in that order.

    Args:
        samples_dir: the ``data/samples`` folder.
        every: keep every ``every``-th MATH-V and TabMWP record (1: all 220 references).
        max_steps: keep at most this many steps of each reference (``None``: all).
    """
    import pysbd

    root = Path(samples_dir)
    seg = pysbd.Segmenter(language="en", clean=False)
    refs: list[tuple[str, list[str]]] = []
    with open(root / "crystal_gallery" / "gallery.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            refs.append((f"crystal-{rec['id']}", list(rec["reference_steps"])))
    tab = json.loads((root / "tabmwp" / "problems_test1k_subset.json").read_text(encoding="utf-8"))
    for pid, rec in list(tab.items())[::every]:
        steps = [s.strip() for s in rec["solution"].split("\n\n") if s.strip()]
        refs.append((f"tabmwp-{pid}", steps))
    with open(root / "mathvision" / "test_subset.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for rec in records[::every]:
        steps = [s.strip() for s in seg.segment(_ASY.sub(" ", rec["solution"])) if s.strip()]
        refs.append((f"mathvision-{rec['id']}", steps))
    refs = [(sid, steps[:max_steps]) for sid, steps in refs]
    return [r for r in refs if r[1]]


def perturb(ref: list[str], others: list[list[str]], rng: random.Random) -> list[str]:
    """A prediction made from ``ref`` by dropping, reordering, duplicating and swapping in steps."""
    kind = rng.randrange(10)
    if kind == 0:
        return list(ref)  # identical
    if kind == 1:
        return []  # no steps
    if kind == 2:
        return list(reversed(ref))
    if kind == 3:  # all foreign
        donor = rng.choice(others)
        return rng.sample(donor, k=min(len(donor), rng.randint(1, 6)))
    pred = [s for s in ref if rng.random() > 0.3] or [rng.choice(ref)]  # drop
    if rng.random() < 0.5 and len(pred) > 1:  # swap two steps
        i, j = rng.sample(range(len(pred)), 2)
        pred[i], pred[j] = pred[j], pred[i]
    if rng.random() < 0.3:  # shuffle everything
        rng.shuffle(pred)
    if rng.random() < 0.4:  # duplicate a step (exact duplicate -> exact similarity ties)
        pred.insert(rng.randrange(len(pred) + 1), rng.choice(pred))
    for _ in range(rng.randint(0, 3)):  # swap in steps of other samples
        donor = rng.choice(others)
        step = rng.choice(donor)
        if pred and rng.random() < 0.5:
            pred[rng.randrange(len(pred))] = step
        else:
            pred.insert(rng.randrange(len(pred) + 1), step)
    return pred


def reword(step: str, words: list[str], rng: random.Random) -> str:
    """A new string made from ``step``: numbers changed, words dropped / swapped / replaced, a lead-in.

    ``words`` is a pool of words from the whole data set to draw replacements from.
    """
    out = _NUMBER.sub(lambda m: str(rng.randint(0, 999)) if rng.random() < 0.5 else m.group(0), step)
    tokens = out.split() or [rng.choice(words)]
    for _ in range(rng.randint(1, 3)):
        edit = rng.randrange(3)
        i = rng.randrange(len(tokens))
        if edit == 0 and len(tokens) > 3:
            del tokens[i]
        elif edit == 1 and len(tokens) > 1:
            j = min(i + 1, len(tokens) - 1)
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens[i] = rng.choice(words)
    if rng.random() < 0.5:
        tokens.insert(0, rng.choice(_LEAD_INS))
    return " ".join(tokens)


def build_pairs(
    samples_dir: str | Path,
    n: int | None = None,
    seed: int = 0,
    *,
    every: int = 1,
    max_steps: int | None = None,
    reword: bool = False,
) -> list[tuple[str, list[str], list[str]]]:
    """``(id, predicted steps, reference steps)``; cycles through the references to reach ``n``.

    Default ``n``: one pair per reference. ``every`` and ``max_steps``: see :func:`load_references`.
    ``reword``: rewrite every predicted step into a string that is no reference step (:func:`reword`).
    """
    refs = load_references(samples_dir, every=every, max_steps=max_steps)
    n = len(refs) if n is None else n
    rng = random.Random(seed)
    all_steps = [steps for _, steps in refs]
    known = {step for steps in all_steps for step in steps}
    words = sorted({w for step in known for w in step.split()})
    pairs = []
    for k in range(n):
        sid, ref = refs[k % len(refs)]
        others = all_steps[: k % len(refs)] + all_steps[k % len(refs) + 1 :]
        suffix = "" if k < len(refs) else f"#{k // len(refs)}"
        pred = perturb(ref, others, rng)
        if reword:
            pred = [_new_string(step, words, known, rng) for step in pred]
        pairs.append((sid + suffix, pred, list(ref)))
    return pairs


def _new_string(step: str, words: list[str], known: set[str], rng: random.Random) -> str:
    out = reword(step, words, rng)
    while out in known:
        out = f"{rng.choice(_LEAD_INS)} {out}"
    return out
