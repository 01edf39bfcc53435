"""Run an ablation: the shared start, each run, the evaluations the table needs, the table and figures.

:func:`run_ablation` is what ``recipes/reward_ablation.py`` and ``cpr ablate`` call. Output folder
(the ablation's ``output_dir``)::

    ablation_plan.json          every run: type, overrides, the equivalent recipe command line
    ablation.log                the ablation's log
    shared_start/               the shared start's run folder (when configured)
    shared_adapter/             a copy of its LoRA adapter: the first phase of every run starts here
    <run>/                      one ordinary run folder per run (run_experiment, or the base / sft entries)
    <run>/final_eval/validation/<benchmark>/   the run's final adapter scored on the validation split
    ablation_weights.{md,json}  or ablation_strategies.{md,json}: the table (cpr.ablation.tables)
    ablation_<kind>.png         bars of the table's columns
    training_dynamics.png       strategies: Match F1 and accuracy against training step (cpr.ablation.figures)

What each run type does: ``grpo`` runs :func:`cpr.training.runner.run_experiment` on the planned
config; ``base`` scores the model (with the configured adapter, if any) on the table's split into
``<run>/final_eval`` (test) or ``<run>/final_eval/validation``
(:func:`cpr.training.evaluate.final_eval_dir`); ``sft`` runs
:func:`cpr.ablation.sft_baseline.run_sft_baseline`. With ``table.split: validation`` the plan adds
``validation`` to the trained runs' ``evaluation.final_splits`` (:mod:`cpr.ablation.plan`), so each
run scores its final adapter on the validation split itself; :func:`evaluate_finished` scores
the finished runs that did not (e.g. runs made before, or with ``--set evaluation.final=false``).

Reruns: a run whose folder holds a finished (or diverged) run is skipped; a folder holding an
unfinished one is an error unless ``resume`` is set (then the run continues: ``run_experiment(resume=True)``).
Evaluations already written are kept. So running the ablation again after an interruption, with
``resume``, finishes what is missing.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpr.ablation.plan import SHARED_START, AblationPlan, PlannedRun, plan_ablation, validate_run
from cpr.ablation.run_folder import DIVERGED, FINISHED, UNFINISHED, read_run
from cpr.ablation.spec import AblationConfig
from cpr.errors import ConfigError
from cpr.io import atomic_write_json

__all__ = ["build_outputs", "ensure_shared_start", "evaluate_finished", "execute_run", "run_ablation"]

logger = logging.getLogger("cpr.ablation")


def _check_folder(run: PlannedRun, resume: bool) -> str:
    status = read_run(run.output_dir).status
    if status == UNFINISHED and not resume:
        raise ConfigError(
            f"{run.output_dir} holds an unfinished run: pass --resume to continue it, or delete the folder",
            field=f"--only {run.name}",
        )
    return status


def ensure_shared_start(plan: AblationPlan, *, resume: bool = False) -> Path | None:
    """Train the shared start unless its adapter is already in ``shared_adapter``; return that folder.

    Raises:
        ConfigError: an unfinished shared start without ``resume``, or a finished one without an adapter.
    """
    if plan.shared_start is None or plan.shared_adapter is None:
        return None
    target = Path(plan.shared_adapter)
    if (target / "adapter_config.json").is_file():
        logger.info("shared start: reusing %s", target)
        return target
    run = plan.shared_start
    exp = validate_run(plan, run)
    kind = plan.config.shared_start.type
    t0 = time.time()
    if kind == "warm_start":
        from cpr.training.warm_start import run_warm_start

        if Path(run.output_dir).exists() and not resume:
            raise ConfigError(f"{run.output_dir} holds an unfinished shared start: pass --resume or delete it",
                              field="shared_start")
        adapter = run_warm_start(exp, None, run.output_dir, resume=resume)
    else:
        from cpr.training.runner import run_experiment

        _check_folder(run, resume)
        summary = run_experiment(exp, resume=resume)
        if not summary.get("final_adapter"):
            raise ConfigError(f"the shared start in {run.output_dir} handed on no adapter", field="shared_start")
        adapter = Path(summary["final_adapter"])
    from cpr.distributed import process_state

    state = process_state()
    if state.is_main_process:
        tmp = target.with_name(target.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(adapter, tmp)
        tmp.rename(target)  # appears whole or not at all
    state.wait_for_everyone()
    logger.info("shared start: %s (%s) in %.1f s -> %s", kind, adapter, time.time() - t0, target)
    return target


def execute_run(plan: AblationPlan, run: PlannedRun, *, resume: bool = False) -> str:
    """Train (or, for ``base``, score) one planned run unless its folder holds a finished or
    diverged one.

    A run that a divergence guard stops (:class:`cpr.training.guards.TrainingDivergedError`) is a
    result of the comparison (the paper's Composite and Answer-Only runs diverge): its folder keeps
    ``summary.json`` with status ``diverged``, the error's message is logged, and the ablation goes
    on with the next run.

    Returns:
        ``"skipped"`` (finished or diverged before), ``"ran"`` or ``"diverged"``.

    Raises:
        ConfigError: an invalid config, a missing shared adapter, or an unfinished folder without ``resume``.
    """
    status = _check_folder(run, resume)
    if status in (FINISHED, DIVERGED):
        logger.info("run %s: %s already, skipping (delete %s to run it again)", run.name, status, run.output_dir)
        return "skipped"
    if run.shared_adapter and not Path(run.shared_adapter, "adapter_config.json").is_file():
        raise ConfigError(
            f"run {run.name!r} starts from the shared adapter {run.shared_adapter}, which does not exist yet: "
            f"run the shared start first (--only {SHARED_START})",
            field="shared_start",
        )
    cfg = validate_run(plan, run)
    logger.info("run %s (%s): starting -> %s", run.name, run.type, run.output_dir)
    if run.type == "grpo":
        from cpr.training.guards import TrainingDivergedError
        from cpr.training.runner import run_experiment

        try:
            run_experiment(cfg, resume=resume)
        except TrainingDivergedError as e:  # recorded in the run's summary.json (status diverged)
            logger.warning("run %s: %s", run.name, e)
            return "diverged"
    elif run.type == "sft":
        from cpr.ablation.sft_baseline import run_sft_baseline

        run_sft_baseline(cfg, resume=resume)
    elif run.type == "base":
        _run_base(plan, run, cfg)
    else:  # pragma: no cover - the planner makes no other type
        raise ConfigError(f"unknown run type {run.type!r}")
    return "ran"


def _run_base(plan: AblationPlan, run: PlannedRun, cfg: Any) -> None:
    import yaml

    from cpr.distributed import process_state
    from cpr.io import atomic_write_text
    from cpr.training.evaluate import final_evaluation

    main = process_state().is_main_process
    out = Path(run.output_dir)
    t0 = time.time()
    if main:
        atomic_write_text(out / "config.yaml", yaml.safe_dump({**cfg.to_dict(), "phases": []}, sort_keys=False))
    split = plan.config.split
    results = final_evaluation(cfg, None, adapter=run.adapter, run_dir=out, label=run.label, on=[split])[split]
    if not main:
        return
    atomic_write_json(out / "summary.json", {
        "run_name": cfg.run_name, "kind": "base", "output_dir": str(out), "model": cfg.model.name_or_path,
        "adapter": run.adapter, "final_adapter": run.adapter, "phases": [], "split": plan.config.split,
        "final_eval": results, "status": "finished", "wall_time_s": round(time.time() - t0, 1),
    })


def evaluate_finished(plan: AblationPlan, runs: Sequence[PlannedRun]) -> list[str]:
    """Score the final adapter of every finished trained run of ``runs`` on the validation split
    when the table reads that split and the run has not scored it itself (module docstring).

    Returns:
        The names of the runs scored now.
    """
    from cpr.training.evaluate import final_evaluation

    split = plan.config.split
    if split != "validation":
        return []
    done = []
    for run in runs:
        if run.type == "base":
            continue
        folder = read_run(run.output_dir)
        if folder.status != FINISHED or folder.eval_metrics(split, plan.config.table.benchmark) is not None:
            continue
        adapter = folder.final_adapter
        if not adapter:
            raise ConfigError(f"finished run {run.name!r} names no final adapter in summary.json",
                              field=f"{run.output_dir}/summary.json")
        cfg = validate_run(plan, run)
        exp = cfg.experiment if run.type == "sft" else cfg
        logger.info("run %s: scoring %s on the validation split", run.name, adapter)
        final_evaluation(exp, None, adapter=adapter, run_dir=run.output_dir, label=run.label, on=[split])
        done.append(run.name)
    return done


def build_outputs(plan: AblationPlan) -> dict[str, Path]:
    """Write the table (JSON, markdown) and figures from whatever the run folders hold.

    Returns:
        ``{"json", "markdown", "table_figure"[, "training_dynamics"]}`` -> path.
    """
    from cpr.ablation.figures import plot_table, plot_training_dynamics
    from cpr.ablation.tables import build_table, write_table

    cfg = plan.config
    out = Path(cfg.output_dir)
    table = build_table(plan)
    json_path, md_path = write_table(table, out, cfg.table_stem)
    paths = {"json": json_path, "markdown": md_path}
    paths["table_figure"] = plot_table(table, out / f"{cfg.table_stem}.png", dpi=cfg.figure.dpi)
    if cfg.kind == "strategies":
        runs = [(r.label, read_run(r.output_dir)) for r in plan.runs if r.type == "grpo"]
        paths["training_dynamics"] = plot_training_dynamics(
            runs, out / cfg.figure.file, title=f"Training dynamics: {cfg.name} (Match F1 and accuracy)", dpi=cfg.figure.dpi
        )
    return paths


def run_ablation(
    cfg: AblationConfig,
    *,
    only: Sequence[str] = (),
    resume: bool = False,
    evaluate_only: bool = False,
    table_only: bool = False,
) -> dict[str, Any]:
    """Run an ablation (module docstring) and build its table and figures.

    Args:
        cfg: the ablation config.
        only: run just these (run names, or ``shared_start``); the table still covers every run.
        resume: continue unfinished runs (``run_experiment(resume=True)``).
        evaluate_only: train nothing; score finished runs that lack the table's evaluation.
        table_only: train and score nothing; build the table and figures from the folders.

    Returns:
        ``{"plan": <ablation_plan.json>, "ran": [...], "skipped": [...], "diverged": [...], "evaluated": [...],
        "outputs": {...}, "statuses": {run: status}, "wall_time_s"}``.

    Raises:
        ConfigError: an unknown name in ``only``, an invalid run config (checked for every
            selected run before anything trains), or a folder state that needs ``resume``.
    """
    from cpr.distributed import process_state
    from cpr.training.logs import close_run_log, open_run_log

    t0 = time.time()
    plan = plan_ablation(cfg)
    threads = None
    if cfg.torch_threads is not None:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.torch_threads)
    selected = [plan.get(n) for n in only] if only else ([plan.shared_start] if plan.shared_start else []) + plan.runs
    out = Path(cfg.output_dir)
    state = process_state()
    handler = open_run_log(out, "ablation.log", write=state.is_main_process)
    ran: list[str] = []
    skipped: list[str] = []
    diverged: list[str] = []
    evaluated: list[str] = []
    try:
        if state.is_main_process:
            atomic_write_json(out / "ablation_plan.json", plan.to_dict())
        logger.info("ablation %s (%s): %d runs -> %s", cfg.name, cfg.kind, len(plan.runs), out)
        if not (table_only or evaluate_only):
            for run in selected:  # every config is checked before anything trains
                if run.type != SHARED_START:
                    validate_run(plan, run)
            if any(r.type == SHARED_START for r in selected) or (not only and plan.shared_start is not None):
                ready = plan.shared_adapter is not None and Path(plan.shared_adapter, "adapter_config.json").is_file()
                ensure_shared_start(plan, resume=resume)
                (skipped if ready else ran).append(SHARED_START)
            for run in selected:
                if run.type == SHARED_START:
                    continue
                outcome = execute_run(plan, run, resume=resume)
                {"ran": ran, "skipped": skipped, "diverged": diverged}[outcome].append(run.name)
        if not table_only:
            evaluated = evaluate_finished(plan, [r for r in selected if r.type != SHARED_START])
        outputs = build_outputs(plan) if state.is_main_process else {}
        statuses = {r.name: read_run(r.output_dir).status for r in plan.runs}
        for path in outputs.values():
            logger.info("wrote %s", path)
        missing = [n for n, s in statuses.items() if s != FINISHED]
        if missing:
            logger.info("not finished yet: %s", ", ".join(f"{n} ({statuses[n]})" for n in missing))
        return {
            "plan": json.loads(json.dumps(plan.to_dict())),
            "ran": ran,
            "skipped": skipped,
            "diverged": diverged,
            "evaluated": evaluated,
            "outputs": {k: str(v) for k, v in outputs.items()},
            "statuses": statuses,
            "wall_time_s": round(time.time() - t0, 1),
        }
    finally:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        close_run_log(handler)

