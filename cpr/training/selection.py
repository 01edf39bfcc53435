"""Checkpoint selection: a phase with ``select_best`` (the built-in ``answer_only`` phase,
CPR-Curriculum's phase 1; docs/method.md section 6) hands the next phase its best adapter on the
validation split rather than its last."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cpr.io import atomic_write_json
from cpr.training.checkpoints import checkpoint_status, checkpoint_step, checkpoints_of
from cpr.training.config import ExperimentConfig, PhaseConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

__all__ = ["select_best"]


def select_best(
    cfg: ExperimentConfig, phase: PhaseConfig, splits: DataSplits, templates: Any, model_path: str
) -> dict[str, Any]:
    """Score every complete checkpoint of the phase and its final adapter with ``crystal`` on the
    validation split (greedy decoding whatever ``evaluation.decoding`` says, training prompt,
    ``rewards.answer_mode``; the base model loaded once) and pick
    the highest ``phase.select_metric`` (``accuracy`` or ``match_f1``), ties to the later step.

    Returns:
        The contents of ``<phase>/selection.json``: ``{"metric", "answer_mode", "n_validation", "picked",
        "scores": [{"checkpoint", "step" (None: the final adapter), "accuracy" (percent), "match_f1"}]}``;
        without validation records ``{"picked": <final adapter>, "reason", "scores": []}``. Every
        process generates its share of the records (:func:`cpr.training.evaluate.score_adapters`); the
        main process scores and writes the file, which the others read.

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
            field=f"{phase.name} checkpoint", phase=phase,
        )
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
