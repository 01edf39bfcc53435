"""Run logs: the run's text log, the trainer's log records as JSON lines, and every scored completion.

* :func:`open_run_log` sends the ``cpr`` loggers' records to the console and to a run folder's
  text log (``run.log``; the ablation's ``ablation.log``), and Python warnings (the libraries'
  ``FutureWarning`` s, ...) and every trainer log record to that file only; :func:`close_run_log` ends it.
* :func:`quiet_console` gives a trainer the console of :class:`ConsoleProgressCallback`: the
  progress bar and one short line per logged step (:func:`console_line`) instead of transformers'
  printed dict of every logged value.
* :class:`JsonlLogCallback` appends each ``Trainer.log`` record (loss, reward, KL, the
  per-reward means, cpr's ``steps/*`` / ``answer/*`` metrics, ...) to ``<phase>/log.jsonl``.
* :class:`ScoredCompletionLog` receives, through :func:`cpr.rewards.set_completion_recorder`,
  one row per completion scored by the ``cpr`` or ``step_f1`` reward (step, reward, correct,
  Match F1, ...) and appends them to ``<phase>/scored_completions[.rank<N>].jsonl``. The
  ablation tables compute Discrimination and r(F1) from these rows (paper Table 6).
* :func:`rollback_logs` cuts a phase's JSON lines logs back to a checkpoint's step when a killed
  run resumes, so the resumed run's logs equal an uninterrupted run's (no rows of the lost
  interval, no duplicates).

Both writers append each batch of lines with one ``write`` and fsync it
(:func:`cpr.io.append_jsonl_many`); a kill leaves at most a truncated last line, which the
readers drop and the next append removes.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from cpr.io import append_jsonl, append_jsonl_many, read_jsonl, rewrite_jsonl

__all__ = [
    "ConsoleLogCallback",
    "ConsoleProgressCallback",
    "JsonlLogCallback",
    "ScoredCompletionLog",
    "close_run_log",
    "console_line",
    "open_run_log",
    "quiet_console",
    "read_log",
    "rollback_logs",
]

#: Loggers written to the run's log file only, never to the console: Python warnings
#: (``logging.captureWarnings``) and every trainer log record (:class:`ConsoleProgressCallback`).
FILE_ONLY_LOGGERS = ("py.warnings", "cpr.trainer_log")
logging.getLogger("cpr.trainer_log").propagate = False  # never to the console, run log or not


class _StderrHandler(logging.StreamHandler):
    """A console handler writing to whatever ``sys.stderr`` is at the time (tests and notebooks
    replace it; a handler holding the old, closed stream would print "Logging error" tracebacks)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def open_run_log(folder: str | Path, name: str = "run.log", *, write: bool = True) -> logging.Handler | None:
    """Log the ``cpr`` loggers' INFO records to the console (standard error, ``[cpr] <message>``;
    added once per process) and, when ``write``, to ``<folder>/<name>`` (time, level, logger,
    message; the folder is created).

    Args:
        folder: the run folder.
        name: the log file's name.
        write: write the file (``False`` on processes other than the main one, which then log
            warnings and errors only, so the console shows each message once).

    With ``write``, Python warnings (``logging.captureWarnings``) and the trainer's log records go to
    the file only (:data:`FILE_ONLY_LOGGERS`), so the console keeps the progress bar and short lines.

    Returns:
        The file handler, for :func:`close_run_log`; ``None`` when ``write`` is false.
    """
    root = logging.getLogger("cpr")
    # other processes of a distributed run log warnings and errors only (as transformers does)
    root.setLevel(logging.INFO if write else logging.WARNING)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
        console = _StderrHandler()
        console.setFormatter(logging.Formatter("[cpr] %(message)s"))
        root.addHandler(console)
    if not write:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(folder / name, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    for name in FILE_ONLY_LOGGERS:
        file_only = logging.getLogger(name)
        file_only.propagate = False
        file_only.setLevel(logging.INFO)
        file_only.addHandler(handler)
    logging.captureWarnings(True)
    return handler


def close_run_log(handler: logging.Handler | None) -> None:
    """Stop writing the log file of :func:`open_run_log` (nothing for ``None``); Python warnings go back
    to standard error once no run log is open."""
    if handler is not None:
        for name in ("cpr", *FILE_ONLY_LOGGERS):
            logging.getLogger(name).removeHandler(handler)
        handler.close()
        if not logging.getLogger("py.warnings").handlers:
            logging.captureWarnings(False)


#: The values of a training log record shown on the console (TRL's names, as in ``log.jsonl``).
CONSOLE_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "loss", "grad_norm", "kl", "completions/mean_length",
                "mean_token_accuracy")


def console_line(state: Any, logs: dict[str, Any]) -> str | None:
    """One short console line for a trainer log record: ``step N/M:`` then the :data:`CONSOLE_KEYS` it
    holds and the eval hook's ``eval_<benchmark>/accuracy`` and ``/match_f1``, as ``key value`` pairs
    (4 significant digits); ``None`` when the record holds none of them."""
    keys = [k for k in CONSOLE_KEYS if k in logs]
    keys += [k for k in logs if k.startswith("eval_") and k.endswith(("/accuracy", "/match_f1"))]
    if not keys:
        return None
    values = ", ".join(f"{k} {logs[k]:.4g}" if isinstance(logs[k], float) else f"{k} {logs[k]}" for k in keys)
    return f"step {state.global_step}/{state.max_steps}: {values}"


