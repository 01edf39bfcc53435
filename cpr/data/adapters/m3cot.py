"""M3CoT (LightChen2333/M3CoT): from a ``save_to_disk`` folder, the hub, or JSON lines of the same
columns (``<split>.jsonl``); reference steps are the sentences of ``rationale`` (docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import Adapter, RawRow, existing_path, jsonl_rows, parse_options, pick_file
from cpr.data.adapters.hf import hf_rows, is_saved_dataset, looks_like_hub_name
from cpr.data.records import Record
from cpr.data.text import split_sentences

_META_KEYS = ("domain", "topic", "category", "image_id", "split", "rationale")


class M3CoTAdapter(Adapter):
    """Reads M3CoT from a saved dataset, the hub, or JSON lines."""

    name = "m3cot"
    loads_hub_datasets = True

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        if looks_like_hub_name(str(path)) or is_saved_dataset(Path(path).expanduser()):
            yield from hf_rows(path, split, self.name, alternatives="a JSON-lines export")
            return
        p = existing_path(path, self.name)
        if p.is_dir():
            names = [f"{split}.jsonl", *(["dev.jsonl"] if split == "validation" else [])] if split else ["*.jsonl"]
            p = pick_file(p, names, self.name)
        yield from jsonl_rows(p, split=split)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        base = row.base_dir or Path.cwd()
        meta = {k: data[k] for k in _META_KEYS if k in data}
        if context := row.text("context", required=False):
            meta["context"] = context
        image_key = "image_path" if data.get("image") is None and "image_path" in data else "image"
        return Record(id=row.text("id"), images=row.images(image_key, [base, base.parent]),
                      question=row.text("question").strip(), options=parse_options(row.require("choices"), row, "choices"),
                      answer=row.text("answer", required=False), reference_steps=split_sentences(row.text("rationale")),
                      source=self.name, meta=meta)
