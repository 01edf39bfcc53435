"""MATH-Vision (mathllm/MATH-V): ``test.jsonl`` / ``testmini.jsonl``, one problem a line; reference
steps are the sentences of ``solution`` (:func:`solution_steps`; fields: docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    existing_path,
    jsonl_rows,
    parse_options,
    pick_file,
    reject_split,
)
from cpr.data.records import Record
from cpr.data.text import remove_image_placeholders, solution_steps


class MathVisionAdapter(Adapter):
    """Reads MATH-Vision JSON lines (a file, or a folder holding ``<split>.jsonl``)."""

    name = "mathvision"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            names = [split or "test", f"data/{split or 'test'}", f"{split or 'test'}_subset"]
            p = pick_file(p, [f"{n}.jsonl" for n in names] + ([] if split else ["*.jsonl"]), self.name)
        else:
            reject_split(split, p, self.name)
        yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        base = row.base_dir or Path.cwd()
        return Record(id=row.text("id"), images=row.images("image", [base, base.parent]),
                      question=remove_image_placeholders(row.text("question")),
                      options=parse_options(data.get("options"), row, "options"), answer=row.text("answer", required=False),
                      reference_steps=solution_steps(row.text("solution")), source=self.name,
                      meta={k: data[k] for k in ("level", "subject", "solution", "image") if k in data})
