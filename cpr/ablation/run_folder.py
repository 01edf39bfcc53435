"""Read a run folder: status, the phases' logs, scored completions and evaluation metrics.

A run folder is what :func:`cpr.training.runner.run_experiment` writes (see its module
docstring), or what the ablation writes for its ``base`` and ``sft`` entries (the same
``config.yaml``, ``summary.json`` and ``final_eval/<benchmark>/metrics.json``, no phases).
Evaluations are where the final evaluation writes them (:func:`cpr.training.evaluate.final_eval_dir`:
``final_eval/<benchmark>`` for test, ``final_eval/validation/<benchmark>`` for validation); folders
written before validation scores moved there keep them in ``ablation_eval/validation``, which is
still read. Reading never loads a model and never imports torch, so tables can be built anywhere.

Status of a run:

* ``finished``: ``summary.json`` says ``"status": "finished"``;
* ``diverged``: a divergence guard with action ``stop`` ended the run (``summary.json`` status
  ``"diverged"``, its ``diverged`` entry says where and why; :mod:`cpr.training.guards`): a result,
  not something to resume;
* ``unfinished``: the folder holds a ``config.yaml`` or ``run.log`` but no finished or diverged
  summary (still running, failed, or killed: ``summary.json``'s own status, when there is one,
  is kept in :attr:`RunFolder.summary`);
* ``not started``: no such folder, or nothing of a run in it.

Restarts (``--resume``): the runner cuts a phase's logs back to the checkpoint it resumes from
(:func:`cpr.training.logs.rollback_logs`), so its logs hold no repeated steps. For logs written
otherwise (appended to by a resumed run without that cut), :func:`drop_superseded` keeps the rows
of the latest attempt: when a row's step goes back (a training log row at a step at or
before the previous training row's, or a scored completion at a step before the previous one's),
the earlier rows from that step on are dropped. A resumed attempt that restarts generation at
exactly the last step the killed attempt scored cannot be told apart from it in
``scored_completions.jsonl`` (its rows carry no attempt id), so those rows count twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import InputError
from cpr.io import read_jsonl

__all__ = [
    "DIVERGED",
    "FINISHED",
    "NOT_STARTED",
    "UNFINISHED",
    "PhaseLogs",
    "RunFolder",
    "classify_log_row",
    "drop_superseded",
    "read_jsonl_rows",
    "read_run",
]

FINISHED = "finished"
DIVERGED = "diverged"
UNFINISHED = "unfinished"
NOT_STARTED = "not started"

#: Where run folders written before ``evaluation.final_splits`` kept their validation scores.
_LEGACY_EVAL_DIRS: dict[str, str] = {"validation": "ablation_eval/validation"}


def read_jsonl_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON lines file (``[]`` when it does not exist; a truncated last line,
    what a killed writer leaves, is dropped).

    Raises:
        InputError: a malformed line (file and line named) or a line that is not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line, row in read_jsonl(path, skip_truncated_tail=True):
        if not isinstance(row, dict):
            raise InputError(f"expected a JSON object, got {type(row).__name__}", path=path, line=line)
        rows.append(row)
    return rows


def classify_log_row(row: dict[str, Any]) -> str:
    """``"train"`` (a training logging step: ``reward`` or ``loss``), ``"eval"`` (the eval hook's
    ``eval_*`` values), ``"final"`` (the trainer's closing ``train_runtime`` row) or ``"other"``."""
    if "train_runtime" in row:
        return "final"
    if "reward" in row or "loss" in row:
        return "train"
    if any(k.startswith("eval_") for k in row):
        return "eval"
    return "other"


def drop_superseded(
    rows: Sequence[dict[str, Any]], *, kind_of: Callable[[dict[str, Any]], str] | None = None, strict: bool = False
) -> list[dict[str, Any]]:
    """Keep the rows of the latest attempt of a resumed phase (module docstring).

    Args:
        rows: rows in file order, each with an integer ``step``.
        kind_of: row -> kind; steps are compared within a kind (default: one kind). Rows of kind
            ``"final"`` / ``"other"`` never mark a restart.
        strict: a restart is a step *below* the previous one of its kind (scored completions,
            where many rows share a step); otherwise *at or below* (one log row per step).

    Returns:
        The kept rows, in file order.
    """
    kind_of = kind_of or (lambda _row: "row")
    out: list[dict[str, Any]] = []
    last: dict[str, int] = {}
    for row in rows:
        step = row.get("step")
        kind = kind_of(row)
        if isinstance(step, int) and kind not in ("final", "other"):
            prev = last.get(kind)
            if prev is not None and (step < prev if strict else step <= prev):
                out = [r for r in out if not (isinstance(r.get("step"), int) and r["step"] >= step)]
                last = {k: v for k, v in last.items() if v < step}
            last[kind] = step
        out.append(row)
    return out


@dataclass
class PhaseLogs:
    """The logs of one phase of a run.

    Attributes:
        name: phase name (its folder).
        offset: global step of the phase's step 0 (the steps of the earlier phases of the run).
        train: training log rows (restart-deduplicated), each with ``global_step = offset + step``.
        eval: the eval hook's rows of ``log.jsonl`` (``eval_<benchmark>/<metric>``), with ``global_step``.
        scored: scored completions of every rank (restart-deduplicated per file), with ``global_step =
            offset + step + 1``: a row's ``step`` is the trainer's global step while the completion was
            scored, one less than the optimizer step it trains (as in the training log).
        eval_history: rows of ``eval_history.jsonl`` (accuracy in percent), with ``global_step``.
        guard_events: rows of ``guard_events.jsonl`` (``{"step", "condition", "action", "reason",
            "values"}``, :class:`cpr.training.guards.GuardEvent`), with ``global_step``.
        last_step: the phase's last step (``phase_done.json``'s ``steps``, else the last logged step, else 0).
    """

    name: str
    offset: int
    train: list[dict[str, Any]] = field(default_factory=list)
    eval: list[dict[str, Any]] = field(default_factory=list)
    scored: list[dict[str, Any]] = field(default_factory=list)
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    guard_events: list[dict[str, Any]] = field(default_factory=list)
    last_step: int = 0


def _with_global(rows: list[dict[str, Any]], offset: int, shift: int = 0) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        step = row.get("step")
        out.append({**row, "global_step": offset + step + shift if isinstance(step, int) else None})
    return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at line {e.lineno})", path=path) from None


