"""Run an experiment: warm start, the GRPO phases, checkpoint selection, final evaluation.

:func:`run_experiment` is what ``recipes/cpr_curriculum.py`` and ``cpr train`` call; it orchestrates
the pieces of :mod:`cpr.training`:

* :mod:`~cpr.training.preflight`: are the model and the step encoder available (before anything loads);
* :mod:`~cpr.training.policy`: the model (``tiny:`` models built), loading, LoRA adapters;
* :mod:`~cpr.training.warm_start`: the supervised LoRA warm start;
* :mod:`~cpr.training.phase`: one GRPO phase (:mod:`~cpr.training.guards`: divergence guards;
  :mod:`~cpr.training.checkpoints`: markers and resume; :mod:`~cpr.training.logs`: JSON lines logs);
* :mod:`~cpr.training.selection`: the best checkpoint of a phase on the validation split;
* :mod:`~cpr.training.evaluate`: the eval hook and the final evaluation;
* :mod:`~cpr.training.oom`: out of memory, explained.

Output folder of a run (``output_dir``)::

    config.yaml                 the resolved config (every default filled in; training_effective:
                                each phase's GRPOConfig values that change the result)
    run.log                     the run's log: cpr's messages, library warnings, every trainer log record
    warm_start/adapter/         supervised LoRA warm start (when enabled)
    <phase>/checkpoint-N/       TRL checkpoints (LoRA adapter, optimizer, trainer and sampler state,
                                guard_state.json, generation_buffer.rank<N>.pt inside a generation
                                batch; checkpoint_complete.json once whole;
                                diverged.json when a guard stopped the phase there)
    <phase>/adapter/            the phase's final LoRA adapter
    <phase>/log.jsonl           every trainer log record (reward, KL, per-reward means, step metrics)
    <phase>/scored_completions.jsonl   one row per completion scored by cpr / step_f1
    <phase>/eval_history.jsonl  the eval hook's validation scores (when evaluation.eval_steps is set)
    <phase>/best_checkpoint.json the eval hook's best step on the validation split (evaluation.metric_for_best)
    <phase>/guard_events.jsonl  divergence-guard events (cpr.training.guards), when any
    <phase>/selection.json      validation scores of each checkpoint and the one picked (select_best)
    <phase>/phase_done.json     written when the phase finished (a resumed run skips it)
    <phase>/abandoned-checkpoint-N-<time>/   checkpoints after the one a resumed run continued from
    final_eval/                 completions, metrics.json and metrics.md on the test split
    final_eval/validation/      the same on the validation split (evaluation.final_splits: [..., validation])
    final_eval/stages/<stage>/  earlier stages scored on the test split (evaluation.compare; cpr.training.report)
    summary.json                what ran, for how long, reward trends, final metrics; ``status`` is
                                running, finished, diverged (with ``diverged``), failed or
                                interrupted (with ``error``)

Every JSON file is written atomically (temporary file, fsync, rename) and every JSON lines file
is appended a batch of lines per ``write`` with fsync (:mod:`cpr.io`), so a kill leaves the
previous version of a file, or at worst a truncated last line that readers drop.

Phases (docs/method.md section 6): each phase trains a LoRA adapter with TRL's ``GRPOTrainer``
(:class:`cpr.curriculum.CurriculumGRPOTrainer`, which only replaces the sampler). A phase
starts from ``init_adapter`` if given, else from the adapter the previous phase handed on
(its best checkpoint on the validation split when ``select_best`` is set, else its final
adapter), else from the warm-start adapter, else from a new LoRA adapter.

Before anything long starts, :func:`run_experiment` checks that the model and the step encoder
can be had (local folder, Hugging Face cache, or a reachable hub: one quick probe, so an
unreachable hub gives one :class:`~cpr.errors.ModelNotAvailableError` naming the config key instead
of minutes of retries) and loads the encoder, then loads the data and the templates and resolves the
model (:func:`check_before_training`); with ``overwrite``, a previous run in ``output_dir`` is deleted
only after all of this has passed. Out of memory in training, generation, the encoder or
an evaluation becomes a :class:`cpr.training.oom.TrainingOutOfMemoryError` naming the settings to
lower. The divergence guards (``guards:``, :mod:`cpr.training.guards`) end a phase with
:class:`cpr.training.guards.TrainingDivergedError` when their action is ``stop``.

Resume (``resume=True``): finished phases are skipped (their hand-over adapter is re-read),
and the current phase continues from its last *complete*, not diverged checkpoint
(:func:`cpr.training.checkpoints.last_checkpoint`) with TRL's ``resume_from_checkpoint`` (adapter,
optimizer, scheduler, RNG states, the curriculum position and the guard counters). Before it
continues, the phase's JSON lines logs are cut back to that checkpoint
(:func:`cpr.training.logs.rollback_logs`) and later checkpoint folders (incomplete or diverged) are
renamed ``abandoned-checkpoint-N-<time>``, so the resumed run never mixes with the lost interval.

Exact resume: every phase samples its prompts with :class:`cpr.curriculum.CurriculumSampler`
(``schedule: none`` included: the same order as TRL's ``RepeatSampler``, but one that continues
correctly past an epoch boundary on resume), and the checkpoint restores the torch / numpy /
Python RNG states that TRL's generation samples from. On CPU with a fixed thread count
(``torch_threads``) a killed and resumed run reproduces the uninterrupted run's adapter
weights and prompt order exactly (tests/test_reliability_resume.py), also from a checkpoint
inside a generation batch (:class:`cpr.training.guards.GenerationStateCallback` restores
TRL's micro-step counter and buffered completions). GPU kernels are not bitwise deterministic unless
``training.full_determinism: true`` (transformers' ``enable_full_determinism``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cpr.io import atomic_write_json, atomic_write_text
from cpr.training.checkpoints import DIVERGED_MARKER, adapter_folder
from cpr.training.config import EVAL_SPLITS, ExperimentConfig
from cpr.training.splits import load_splits

logger = logging.getLogger("cpr.training")

__all__ = [
    "check_before_training",
    "check_resumed_config",
    "claim_output_dir",
    "delete_previous_run",
    "previous_run",
    "run_experiment",
]


def run_experiment(
    cfg: ExperimentConfig, *, resume: bool = False, overwrite: bool = False, callbacks: Sequence[Any] = ()
) -> dict[str, Any]:
    """Run every phase of ``cfg`` and return the summary (also written to ``summary.json``).

    Args:
        cfg: a validated config (:func:`cpr.training.config.load_config`).
        resume: continue the run in ``cfg.output_dir`` (see the module docstring).
        overwrite: delete a previous run in ``cfg.output_dir`` (as transformers'
            ``overwrite_output_dir`` did), once every check before training has passed
            (:func:`check_before_training`; a failing check leaves the previous run untouched).
            Without it (and without ``resume``) a folder that holds a previous run is refused, so a
            fresh run never mixes its logs, checkpoints or final completions with an older run's.
        callbacks: extra ``transformers.TrainerCallback`` objects added to every GRPO phase's trainer
            (before the checkpoint completion marker).

    ``summary.json`` is rewritten after each phase and at the end (status ``"finished"``); when
    the run ends early its status says how: ``"diverged"`` (with ``diverged``: phase, step,
    condition, reason, checkpoint), ``"failed"`` or ``"interrupted"`` (with ``error``). With
    ``evaluation.final``, it holds the final evaluation of each split of ``evaluation.final_splits``
    (``final_eval``: test, ``final_eval_validation``: validation; ``{benchmark: overall}``).

    Raises:
        ConfigError / InputError: invalid config or data (before any model is loaded); ``output_dir``
            holds a previous run and neither ``resume`` nor ``overwrite`` is set.
        ModelNotAvailableError: the model or encoder is neither local nor downloadable (checked
            before the data and the model load).
        TrainingDivergedError: a divergence guard with action ``stop`` ended a phase
            (:mod:`cpr.training.guards`); it carries the summary.
        TrainingOutOfMemoryError: out of memory, naming the settings to lower.
    """
    import torch

    from cpr.distributed import process_state
    from cpr.training.evaluate import final_evaluation, summary_entries
    from cpr.training.guards import TrainingDivergedError
    from cpr.training.logs import close_run_log, open_run_log
    from cpr.training.phase import check_launch_settings, resolved_config, train_phase
    from cpr.training.report import chance_accuracy, compare_stages, phase_bucket_mixes
    from cpr.training.selection import select_best
    from cpr.training.warm_start import run_warm_start

    check_launch_settings(cfg)  # before the process group forms: every process refuses alike
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    state = process_state()
    out = Path(cfg.output_dir)
    checked = None
    if claim_output_dir(out, resume=resume, overwrite=overwrite, state=state):
        checked = check_before_training(cfg, state)  # nothing of the previous run is touched before this passed
        delete_previous_run(out, state)
    handler = open_run_log(out, write=state.is_main_process)
    t_start = time.time()
    summary: dict[str, Any] = {
        "run_name": cfg.run_name,
        "output_dir": str(out),
        "model": cfg.model.name_or_path,
        "phases": [],
        "status": "running",
    }

    def write_summary() -> None:
        summary["wall_time_s"] = round(time.time() - t_start, 1)
        if state.is_main_process:
            atomic_write_json(out / "summary.json", summary)

    try:
        if resume:
            check_resumed_config(out, cfg)
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "config.yaml", yaml.safe_dump(resolved_config(cfg), sort_keys=False, allow_unicode=True))
        logger.info("run %s -> %s (torch threads: %d)", cfg.run_name, out.resolve(), torch.get_num_threads())
        splits, templates, model_path = checked or check_before_training(cfg, state)
        logger.info("data: %s", splits.counts())
        logger.info("model: %s", model_path)
        summary["data"] = splits.counts()

        handover: Path | None = None
        if cfg.warm_start.enabled:
            handover = run_warm_start(
                cfg, splits, out / "warm_start", templates=templates, model_path=model_path, resume=resume
            )
            summary["warm_start_adapter"] = str(handover)

        for name in cfg.phases:
            phase = cfg.phase(name)
            phase_dir = out / name
            done_file = phase_dir / "phase_done.json"
            if resume and done_file.is_file():
                done = json.loads(done_file.read_text(encoding="utf-8"))
                logger.info("phase %s: already finished, skipping", name)
                summary["phases"].append(done)
                handover = Path(done["handover_adapter"])
                continue
            init = Path(phase.init_adapter) if phase.init_adapter else handover
            result = train_phase(cfg, phase, splits, templates, model_path, init, resume, callbacks)
            if result.get("status") == "diverged":
                d = result["diverged"]
                summary["phases"].append(result)
                summary["status"] = "diverged"
                summary["diverged"] = d
                write_summary()
                where = f"checkpoint {d['checkpoint']} is marked {DIVERGED_MARKER}" if d["checkpoint"] else "no checkpoint"
                raise TrainingDivergedError(
                    f"phase {name} diverged at step {d['step']}: {d['reason']} (guard {d['condition']}, action stop); "
                    f"{where}; {out / 'summary.json'} has status 'diverged'",
                    event=d,
                    checkpoint=d["checkpoint"],
                    summary=summary,
                )
            if phase.select_best:
                selection = select_best(cfg, phase, splits, templates, model_path)
                result["selection"] = selection
                handover = adapter_folder(Path(selection["picked"]), field=f"{name} selection.json picked")
            else:
                handover = Path(result["adapter"])
            result["handover_adapter"] = str(handover)
            summary["phases"].append(result)
            if state.is_main_process:
                atomic_write_json(done_file, result)
            write_summary()

        summary["final_adapter"] = str(handover) if handover else None
        if cfg.evaluation.final:
            results = final_evaluation(
                cfg, splits, adapter=handover, run_dir=out, label=cfg.run_name, templates=templates,
                model_path=model_path, skip_empty=True, echo=True,
            )
            summary.update(summary_entries(results))
            if cfg.evaluation.compare:  # the closing table: earlier stages beside the final adapter
                summary["chance_accuracy"] = chance_accuracy(splits.test)
                summary["comparison"] = compare_stages(cfg, splits, summary, out, templates=templates,
                                                       model_path=model_path)
        summary["bucket_mix"] = phase_bucket_mixes(out, summary, splits.train)
        summary["status"] = "finished"
        write_summary()
        if state.is_main_process:
            _print_summary(summary)
        return summary
    except TrainingDivergedError:
        raise
    except BaseException as e:
        summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        text = " ".join(str(e).split()) or type(e).__name__
        summary["error"] = f"{type(e).__name__}: {text}"[:2000]
        with contextlib.suppress(OSError):
            write_summary()
        raise
    finally:
        close_run_log(handler)


#: Files and folders whose presence means ``output_dir`` holds a run (what the runner writes first).
_RUN_MARKERS = ("config.yaml", "summary.json", "run.log")


def previous_run(out: Path) -> str | None:
    """What in ``out`` shows it holds a run (a file of :data:`_RUN_MARKERS`), or ``None``."""
    for name in _RUN_MARKERS:
        if (out / name).exists():
            status = ""
            if name == "summary.json":
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    status = f" (status {json.loads((out / name).read_text(encoding='utf-8')).get('status')!r})"
            return f"{out / name}{status}"
    return None


def _differences(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in list(old) + [k for k in new if k not in old]:
            out += _differences(old.get(k), new.get(k), f"{key}.{k}" if key else str(k))
        return out
    return [] if old == new else [(key, old, new)]


def check_resumed_config(out: Path, cfg: ExperimentConfig) -> None:
    """Refuse to resume the run in ``out`` with a config that differs from the one it was started
    with (its ``config.yaml``): the finished phases and checkpoints were made with the old values,
    so mixing them would leave a run whose ``config.yaml`` describes neither.

    Raises:
        ConfigError: naming the first differing key, its old and new value, and how many more differ.
    """
    from cpr.errors import ConfigError

    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return
    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
    current = yaml.safe_load(yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
    # training_effective is derived (the GRPOConfig values of the config under the installed TRL)
    diffs = [d for d in _differences(saved, current) if d[0] != "config_path" and d[0].split(".")[0] != "training_effective"]
    if diffs:
        key, old, new = diffs[0]
        more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
        raise ConfigError(
            f"--resume with a config that differs from the run's {saved_path}: {key} was {old!r}, now {new!r}{more}; "
            "resume with the config the run started with, or start over (--overwrite or another output_dir)",
            field=key,
        )


def _failed_without_output(out: Path) -> bool:
    """``out`` holds only what a run that failed before training wrote (config.yaml, run.log and a
    summary.json with status failed or interrupted): nothing there is worth keeping."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if "summary.json" not in names or not names <= set(_RUN_MARKERS):
        return False
    try:
        status = json.loads((out / "summary.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError, AttributeError):
        return False
    return status in ("failed", "interrupted")


def claim_output_dir(out: Path, *, resume: bool, overwrite: bool, state: Any) -> bool:
    """Refuse a previous run in ``out`` before a fresh run starts, or tell the caller to replace it
    (used by :func:`run_experiment` and :func:`cpr.ablation.sft_baseline.run_sft_baseline`).

    Nothing is deleted here: with ``overwrite`` (or a folder holding only a run that failed before
    training) the caller first runs :func:`check_before_training`, then :func:`delete_previous_run`,
    so a bad config, data file, model or adapter leaves the previous run as it was. Every rank
    looks before any rank writes (a barrier follows the look), so all ranks raise or none does.

    Returns:
        Whether ``out`` holds a run to delete once the checks have passed.

    Raises:
        ConfigError: ``out`` holds a run and ``overwrite`` is not set; or ``overwrite`` would delete
            the working directory or a folder above it.
    """
    if resume:
        return False
    from cpr.errors import ConfigError

    found = previous_run(out)
    if found and _failed_without_output(out):
        logger.info("replacing %s: a run that failed before it trained anything", found)
        overwrite = True
    state.wait_for_everyone()
    if found and not overwrite:
        raise ConfigError(
            f"{out} already holds a run ({found}): pass --resume to continue it, --overwrite to delete it "
            "and start over, or choose another output_dir",
            field="output_dir",
        )
    if found:
        here, target = Path.cwd().resolve(), out.resolve()
        if target == here or target in here.parents:
            raise ConfigError(
                f"--overwrite would delete {target}, which holds the working directory: choose an output_dir "
                "of its own",
                field="output_dir",
            )
    return bool(found)


def delete_previous_run(out: Path, state: Any) -> None:
    """Delete the run in ``out`` (main process) once every process has got here, i.e. passed its
    :func:`check_before_training` (a process whose check failed raised and never arrives)."""
    state.wait_for_everyone()
    if state.is_main_process:
        import shutil

        logger.warning("overwrite: deleting the previous run in %s", out)
        shutil.rmtree(out)
    state.wait_for_everyone()


def check_before_training(cfg: ExperimentConfig, state: Any, *, grpo: bool = True) -> tuple[Any, Any, str]:
    """Everything about a run that can be checked before anything trains: the model and the step
    encoder can be had (:func:`cpr.training.preflight.preflight`, which loads the encoder), the data
    load and validate, the prompt templates load, the model resolves (a ``tiny:`` model is built),
    each phase's ``init_adapter`` was trained on that model (:func:`cpr.training.policy.check_base`)
    and, with ``grpo`` (not for the SFT baseline), the warm start's settings and each phase's
    ``trl.GRPOConfig`` pass their own checks.

    Returns:
        ``(splits, templates, model_path)``.

    Raises:
        ModelNotAvailableError, InputError, ConfigError: as the checks raise them.
    """
    from cpr.data import load_templates
    from cpr.training.phase import grpo_config
    from cpr.training.policy import check_base, resolve_model_path
    from cpr.training.preflight import preflight
    from cpr.training.warm_start import warm_start_settings

    if grpo:
        for name in cfg.phases:
            grpo_config(cfg, cfg.phase(name))
        if cfg.warm_start.enabled:
            warm_start_settings(cfg)
    preflight(cfg, str(state.device))
    splits = load_splits(cfg.data)
    templates = load_templates(cfg.data.prompts)
    model_path = resolve_model_path(cfg, splits)
    for name in cfg.phases:
        if cfg.phase(name).init_adapter:
            check_base(cfg.phase(name).init_adapter, model_path, cfg, field=f"phase_settings.{name}.init_adapter")
    return splits, templates, model_path


def _print_summary(summary: dict[str, Any]) -> None:
    from cpr.training.evaluate import final_eval_key
    from cpr.training.report import closing_lines

    lines = [f"run {summary['run_name']} finished in {summary['wall_time_s']} s -> {summary['output_dir']}"]
    for p in summary["phases"]:
        t = p.get("reward_trend", {})
        lines.append(
            f"  phase {p['phase']}: {p['steps']} steps in {p['wall_time_s']} s; reward first 10% "
            f"{t.get('first', math.nan):.3f} -> last 10% {t.get('last', math.nan):.3f}; "
            f"frac_reward_zero_std {p.get('frac_reward_zero_std', math.nan):.2f}"
        )
        if "selection" in p:
            lines.append(f"    selected {p['selection']['picked']}")
    for split in EVAL_SPLITS:
        for name, overall in (summary.get(final_eval_key(split)) or {}).items():
            keys = [k for k in ("accuracy", "match_f1", "precision", "recall", "steps", "lis", "ordered_f1") if k in overall]
            lines.append(f"  {split} {name}: " + ", ".join(f"{k} {overall[k]:.3f}" for k in keys))
    print("\n".join(lines + closing_lines(summary)))
