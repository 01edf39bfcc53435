"""``synthetic``: the generated colour-grid counting task (:mod:`cpr.data.synthetic`), no files needed.

Options: ``size`` (items to generate, default 300), ``seed`` (default 0). ``split`` picks the
images (``train``, ``validation`` or ``test``: disjoint grids; default ``train``); ``path`` is not
read. Records carry their image in memory and are bucketed by their number of reference steps
(1 easy, 3 medium, 4 hard; ``data.buckets.steps_by_source.synthetic``).

    data:
      train:      [{source: synthetic, split: train, options: {size: 600, seed: 0}}]
      validation: [{source: synthetic, split: validation, options: {size: 60}}]
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cpr.data.adapters.base import Adapter, RawRow
from cpr.data.records import Record
from cpr.data.synthetic import SPLITS, generate
from cpr.errors import ConfigError


class SyntheticAdapter(Adapter):
    """Generates colour-grid counting items (:func:`cpr.data.synthetic.generate`)."""

    name = "synthetic"
    reads_path = False
    option_names = ("size", "seed")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for key, low in (("size", 1), ("seed", 0)):
            value = options.get(key, low)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"must be an integer >= {low}, got {value!r}", field=f"options.{key}")

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        split = split or "train"
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r} for source 'synthetic'; expected one of {', '.join(SPLITS)}",
                              field="split")
        seed = self.options.get("seed", 0)
        for i, record in enumerate(generate(self.options.get("size", 300), seed=seed, split=split)):
            yield RawRow(data={"record": record}, path=f"synthetic(seed={seed}, split={split})",
                         record_id=record.id, index=i, split=split)

    def convert(self, row: RawRow) -> Record:
        return row.data["record"]
