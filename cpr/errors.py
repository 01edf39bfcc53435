"""Error types shared by the package.

Every error about user input names where the problem is (file, line or record id,
field) so that a researcher can fix the data without reading a stack trace.
"""

from __future__ import annotations

from pathlib import Path


class CprError(Exception):
    """Base class of every error raised on purpose by cpr."""


class InputError(CprError, ValueError):
    """Invalid user input: a data file, a config value or a command-line argument.

    Args:
        message: what is wrong, in words.
        path: the file the problem is in, if any.
        line: 1-based line number in ``path`` (JSON lines files), if known.
        record_id: the record's ``id``, if known.
        field: the field (or config key) that is wrong, if any.

    The string form is ``"<path>:<line> (id <record_id>) field '<field>': <message>"``,
    leaving out the parts that are not known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        record_id: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        self.record_id = record_id
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(f"{self.path}:{self.line}" if self.line is not None else self.path)
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.record_id is not None:
            where.append(f"(id {self.record_id})")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        prefix = " ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class ConfigError(InputError):
    """Invalid configuration value; ``field`` is the dotted config key."""


class ModelNotAvailableError(CprError, OSError):
    """A model, processor or encoder is neither on disk nor downloadable.

    The message names what was asked for and how to supply a local path.
    """
