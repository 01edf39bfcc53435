"""M3CoT (LightChen2333/M3CoT): multi-domain multiple-choice questions with a rationale.

Schema of the Hugging Face dataset (splits train / validation / test): ``id``, ``category``,
``image_id``, ``question``, ``choices`` (list), ``context``, ``answer`` (a letter),
``rationale``, ``split``, ``image`` (an image feature), ``domain`` (science, commonsense,
mathematics), ``topic``. Read from a ``save_to_disk`` folder, the hub name (offline machines get
an error saying how to give a local copy), or JSON lines in the same schema, such as the
repository's ``<split>.jsonl`` export, with ``image`` (or ``image_path``) a path relative to the
file's folder.

Reference steps are the sentences of ``rationale``; ``context`` becomes ``meta["context"]``.
There is no difficulty field: buckets come from the number of steps.
"""

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
        text = str(path)
        p = Path(text).expanduser()
        if looks_like_hub_name(text) or is_saved_dataset(p):
            yield from hf_rows(text, split, self.name, alternatives="a JSON-lines export")
            return
        p = existing_path(p, self.name)
        if p.is_dir():
            names = (
                [f"{split}.jsonl"] + (["dev.jsonl"] if split == "validation" else [])
                if split
                else ["*.jsonl"]
            )
            p = pick_file(p, names, self.name)
        for row in jsonl_rows(p):
            if split is not None and row.data.get("split") not in (None, split):
                continue
            yield row

    def convert(self, row: RawRow) -> Record:
        data = row.data
        key = "image_path" if data.get("image") is None and "image_path" in data else "image"
        base = row.base_dir or Path.cwd()
        images = row.require_images(key, [base, base.parent])
        meta = {k: data[k] for k in _META_KEYS if k in data}
        context = row.optional_str("context")
        if context:
            meta["context"] = context
        return Record(
            id=row.require_str("id"),
            images=images,
            question=row.require_str("question").strip(),
            options=parse_options(row.require("choices"), row, "choices"),
            answer=row.optional_str("answer"),
            reference_steps=split_sentences(row.require_str("rationale")),
            source=self.name,
            meta=meta,
        )
