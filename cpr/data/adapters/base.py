"""What every source adapter shares: the raw row, the :class:`Adapter` interface (docs/data.md section 1;
the built-in layouts: section 3), and small readers."""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cpr.data.records import OPTION_LETTERS, ImageRef, Record
from cpr.data.validation import BAD_VALUE, MALFORMED_JSON, MISSING_FIELD, MISSING_IMAGE, RecordError
from cpr.errors import ConfigError, InputError
from cpr.io import parse_jsonl_line


@dataclass
class RawRow:
    """One row as published (``data``, unchanged: an embedded image is its encoded ``{"bytes", "path"}``)
    and where it came from: ``path`` (file, dataset folder or hub name), 1-based ``line`` in a
    JSON-lines file, 0-based ``index``, ``split`` when the layout says, ``record_id`` when known before
    conversion, and ``base_dir`` (relative image paths resolve against it). ``problem`` says why the
    row could not be read (malformed JSON, not an object); the loader then raises or skips it.
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
        return RecordError(message, reason=reason, path=self.path, line=self.line, record_id=self.record_id, field=field)

    def require(self, key: str) -> Any:
        """``data[key]``; a ``missing field`` error when absent or ``None``."""
        if (value := self.data.get(key)) is None:
            raise self.error("required field is missing", reason=MISSING_FIELD, field=key)
        return value

    def text(self, key: str, required: bool = True) -> str:
        """``data[key]`` as a string (numbers converted). When absent: a ``missing field`` error if
        ``required``, else ``""``; optional values are stripped (validation then reports e.g. a missing
        answer with its own reason)."""
        value = self.require(key) if required else self.data.get(key)
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(f"expected a string, got {type(value).__name__}", reason=BAD_VALUE, field=key)
        return str(value) if required else str(value).strip()

    def images(self, key: str, base_dirs: Sequence[Path] = ()) -> list[ImageRef]:
        """The image reference(s) in ``data[key]`` (:func:`image_refs`); ``missing image`` when none."""
        if not (refs := image_refs(self.data.get(key), self, key, base_dirs)):
            raise self.error("the record has no image", reason=MISSING_IMAGE, field=key)
        return refs


class SkipRow(Exception):
    """Raised by :meth:`Adapter.convert` for a valid row left out by policy (e.g. a text-only
    ScienceQA question); counted in the load report by ``reason``, not an error."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Adapter(ABC):
    """Reads one source's published layout. Subclasses set ``name`` (registry key and
    ``Record.source``) and may set ``allows_empty_answer`` (no answer field), ``loads_hub_datasets``
    (``path`` may be a hub ``owner/name``), ``reads_path`` (``False``: generated, no ``path``) and ``option_names`` (the keyword options the constructor
    accepts, from ``load_records(options=...)``; others raise ``ConfigError``)."""

    name: ClassVar[str]
    allows_empty_answer: ClassVar[bool] = False
    loads_hub_datasets: ClassVar[bool] = False
    reads_path: ClassVar[bool] = True
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        for key in sorted(set(options) - set(self.option_names)):
            allowed = ", ".join(self.option_names) or "none"
            raise ConfigError(f"unknown option for source '{self.name}' (allowed: {allowed})", field=f"options.{key}")
        self.options = options

    @abstractmethod
    def rows(self, path: str | Path, split: str | None) -> Iterator[RawRow]:
        """The raw rows of ``path`` (of ``split`` where the layout has splits); ``InputError`` when the
        path does not exist or has the wrong layout."""

    @abstractmethod
    def convert(self, row: RawRow) -> Record:
        """Turn a raw row into a record. Raises ``RecordError`` or ``SkipRow``."""


def existing_path(path: str | Path, source: str) -> Path:
    """``Path(path)`` if it exists; else ``InputError`` naming it."""
    if not (p := Path(path).expanduser()).exists():
        raise InputError(f"{source}: path does not exist", path=p)
    return p


def pick_file(folder: Path, candidates: Sequence[str], source: str) -> Path:
    """The first of ``candidates`` (relative paths or globs; a glob must match one file) in ``folder``.
    Raises ``InputError`` listing what was looked for."""
    for cand in candidates:
        matches = sorted(folder.glob(cand)) if any(ch in cand for ch in "*?[") else [folder / cand]
        matches = [m for m in matches if m.is_file()]
        if len(matches) > 1:
            names = ", ".join(m.name for m in matches)
            raise InputError(f"{source}: several files match {cand!r} ({names}); pass one file", path=folder)
        if matches:
            return matches[0]
    raise InputError(f"{source}: none of {list(candidates)} found in this folder", path=folder)


def reject_split(split: str | None, path: Path, source: str) -> None:
    """Raise when ``split`` is given for a single file without a split field."""
    if split is not None:
        raise InputError(f"{source}: this file has no split field, so split={split!r} cannot be applied; "
                         "omit the split or pass a folder that holds one file per split", path=path,
                         field="split")


