"""A generated visual-reasoning task a tiny model can learn on a CPU: counting colours on a 3 x 3 grid
(docs/data.md section 7). Item ``i`` of ``(seed, split)`` is drawn from a ``random.Random`` seeded by a
SHA-256 of ``"{seed}/{split}/{i}"``; a grid belongs to the split a SHA-256 of its cells picks (8 in 10
train, 1 validation, 1 test).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from PIL import Image, ImageDraw

from cpr.data.records import OPTION_LETTERS, Record
from cpr.errors import ConfigError

__all__ = ["CELL_PX", "COLOURS", "GRID", "KINDS", "SPLITS", "generate", "grid_split", "make_item", "render"]

#: Side of one cell in pixels: one merged image token of Qwen2.5-VL (patch 14 x merge 2).
CELL_PX = 28
#: Cells per side.
GRID = 3
#: The colours, in option order, as RGB.
COLOURS: dict[str, tuple[int, int, int]] = {"red": (230, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 230)}
#: Question kinds in bucket order (easy, medium, hard).
KINDS = ("count", "sum", "most")
#: Split -> the SHA-256 residues (mod 10) of the grids it owns.
SPLITS: dict[str, range] = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}
_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_COUNT_OPTIONS = (2, 3, 4)
_SUM_OPTIONS = (4, 5, 6)


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def grid_split(cells: tuple[str, ...]) -> str:
    """The split owning a grid (a tuple of ``GRID * GRID`` colour names, row by row)."""
    residue = hashlib.sha256(",".join(cells).encode()).digest()[0] % 10
    return next(name for name, owned in SPLITS.items() if residue in owned)


def render(cells: tuple[str, ...]) -> Image.Image:
    """The RGB image of a grid: ``GRID * CELL_PX`` px square, one solid rectangle per cell."""
    side = GRID * CELL_PX
    image = Image.new("RGB", (side, side))
    draw = ImageDraw.Draw(image)
    for k, colour in enumerate(cells):
        y, x = divmod(k, GRID)
        box = (x * CELL_PX, y * CELL_PX, (x + 1) * CELL_PX - 1, (y + 1) * CELL_PX - 1)
        draw.rectangle(box, fill=COLOURS[colour])
    return image


def _cells_fact(n: int, what: str) -> str:
    return f"{_WORDS[n].capitalize()} {what} {'cell' if n == 1 else 'cells'}."


def _counts(rng: random.Random, kind: str, colours: list[str], target: int) -> dict[str, int]:
    """Colour counts (summing to GRID * GRID) for which option ``target`` is the answer."""
    n = GRID * GRID
    a, b, c = colours
    if kind == "count":  # how many cells are a?  the others split the rest at random
        k = _COUNT_OPTIONS[target]
        nb = sum(rng.random() < 0.5 for _ in range(n - k))
        return {a: k, b: nb, c: n - k - nb}
    if kind == "sum":  # how many cells are a or b?
        s = _SUM_OPTIONS[target]
        na = sum(rng.random() < 0.5 for _ in range(s))
        return {a: na, b: s - na, c: n - s}
    triples = [(x, y, n - x - y) for x in range(n + 1) for y in range(n + 1 - x)]  # which colour has the most?
    choices = [t for t in triples if t[target] > max(v for i, v in enumerate(t) if i != target)]
    return dict(zip(COLOURS, rng.choice(choices), strict=True))


def make_item(seed: int, split: str, index: int) -> Record:
    """Item ``index`` of the ``(seed, split)`` sequence (module docstring); the question kind is
    ``KINDS[index % 3]``, so any run of three consecutive items holds one of each. Raises ``ConfigError``
    for an unknown split."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", field="split")
    kind = KINDS[index % len(KINDS)]
    rng = _rng("cpr-synthetic", seed, split, index)
    names = list(COLOURS)
    targets = list(range(3))  # each block of 9 items holds every (kind, correct letter) pair once
    _rng("cpr-synthetic", seed, split, "block", index // 9, kind).shuffle(targets)
    target = targets[index // 3 % 3]
    asked = rng.sample(names, 3)  # colours named in the question (count, sum)
    while True:
        counts = _counts(rng, kind, asked, target)
        cells = tuple(rng.sample([c for c in names for _ in range(counts[c])], GRID * GRID))
        if grid_split(cells) == split:
            break
    a, b = asked[0], asked[1]
    if kind == "count":
        question, options = f"How many cells are {a}?", [_WORDS[k] for k in _COUNT_OPTIONS]
        steps = [_cells_fact(counts[a], a)]
    elif kind == "sum":
        a, b = sorted((a, b), key=names.index)
        question, options = f"How many cells are {a} or {b}?", [_WORDS[k] for k in _SUM_OPTIONS]
        steps = [_cells_fact(counts[a], a), _cells_fact(counts[b], b), _cells_fact(counts[a] + counts[b], f"{a} or {b}")]
    else:
        question, options = "Which colour has the most cells?", names
        winner = max(names, key=counts.__getitem__)
        steps = [_cells_fact(counts[c], c) for c in names] + [f"{winner.capitalize()} has the most cells."]
    return Record(id=f"grid-s{seed}-{split}-{index}", images=[render(cells)], question=question,
                  options=options, answer=OPTION_LETTERS[target], reference_steps=steps, source="synthetic",
                  meta={"kind": kind, "cells": "".join(c[0] for c in cells), "counts": counts})


def generate(size: int, *, seed: int = 0, split: str = "train") -> Iterator[Record]:
    """Items ``0 .. size - 1`` of the ``(seed, split)`` sequence (:func:`make_item`). Raises ``ConfigError``
    for ``size`` below 1 or an unknown split."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"size must be a positive integer, got {size!r}", field="size")
    for i in range(size):
        yield make_item(seed, split, i)
