"""What every source adapter shares: the raw row, the adapter interface, and small readers.

An adapter reads a dataset in the layout its authors publish (:meth:`Adapter.rows`) and turns
one raw row into a :class:`~cpr.data.records.Record` (:meth:`Adapter.convert`). Conversion
problems raise :class:`~cpr.data.validation.RecordError` so the loader can skip or report them;
rows an adapter leaves out on purpose (not errors) raise :class:`SkipRow`.
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from PIL import Image

from cpr.data.records import OPTION_LETTERS, ImageRef, Record
from cpr.data.validation import (
    ANSWER_NOT_OPTION,
    BAD_VALUE,
    MALFORMED_JSON,
    MISSING_FIELD,
    MISSING_IMAGE,
    RecordError,
)
from cpr.errors import ConfigError, InputError
from cpr.io import parse_jsonl_line


@dataclass
class RawRow:
    """One row as published, with where it came from.

    Attributes:
        data: the row's fields, unchanged (an embedded image of a Hugging Face dataset or a
            parquet file is its encoded ``{"bytes", "path"}`` dict: nothing is decoded).
        path: the file, dataset folder or hub name the row came from (for messages).
        line: 1-based line number for JSON-lines files, else ``None``.
        record_id: the row's id when known before conversion.
        base_dir: folder that relative image paths resolve against.
        index: 0-based position of the row in its file / dataset.
        split: the split the row belongs to, when the layout says (Hugging Face splits).
        problem: why the row could not be read (a malformed JSON line, a line that is not an
            object); ``data`` is then empty and the loader raises or skips it (``on_invalid``).
    """

    data: Mapping[str, Any]
    path: str | Path
    line: int | None = None
    record_id: str | None = None
    base_dir: Path | None = None
    index: int = 0
    split: str | None = None
    problem: RecordError | None = None

    def error(self, message: str, *, reason: str, field: str | None = None) -> RecordError:
        """A :class:`RecordError` located at this row."""
        return RecordError(
            message, reason=reason, path=self.path, line=self.line, record_id=self.record_id, field=field
        )

    def require(self, key: str) -> Any:
        """``data[key]``; a ``missing field`` error when absent or ``None``."""
        value = self.data.get(key)
        if value is None:
            raise self.error("required field is missing", reason=MISSING_FIELD, field=key)
        return value

    def require_str(self, key: str) -> str:
        """``data[key]`` as a string (numbers are converted); ``missing field`` when absent."""
        value = self.require(key)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(f"expected a string, got {type(value).__name__}", reason=BAD_VALUE, field=key)
        return str(value)

    def optional_str(self, key: str) -> str:
        """``data[key]`` as a stripped string, ``""`` when absent or ``None`` (the record's
        validation then reports e.g. a missing answer with its own reason)."""
        value = self.data.get(key)
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(f"expected a string, got {type(value).__name__}", reason=BAD_VALUE, field=key)
        return str(value).strip()

    def require_images(self, key: str, base_dirs: Sequence[Path] = ()) -> list[ImageRef]:
        """The image reference(s) in ``data[key]``; a ``missing image`` error when there is none."""
        refs = image_refs(self.data.get(key), self, key, base_dirs)
        if not refs:
            raise self.error("the record has no image", reason=MISSING_IMAGE, field=key)
        return refs


class SkipRow(Exception):
    """Raised by :meth:`Adapter.convert` for a valid row the adapter leaves out by policy
    (e.g. a text-only ScienceQA question); counted in the load report, not an error."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Adapter(ABC):
    """Reads one source's published layout.

    Subclasses set ``name`` (the registry key and ``Record.source``), may set
    ``allows_empty_answer`` (sources without an answer field), ``loads_hub_datasets`` (``path``
    may also be a Hugging Face hub dataset name, ``owner/name``), ``reads_path`` (``False`` for
    sources that generate their records: no ``path`` is needed) and ``option_names`` (the
    keyword options their constructor accepts, passed through ``load_records(options=...)``).
    """

    name: ClassVar[str]
    allows_empty_answer: ClassVar[bool] = False
    loads_hub_datasets: ClassVar[bool] = False
    reads_path: ClassVar[bool] = True
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        unknown = set(options) - set(self.option_names)
        if unknown:
            allowed = ", ".join(self.option_names) or "none"
            raise ConfigError(
                f"unknown option(s) {sorted(unknown)} for source '{self.name}' (allowed: {allowed})",
                field="options",
            )
        self.options = options

    @abstractmethod
    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        """Yield the raw rows of ``path`` (restricted to ``split`` where the layout has splits).

        Raises ``InputError`` when the path does not exist or has the wrong layout.
        """

    @abstractmethod
    def convert(self, row: RawRow) -> Record:
        """Turn a raw row into a record. Raises ``RecordError`` or ``SkipRow``."""


# ---------------------------------------------------------------------------------------------
# Readers


