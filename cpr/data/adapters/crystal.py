"""CRYSTAL (waybarrios/CRYSTAL, gated): image, question, answer, reference steps, source.

Accepted inputs, all with the dataset's own columns (``image``, ``question``, ``answer``,
``reference_steps``, ``choices`` or ``options``, ``source``, optionally ``id``):

- the hub name ``waybarrios/CRYSTAL`` (needs hub access; offline machines get an error naming
  the dataset and how to pass a local copy), or a ``save_to_disk`` folder of it;
- a parquet file (``image`` a ``{"bytes", "path"}`` struct as the hub exports it, or a path);
- a JSON-lines file, or a folder holding one (e.g. the project website's ``gallery.jsonl``),
  with ``image`` a path relative to the file's folder.

``reference_steps`` may be a list or a JSON string of a list. With options, the answer is
mapped to its letter (a letter, "B (60°)", "A) Yes" or the option text; the published answer
is kept as ``meta["answer_raw"]``); without options the answer is kept as published. Rows
without an ``id`` get ``"<split>-<index>"`` (``"row-<index>"`` when the split is unknown). The per-item ``source`` (MathVision,
ScienceQA, ...) is kept as ``meta["source"]``; difficulty comes from the number of steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    existing_path,
    jsonl_rows,
    letter_or_error,
    parse_options,
    pick_file,
    reject_split,
    strip_option_labels,
)
from cpr.data.adapters.hf import arrow_rows, hf_rows, is_saved_dataset, looks_like_hub_name
from cpr.data.records import Record
from cpr.data.validation import BAD_VALUE, EMPTY_STEPS

_KNOWN = {"id", "image", "images", "question", "answer", "reference_steps", "choices", "options"}


class CrystalAdapter(Adapter):
    """Reads CRYSTAL from the hub, a saved dataset, parquet, or JSON lines."""

    name = "crystal"
    loads_hub_datasets = True

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        text = str(path)
        p = Path(text).expanduser()
        if looks_like_hub_name(text) or is_saved_dataset(p):
            yield from hf_rows(text, split, self.name, alternatives="a parquet or JSON-lines export")
            return
        p = existing_path(p, self.name)
        if p.is_dir():
            p = pick_file(
                p,
                ["gallery.jsonl", *([f"{split}.jsonl"] if split else []), "*.jsonl", "*.parquet"],
                self.name,
            )
        if p.suffix == ".parquet":
            yield from _parquet_rows(p, split)
            return
        reject_split(split, p, self.name)
        yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        rid = row.record_id or f"{row.split or row.data.get('split') or 'row'}-{row.index}"
        row.record_id = rid
        key = "images" if data.get("image") is None and "images" in data else "image"
        images = row.require_images(key)
        raw_options = data.get("choices") if data.get("choices") is not None else data.get("options")
        options = strip_option_labels(parse_options(raw_options, row, "choices"))
        answer_raw = row.optional_str("answer")
        answer = letter_or_error(answer_raw, options, row) if options and answer_raw else answer_raw
        meta = {k: v for k, v in data.items() if k not in _KNOWN and _is_plain(v)}
        if answer != answer_raw:
            meta["answer_raw"] = answer_raw
        return Record(
            id=str(rid),
            images=images,
            question=row.require_str("question").strip(),
            options=options,
            answer=answer,
            reference_steps=_steps(row),
            source=self.name,
            meta=meta,
        )


def _steps(row: RawRow) -> list[str]:
    value = row.data.get("reference_steps")
    if value is None:
        raise row.error("reference_steps is missing", reason=EMPTY_STEPS, field="reference_steps")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise row.error(
                "expected a list of steps (or a JSON list)", reason=BAD_VALUE, field="reference_steps"
            ) from None
    if not isinstance(value, (list, tuple)):
        raise row.error(
            f"expected a list of steps, got {type(value).__name__}", reason=BAD_VALUE, field="reference_steps"
        )
    return [s.strip() if isinstance(s, str) else s for s in value]


def _is_plain(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (str, int, float, bool))
        or (isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value))
    )


def _parquet_rows(path: Path, split: str | None) -> Iterator[RawRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # memory-mapped and not pre-buffered: only the batch being read is held in memory
    batches = pq.ParquetFile(path, memory_map=True, pre_buffer=False).iter_batches(batch_size=32)
    for row in arrow_rows(batches, path, base_dir=path.parent):
        if split is None or row.data.get("split") in (None, split):
            yield row
    pa.default_memory_pool().release_unused()  # the decoded pages, kept by Arrow's allocator otherwise
