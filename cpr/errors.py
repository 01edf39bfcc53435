"""Error types. Every error about user input names where the problem is (file, line or record id,
field), so that a researcher can fix the data without reading a stack trace; :func:`run_command` turns
one into a one-line message and an exit code for the command line and the recipes."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class CprError(Exception):
    """Base class of every error raised on purpose by cpr."""


class InputError(CprError, ValueError):
    """Invalid user input (a data file, a config value, a command-line argument): ``message`` says
    what is wrong; ``path``, 1-based ``line``, ``record_id`` and ``field`` (or config key) where, if
    known. The string form is ``"<path>:<line> (id <record_id>) field '<field>': <message>"`` without
    the unknown parts (``"line <line>"`` without a path)."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 record_id: str | None = None, field: str | None = None) -> None:
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


class DatasetNotAvailableError(InputError):
    """A Hugging Face hub dataset this machine cannot load. ``offline``: the hub cannot be reached at all
    (``HF_HUB_OFFLINE`` or no network), as opposed to a dataset that is gated, private or missing."""

    def __init__(self, message: str, *, offline: bool, path: str | Path | None = None) -> None:
        super().__init__(message, path=path)
        self.offline = offline


def check_choice(value: object, allowed: Iterable[str], field: str) -> str:
    """``value`` when it is one of ``allowed``; else raises ``ConfigError`` naming ``field``: "must be one of
    <allowed>, got <value>"."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"must be one of {', '.join(allowed)}, got {value!r}", field=field)
    return value  # type: ignore[return-value]


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (``KeyboardInterrupt``) that has already logged its one line (what was kept and
    the command that continues it); :func:`run_command` exits with :data:`INTERRUPTED_EXIT_CODE`
    without printing more."""


#: Exit code of a command stopped by Ctrl-C: 128 + SIGINT (2), as shells report it.
INTERRUPTED_EXIT_CODE = 130


class ModelNotAvailableError(CprError, OSError):
    """A model, processor or encoder is neither on disk nor downloadable; the message names what was
    asked for and how to supply a local path."""


def error_exit_code(error: CprError) -> int:
    """The process exit code for ``error``: its class's ``exit_code`` where it sets one
    (:class:`cpr.training.divergence.TrainingDivergedError`: 3), else 2."""
    return int(getattr(error, "exit_code", 2))


#: The start of the warning DeepSpeed logs when it finds no CUDA device (deepspeed/accelerator/real_accelerator.py).
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _DeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        deepspeed_launch = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").strip().lower() in ("1", "true", "yes", "on")
        return deepspeed_launch or not record.getMessage().startswith(DEEPSPEED_CPU_NOTICE)


def quiet_deepspeed_cpu_notice() -> None:
    """Drop DeepSpeed's warning "Setting accelerator to CPU. ..." (logged on every CUDA-less machine where
    accelerate imports DeepSpeed) unless the launch uses DeepSpeed: a filter on its logger, installed once."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DeepSpeedCpuNotice) for f in logger.filters):
        logger.addFilter(_DeepSpeedCpuNotice())


def run_command(prog: str, func: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a command's ``func(args)`` and return its exit code (``None`` counts as 0). A
    :class:`~cpr.errors.CprError` is printed as one line ``"<prog>: error: <message>"`` on standard
    error and gives :func:`error_exit_code`; Ctrl-C gives exit code 130 and, unless the run already said so
    (:class:`RunInterrupted`), the line ``"<prog>: interrupted"``."""
    quiet_deepspeed_cpu_notice()
    try:
        return int(func(args) or 0)
    except CprError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return error_exit_code(e)
    except KeyboardInterrupt as e:
        if not isinstance(e, RunInterrupted):
            print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except BrokenPipeError:  # output piped into a command that stopped reading (`| head`): not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
