"""Run an experiment, step by step, as :func:`run_experiment` (``cpr train``, the ablation sweep) and
``recipes/cpr_curriculum.py`` do. A phase starts from its ``init_adapter``, else the adapter the previous phase
handed on, else the warm start's, else a new one. The run folder, ``--resume`` and Ctrl-C: docs/training.md, "The
run folder" and "Divergence guards, resume and failures".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import ConfigError, RunInterrupted
from cpr.io import atomic_write_json, atomic_write_text
from cpr.training.checkpoints import DIVERGED_MARKER, adapter_folder, last_checkpoint
from cpr.training.config import config_from_dict
from cpr.training.config_sections import EVAL_SPLITS, ExperimentConfig
from cpr.training.splits import load_run_data

logger = logging.getLogger("cpr.training")


def run_experiment(cfg: ExperimentConfig, *, resume: bool = False, overwrite: bool = False,
                   callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Run every phase of ``cfg`` and return the summary (also ``summary.json``, rewritten after each phase; with
    ``evaluation.final``, ``final_eval`` / ``final_eval_validation``: ``{benchmark: overall}``). ``overwrite``
    deletes a previous run once :func:`check_before_training` passed; ``callbacks`` go to every phase's trainer.

    Raises:
        ConfigError / InputError: invalid config or data (before any model loads), or a refused ``output_dir``.
        ModelNotAvailableError: the model or encoder is neither local nor downloadable.
        TrainingDivergedError / TrainingOutOfMemoryError: a guard stopped a phase / out of memory.
        DiskFullError: no space left in ``output_dir``.
    """
    from cpr.training.build import build_phases

    phases = build_phases(cfg)  # each phase's GRPOConfig, reward functions and weights, curriculum
    with open_run(cfg, phases, resume=resume, overwrite=overwrite) as run:
        load_data(run)
        handover = warm_start(run)
        for spec in phases.values():
            if (done := finished_phase(run, spec)) is not None:  # --resume: a phase that finished before
                handover = done
                continue
            result = train_phase(run, spec, handover, callbacks)
            best = select_best(run, spec, result)
            handover = hand_over(run, spec, result, best)
        final_evaluation(run, handover)
        return close(run)


@dataclass
class Run:
    """What the steps of one run share (:func:`open_run` makes it); ``stage`` is the step running now (named when
    interrupted); :func:`load_data` sets ``splits``, ``templates`` and ``model_path``."""

    cfg: ExperimentConfig
    phases: Mapping[str, Any]
    out: Path
    state: Any
    resume: bool
    checked: Any = None  # what check_before_training returned when the launch ran it
    splits: Any = None
    templates: Any = None
    model_path: str = ""
    t_start: float = field(default_factory=time.time)
    summary: dict[str, Any] = field(init=False)
    stage: str = "setup"

    def __post_init__(self) -> None:
        self.summary = {"run_name": self.cfg.run_name, "output_dir": str(self.out), "model": self.cfg.model.name_or_path,
                        "phases": [], "status": "running"}

    def write_summary(self) -> None:
        """``summary.json`` (main process), with the wall time so far."""
        self.summary["wall_time_s"] = round(time.time() - self.t_start, 1)
        if self.state.is_main_process:
            atomic_write_json(self.out / "summary.json", self.summary)


@contextlib.contextmanager
def open_run(cfg: ExperimentConfig, phases: Mapping[str, Any], *, resume: bool = False, overwrite: bool = False
             ) -> Iterator[Run]:
    """Open the run in ``cfg.output_dir`` for the steps inside the ``with`` (launch checked, folder locked and
    claimed, ``run.log`` opened, ``config.yaml`` written); a failure inside is written into ``summary.json``
    (status ``failed``, or ``interrupted`` for Ctrl-C; a diverged phase wrote its own).

    Raises:
        ConfigError: a refused ``output_dir`` or resumed config (before anything of a previous run is touched).
        RunInterrupted: Ctrl-C inside.
        DiskFullError: a failure inside that a full disk caused.
    """
    from cpr.io import unlock_file
    from cpr.training.diskspace import disk_full_error
    from cpr.training.divergence import TrainingDivergedError
    from cpr.training.logs import close_run_log, open_run_log

    state, checked, lock = _launch(cfg, phases, resume=resume, overwrite=overwrite)
    try:
        handler = open_run_log(Path(cfg.output_dir), write=state.is_main_process)
        run = Run(cfg, phases, Path(cfg.output_dir), state, resume, checked)
        try:
            _write_config(run)
            yield run
        except TrainingDivergedError:
            raise
        except BaseException as e:
            _record_failure(run, e)
            if (full := disk_full_error(e, run.out)) is not None:
                raise full from e
            raise
        finally:
            close_run_log(handler)
    finally:
        if lock is not None:
            unlock_file(lock)


