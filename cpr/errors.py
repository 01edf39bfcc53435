"""Error types. Every error about user input names where the problem is (file, line or record id,
field), so that a researcher can fix the data without reading a stack trace."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class CprError(Exception):
    """Base class of every error raised on purpose by cpr."""


class InputError(CprError, ValueError):
    """Invalid user input (a data file, a config value, a command-line argument): ``message`` says
    what is wrong; ``path``, 1-based ``line``, ``record_id`` and ``field`` (or config key) where, if
    known. The string form is ``"<path>:<line> (id <record_id>) field '<field>': <message>"`` without
    the unknown parts (``"line <line>"`` without a path)."""

    def __init__(
        self, message: str, *, path: str | Path | None = None, line: int | None = None,
        record_id: str | None = None, field: str | None = None,
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line, self.record_id, self.field = line, record_id, field
        where = [
            (f"{self.path}:{line}" if line is not None else self.path) if self.path is not None
            else f"line {line}" if line is not None else None,
            f"(id {record_id})" if record_id is not None else None,
            f"field '{field}'" if field is not None else None,
        ]
        prefix = " ".join(w for w in where if w is not None)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(InputError):
    """Invalid configuration value; ``field`` is the dotted config key."""


def check_choice(value: object, allowed: Iterable[str], field: str) -> str:
    """``value`` when it is one of ``allowed``.

    Raises:
        ConfigError: naming ``field``: "must be one of <allowed>, got <value>".
    """
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"must be one of {', '.join(allowed)}, got {value!r}", field=field)
    return value  # type: ignore[return-value]


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (``KeyboardInterrupt``) that has already logged its one line (what was kept and
    the command that continues it); :func:`cpr.cli.run_command` exits with :data:`INTERRUPTED_EXIT_CODE`
    without printing more."""


#: Exit code of a command stopped by Ctrl-C: 128 + SIGINT (2), as shells report it.
INTERRUPTED_EXIT_CODE = 130


class ModelNotAvailableError(CprError, OSError):
    """A model, processor or encoder is neither on disk nor downloadable; the message names what was
    asked for and how to supply a local path."""
