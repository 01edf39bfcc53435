"""VLRMBench (JCruan519/VLRMBench): ``benchmark_data/<task>.jsonl``, images in ``meta_data/Image/``.

Reference steps are ``step_list`` without the ``STEPn:`` prefixes (one step per entry, aligned with
the per-step error labels ``task_gt``); ``task_gt``, the task and the error-injected steps are kept in
``meta`` for the step-error scorers. VLRMBench has no answer field: records carry ``answer=""``,
which validation accepts for this source only (fields: docs/data.md).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from cpr.data.adapters.base import Adapter, RawRow, existing_path, jsonl_rows, reject_split
from cpr.data.records import Record
from cpr.data.text import remove_image_placeholders, strip_step_prefix
from cpr.data.validation import BAD_VALUE
from cpr.errors import InputError

_STEP_MARK_RE = re.compile(r"(?:^|\n)\s*STEP\s*\d+\s*:", re.IGNORECASE)


def split_question_options(question: str) -> tuple[str, list[str]]:
    """Split VLRMBench's "question text\\n['opt', ...]" into the text and the options (a last line
    that is not a list literal leaves the question whole, with no options)."""
    head, sep, last = question.rstrip().rpartition("\n")
    last = last.strip()
    if sep and last.startswith("[") and last.endswith("]"):
        try:
            value = ast.literal_eval(last)
        except (ValueError, SyntaxError):
            return question, []
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            return head, [str(v) for v in value]
    return question, []


class VLRMBenchAdapter(Adapter):
    """Reads VLRMBench task files (a ``.jsonl``, or the repository root / ``benchmark_data``).
    Option ``image_root``: the folder ``image`` paths are relative to (default ``meta_data/Image``
    beside the ``benchmark_data`` folder holding the file)."""

    name = "vlrmbench"
    allows_empty_answer = True
    option_names = ("image_root",)

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        reject_split(split, p, self.name)
        files = [p]
        if p.is_dir():
            folder = p / "benchmark_data" if (p / "benchmark_data").is_dir() else p
            if not (files := sorted(folder.glob("*.jsonl"))):
                raise InputError(f"{self.name}: no .jsonl task files here", path=folder)
        for f in files:
            yield from jsonl_rows(f, base_dir=Path(self.options.get("image_root") or f.parent.parent / "meta_data" / "Image"))

    def convert(self, row: RawRow) -> Record:
        data = row.data
        if not isinstance(steps := row.require("step_list"), list):
            raise row.error("expected a list of steps", reason=BAD_VALUE, field="step_list")
        question = row.text("question")
        text, options = split_question_options(question)
        meta = {"task": data.get("category"), "category": data.get("category"), "task_gt": data.get("task_gt"),
                "question_raw": question}
        if isinstance(error := data.get("reasoning_error"), str):
            parts = _STEP_MARK_RE.split(error)
            meta |= {"reasoning_error": error,
                     "reasoning_error_steps": [s.strip() for s in parts[1:]] if len(parts) > 1 else [error.strip()]}
        return Record(id=row.text("id"), images=row.images("image"), question=remove_image_placeholders(text),
                      options=options, answer="", source=self.name, meta=meta,
                      reference_steps=[strip_step_prefix(s) if isinstance(s, str) else s for s in steps])
