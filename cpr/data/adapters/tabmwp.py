"""TabMWP (lupantech/PromptPG): ``problems_<split>.json``, an object ``pid -> problem``.

Fields: ``question``, ``choices`` (list, or ``null`` for free-text questions), ``answer`` (the
answer *text*), ``unit``, ``table_title``, ``table``, ``solution`` (worked steps separated by
blank lines), ``ques_type``, ``ans_type``, ``grade`` (1-8), ``split``. The table image of
``pid`` is ``tables/<pid>.png`` next to the JSON file (the source's convention; no image field).

Reference steps are the blank-line separated blocks of ``solution``. For multiple choice the
answer text is mapped to its option letter (the text is kept as ``meta["answer_text"]``).
``grade`` is the difficulty field; ``unit`` and the table fields are kept in ``meta``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import (
    Adapter,
    RawRow,
    existing_path,
    json_object,
    parse_options,
    pick_file,
)
from cpr.data.records import OPTION_LETTERS, Record
from cpr.data.text import split_blank_lines
from cpr.data.validation import ANSWER_NOT_OPTION

_META_KEYS = (
    "grade",
    "unit",
    "table_title",
    "table",
    "ques_type",
    "ans_type",
    "split",
    "row_num",
    "column_num",
)


class TabMWPAdapter(Adapter):
    """Reads a TabMWP problems file (or a folder holding ``problems_<split>.json``)."""

    name = "tabmwp"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            names = [f"problems_{split}.json", f"problems_{split}_subset.json"] if split else []
            p = pick_file(p, [*names, "problems_*.json"], self.name)
        problems = json_object(p)
        for i, (pid, prob) in enumerate(problems.items()):
            if split is not None and isinstance(prob, dict) and prob.get("split") != split:
                continue
            yield RawRow(data=prob, path=p, record_id=str(pid), base_dir=p.parent, index=i)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        pid = str(row.record_id)
        answer_text = row.optional_str("answer")
        options = parse_options(data.get("choices"), row, "choices")
        answer = answer_text
        if options and answer_text:
            hits = [i for i, c in enumerate(options) if c == answer_text]
            if len(hits) != 1:
                raise row.error(
                    f"answer {answer_text!r} is not exactly one of the choices {options}",
                    reason=ANSWER_NOT_OPTION,
                    field="answer",
                )
            answer = OPTION_LETTERS[hits[0]]
        solution = row.require_str("solution")
        meta = {k: data[k] for k in _META_KEYS if k in data}
        meta["answer_text"] = answer_text
        meta["solution"] = solution
        return Record(
            id=pid,
            images=[row.base_dir / "tables" / f"{pid}.png"]
            if row.base_dir
            else [Path("tables") / f"{pid}.png"],
            question=row.require_str("question").strip(),
            options=options,
            answer=answer,
            reference_steps=split_blank_lines(solution),
            source=self.name,
            meta=meta,
        )