class _ShortLines:
    """``on_log``: the whole record to ``run.log`` (logger ``cpr.trainer_log``), one short line to the console."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not state.is_world_process_zero or not logs:
            return
        record = {k: _finite(v) for k, v in logs.items()}
        logging.getLogger("cpr.trainer_log").info("step %d: %s", state.global_step, json.dumps(record))
        line = console_line(state, logs)
        bar = getattr(self, "training_bar", None)
        if line is not None and bar is not None:
            bar.write(line)
        elif line is not None:
            print(line, flush=True)


class ConsoleProgressCallback(_ShortLines, ProgressCallback):
    """transformers' ``ProgressCallback`` (the progress bar) printing :func:`console_line` above the bar
    instead of every logged value; the whole record goes to ``run.log`` (and ``log.jsonl``)."""


class ConsoleLogCallback(_ShortLines, PrinterCallback):
    """transformers' ``PrinterCallback`` (``disable_tqdm: true``) printing :func:`console_line` instead
    of every logged value; the whole record goes to ``run.log`` (and ``log.jsonl``)."""


def quiet_console(trainer: Any) -> None:
    """Replace a trainer's ``ProgressCallback`` / ``PrinterCallback`` (they print every log record as a
    dict) with :class:`ConsoleProgressCallback` / :class:`ConsoleLogCallback`."""
    for old, new in ((ProgressCallback, ConsoleProgressCallback), (PrinterCallback, ConsoleLogCallback)):
        if trainer.pop_callback(old) is not None:
            trainer.add_callback(new)


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN / Inf: "nan", "inf" keep the fact visible
    return v


class JsonlLogCallback(TrainerCallback):
    """Append every log record of the trainer to a JSON lines file (main process only).

    Each line: ``{"step": global_step, "epoch": ..., <logged keys>}``. NaN and infinite values
    are written as the strings ``"nan"`` / ``"inf"``. The file is appended to (a resumed run
    continues it, after :func:`rollback_logs`); each line is written with one ``write`` and fsync'ed.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row = {"step": state.global_step, **{k: _finite(v) for k, v in logs.items()}}
        append_jsonl(self.path, row)


class ScoredCompletionLog:
    """A completion recorder (see :func:`cpr.rewards.set_completion_recorder`) writing JSON lines.

    Args:
        path: file to append to; with ``rank > 0`` the rank is added to the name, so every
            process writes its own completions without interleaving.
        rank: this process's index.
    """

    def __init__(self, path: str | Path, rank: int = 0) -> None:
        path = Path(path)
        if rank:
            path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        append_jsonl_many(self.path, ({k: _finite(v) for k, v in r.items()} for r in rows))


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``log.jsonl`` / ``scored_completions.jsonl`` file (a truncated last line is dropped)."""
    path = Path(path)
    if not path.exists():
        return []
    return [row for _, row in read_jsonl(path, skip_truncated_tail=True)]


#: Phase log files and how their rows relate to a checkpoint at optimizer step N: trainer logs,
#: eval-hook scores and guard events of step <= N were written before the checkpoint; a scored
#: completion row carries the global step *before* its optimizer step, so rows of step < N are.
_ROLLBACK_RULES: tuple[tuple[str, bool], ...] = (
    ("log.jsonl", True),
    ("eval_history.jsonl", True),
    ("guard_events.jsonl", True),
    ("scored_completions*.jsonl", False),
)


def rollback_logs(phase_dir: str | Path, step: int) -> dict[str, tuple[int, int]]:
    """Drop the rows a killed run wrote after the checkpoint at optimizer step ``step``.

    Rewrites (atomically) ``log.jsonl``, ``eval_history.jsonl``, ``guard_events.jsonl`` (rows with
    ``step <= step``) and ``scored_completions[.rankN].jsonl`` (rows with ``step < step``: their
    ``step`` is the trainer's global step while the completion was scored, one less than the
    optimizer step it belongs to) of a phase folder; a truncated last line goes too. ``step = 0``
    empties them (a phase restarting from scratch). Rows without a numeric ``step`` are kept.

    Returns:
        ``{file name: (rows kept, rows dropped)}`` for the files that exist.

    Raises:
        InputError: a malformed line other than the last (from :func:`cpr.io.read_jsonl`).
    """
    phase_dir = Path(phase_dir)
    out: dict[str, tuple[int, int]] = {}
    for pattern, inclusive in _ROLLBACK_RULES:
        for path in sorted(phase_dir.glob(pattern)):

            def keep(row: Any, inclusive: bool = inclusive) -> bool:
                s = row.get("step") if isinstance(row, dict) else None
                if not isinstance(s, (int, float)) or isinstance(s, bool):
                    return True
                return s <= step if inclusive else s < step

            out[path.name] = rewrite_jsonl(path, keep)
    return out
