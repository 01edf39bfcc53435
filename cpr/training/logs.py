"""Run logs: the trainer's log records as JSON lines, and every scored completion.

* :class:`JsonlLogCallback` appends each ``Trainer.log`` record (loss, reward, KL, the
  per-reward means, cpr's ``steps/*`` / ``answer/*`` metrics, ...) to ``<phase>/log.jsonl``.
* :class:`ScoredCompletionLog` receives, through :func:`cpr.rewards.set_completion_recorder`,
  one row per completion scored by the ``cpr`` or ``step_f1`` reward (step, reward, correct,
  Match F1, ...) and appends them to ``<phase>/scored_completions[.rank<N>].jsonl``. The
  ablation tables compute Discrimination and r(F1) from these rows (paper Table 6).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from cpr.io import read_jsonl

__all__ = ["JsonlLogCallback", "ScoredCompletionLog", "read_log"]


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN / Inf: "nan", "inf" keep the fact visible
    return v


class JsonlLogCallback(TrainerCallback):
    """Append every log record of the trainer to a JSON lines file (main process only).

    Each line: ``{"step": global_step, "epoch": ..., <logged keys>}``. NaN and infinite values
    are written as the strings ``"nan"`` / ``"inf"``. The file is appended to (a resumed run
    continues it); each line is flushed as it is written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row = {"step": state.global_step, **{k: _finite(v) for k, v in logs.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


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
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({k: _finite(v) for k, v in r.items()}) + "\n" for r in rows))


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``log.jsonl`` / ``scored_completions.jsonl`` file (a truncated last line is dropped)."""
    path = Path(path)
    if not path.exists():
        return []
    return [row for _, row in read_jsonl(path, skip_truncated_tail=True)]