@dataclass
class RunFolder:
    """One run folder (read with :func:`read_run`).

    Attributes:
        path: the folder.
        status: ``finished``, ``diverged``, ``unfinished`` or ``not started`` (module docstring).
        summary: ``summary.json`` (``None`` when absent).
        config: ``config.yaml``, the resolved config the run was started with (``None`` when absent).
    """

    path: Path
    status: str
    summary: dict[str, Any] | None
    config: dict[str, Any] | None

    @property
    def phases(self) -> list[str]:
        """The GRPO phases of the run, in order (``[]`` for base / sft entries)."""
        if self.config and isinstance(self.config.get("phases"), list):
            return [str(p) for p in self.config["phases"]]
        if self.summary:
            return [p["phase"] for p in self.summary.get("phases", []) if isinstance(p, dict) and "phase" in p]
        return []

    def _phase_logs(self, name: str, offset: int) -> PhaseLogs:
        folder = self.path / name
        log = drop_superseded(read_jsonl_rows(folder / "log.jsonl"), kind_of=classify_log_row)
        train = [r for r in log if classify_log_row(r) == "train"]
        evals = [r for r in log if classify_log_row(r) == "eval"]
        scored: list[dict[str, Any]] = []
        for path in sorted(folder.glob("scored_completions*.jsonl")):
            scored.extend(drop_superseded(read_jsonl_rows(path), strict=True))
        history = drop_superseded(
            read_jsonl_rows(folder / "eval_history.jsonl"), kind_of=lambda r: str(r.get("benchmark"))
        )
        events = read_jsonl_rows(folder / "guard_events.jsonl")
        done = _read_json(folder / "phase_done.json") if (folder / "phase_done.json").is_file() else {}
        if isinstance(done.get("steps"), int):
            last = done["steps"]
        else:
            last = max((r["step"] for r in log if isinstance(r.get("step"), int)), default=0)
        return PhaseLogs(
            name=name,
            offset=offset,
            train=_with_global(train, offset),
            eval=_with_global(evals, offset),
            scored=_with_global(scored, offset, shift=1),
            eval_history=_with_global(history, offset),
            guard_events=_with_global(events, offset),
            last_step=last,
        )

    def phase_logs(self, names: Sequence[str] | None = None) -> list[PhaseLogs]:
        """The logs of the run's phases in training order (all of them, or those in ``names``),
        with global steps counted across phases (phase k starts where phase k-1 ended).
        Phases that have not started give empty logs.

        Raises:
            InputError: a malformed log file (file and line named).
        """
        out = []
        offset = 0
        for name in self.phases:
            logs = self._phase_logs(name, offset)
            offset += logs.last_step
            if names is None or name in names:
                out.append(logs)
        return out

    def eval_metrics(self, split: str, benchmark: str = "crystal") -> dict[str, Any] | None:
        """The metrics dict of the run's evaluation on ``split`` (``test`` or ``validation``) for
        ``benchmark``, or ``None`` when that evaluation has not been written.

        Raises:
            InputError: an unknown split (a :class:`~cpr.errors.ConfigError`), or a malformed ``metrics.json``.
        """
        from cpr.training.evaluate import final_eval_dir

        paths = [final_eval_dir(self.path, split) / benchmark / "metrics.json"]
        if split in _LEGACY_EVAL_DIRS:
            paths.append(self.path / _LEGACY_EVAL_DIRS[split] / benchmark / "metrics.json")
        path = next((p for p in paths if p.is_file()), None)
        return _read_json(path) if path is not None else None

    @property
    def diverged(self) -> dict[str, Any] | None:
        """``summary.json``'s ``diverged`` entry (phase, step, condition, reason, checkpoint) of a
        run a divergence guard stopped, else ``None``."""
        if self.status != DIVERGED:
            return None
        return (self.summary or {}).get("diverged") or {}

    @property
    def final_adapter(self) -> str | None:
        """The adapter the run ended with (``summary.json``'s ``final_adapter``), if finished."""
        return (self.summary or {}).get("final_adapter")


def read_run(path: str | Path) -> RunFolder:
    """Read the status, summary and resolved config of a run folder (logs are read on demand).

    Raises:
        InputError: a malformed ``summary.json`` or ``config.yaml``.
    """
    path = Path(path)
    summary = _read_json(path / "summary.json") if (path / "summary.json").is_file() else None
    config = None
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise InputError(f"invalid YAML: {e}", path=path / "config.yaml") from None
    if summary is not None and summary.get("status") in (FINISHED, DIVERGED):
        status = summary["status"]
    elif config is not None or summary is not None or (path / "run.log").is_file():
        status = UNFINISHED
    else:
        status = NOT_STARTED
    return RunFolder(path=path, status=status, summary=summary, config=config)
