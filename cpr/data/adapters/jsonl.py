"""Generic JSON lines in the record schema: one :class:`~cpr.data.records.Record` per line.

Fields: ``id`` (required), ``image`` (one path) or ``images`` (list of paths), relative to the
file's folder; ``question``; ``options`` (list, may be empty; letters A, B, ... in order);
``answer`` (the letter for multiple choice); ``reference_steps`` (list); optional
``difficulty`` (easy / medium / hard; computed from the bucket config when absent), ``source``
(default ``"jsonl"``; a record whose source has a bucket table is bucketed by it), ``context``
(stored as ``meta["context"]``) and ``meta`` (an object). Other keys are kept in ``meta``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import Adapter, RawRow, existing_path, jsonl_rows, parse_options, reject_split
from cpr.data.records import Record
from cpr.data.validation import BAD_VALUE
from cpr.errors import InputError

_KNOWN = {
    "id",
    "image",
    "images",
    "question",
    "options",
    "answer",
    "reference_steps",
    "difficulty",
    "source",
    "meta",
    "context",
}


class JsonlAdapter(Adapter):
    """Reads a JSON-lines file in the record schema."""

    name = "jsonl"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            raise InputError(f"{self.name}: expected a .jsonl file, got a folder", path=p)
        reject_split(split, p, self.name)
        yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise row.error("expected an object", reason=BAD_VALUE, field="meta")
        meta = {**{k: v for k, v in data.items() if k not in _KNOWN}, **meta}
        context = row.optional_str("context")
        if context:
            meta["context"] = context
        steps = row.require("reference_steps")
        if not isinstance(steps, list):
            raise row.error(
                f"expected a list, got {type(steps).__name__}", reason=BAD_VALUE, field="reference_steps"
            )
        key = "images" if "images" in data else "image"
        difficulty = data.get("difficulty")
        return Record(
            id=row.require_str("id"),
            images=row.require_images(key),
            question=row.require_str("question").strip(),
            options=parse_options(data.get("options"), row, "options"),
            answer=row.optional_str("answer"),
            reference_steps=steps,
            difficulty=str(difficulty) if difficulty is not None else None,
            source=row.optional_str("source") or self.name,
            meta=meta,
        )
