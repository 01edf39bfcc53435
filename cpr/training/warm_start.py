"""The supervised LoRA warm start before GRPO (:func:`cpr.training.sft.run_sft` on the training records' target
JSON, so that a model that never writes the output format earns rewards at all), and :func:`train_lora` (the SFT
baseline is a run of the warm start alone)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpr.data.records import Record
from cpr.io import atomic_write_json
from cpr.training import policy
from cpr.training.config_checks import warm_start_settings
from cpr.training.config_sections import ExperimentConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

#: Written next to the warm-start adapter once it is saved.
WARM_START_DONE = "warm_start_done.json"


def warm_start_finished(adapter: Path, done: Path) -> bool:
    """Whether an earlier run's warm-start adapter is whole: its marker ``done`` exists, or (a run without the
    marker) ``adapter`` holds its config and weights whose safetensors header reads."""
    if done.is_file():
        return True
    weights = adapter / "adapter_model.safetensors"
    if not (adapter / "adapter_config.json").is_file() or not weights.is_file():
        return False
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except SafetensorError:  # a truncated file (the header names more bytes than it has): train again
        return False
    return True


def train_lora(cfg: ExperimentConfig, settings: Any, out_dir: str | Path, records: Sequence[Any], *, templates: Any,
               model_path: str, resume_from_checkpoint: str | Path | None = None) -> Path:
    """Train a new LoRA adapter (``cfg.lora``) on ``records`` with :func:`cpr.training.sft.run_sft` into ``out_dir``
    and return ``<out_dir>/adapter``. Raises as ``run_sft`` (fields ``warm_start.<key>``), or out of memory."""
    from cpr.training.oom import explain_oom
    from cpr.training.sft import run_sft

    model, processor = policy.load_policy(cfg, model_path)
    logger.info("supervised LoRA on %d records for %d steps -> %s", len(records), settings.max_steps, out_dir)
    t0 = time.time()
    with explain_oom(cfg, "warm start"):
        path = run_sft(model, processor, records, templates, settings, out_dir,
                       peft_config=policy.lora_config(cfg, model_path), prefix="warm_start",
                       resume_from_checkpoint=resume_from_checkpoint)
    logger.info("supervised LoRA: done in %.1f s -> %s", time.time() - t0, path)
    del model
    policy.free_memory()
    return Path(path)


def teacher_records(records: Sequence[Record], step_keep: float, seed: int) -> list[Record]:
    """The warm start's targets as a teacher that states each reference step with probability ``step_keep``
    (``warm_start.step_keep``): a model trained on them states some of the facts and leaves the others out, as
    the CRYSTAL paper's base models do (arXiv 2603.13099, Table 4: Qwen2.5-VL-3B step precision 0.898, recall
    0.347; CPR-Curriculum raises the recall to 0.493), and only a reward on the steps (Match F1, CPR) pays for
    the ones it leaves out. Each record keeps at least one step, in order, drawn by ``(seed, record id)``."""
    if step_keep >= 1.0:
        return list(records)
    out = []
    for record in records:
        steps = list(record.reference_steps)
        if len(steps) > 1:
            digest = hashlib.sha256(f"warm_start.step_keep/{seed}/{record.id}".encode()).digest()
            rng = random.Random(int.from_bytes(digest[:8], "big"))
            kept: list[str] = []
            while not kept:
                kept = [s for s in steps if rng.random() < step_keep]
            steps = kept
        out.append(dataclasses.replace(record, reference_steps=steps))
    return out


def run_warm_start(cfg: ExperimentConfig, splits: DataSplits | None, out_dir: str | Path, *, templates: Any = None,
                   model_path: str | None = None, resume: bool = False) -> Path:
    """Run ``cfg``'s warm start into ``out_dir`` and return ``<out_dir>/adapter`` (``resume``: a finished adapter
    reused, else from the last complete checkpoint). Raises ``ConfigError`` or ``TrainingOutOfMemoryError``."""
    from cpr.data import load_templates
    from cpr.distributed import process_state
    from cpr.evaluation import subset
    from cpr.training.checkpoints import prepare_resume
    from cpr.training.splits import load_splits

    out = Path(out_dir)
    adapter, done = out / "adapter", out / WARM_START_DONE
    if resume and warm_start_finished(adapter, done):
        logger.info("warm start: reusing %s", adapter)
        return adapter
    settings = warm_start_settings(cfg)
    splits = splits if splits is not None else load_splits(cfg.data)
    templates = templates if templates is not None else load_templates(cfg.data.prompts)
    model_path = model_path or cfg.model.name_or_path
    records = teacher_records(subset(splits.train, cfg.warm_start.max_records, cfg.seed), cfg.warm_start.step_keep,
                              cfg.seed)
    logger.info("warm start: %d records, %d steps", len(records), settings.max_steps)
    ckpt = prepare_resume(out, resume, process_state())
    if ckpt is not None:
        logger.info("warm start: resuming from %s", ckpt)
    path = train_lora(cfg, settings, out, records, templates=templates, model_path=model_path,
                      resume_from_checkpoint=ckpt)
    if process_state().is_main_process:
        atomic_write_json(done, {"adapter": str(path), "max_steps": settings.max_steps, "time": time.time()})
    return path
