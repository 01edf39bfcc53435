"""Small file helpers: atomic writes and JSON lines reading with located errors.

Atomic writes go to a temporary file in the same folder, are flushed and fsync'ed, and
then renamed over the target (``os.replace``), so a process killed mid-write leaves the
previous version of the file intact. JSON lines files are appended with one ``write`` per
batch of lines and fsync'ed; a kill can leave at most a truncated last line, which readers
skip (``read_jsonl(skip_truncated_tail=True)``) and the next append cuts off.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cpr.errors import InputError


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename).

    Creates the parent folder if needed. Raises ``OSError`` from the file system.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Serialise ``obj`` as JSON and write it atomically to ``path``."""
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars / arrays and Paths appear in metrics dicts.
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except (ValueError, TypeError):
            pass
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON object as a line to ``path`` and fsync it.

    The line goes out in a single ``write`` on an ``O_APPEND`` descriptor, so a kill can at worst
    leave a truncated last line, which :func:`read_jsonl` with ``skip_truncated_tail=True`` drops
    and which the next append removes first (:func:`repair_truncated_tail`).
    """
    append_jsonl_many(path, [obj])


def append_jsonl_many(path: str | Path, objs: Iterable[Any]) -> None:
    """Append JSON objects, one a line, to ``path`` with one ``write`` call, then fsync.

    A truncated last line left by a writer killed mid-write is removed first, so the file stays
    valid JSON lines. Creates the parent folder if needed. Raises ``OSError`` from the file system
    and ``TypeError`` for an object JSON cannot encode.
    """
    data = "".join(json.dumps(o, ensure_ascii=False, default=_json_default) + "\n" for o in objs).encode("utf-8")
    if not data:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_truncated_tail(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # os.write may write less than asked (rare on regular files)
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_truncated_tail(path: str | Path) -> bool:
    """Cut a JSON lines file back to its last newline if it does not end with one.

    What a writer killed mid-line leaves behind is an incomplete last line; appending after it
    would glue the next record onto it. Returns ``True`` if bytes were removed; a missing or
    empty file is left alone.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        # Scan backwards in blocks for the last newline.
        pos = size
        cut = 0
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            k = block.rfind(b"\n")
            if k >= 0:
                cut = start + k + 1
                break
            pos = start
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return True


def rewrite_jsonl(path: str | Path, keep: Callable[[Any], bool]) -> tuple[int, int]:
    """Atomically rewrite a JSON lines file keeping the rows for which ``keep(row)`` is true.

    A truncated last line is dropped. Returns ``(kept, dropped)`` (the truncated line is not
    counted). A missing file is left missing and gives ``(0, 0)``.

    Raises:
        InputError: a line other than the last is not valid JSON (names the file and line).
    """
    path = Path(path)
    if not path.exists():
        return 0, 0
    rows = [row for _, row in read_jsonl(path, skip_truncated_tail=True)]
    kept = [r for r in rows if keep(r)]
    atomic_write_text(
        path, "".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n" for r in kept)
    )
    return len(kept), len(rows) - len(kept)


def read_jsonl(path: str | Path, *, skip_truncated_tail: bool = False) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON lines file.

    Args:
        path: the file.
        skip_truncated_tail: drop an unparsable *last* line that has no trailing newline
            (what a killed writer leaves behind) instead of raising.

    Raises:
        InputError: a line is not valid JSON (names the file and 1-based line number).
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = parse_jsonl_line(raw, path, i)
        except InputError:
            if skip_truncated_tail and i == len(lines) and not raw.endswith("\n"):
                return
            raise
        yield i, obj


def parse_jsonl_line(raw: str, path: str | Path, line: int) -> Any:
    """Decode one line of a JSON lines file (its newline, if any, is not part of the value).

    Raises:
        InputError: the line is not valid JSON; names the file, the 1-based line and the 1-based
            column where decoding failed (one past the last character when the value is cut short).
    """
    try:
        return json.loads(raw.rstrip("\n"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at column {e.colno})", path=path, line=line) from None
