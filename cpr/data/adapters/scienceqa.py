"""ScienceQA (lupantech/ScienceQA): ``data/scienceqa/problems.json``, an object ``pid -> problem``.

The answer index becomes its letter, ``hint`` the context, the sentences of ``solution`` the reference steps
(fields: docs/data.md). Questions without an image are left out by default (CRYSTAL uses the image subset,
ScienceQA-IMG); ``options={"text_only": "keep"}`` keeps them with ``images=[]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    SkipRow,
    existing_path,
    parse_options,
    pick_file,
    problem_rows,
)
from cpr.data.records import OPTION_LETTERS, Record
from cpr.data.text import split_sentences
from cpr.data.validation import ANSWER_NOT_OPTION, MISSING_ANSWER
from cpr.errors import ConfigError

_META_KEYS = ("grade", "subject", "topic", "category", "skill", "task", "lecture", "hint", "split", "image")


class ScienceQAAdapter(Adapter):
    """Reads ScienceQA ``problems.json`` (or the folder holding it, or the repository root).
    Option ``text_only``: ``"skip"`` (default) or ``"keep"`` questions whose ``image`` is null."""

    name = "scienceqa"
    option_names = ("text_only",)

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self.text_only = options.get("text_only", "skip")
        if self.text_only not in ("skip", "keep"):
            raise ConfigError(f"text_only must be 'skip' or 'keep', got {self.text_only!r}", field="options.text_only")

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            names = ["problems.json", "problems_subset.json", "data/scienceqa/problems.json",
                     "data/scienceqa/problems_subset.json"]
            p = pick_file(p, names, self.name)
        yield from problem_rows(p, split)

    def convert(self, row: RawRow) -> Record:
        data, pid = row.data, str(row.record_id)
        options = parse_options(row.require("choices"), row, "choices")
        index = data.get("answer")
        if index is None:
            raise row.error("answer index is missing", reason=MISSING_ANSWER, field="answer")
        if isinstance(index, bool) or not isinstance(index, int):
            raise row.error(f"answer must be an index into choices, got {index!r}", reason=ANSWER_NOT_OPTION, field="answer")
        if not 0 <= index < len(options):
            message = f"option index {index} is out of range for {len(options)} options"
            raise row.error(message, reason=ANSWER_NOT_OPTION, field="answer")
        images = []
        if data.get("image"):
            images = [row.base_dir / "images" / (row.text("split", required=False) or "test") / pid / str(data["image"])]
        elif self.text_only == "skip":
            raise SkipRow("text-only question (no image)")
        meta = {k: data[k] for k in _META_KEYS if k in data}
        if hint := row.text("hint", required=False):
            meta["context"] = hint
        meta["solution"] = row.text("solution")
        return Record(id=pid, images=images, question=row.text("question").strip(), options=options,
                      answer=OPTION_LETTERS[index], reference_steps=split_sentences(meta["solution"]), source=self.name,
                      meta=meta)
