"""Run logs: the text log (``run.log``), the console, trainer log records as JSON lines, scored completions
(appended with one fsync'ed ``write`` a batch: a kill truncates at most the last line, which readers drop)."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from cpr.io import append_jsonl_many, read_jsonl, rewrite_jsonl

#: Loggers that go to the run's log file only: Python warnings and every trainer log record.
FILE_ONLY_LOGGERS = ("py.warnings", "cpr.trainer_log")
logging.getLogger("cpr.trainer_log").propagate = False  # never to the console, run log or not


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (tests and notebooks replace it)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


def open_run_log(folder: str | Path, name: str = "run.log", *, write: bool = True) -> logging.Handler | None:
    """Send the ``cpr`` loggers' INFO records to standard error and, with ``write``, to ``<folder>/<name>`` with
    :data:`FILE_ONLY_LOGGERS`; return the file handler. Without ``write`` only warnings and errors are logged."""
    root = logging.getLogger("cpr")
    root.setLevel(logging.INFO if write else logging.WARNING)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
        console = _StderrHandler()
        console.setFormatter(logging.Formatter("[cpr] %(message)s"))
        root.addHandler(console)
    if not write:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(Path(folder) / name, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    for logger_name in FILE_ONLY_LOGGERS:
        file_only = logging.getLogger(logger_name)
        file_only.propagate = False
        file_only.setLevel(logging.INFO)
        file_only.addHandler(handler)
    logging.captureWarnings(True)
    return handler


def close_run_log(handler: logging.Handler | None) -> None:
    """Stop writing the file of :func:`open_run_log` (warnings back to standard error once no run log is open)."""
    if handler is not None:
        for name in ("cpr", *FILE_ONLY_LOGGERS):
            logging.getLogger(name).removeHandler(handler)
        handler.close()
        if not logging.getLogger("py.warnings").handlers:
            logging.captureWarnings(False)


#: The values of a training log record shown on the console (TRL's names, as in ``log.jsonl``).
CONSOLE_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "baseline/frac_zero_signal", "loss", "grad_norm", "kl", "completions/mean_length",
                "mean_token_accuracy")


def console_line(state: Any, logs: dict[str, Any]) -> str | None:
    """``step N/M: key value, ...`` of a log record's :data:`CONSOLE_KEYS` and the eval hook's accuracy and Match
    F1; ``None`` when it holds none."""
    keys = [k for k in CONSOLE_KEYS if k in logs]
    keys += [k for k in logs if k.startswith("eval_") and k.endswith(("/accuracy", "/match_f1"))]
    if not keys:
        return None
    values = ", ".join(f"{k} {logs[k]:.4g}" if isinstance(logs[k], float) else f"{k} {logs[k]}" for k in keys)
    return f"step {state.global_step}/{state.max_steps}: {values}"


class _ShortLines:
    """``on_log``: the whole record to ``run.log`` (logger ``cpr.trainer_log``), :func:`console_line` to the console."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not state.is_world_process_zero or not logs:
            return
        logging.getLogger("cpr.trainer_log").info("step %d: %s", state.global_step, json.dumps(_finite(logs)))
        line = console_line(state, logs)
        if line is not None and getattr(self, "training_bar", None) is not None:
            self.training_bar.write(line)
        elif line is not None:
            print(line, flush=True)


class ConsoleProgressCallback(_ShortLines, ProgressCallback):
    """transformers' progress bar, with :func:`console_line` above it instead of every logged value."""


class ConsoleLogCallback(_ShortLines, PrinterCallback):
    """transformers' ``PrinterCallback`` (``disable_tqdm: true``) printing :func:`console_line` instead."""


def quiet_console(trainer: Any) -> None:
    """Replace a trainer's ``ProgressCallback`` / ``PrinterCallback`` with their :func:`console_line` versions."""
    for old, new in ((ProgressCallback, ConsoleProgressCallback), (PrinterCallback, ConsoleLogCallback)):
        if trainer.pop_callback(old) is not None:
            trainer.add_callback(new)


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN / Inf: they become the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


class JsonlLogCallback(TrainerCallback):
    """Append each trainer log record (main process) to a JSON lines file as ``{"step": global_step, <logged
    keys>}`` (non-finite values as strings)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if state.is_world_process_zero and logs:
            append_jsonl_many(self.path, [_finite({"step": state.global_step, **logs})])


class ScoredCompletionLog:
    """A completion recorder (:func:`cpr.rewards.set_completion_recorder`) appending its rows to ``path``
    (``<stem>.rank<N><suffix>`` for ``rank`` > 0), which the ablation tables read (paper Table 6)."""

    def __init__(self, path: str | Path, rank: int = 0) -> None:
        path = Path(path)
        self.path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}") if rank else path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        append_jsonl_many(self.path, map(_finite, rows))


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON lines log (``[]`` when missing; a truncated last line is dropped)."""
    return [row for _, row in read_jsonl(path, skip_truncated_tail=True)] if Path(path).exists() else []


def rollback_logs(phase_dir: str | Path, step: int) -> dict[str, tuple[int, int]]:
    """Drop the rows a killed run wrote to a phase's JSON lines logs after optimizer step ``step``; returns
    ``{file: (kept, dropped)}``, raises ``InputError`` for a malformed line other than the last."""

    def keep(row: Any) -> bool:
        s = row.get("step") if isinstance(row, dict) else None
        return not isinstance(s, (int, float)) or isinstance(s, bool) or s <= step

    out: dict[str, tuple[int, int]] = {}
    for pattern in ("log.jsonl", "eval_history.jsonl", "guard_events.jsonl", "scored_completions*.jsonl"):
        for path in sorted(Path(phase_dir).glob(pattern)):
            out[path.name] = rewrite_jsonl(path, keep)
    return out
