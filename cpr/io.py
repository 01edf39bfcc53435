"""File helpers: atomic writes (temporary file, fsync, ``os.replace``: a kill leaves the previous
version) and JSON lines (one fsync'ed ``write`` per batch of lines: a kill leaves at most a truncated
last line, which readers can skip and the next append cuts off), with located errors.

Every JSON file cpr writes goes through :func:`json_text` and is strict JSON (RFC 8259): a non-finite
float (NaN, Infinity) is written as ``null``, which every parser reads; Python's ``json`` would write
the non-standard ``NaN``. :func:`lock_file` keeps a folder to one process at a time."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cpr.errors import InputError


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically, creating the parent folder. Raises ``OSError``."""
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
    """Serialise ``obj`` as strict JSON (:func:`json_text`) and write it atomically to ``path``."""
    atomic_write_text(path, json_text(obj, indent=indent) + "\n")


def atomic_write_jsonl(path: str | Path, objs: Iterable[Any]) -> None:
    """Write ``objs`` as JSON lines (:func:`json_text`, one object a line) atomically to ``path``."""
    atomic_write_text(path, _json_lines(objs))


def json_text(obj: Any, indent: int | None = None) -> str:
    """``obj`` as strict JSON text (no trailing newline): non-finite floats become ``null``; numpy /
    torch scalars and arrays become numbers and lists, paths strings. Raises ``TypeError`` for an
    object JSON cannot encode."""
    return json.dumps(_plain(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def _plain(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``None``, arrays and tensors as lists, paths as strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, type(None))):  # bool is an int
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays appear in metrics dicts
        return _plain(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _json_lines(objs: Iterable[Any]) -> str:
    return "".join(json_text(o) + "\n" for o in objs)


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON object as a line to ``path`` (:func:`append_jsonl_many`)."""
    append_jsonl_many(path, [obj])


def append_jsonl_many(path: str | Path, objs: Iterable[Any]) -> None:
    """Append JSON objects, one a line, to ``path`` in one ``write`` on an ``O_APPEND`` descriptor, then
    fsync; a truncated last line (a writer killed mid-line) is cut off first. Creates the parent folder.
    Raises ``OSError`` from the file system, ``TypeError`` for an object JSON cannot encode."""
    data = _json_lines(objs).encode("utf-8")
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
    """Cut a JSON lines file back to its last newline if it does not end with one (an incomplete line
    left by a killed writer, which the next append would glue onto). Returns ``True`` if bytes were
    removed; a missing or empty file is left alone."""
    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    if size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        cut = 0
        for pos in range(size, 0, -65536):  # scan backwards in blocks for the last newline
            f.seek(start := max(0, pos - 65536))
            if (k := f.read(pos - start).rfind(b"\n")) >= 0:
                cut = start + k + 1
                break
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return True


def rewrite_jsonl(path: str | Path, keep: Callable[[Any], bool]) -> tuple[int, int]:
    """Atomically rewrite a JSON lines file keeping the rows for which ``keep(row)`` is true; a
    truncated last line is dropped (not counted). Returns ``(kept, dropped)``; ``(0, 0)`` for a missing
    file. Raises :class:`InputError` (file and line) for a bad line other than the last."""
    path = Path(path)
    if not path.exists():
        return 0, 0
    rows = [row for _, row in read_jsonl(path, skip_truncated_tail=True)]
    kept = [r for r in rows if keep(r)]
    atomic_write_text(path, _json_lines(kept))
    return len(kept), len(rows) - len(kept)


def read_jsonl(path: str | Path, *, skip_truncated_tail: bool = False) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON lines file;
    ``skip_truncated_tail`` drops an unparsable *last* line without a newline (a killed writer's).

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
    """Decode one line of a JSON lines file. Raises :class:`InputError` naming the file, the 1-based
    line and column where decoding failed (one past the end when the value is cut short)."""
    try:
        return json.loads(raw.rstrip("\n"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at column {e.colno})", path=path, line=line) from None


class FolderLockedError(OSError):
    """:func:`lock_file` found the lock held by another process (``holder``: what that process wrote into it)."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path, self.holder = path, holder
        super().__init__(f"{path} is held by another process ({holder or 'unknown'})")


def lock_file(path: str | Path, note: str = "") -> Any:
    """Take an exclusive lock on ``path`` (created when missing) and write ``note`` (e.g. the process id) into
    it; the lock lasts while the returned file object stays open. It is the kernel's (``fcntl.flock``): closing
    the file or the process ending, even by SIGKILL, releases it, so a killed process never leaves it stuck.

    Raises:
        FolderLockedError: another process holds it.
        OSError: ``path`` cannot be created or opened.
    """
    import fcntl

    path = Path(path)
    while True:
        f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held open: the lock lives as long as the file)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            f.close()
            raise FolderLockedError(path, holder) from None
        except BaseException:
            f.close()
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else its holder removed it (unlock_file) between our open and our lock: take the new one
            break
        f.close()
    f.seek(0)
    f.truncate()
    f.write(note)
    f.flush()
    return f


def unlock_file(f: Any) -> None:
    """Release a lock of :func:`lock_file`: remove its file (while still holding it), then close it."""
    with contextlib.suppress(OSError):
        os.unlink(f.name)
    f.close()
