"""MATH-Vision (mathllm/MATH-V): ``test.jsonl`` / ``testmini.jsonl``, one problem a line.

Fields: ``id``, ``question`` (with an ``<image1>`` placeholder), ``options`` (``[]`` when
free-form), ``answer`` (a letter A-E for multiple choice, else a value), ``solution`` (prose with
LaTeX), ``level`` (1-5), ``subject``, ``image`` (``images/<id>.jpg``, relative to the file's
folder or, in the original repository, to its parent).

Reference steps are the sentences of ``solution`` (:func:`cpr.data.text.split_sentences`):
literal ``\\n`` escapes are turned into newlines, ``[asy]...[/asy]`` drawing code is dropped
(it draws the figure, it is not reasoning), only "Solution 1" is kept when several are given,
and display-math blocks stay whole inside their sentence. The placeholder is removed from the
question (the image goes in the prompt's image slot). ``level`` is the difficulty field.
"""

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
from cpr.data.text import (
    drop_asy_blocks,
    first_solution,
    remove_image_placeholders,
    split_sentences,
    unescape_literal_newlines,
)


def solution_steps(solution: str) -> list[str]:
    """MATH-Vision ``solution`` prose -> reference steps (see the module docstring)."""
    text = unescape_literal_newlines(solution)
    text = drop_asy_blocks(text)
    text = first_solution(text.strip())
    return split_sentences(text)


class MathVisionAdapter(Adapter):
    """Reads MATH-Vision JSON lines (a file, or a folder holding ``<split>.jsonl``)."""

    name = "mathvision"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            names = (
                [f"{split}.jsonl", f"data/{split}.jsonl", f"{split}_subset.jsonl"]
                if split
                else ["test.jsonl", "data/test.jsonl", "test_subset.jsonl", "*.jsonl"]
            )
            p = pick_file(p, names, self.name)
        else:
            reject_split(split, p, self.name)
        yield from jsonl_rows(p)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        rid = row.require_str("id")
        base = row.base_dir or Path.cwd()
        images = row.require_images("image", [base, base.parent])
        options = parse_options(data.get("options"), row, "options")
        meta = {k: data[k] for k in ("level", "subject", "solution", "image") if k in data}
        return Record(
            id=rid,
            images=images,
            question=remove_image_placeholders(row.require_str("question")),
            options=options,
            answer=row.optional_str("answer"),
            reference_steps=solution_steps(row.require_str("solution")),
            source=self.name,
            meta=meta,
        )
