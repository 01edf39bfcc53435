"""VLRMBench (JCruan519/VLRMBench): ``benchmark_data/<task>.jsonl``, images in ``meta_data/Image/``.

Fields of the step-error tasks (e.g. ``location_error``): ``id``, ``image`` (list of paths
relative to ``meta_data/Image/``), ``question`` (with ``<image1>`` and, on its last line, the
options as a Python list literal, ``[]`` when free-form), ``step_list`` (a model's reasoning
steps, each prefixed ``STEPn:``), ``reasoning_error`` (the steps joined, with errors injected),
``task_gt`` (per-step 0/1 labels, 1 = step altered by an injected error), ``category`` (task).

Reference steps are ``step_list`` without the ``STEPn:`` prefixes (one step per entry, not
re-split, so they stay aligned with ``task_gt``). ``task_gt``, ``category`` (also as
``meta["task"]``), ``reasoning_error`` and its steps (``meta["reasoning_error_steps"]``) are kept
for the step-error scorers. **VLRMBench has no answer field**: its records carry ``answer=""``,
which validation accepts for this source only. Images resolve against ``meta_data/Image`` next to
``benchmark_data`` (option ``image_root`` overrides).
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
    """Split VLRMBench's "question text\\n['opt', ...]" into the text and the option list.

    A last line that is not a list literal leaves the question unchanged with no options.
    """
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


def split_marked_steps(text: str) -> list[str]:
    """Split text at ``STEPn:`` markers (``reasoning_error``) into stripped steps."""
    parts = _STEP_MARK_RE.split(text)
    return [p.strip() for p in parts[1:]] if len(parts) > 1 else [text.strip()]


class VLRMBenchAdapter(Adapter):
    """Reads VLRMBench task files (a ``.jsonl``, or the repository root / ``benchmark_data``).

    Options:
        image_root: folder the ``image`` paths are relative to (default: ``meta_data/Image``
            beside the ``benchmark_data`` folder that holds the file).
    """

    name = "vlrmbench"
    allows_empty_answer = True
    option_names = ("image_root",)

    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        p = existing_path(path, self.name)
        reject_split(split, p, self.name)
        files = [p]
        if p.is_dir():
            folder = p / "benchmark_data" if (p / "benchmark_data").is_dir() else p
            files = sorted(folder.glob("*.jsonl"))
            if not files:
                raise InputError(f"{self.name}: no .jsonl task files here", path=folder)
        for f in files:
            root = (
                Path(self.options["image_root"])
                if "image_root" in self.options
                else (f.parent.parent / "meta_data" / "Image")
            )
            yield from jsonl_rows(f, base_dir=root)

    def convert(self, row: RawRow) -> Record:
        data = row.data
        steps_raw = row.require("step_list")
        if not isinstance(steps_raw, list):
            raise row.error("expected a list of steps", reason=BAD_VALUE, field="step_list")
        question_raw = row.require_str("question")
        text, options = split_question_options(question_raw)
        meta = {
            "task": data.get("category"),
            "category": data.get("category"),
            "task_gt": data.get("task_gt"),
            "question_raw": question_raw,
        }
        if isinstance(data.get("reasoning_error"), str):
            meta["reasoning_error"] = data["reasoning_error"]
            meta["reasoning_error_steps"] = split_marked_steps(data["reasoning_error"])
        return Record(
            id=row.require_str("id"),
            images=row.require_images("image"),
            question=remove_image_placeholders(text),
            options=options,
            answer="",
            reference_steps=[strip_step_prefix(s) if isinstance(s, str) else s for s in steps_raw],
            source=self.name,
            meta=meta,
        )
