"""Read a run folder (what :func:`cpr.training.experiment.run_experiment` writes): status, config, the phases'
logs on one global step axis, the final evaluation's metrics. Never loads a model or torch.

Status: ``finished`` or ``diverged`` (a divergence guard stopped it), as ``summary.json`` says;
``unfinished`` (a ``config.yaml``, ``summary.json`` or ``run.log``, but neither of those: running, failed
or killed); ``not started``. A resumed phase's logs hold each step once: the runner cuts them back to the
checkpoint it resumes from (:func:`cpr.training.logs.rollback_logs`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import InputError

__all__ = ["DIVERGED", "FINISHED", "NOT_STARTED", "UNFINISHED", "PhaseLogs", "RunFolder", "read_run"]

FINISHED, DIVERGED, UNFINISHED, NOT_STARTED = "finished", "diverged", "unfinished", "not started"


@dataclass
class PhaseLogs:
    """One phase's rows, each with ``global_step`` = ``offset`` (the earlier phases' steps) + its step:
    ``train`` (``log.jsonl`` rows with ``loss`` or ``reward``), ``scored`` (``scored_completions*.jsonl``
    of every rank; a row's step is the optimizer step its batch trains), ``eval_history`` (the eval
    hook's, accuracy in percent), ``guard_events``; ``last_step`` from ``phase_done.json``, else the log."""

    name: str
    offset: int
    train: list[dict[str, Any]] = field(default_factory=list)
    scored: list[dict[str, Any]] = field(default_factory=list)
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    guard_events: list[dict[str, Any]] = field(default_factory=list)
    last_step: int = 0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at line {e.lineno})", path=path) from None


def _global(rows: list[dict[str, Any]], offset: int) -> list[dict[str, Any]]:
    return [{**r, "global_step": offset + r["step"] if isinstance(r.get("step"), int) else None} for r in rows]


@dataclass
class RunFolder:
    """A run folder (:func:`read_run`): ``status``, ``summary.json`` and ``config.yaml`` (``None``: absent)."""

    path: Path
    status: str
    summary: dict[str, Any] | None
    config: dict[str, Any] | None

    @property
    def phases(self) -> list[str]:
        """The GRPO phases of the run, in order (``[]`` for a run that trains none)."""
        return [str(p) for p in (self.config or {}).get("phases") or []]

    def phase_logs(self, names: Sequence[str] | None = None) -> list[PhaseLogs]:
        """The logs of the run's phases (all, or those in ``names``) in order; phase k starts where phase
        k-1 ended, one not started gives empty logs. Raises InputError naming a malformed file and line."""
        from cpr.training.logs import read_log

        out, offset = [], 0
        for name in self.phases:
            folder = self.path / name
            log = read_log(folder / "log.jsonl")
            done = _read_json(folder / "phase_done.json") or {}
            last = done.get("steps") if isinstance(done.get("steps"), int) else max(
                (r["step"] for r in log if isinstance(r.get("step"), int)), default=0)
            if names is None or name in names:
                train = [r for r in log if ("loss" in r or "reward" in r) and "train_runtime" not in r]
                scored = [r for p in sorted(folder.glob("scored_completions*.jsonl")) for r in read_log(p)]
                out.append(PhaseLogs(name, offset, _global(train, offset), _global(scored, offset),
                                     _global(read_log(folder / "eval_history.jsonl"), offset),
                                     _global(read_log(folder / "guard_events.jsonl"), offset), last))
            offset += last
        return out

    def eval_metrics(self, split: str, benchmark: str = "crystal") -> dict[str, Any] | None:
        """``metrics.json`` of the final evaluation on ``split`` for ``benchmark`` (``None``: not written);
        ConfigError for an unknown split, InputError for a malformed file."""
        from cpr.training.evaluate import final_eval_dir

        return _read_json(final_eval_dir(self.path, split) / benchmark / "metrics.json")

    @property
    def diverged(self) -> dict[str, Any] | None:
        """``summary.json``'s ``diverged`` entry (phase, step, condition, reason) of a diverged run."""
        return (self.summary or {}).get("diverged") or {} if self.status == DIVERGED else None

    @property
    def final_adapter(self) -> str | None:
        """The adapter a finished run ended with (``summary.json``'s ``final_adapter``)."""
        return (self.summary or {}).get("final_adapter") if self.status == FINISHED else None


def read_run(path: str | Path) -> RunFolder:
    """Read a run folder's status, ``summary.json`` and ``config.yaml`` (InputError: malformed); logs on demand."""
    path = Path(path)
    summary = _read_json(path / "summary.json")
    config = None
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise InputError(f"invalid YAML: {' '.join(str(e).split())}", path=path / "config.yaml") from None
    if summary is not None and summary.get("status") in (FINISHED, DIVERGED):
        status = summary["status"]
    elif config is not None or summary is not None or (path / "run.log").is_file():
        status = UNFINISHED
    else:
        status = NOT_STARTED
    return RunFolder(path, status, summary, config)