def existing_path(path: str | Path, source: str) -> Path:
    """``Path(path)`` if it exists; else ``InputError`` naming the path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{source}: path does not exist", path=p)
    return p


def pick_file(folder: Path, candidates: Sequence[str], source: str) -> Path:
    """The first of ``candidates`` (relative paths, globs allowed) that exists in ``folder``.

    A glob must match exactly one file. Raises ``InputError`` listing what was looked for.
    """
    for cand in candidates:
        if any(ch in cand for ch in "*?["):
            matches = sorted(folder.glob(cand))
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                names = ", ".join(m.name for m in matches)
                raise InputError(
                    f"{source}: several files match {cand!r} ({names}); pass one file", path=folder
                )
        elif (folder / cand).is_file():
            return folder / cand
    raise InputError(f"{source}: none of {list(candidates)} found in this folder", path=folder)


def jsonl_rows(path: Path, *, base_dir: Path | None = None) -> Iterator[RawRow]:
    """Rows of a JSON-lines file, one per non-blank line. A line that is not valid JSON or not a
    JSON object gives a row with :attr:`RawRow.problem` set (reason ``malformed JSON`` /
    ``bad value``), so that ``on_invalid: skip`` skips it like any invalid record."""
    with open(path, encoding="utf-8") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            row = RawRow(data={}, path=path, line=line, base_dir=base_dir or path.parent, index=line - 1)
            try:
                obj = parse_jsonl_line(raw, path, line)
            except InputError as e:
                row.problem = row.error(e.message, reason=MALFORMED_JSON)
            else:
                if isinstance(obj, Mapping):
                    row.data, row.record_id = obj, (None if obj.get("id") is None else str(obj["id"]))
                else:
                    row.problem = row.error(
                        f"expected a JSON object, got {type(obj).__name__}", reason=BAD_VALUE
                    )
            yield row


def json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object (TabMWP / ScienceQA ``pid -> record``)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg})", path=path, line=e.lineno) from None
    if not isinstance(data, dict):
        raise InputError(
            f"expected a JSON object mapping ids to records, got {type(data).__name__}", path=path
        )
    return data


def reject_split(split: str | None, path: Path, source: str) -> None:
    """Raise when ``split`` is given for a single file that has no split field."""
    if split is not None:
        raise InputError(
            f"{source}: this file has no split field, so split={split!r} cannot be applied; "
            "omit the split or pass a folder that holds one file per split",
            path=path,
            field="split",
        )


def resolve_image_path(rel: str, base_dirs: Sequence[Path]) -> Path:
    """Resolve a relative image path against ``base_dirs`` in order (first existing wins;
    if none exists, the path under the first folder, so the error names it)."""
    p = Path(rel).expanduser()
    if p.is_absolute():
        return p
    for base in base_dirs:
        if (base / p).exists():
            return base / p
    return base_dirs[0] / p


def image_refs(value: Any, row: RawRow, field: str, base_dirs: Sequence[Path] = ()) -> list[ImageRef]:
    """Image references from a cell: ``None``, a path string (resolved against ``base_dirs``,
    else ``row.base_dir``), an encoded ``{"bytes", "path"}`` dict, a PIL image, or a list of those."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [ref for item in value for ref in image_refs(item, row, field, base_dirs)]
    if isinstance(value, Image.Image):
        return [value]
    dirs = list(base_dirs) or ([row.base_dir] if row.base_dir else [Path.cwd()])
    if isinstance(value, str):
        if not value.strip():
            return []
        return [resolve_image_path(value, dirs)]
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes") is None and value.get("path"):
            return [resolve_image_path(str(value["path"]), dirs)]
        return [dict(value)]
    raise row.error(f"cannot read an image from a {type(value).__name__}", reason=BAD_VALUE, field=field)


# ---------------------------------------------------------------------------------------------
# Options and answers

_LABEL_RE = re.compile(r"^\s*\(?([A-Z])\s*[).:]\s*(.*)$", re.DOTALL)
_ANSWER_LETTER_RE = re.compile(r"^\s*\(?([A-Z])(?:\s*[).:]|\s*$|\s+\()", re.DOTALL)


def parse_options(value: Any, row: RawRow, field: str) -> list[str]:
    """Options from a list, ``None`` (no options) or a JSON / Python-literal list string."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise row.error("expected a list of option texts", reason=BAD_VALUE, field=field) from None
    if not isinstance(value, (list, tuple)):
        raise row.error(
            f"expected a list of option texts, got {type(value).__name__}", reason=BAD_VALUE, field=field
        )
    if len(value) > len(OPTION_LETTERS):
        raise row.error(f"{len(value)} options; at most 26 can be lettered", reason=BAD_VALUE, field=field)
    return [str(v) for v in value]


def strip_option_labels(options: list[str]) -> list[str]:
    """Drop "A) " / "(B) " / "C. " prefixes when *every* option carries its own letter in order."""
    if not options:
        return options
    matches = [_LABEL_RE.match(o) for o in options]
    if all(m and m.group(1) == OPTION_LETTERS[i] for i, m in enumerate(matches)):
        return [m.group(2).strip() for m in matches if m]
    return options


def answer_to_letter(answer: str, options: list[str]) -> str | None:
    """The option letter an answer denotes, or ``None``.

    Accepts the letter itself, a labelled form ("B)", "(B)", "B.", "B (60°)", "A) Yes"), or
    the exact text of one option (compared after stripping and case-folding).
    """
    letters = OPTION_LETTERS[: len(options)]
    text = answer.strip()
    if text in letters and text:
        return text
    m = _ANSWER_LETTER_RE.match(text)
    if m and m.group(1) in letters:
        return m.group(1)
    folded = text.casefold()
    hits = [i for i, o in enumerate(options) if o.strip().casefold() == folded]
    if len(hits) == 1:
        return letters[hits[0]]
    return None


def letter_or_error(answer: str, options: list[str], row: RawRow, field: str = "answer") -> str:
    """:func:`answer_to_letter` or an ``answer not an option letter`` error."""
    letter = answer_to_letter(answer, options)
    if letter is None:
        raise row.error(
            f"answer {answer!r} matches none of the options ({', '.join(OPTION_LETTERS[: len(options)])})",
            reason=ANSWER_NOT_OPTION,
            field=field,
        )
    return letter
