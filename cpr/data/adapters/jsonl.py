"""Generic JSON lines in the record schema, one record per line (fields: docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import Adapter, RawRow, existing_path, jsonl_rows, parse_options, reject_split
from cpr.data.records import Record
from cpr.data.validation import BAD_VALUE
from cpr.errors import InputError

_KNOWN = {"id", "image", "images", "question", "options", "answer", "reference_steps", "difficulty", "source", "meta",
          "context"}


class JsonlAdapter(Adapter):
    """Reads a JSON-lines file in the record schema; other keys are kept in ``meta``."""

    name = "jsonl"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            raise InputError(f"{self.name}: expected a .jsonl file, got a folder", path=p)
        reject_split(split, p, self.name)
        yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        if not isinstance(meta := data.get("meta") or {}, dict):
            raise row.error("expected an object", reason=BAD_VALUE, field="meta")
        meta = {**{k: v for k, v in data.items() if k not in _KNOWN}, **meta}
        if context := row.text("context", required=False):
            meta["context"] = context
        if not isinstance(steps := row.require("reference_steps"), list):
            raise row.error(f"expected a list, got {type(steps).__name__}", reason=BAD_VALUE, field="reference_steps")
        difficulty = data.get("difficulty")
        return Record(id=row.text("id"), images=row.images("images" if "images" in data else "image"),
                      question=row.text("question").strip(), options=parse_options(data.get("options"), row, "options"),
                      answer=row.text("answer", required=False), reference_steps=steps,
                      difficulty=None if difficulty is None else str(difficulty),
                      source=row.text("source", required=False) or self.name, meta=meta)