def jsonl_rows(path: Path, *, base_dir: Path | None = None, split: str | None = None) -> Iterator[RawRow]:
    """Rows of a JSON-lines file, one per non-blank line (with ``split``: those whose ``split`` field
    is absent or equal). A line that is not valid JSON or not an object gives a row with
    :attr:`RawRow.problem` set (reason ``malformed JSON`` / ``bad value``), as does a line that is not UTF-8
    text (reason ``malformed JSON``, naming the first bad byte and its column)."""
    with open(path, "rb") as f:
        for line, raw_bytes in enumerate(f, start=1):
            row = RawRow(data={}, path=path, line=line, base_dir=base_dir or path.parent, index=line - 1)
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                row.problem = row.error(f"malformed JSON (not UTF-8 text: byte 0x{raw_bytes[e.start]:02x} at column "
                                        f"{e.start + 1})", reason=MALFORMED_JSON)
                yield row
                continue
            if not raw.strip():
                continue
            try:
                obj = parse_jsonl_line(raw, path, line)
            except InputError as e:
                row.problem = row.error(e.message, reason=MALFORMED_JSON)
            else:
                if not isinstance(obj, Mapping):
                    row.problem = row.error(f"expected a JSON object, got {type(obj).__name__}", reason=BAD_VALUE)
                elif split is not None and obj.get("split") not in (None, split):
                    continue
                else:
                    row.data, row.record_id = obj, (None if obj.get("id") is None else str(obj["id"]))
            yield row


def problem_rows(path: Path, split: str | None) -> Iterator[RawRow]:
    """Rows of a JSON file holding one object ``id -> problem`` (TabMWP, ScienceQA); with ``split``,
    the problems whose ``split`` field equals it. ``InputError`` for malformed JSON or another shape."""
    try:
        with open(path, encoding="utf-8") as f:
            problems = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg})", path=path, line=e.lineno) from None
    if not isinstance(problems, dict):
        raise InputError(f"expected a JSON object mapping ids to records, got {type(problems).__name__}", path=path)
    for i, (pid, prob) in enumerate(problems.items()):
        row = RawRow(data=prob, path=path, record_id=str(pid), base_dir=path.parent, index=i)
        if not isinstance(prob, Mapping):
            row.data, row.problem = {}, row.error(f"expected an object, got {type(prob).__name__}", reason=BAD_VALUE)
        elif split is not None and prob.get("split") != split:
            continue
        yield row


def image_refs(value: Any, row: RawRow, field: str, base_dirs: Sequence[Path] = ()) -> list[ImageRef]:
    """Image references in a cell: ``None``, a path (relative ones resolve against the first of
    ``base_dirs``, else ``row.base_dir``, where the file exists), an encoded ``{"bytes", "path"}``
    dict, or a list of those."""
    if value is None or isinstance(value, str) and not value.strip():
        return []
    if isinstance(value, (list, tuple)):
        return [ref for item in value for ref in image_refs(item, row, field, base_dirs)]
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None or not value.get("path"):
            return [dict(value)]
        value = str(value["path"])
    if not isinstance(value, str):
        raise row.error(f"cannot read an image from a {type(value).__name__}", reason=BAD_VALUE, field=field)
    if (p := Path(value).expanduser()).is_absolute():
        return [p]
    dirs = list(base_dirs) or [row.base_dir or Path.cwd()]
    return [next((d / p for d in dirs if (d / p).exists()), dirs[0] / p)]

_LABEL_RE = re.compile(r"^\s*\(?([A-Z])\s*[).:]\s*(.*)$", re.DOTALL)
_ANSWER_LETTER_RE = re.compile(r"^\s*\(?([A-Z])(?:\s*[).:]|\s*$|\s+\()", re.DOTALL)


def parse_options(value: Any, row: RawRow, field: str) -> list[str]:
    """Options from a list, ``None`` (no options) or a JSON / Python-literal list string."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text else None
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise row.error("expected a list of option texts", reason=BAD_VALUE, field=field) from None
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise row.error(f"expected a list of option texts, got {type(value).__name__}", reason=BAD_VALUE, field=field)
    if len(value) > len(OPTION_LETTERS):
        raise row.error(f"{len(value)} options; at most 26 can be lettered", reason=BAD_VALUE, field=field)
    return [str(v) for v in value]


def strip_option_labels(options: list[str]) -> list[str]:
    """Drop "A) " / "(B) " / "C. " prefixes when *every* option carries its own letter in order."""
    matches = [_LABEL_RE.match(o) for o in options]
    if options and all(m and m.group(1) == OPTION_LETTERS[i] for i, m in enumerate(matches)):
        return [m.group(2).strip() for m in matches if m]
    return options


def answer_to_letter(answer: str, options: list[str]) -> str | None:
    """The option letter an answer denotes, or ``None``: the letter itself, a labelled form ("B)",
    "(B)", "B.", "B (60°)", "A) Yes"), or the text of exactly one option (stripped, case-folded)."""
    letters = OPTION_LETTERS[: len(options)]
    text = answer.strip()
    if text and text in letters:
        return text
    if (m := _ANSWER_LETTER_RE.match(text)) and m.group(1) in letters:
        return m.group(1)
    hits = [letters[i] for i, o in enumerate(options) if o.strip().casefold() == text.casefold()]
    return hits[0] if len(hits) == 1 else None
