"""Checkpoint selection: score a phase's checkpoints on the validation split and pick the best.

A phase with ``select_best`` (the built-in ``answer_only`` phase, CPR-Curriculum's phase 1;
docs/method.md section 6) hands the next phase its best adapter on the validation split rather than its last.
:func:`select_best` scores every complete checkpoint of the phase and its final adapter with
``crystal`` on the validation split, with the training prompt and the rewards' answer checking
(``rewards.answer_mode``), and picks the highest ``select_metric`` (``accuracy`` or ``match_f1``);
ties go to the later step. The base model is loaded once and the adapters are swapped on it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cpr.io import atomic_write_json
from cpr.training import policy
from cpr.training.checkpoints import checkpoint_status, checkpoint_step, checkpoints_of
from cpr.training.config import ExperimentConfig, PhaseConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

__all__ = ["select_best"]

_FINAL = 10**9  # sorts the final adapter after every checkpoint


def select_best(
    cfg: ExperimentConfig, phase: PhaseConfig, splits: DataSplits, templates: Any, model_path: str
) -> dict[str, Any]:
    """Score the phase's checkpoints and final adapter on the validation split; pick the best.

    Args:
        cfg: the run's config.
        phase: the phase (``select_metric``: ``accuracy`` or ``match_f1``).
        splits: the run's data splits.
        templates: prompt templates.
        model_path: the model folder or hub id (``model.name_or_path``).

    Returns:
        The contents of ``<phase>/selection.json``: ``{"metric", "answer_mode", "n_validation",
        "picked", "scores": [{"checkpoint", "step" (None: the final adapter), "accuracy" (percent),
        "match_f1"}]}``; with no validation records, ``{"picked": <final adapter>, "reason", "scores": []}``.
        The main process scores; the others wait and read the file.

    Raises:
        TrainingOutOfMemoryError: out of memory while scoring.
    """
    from cpr.distributed import process_state
    from cpr.evaluation import evaluate_model
    from cpr.matching import zero3_disabled
    from cpr.training.evaluate import generation_settings, scoring_settings
    from cpr.training.oom import explain_oom

    state = process_state()
    phase_dir = Path(cfg.output_dir) / phase.name
    out = phase_dir / "selection.json"
    if state.is_main_process:
        candidates = [(checkpoint_step(p), p) for p in checkpoints_of(phase_dir) if checkpoint_status(p) == "complete"]
        candidates.append((_FINAL, phase_dir / "adapter"))
        if not splits.validation:
            choice = {"picked": str(phase_dir / "adapter"), "reason": "no validation records", "scores": []}
        else:
            from peft import PeftModel

            gen = generation_settings(cfg, progress=False, prompt_mode="train")
            scoring = scoring_settings(cfg, cfg.rewards.answer_mode)
            scores = []
            with zero3_disabled(), explain_oom(cfg, "evaluation", phase):
                base, processor = policy.load_policy(cfg, model_path)
                peft_model = None
                for i, (step, path) in enumerate(candidates):
                    name = f"c{i}"
                    policy.check_base(path, base.name_or_path, cfg, field=f"{phase.name} checkpoint")
                    if peft_model is None:
                        peft_model = PeftModel.from_pretrained(base, str(path), adapter_name=name)
                    else:
                        peft_model.load_adapter(str(path), adapter_name=name)
                    peft_model.set_adapter(name)
                    metrics = evaluate_model(
                        peft_model,
                        processor,
                        "crystal",
                        splits.validation,
                        generation=gen,
                        scoring=scoring,
                        templates=templates,
                    )
                    overall = metrics["overall"]
                    scores.append(
                        {
                            "checkpoint": str(path),
                            "step": None if step == _FINAL else step,
                            "accuracy": overall["accuracy"],
                            "match_f1": overall["match_f1"],
                        }
                    )
                    logger.info(
                        "phase %s: %s validation accuracy %.2f%% match_f1 %.3f",
                        phase.name,
                        path.name,
                        overall["accuracy"],
                        overall["match_f1"],
                    )
                    if i > 0:
                        peft_model.delete_adapter(f"c{i - 1}")
                del peft_model, base
            metric = phase.select_metric
            best = max(range(len(scores)), key=lambda i: (scores[i][metric], i))
            choice = {
                "metric": metric,
                "answer_mode": cfg.rewards.answer_mode,
                "n_validation": len(splits.validation),
                "picked": scores[best]["checkpoint"],
                "scores": scores,
            }
        atomic_write_json(out, choice)
    state.wait_for_everyone()
    return json.loads(out.read_text(encoding="utf-8"))
