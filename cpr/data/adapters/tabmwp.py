"""TabMWP (lupantech/PromptPG): ``problems_<split>.json``, an object ``pid -> problem``, with the table
image of ``pid`` at ``tables/<pid>.png``; reference steps are the blank-line separated blocks of
``solution``, a multiple-choice answer text becomes its letter (fields: docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import Adapter, RawRow, existing_path, parse_options, pick_file, problem_rows
from cpr.data.records import OPTION_LETTERS, Record
from cpr.data.text import split_blank_lines
from cpr.data.validation import ANSWER_NOT_OPTION

_META_KEYS = ("grade", "unit", "table_title", "table", "ques_type", "ans_type", "split", "row_num", "column_num")


class TabMWPAdapter(Adapter):
    """Reads a TabMWP problems file (or a folder holding ``problems_<split>.json``)."""

    name = "tabmwp"

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        if p.is_dir():
            names = [f"problems_{split}.json", f"problems_{split}_subset.json"] if split else []
            p = pick_file(p, [*names, "problems_*.json"], self.name)
        yield from problem_rows(p, split)

    def convert(self, row: RawRow) -> Record:
        pid, answer_text = str(row.record_id), row.text("answer", required=False)
        options = parse_options(row.data.get("choices"), row, "choices")
        answer = answer_text
        if options and answer_text:
            if len(hits := [i for i, c in enumerate(options) if c == answer_text]) != 1:
                message = f"answer {answer_text!r} is not exactly one of the choices {options}"
                raise row.error(message, reason=ANSWER_NOT_OPTION, field="answer")
            answer = OPTION_LETTERS[hits[0]]
        solution = row.text("solution")
        meta = {k: row.data[k] for k in _META_KEYS if k in row.data} | {"answer_text": answer_text, "solution": solution}
        return Record(id=pid, images=[(row.base_dir or Path()) / "tables" / f"{pid}.png"],
                      question=row.text("question").strip(), options=options, answer=answer,
                      reference_steps=split_blank_lines(solution), source=self.name, meta=meta)
