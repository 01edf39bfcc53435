"""CRYSTAL (waybarrios/CRYSTAL, gated): from the hub, a ``save_to_disk`` folder, a parquet file, or
JSON lines such as the project website's ``gallery.jsonl`` (columns and mapping: docs/data.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    answer_to_letter,
    existing_path,
    jsonl_rows,
    parse_options,
    pick_file,
    reject_split,
    strip_option_labels,
)
from cpr.data.adapters.hf import arrow_rows, hf_rows, is_saved_dataset, looks_like_hub_name
from cpr.data.records import OPTION_LETTERS, Record
from cpr.data.validation import ANSWER_NOT_OPTION, BAD_VALUE, EMPTY_STEPS

_KNOWN = {"id", "image", "images", "question", "answer", "reference_steps", "choices", "options"}


class CrystalAdapter(Adapter):
    """Reads CRYSTAL from the hub, a saved dataset, parquet, or JSON lines."""

    name = "crystal"
    loads_hub_datasets = True

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        if looks_like_hub_name(str(path)) or is_saved_dataset(Path(path).expanduser()):
            yield from hf_rows(path, split, self.name, alternatives="a parquet or JSON-lines export")
            return
        p = existing_path(path, self.name)
        if p.is_dir():
            p = pick_file(p, ["gallery.jsonl", *([f"{split}.jsonl"] if split else []), "*.jsonl", "*.parquet"], self.name)
        if p.suffix == ".parquet":
            yield from _parquet_rows(p, split)
        else:
            reject_split(split, p, self.name)
            yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        row.record_id = row.record_id or f"{row.split or data.get('split') or 'row'}-{row.index}"
        choices = data.get("choices") if data.get("choices") is not None else data.get("options")
        options = strip_option_labels(parse_options(choices, row, "choices"))
        answer_raw = row.text("answer", required=False)
        answer = answer_to_letter(answer_raw, options) if options and answer_raw else answer_raw
        if answer is None:
            letters = ", ".join(OPTION_LETTERS[: len(options)])
            message = f"answer {answer_raw!r} matches none of the options ({letters})"
            raise row.error(message, reason=ANSWER_NOT_OPTION, field="answer")
        meta = {k: v for k, v in data.items() if k not in _KNOWN and _plain(v)}
        if answer != answer_raw:
            meta["answer_raw"] = answer_raw
        image_key = "images" if data.get("image") is None and "images" in data else "image"
        return Record(id=row.record_id, images=row.images(image_key), question=row.text("question").strip(),
                      options=options, answer=answer, reference_steps=_steps(row), source=self.name, meta=meta)


def _plain(value: Any) -> bool:
    """A value worth keeping in ``meta``: ``None``, a scalar, or a list of scalars."""
    scalars = (str, int, float, bool)
    return value is None or isinstance(value, scalars) or isinstance(value, (list, tuple)) and all(
        isinstance(v, scalars) for v in value)


def _steps(row: RawRow) -> list[Any]:
    """``reference_steps``: a list, or a JSON string of one."""
    value = row.data.get("reference_steps")
    if value is None:
        raise row.error("reference_steps is missing", reason=EMPTY_STEPS, field="reference_steps")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise row.error("expected a list of steps (or a JSON list)", reason=BAD_VALUE, field="reference_steps") from None
    if not isinstance(value, (list, tuple)):
        raise row.error(f"expected a list of steps, got {type(value).__name__}", reason=BAD_VALUE, field="reference_steps")
    return [s.strip() if isinstance(s, str) else s for s in value]


def _parquet_rows(path: Path, split: str | None) -> Iterator[RawRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # memory-mapped and not pre-buffered: only the batch being read is held in memory
    batches = pq.ParquetFile(path, memory_map=True, pre_buffer=False).iter_batches(batch_size=32)
    for row in arrow_rows(batches, path, base_dir=path.parent):
        if split is None or row.data.get("split") in (None, split):
            yield row
    pa.default_memory_pool().release_unused()  # the decoded pages, kept by Arrow's allocator otherwise
