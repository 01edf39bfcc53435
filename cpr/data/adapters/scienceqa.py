"""ScienceQA (lupantech/ScienceQA): ``data/scienceqa/problems.json``, an object ``pid -> problem``.

Fields: ``question``, ``choices``, ``answer`` (0-based index into ``choices``), ``hint`` (text
context), ``image`` (file name inside ``images/<split>/<pid>/``, or ``null``), ``task``,
``grade`` (``grade1``..``grade12``), ``subject``, ``topic``, ``category``, ``skill``,
``lecture``, ``solution`` (1-3 sentences separated by newlines), ``split``.

The answer index becomes its option letter; ``hint`` becomes ``meta["context"]`` (rendered before
the question); reference steps are the lines of ``solution`` split into sentences; ``grade`` is
the difficulty field.

**Choice (questions without an image):** about half of ScienceQA has no image. By default they
are left out (counted in the load report as "text-only question (no image)"): CRYSTAL's
ScienceQA part is the image subset (ScienceQA-IMG, 2,017 test questions) and a vision-language
policy gains nothing from them. ``options={"text_only": "keep"}`` keeps them as records with
``images=[]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    SkipRow,
    existing_path,
    json_object,
    parse_options,
    pick_file,
)
from cpr.data.records import Record, letter_for_index
from cpr.data.text import split_sentences
from cpr.data.validation import ANSWER_NOT_OPTION, MISSING_ANSWER
from cpr.errors import ConfigError

_META_KEYS = ("grade", "subject", "topic", "category", "skill", "task", "lecture", "hint", "split", "image")
TEXT_ONLY_REASON = "text-only question (no image)"


class ScienceQAAdapter(Adapter):
    """Reads ScienceQA ``problems.json`` (or the folder that holds it, or the repository root).

    Options:
        text_only: ``"skip"`` (default) or ``"keep"`` questions whose ``image`` is null.
    """

    name = "scienceqa"
    option_names = ("text_only",)

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self.text_only = options.get("text_only", "skip")
        if self.text_only not in ("skip", "keep"):
            raise ConfigError(
                f"text_only must be 'skip' or 'keep', got {self.text_only!r}", field="options.text_only"
            )

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            p = pick_file(
                p,
                [
                    "problems.json",
                    "problems_subset.json",
                    "data/scienceqa/problems.json",
                    "data/scienceqa/problems_subset.json",
                ],
                self.name,
            )
        problems = json_object(p)
        for i, (pid, prob) in enumerate(problems.items()):
            if split is not None and isinstance(prob, dict) and prob.get("split") != split:
                continue
            yield RawRow(data=prob, path=p, record_id=str(pid), base_dir=p.parent, index=i)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        pid = str(row.record_id)
        options = parse_options(row.require("choices"), row, "choices")
        index = data.get("answer")
        if index is None:
            raise row.error("answer index is missing", reason=MISSING_ANSWER, field="answer")
        if isinstance(index, bool) or not isinstance(index, int):
            raise row.error(
                f"answer must be an index into choices, got {index!r}",
                reason=ANSWER_NOT_OPTION,
                field="answer",
            )
        try:
            answer = letter_for_index(index, len(options))
        except ValueError as e:
            raise row.error(str(e), reason=ANSWER_NOT_OPTION, field="answer") from None
        image_name = data.get("image")
        if image_name:
            split_dir = row.optional_str("split") or "test"
            images = [row.base_dir / "images" / split_dir / pid / str(image_name)] if row.base_dir else []
        elif self.text_only == "skip":
            raise SkipRow(TEXT_ONLY_REASON)
        else:
            images = []
        meta = {k: data[k] for k in _META_KEYS if k in data}
        hint = row.optional_str("hint")
        if hint:
            meta["context"] = hint
        meta["solution"] = row.require_str("solution")
        return Record(
            id=pid,
            images=images,
            question=row.require_str("question").strip(),
            options=options,
            answer=answer,
            reference_steps=split_sentences(meta["solution"]),
            source=self.name,
            meta=meta,
        )