def _launch(cfg: ExperimentConfig, phases: Mapping[str, Any], *, resume: bool, overwrite: bool
            ) -> tuple[Any, Any, Any]:
    """Check the launch, form the process group, lock and claim ``output_dir``: ``(state, checked, lock)``."""
    import torch

    from cpr.distributed import check_shared_output_dir, process_state
    from cpr.io import unlock_file
    from cpr.training.preflight import check_launch, process_group_timeout

    check_launch(cfg, phases)
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    state = process_state(timeout_s=process_group_timeout(cfg, phases))
    out = Path(cfg.output_dir)
    created = state.is_main_process and not out.exists()
    lock = lock_run_folder(out) if state.is_main_process else None
    try:
        check_shared_output_dir(out, state)  # multi-node: every rank reads what the main process writes
        checked = None
        if claim_output_dir(out, resume=resume, overwrite=overwrite, state=state):
            checked = check_before_training(cfg, state, phases)  # nothing of the previous run is touched before this passed
            delete_previous_run(out, state)
    except BaseException:
        if lock is not None:
            unlock_file(lock)
            if created:  # a refused run leaves no folder behind
                with contextlib.suppress(OSError):
                    out.rmdir()
        raise
    return state, checked, lock


#: The lock file of a run folder while a run holds it (:func:`lock_run_folder`).
RUN_LOCK = "run.lock"


def lock_run_folder(out: Path) -> Any:
    """Lock the run folder ``out`` (created when missing) for this process: :data:`RUN_LOCK`, a kernel lock
    (:func:`cpr.io.lock_file`, held until :func:`cpr.io.unlock_file`) naming the holder. Raises
    ``ConfigError`` when another run holds ``out``, ``out`` is a file, or it cannot be created or written."""
    import os
    import socket

    from cpr.io import FolderLockedError, lock_file

    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file, not a folder: choose another output_dir", field="output_dir")
    note = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        try:
            return lock_file(out / RUN_LOCK, note)
        except OSError:
            if created:  # nothing left behind
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
    except FolderLockedError as e:
        raise ConfigError(f"{out} is in use by another run ({e.holder or 'unknown process'}, {e.path}): wait for it "
                          "to end or stop it; two runs never write one folder", field="output_dir") from None
    except OSError as e:
        raise ConfigError(f"cannot write into {out}: {e.strerror or e}; choose a writable output_dir",
                          field="output_dir") from None


def _write_config(run: Run) -> None:
    """Refuse a resumed run whose config differs from its ``config.yaml`` (naming the first key), then write it."""
    import torch

    from cpr.training.phase import resolved_config

    if run.resume and (diffs := config_differences(run.out, run.cfg)):
        raise ConfigError(f"--resume with a config that differs from the run's {run.out / 'config.yaml'}: "
                          f"{describe_differences(diffs)}; resume with the config the run started with, or "
                          "start over (--overwrite or another output_dir)", field=diffs[0][0])
    if run.state.is_main_process:
        run.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.out / "config.yaml",
                          yaml.safe_dump(resolved_config(run.cfg, run.phases), sort_keys=False, allow_unicode=True))
    logger.info("run %s -> %s (torch threads: %d)", run.cfg.run_name, run.out.resolve(), torch.get_num_threads())


def load_data(run: Run) -> Any:
    """Load the run's data: ``run.splits`` (returned; their counts go into the summary), ``run.templates`` and
    ``run.model_path``, from :func:`check_before_training` (unless the launch ran it), raising as it does."""
    run.splits, run.templates, run.model_path = run.checked or check_before_training(run.cfg, run.state, run.phases)
    logger.info("data: %s", run.splits.counts())
    logger.info("model: %s", run.model_path)
    run.summary["data"] = run.splits.counts()
    return run.splits


def warm_start(run: Run) -> Path | None:
    """Train the supervised warm start (:func:`cpr.training.warm_start.run_warm_start`, into ``warm_start/``)
    and return its adapter, or ``None`` when ``warm_start.enabled`` is off."""
    from cpr.training.warm_start import run_warm_start

    if not run.cfg.warm_start.enabled:
        return None
    run.stage = "warm_start"
    adapter = run_warm_start(run.cfg, run.splits, run.out / "warm_start", templates=run.templates,
                             model_path=run.model_path, resume=run.resume)
    run.summary["warm_start_adapter"] = str(adapter)
    return adapter


