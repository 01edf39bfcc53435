"""Checkpoint selection: a phase with ``select_best`` (the built-in ``answer_only`` phase,
CPR-Curriculum's phase 1; docs/method.md section 6) hands the next phase its best adapter on the
validation split rather than its last, and that adapter becomes the phase's ``adapter/`` folder
(:func:`install_selected`); the last step stays in its checkpoint."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from cpr.io import atomic_write_json
from cpr.training.checkpoints import adapter_folder, checkpoint_status, checkpoint_step, checkpoints_of
from cpr.training.config_sections import ExperimentConfig, PhaseConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

__all__ = ["LAST_STEP_ADAPTER", "install_selected", "select_best"]

#: Where the phase's last step is kept when no complete checkpoint holds it and another adapter was selected.
LAST_STEP_ADAPTER = "last_step_adapter"


def select_best(cfg: ExperimentConfig, phase: PhaseConfig, splits: DataSplits, templates: Any,
                model_path: str) -> dict[str, Any]:
    """Score every complete checkpoint of the phase and its final adapter with ``crystal`` on the validation
    split (greedy, training prompt) and pick the highest ``phase.select_metric``, ties to the later step.
    Returns the contents of ``<phase>/selection.json``: ``{"metric", "answer_mode", "n_validation", "picked",
    "scores": [{"checkpoint", "step" (None: the final adapter), "accuracy" (percent), "match_f1"}]}``; without
    validation records ``{"picked": <final adapter>, "reason", "scores": []}``.

    Raises:
        ConfigError: a checkpoint trained on another base model.
        TrainingOutOfMemoryError: out of memory while scoring.
    """
    from cpr.distributed import process_state
    from cpr.evaluation import evaluate_model
    from cpr.training.evaluate import generation_settings, score_adapters, scoring_settings

    state = process_state()
    phase_dir = Path(cfg.output_dir) / phase.name
    out = phase_dir / "selection.json"
    if not splits.validation:
        if state.is_main_process:
            atomic_write_json(out, {"picked": str(phase_dir / "adapter"), "reason": "no validation records",
                                    "scores": []})
    else:
        candidates = [(checkpoint_step(p), p) for p in checkpoints_of(phase_dir) if checkpoint_status(p) == "complete"]
        candidates.append((None, phase_dir / "adapter"))
        generation = generation_settings(cfg, progress=False, prompt_mode="train", greedy=True)
        scoring = scoring_settings(cfg, cfg.rewards.answer_mode)
        logger.info("phase %s: selecting among %d adapters on %d validation records (%d processes)", phase.name,
                    len(candidates), len(splits.validation), state.num_processes)
        overall = score_adapters(
            cfg, model_path, [path for _, path in candidates],
            lambda model, processor: evaluate_model(model, processor, "crystal", splits.validation,
                                                    generation=generation, scoring=scoring,
                                                    templates=templates, shard=state),
            field=f"{phase.name} checkpoint", phase=phase)
        if state.is_main_process:
            scores = [{"checkpoint": str(path), "step": step, "accuracy": o["overall"]["accuracy"],
                       "match_f1": o["overall"]["match_f1"]} for (step, path), o in zip(candidates, overall, strict=True)]
            for s in scores:
                logger.info("phase %s: %s validation accuracy %.2f%% match_f1 %.3f", phase.name,
                            Path(s["checkpoint"]).name, s["accuracy"], s["match_f1"])
            best = max(range(len(scores)), key=lambda i: (scores[i][phase.select_metric], i))
            atomic_write_json(out, {"metric": phase.select_metric, "answer_mode": cfg.rewards.answer_mode,
                                    "n_validation": len(splits.validation), "picked": scores[best]["checkpoint"],
                                    "scores": scores})
    state.wait_for_everyone()
    return json.loads(out.read_text(encoding="utf-8"))


def install_selected(phase_dir: str | Path, picked: str | Path, last_step: int) -> dict[str, str] | None:
    """Make the phase's ``adapter/`` folder the selected adapter ``picked`` (a ``checkpoint-N``; its adapter files
    over the final adapter's, written as ``adapter.partial`` and moved into place), on the main process. Unless
    ``checkpoint-<last_step>`` is complete, the final adapter is first moved to :data:`LAST_STEP_ADAPTER`. Returns
    ``{"adapter_from", "last_step_adapter"}``, or ``None`` when ``picked`` is the final adapter; raises
    ``ConfigError`` when ``picked`` holds no LoRA adapter."""
    phase_dir, picked = Path(phase_dir), Path(picked)
    adapter = phase_dir / "adapter"
    if picked.resolve() == adapter.resolve():
        return None
    adapter_folder(picked, field=f"{phase_dir.name} selection.json picked")
    last = phase_dir / f"checkpoint-{last_step}"
    if checkpoint_status(last) != "complete":
        last = phase_dir / LAST_STEP_ADAPTER
        if last.exists():
            shutil.rmtree(last)
        os.replace(adapter, last)
        logger.info("phase %s: no complete checkpoint holds the last step %d; its adapter moved to %s", phase_dir.name,
                    last_step, last)
    source = adapter if adapter.is_dir() else last
    names = {f.name for f in source.iterdir() if f.is_file()} | {
        f.name for f in picked.iterdir() if f.is_file() and f.name.startswith("adapter_")}
    partial = phase_dir / "adapter.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    for name in sorted(names):
        shutil.copy2(picked / name if (picked / name).is_file() else source / name, partial / name)
    if adapter.is_dir():
        old = phase_dir / "adapter.replaced"
        if old.exists():
            shutil.rmtree(old)
        os.replace(adapter, old)
        os.replace(partial, adapter)
        shutil.rmtree(old)
    else:
        os.replace(partial, adapter)
    logger.info("phase %s: %s now holds the selected %s; the last step stays in %s", phase_dir.name, adapter,
                picked.name, last)
    return {"adapter_from": str(picked), "last_step_adapter": str(last)}
