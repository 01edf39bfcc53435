"""Small file helpers: atomic writes and JSON lines reading with located errors.

Atomic writes go to a temporary file in the same folder, are flushed and fsync'ed, and
then renamed over the target (``os.replace``), so a process killed mid-write leaves the
previous version of the file intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
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

    A line is written with a single ``write`` call so a kill can at worst leave a
    truncated last line, which :func:`read_jsonl` with ``skip_truncated_tail=True`` drops.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(obj, ensure_ascii=False, default=_json_default) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


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
            yield i, json.loads(raw)
        except json.JSONDecodeError as e:
            if skip_truncated_tail and i == len(lines) and not raw.endswith("\n"):
                return
            raise InputError(f"malformed JSON ({e.msg} at column {e.colno})", path=path, line=i) from None