def finished_phase(run: Run, spec: Any) -> Path | None:
    """With ``resume``, the adapter phase ``spec`` handed over when it finished before (its ``phase_done.json``,
    back into the summary); ``None`` when it is to be trained."""
    done_file = run.out / spec.name / "phase_done.json"
    if not (run.resume and done_file.is_file()):
        return None
    logger.info("phase %s: already finished, skipping", spec.name)
    run.summary["phases"].append(json.loads(done_file.read_text(encoding="utf-8")))
    return Path(run.summary["phases"][-1]["handover_adapter"])


def train_phase(run: Run, spec: Any, handover: Path | None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train phase ``spec`` from its ``init_adapter``, else ``handover`` (``None``: a new one); its result goes into
    the summary and is returned. Raises ``TrainingDivergedError`` (status ``diverged``) when a guard stopped it."""
    from cpr.training import phase
    from cpr.training.divergence import TrainingDivergedError

    run.stage = spec.name
    result = phase.train_phase(run.cfg, spec, run.splits, run.templates, run.model_path, spec.init_adapter or handover,
                               run.resume, callbacks)
    run.summary["phases"].append(result)
    if result.get("status") == "diverged":
        d = run.summary["diverged"] = result["diverged"]
        run.summary["status"] = "diverged"
        run.write_summary()
        where = f"checkpoint {d['checkpoint']} is marked {DIVERGED_MARKER}" if d["checkpoint"] else "no checkpoint"
        raise TrainingDivergedError(f"phase {spec.name} diverged at step {d['step']}: {d['reason']} (guard "
                                    f"{d['condition']}, action stop); {where}; {run.out / 'summary.json'} "
                                    "has status 'diverged'",
                                    event=d, checkpoint=d["checkpoint"], summary=run.summary)
    return result


def select_best(run: Run, spec: Any, result: dict[str, Any]) -> Path:
    """The adapter phase ``spec`` hands on: with ``select_best``, its best checkpoint on the validation split
    (:func:`cpr.training.selection.select_best`), installed as the phase's ``adapter/``
    (:func:`cpr.training.selection.install_selected`); else its final adapter. Raises ``ConfigError`` when the
    picked checkpoint holds no LoRA adapter."""
    from cpr.training import selection

    if not spec.phase.select_best:
        return Path(result["adapter"])
    result["selection"] = selection.select_best(run.cfg, spec.phase, run.splits, run.templates, run.model_path)
    picked = adapter_folder(Path(result["selection"]["picked"]), field=f"{spec.name} selection.json picked")
    if run.state.is_main_process:
        result.update(selection.install_selected(run.out / spec.name, picked, result["steps"]) or {})
    run.state.wait_for_everyone()
    return picked


def hand_over(run: Run, spec: Any, result: dict[str, Any], adapter: Path) -> Path:
    """Record ``adapter`` as what phase ``spec`` hands over (``phase_done.json``) and rewrite the summary."""
    result["handover_adapter"] = str(adapter)
    if run.state.is_main_process:
        atomic_write_json(run.out / spec.name / "phase_done.json", result)
    run.write_summary()
    return adapter


def final_evaluation(run: Run, adapter: Path | None) -> None:
    """Score the final ``adapter`` (``None``: the model as loaded) with ``evaluation.final`` (into ``final_eval/``
    and the summary), and with ``evaluation.compare`` the earlier stages beside it."""
    from cpr.training import evaluate
    from cpr.training.report import chance_accuracy, compare_stages

    cfg, summary = run.cfg, run.summary
    summary["final_adapter"] = str(adapter) if adapter else None
    run.stage = "final evaluation"
    if not cfg.evaluation.final:
        return
    results = evaluate.final_evaluation(cfg, run.splits, adapter=adapter, run_dir=run.out, label=cfg.run_name,
                                        templates=run.templates, model_path=run.model_path, skip_empty=True, echo=True)
    summary.update(evaluate.summary_entries(results))
    if cfg.evaluation.compare:  # the closing table: earlier stages beside the final adapter
        summary["chance_accuracy"] = chance_accuracy(run.splits.test)
        summary["comparison"] = compare_stages(cfg, run.splits, summary, run.out, templates=run.templates,
                                               model_path=run.model_path)


def close(run: Run) -> dict[str, Any]:
    """Finish the summary (bucket mixes, status ``finished``), print it with the closing table and return it."""
    from cpr.training.report import phase_bucket_mixes

    run.summary["bucket_mix"] = phase_bucket_mixes(run.out, run.summary, run.splits.train)
    run.summary["status"] = "finished"
    run.write_summary()
    if run.state.is_main_process:
        _print_summary(run.summary)
    return run.summary


def _record_failure(run: Run, e: BaseException) -> None:
    """Write ``summary.json`` with status ``failed`` / ``interrupted``; raises RunInterrupted on Ctrl-C."""
    run.summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
    run.summary["error"] = f"{type(e).__name__}: {' '.join(str(e).split()) or type(e).__name__}"[:2000]
    with contextlib.suppress(OSError):
        run.write_summary()
    if isinstance(e, KeyboardInterrupt):
        if run.state.is_main_process:
            if run.stage not in ("setup", "final evaluation"):  # the trainer's progress bar stops mid-line
                print(file=sys.stderr, flush=True)
            ckpt = last_checkpoint(run.out / run.stage) if run.stage not in ("setup", "final evaluation") else None
            where = f"{run.stage} (last complete checkpoint {ckpt})" if ckpt else run.stage
            logger.warning("interrupted (Ctrl-C) during %s; everything written so far is kept in %s; continue "
                           "with: %s", where, run.out, resume_command(run.state.num_processes))
        raise RunInterrupted(str(e)) from None


def resume_command(num_processes: int = 1, argv: Sequence[str] | None = None) -> str:
    """The command line that continues this process's run: ``argv`` (default ``sys.argv``) without ``--overwrite``,
    with ``--resume``; a distributed run (``num_processes`` > 1) is started again by its launcher."""
    import shlex

    argv = list(sys.argv if argv is None else argv)
    head = ["python", argv[0]] if argv and argv[0].endswith(".py") else [Path(argv[0]).name] if argv else ["cpr", "train"]
    rest = [a for a in argv[1:] if a not in ("--overwrite", "--resume")]
    line = shlex.join([*head, *rest, "--resume"])
    return f"{line} (under the same launcher, {num_processes} processes)" if num_processes > 1 else line


#: Files whose presence means ``output_dir`` holds a run (what the runner writes first).
_RUN_MARKERS = ("config.yaml", "summary.json", "run.log")


def _status(out: Path) -> Any:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return json.loads((out / "summary.json").read_text(encoding="utf-8")).get("status")
    return None


def previous_run(out: Path) -> str | None:
    """What in ``out`` shows it holds a run (a file of :data:`_RUN_MARKERS`, with the summary's status), or ``None``."""
    for name in _RUN_MARKERS:
        if (out / name).exists():
            return f"{out / name}" + (f" (status {_status(out)!r})" if name == "summary.json" else "")
    return None


def _differences(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [d for k in keys for d in _differences(old.get(k), new.get(k), f"{key}.{k}" if key else str(k))]
    return [] if old == new else [(key, old, new)]


def config_differences(out: Path, cfg: ExperimentConfig) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in the run's config.yaml, value in cfg)`` for each setting in which ``cfg`` differs
    from the config the run in ``out`` was made with (none without ``config.yaml``; ``training_effective`` is
    not compared). The saved config is read through today's schema first (defaults for settings it lacks), else
    compared as written."""
    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return []

    def plain(c: ExperimentConfig) -> dict:
        return yaml.safe_load(yaml.safe_dump(c.to_dict(), sort_keys=False, allow_unicode=True))

    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
    try:
        saved = plain(config_from_dict(saved, config_path=cfg.config_path))
    except ConfigError as e:
        logger.info("comparing %s as written (today's schema refuses it: %s)", saved_path, e)
    return [d for d in _differences(saved, plain(cfg)) if d[0] != "config_path" and d[0].split(".")[0] != "training_effective"]


def describe_differences(diffs: list[tuple[str, Any, Any]]) -> str:
    """The first of :func:`config_differences` in words: "<key> was <old>, now <new> (and N more)"."""
    key, old, new = diffs[0]
    return f"{key} was {old!r}, now {new!r}" + (f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else "")


def claim_output_dir(out: Path, *, resume: bool, overwrite: bool, state: Any) -> bool:
    """Whether ``out`` holds a run the caller deletes (:func:`delete_previous_run`) once
    :func:`check_before_training` passed: with ``overwrite``, or when it holds only a run that failed before
    training. The main process looks and broadcasts what it found, so all processes decide alike (on a shared
    filesystem another may still list a file it has just removed), before any writes. Raises ``ConfigError``
    when ``out`` holds a run and ``overwrite`` is not set, ``overwrite`` would delete the working directory or
    a folder above it, or ``resume`` and ``out`` holds no run."""
    from accelerate.utils import broadcast_object_list

    seen: list[Any] = [None]
    if state.is_main_process:
        found = previous_run(out)
        names = {p.name for p in out.iterdir() if p.name != RUN_LOCK} if out.is_dir() else set()
        failed = bool(found and "summary.json" in names and names <= set(_RUN_MARKERS)
                      and _status(out) in ("failed", "interrupted"))
        seen = [(found, failed)]
    if state.num_processes > 1:
        broadcast_object_list(seen, from_process=0)  # also the barrier: every process looks before any writes
    found, failed = seen[0]
    if resume:
        if found is None:
            raise ConfigError(f"--resume: {out} holds no run to continue (no {', '.join(_RUN_MARKERS)}); check the "
                              "output_dir, or start the run without --resume", field="output_dir")
        return False
    if failed:
        logger.info("replacing %s: a run that failed before it trained anything", found)
        overwrite = True
    if found and not overwrite:
        raise ConfigError(f"{out} already holds a run ({found}): pass --resume to continue it, --overwrite to delete "
                          "it and start over, or choose another output_dir", field="output_dir")
    here, target = Path.cwd().resolve(), out.resolve()
    if found and (target == here or target in here.parents):
        raise ConfigError(f"--overwrite would delete {target}, which holds the working directory: choose an "
                          "output_dir of its own", field="output_dir")
    return bool(found)


def delete_previous_run(out: Path, state: Any) -> None:
    """Delete the run in ``out`` (main process) once every process passed its :func:`check_before_training`;
    the lock this run holds (:data:`RUN_LOCK`) stays."""
    state.wait_for_everyone()
    if state.is_main_process:
        logger.warning("overwrite: deleting the previous run in %s", out)
        for entry in [e for e in out.iterdir() if e.name != RUN_LOCK]:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    state.wait_for_everyone()


def check_before_training(cfg: ExperimentConfig, state: Any, phases: Mapping[str, Any] | None = None
                          ) -> tuple[Any, Any, str]:
    """``(splits, templates, model_path)``, once everything that can be checked before training passed (the
    encoder is loaded; ``phases``: none for the SFT baseline). Raises ``ConfigError`` (a phase's
    ``GRPOConfig`` or an ``init_adapter`` of another base), ``ModelNotAvailableError`` (the model or the step
    encoder cannot be had) or ``InputError`` (a dataset that does not load)."""
    from cpr.training.policy import check_base
    from cpr.training.preflight import preflight

    for spec in (phases or {}).values():  # TRL's checks (the warm start's settings were checked with the config)
        spec.args  # noqa: B018 (built once, here)
    preflight(cfg, str(state.device))
    splits, templates = load_run_data(cfg)
    model_path = cfg.model.name_or_path
    for name in cfg.phases:
        if cfg.phase(name).init_adapter:
            check_base(cfg.phase(name).init_adapter, model_path, cfg, field=f"phase_settings.{name}.init_adapter")
    return splits, templates, model_path


def _number(value: Any) -> float:
    """A summary value as a float; NaN for ``None`` (strict JSON's ``null`` for a NaN, :mod:`cpr.io`)."""
    return math.nan if value is None else float(value)


def _print_summary(summary: dict[str, Any]) -> None:
    from cpr.training.evaluate import final_eval_key
    from cpr.training.report import COLUMNS, closing_lines

    lines = [f"run {summary['run_name']} finished in {summary['wall_time_s']} s -> {summary['output_dir']}"]
    for p in summary["phases"]:
        t = p.get("reward_trend") or {}
        lines.append(f"  phase {p['phase']}: {p['steps']} steps in {p['wall_time_s']} s; reward first 10% "
                     f"{_number(t.get('first')):.3f} -> last 10% {_number(t.get('last')):.3f}; "
                     f"frac_reward_zero_std {_number(p.get('frac_reward_zero_std')):.2f}")
        if "selection" in p:
            lines.append(f"    selected {p['selection']['picked']}")
    for split in EVAL_SPLITS:
        for name, overall in (summary.get(final_eval_key(split)) or {}).items():
            keys = [k for _, k, _ in COLUMNS if k in overall]
            lines.append(f"  {split} {name}: " + ", ".join(f"{k} {_number(overall[k]):.3f}" for k in keys))
    print("\n".join(lines + closing_lines(summary)))
