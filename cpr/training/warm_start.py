"""The supervised LoRA warm start before GRPO, and supervised LoRA training of a new adapter.

The ``warm_start`` section of an experiment config (:class:`cpr.training.config.WarmStartConfig`)
runs TRL's ``SFTTrainer`` (:func:`cpr.training.sft.run_sft`) on the training records' target JSON
before the first GRPO phase, so that a model that never writes the output format (the offline
demo's random tiny model) earns rewards at all. :func:`run_warm_start` is what the runner calls
(into ``<output_dir>/warm_start``) and what the ablations' shared start calls (once, for every
run); :func:`train_lora` also trains the SFT baseline (:mod:`cpr.ablation.sft_baseline`).

Output folder::

    adapter/                the LoRA adapter (and the processor files)
    trainer_state.json      SFTTrainer's log history
    warm_start_done.json    written once the adapter is saved (a resumed run reuses only such an adapter)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpr.io import atomic_write_json
from cpr.training import policy
from cpr.training.config import ExperimentConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

__all__ = ["WARM_START_DONE", "run_warm_start", "train_lora", "warm_start_finished", "warm_start_settings"]

#: Written next to the warm-start adapter once it is saved (a resumed run reuses only such an adapter).
WARM_START_DONE = "warm_start_done.json"


def warm_start_settings(cfg: ExperimentConfig) -> Any:
    """The :class:`~cpr.training.sft.SFTSettings` of an experiment's warm start: the ``warm_start``
    section's steps, learning rate, batch size, max length, warm-up and ``extra`` fields; the
    experiment's seed; a log line every 1/20 of the steps; no intermediate checkpoints; no reports.

    Raises:
        ConfigError: an invalid setting (field ``warm_start.<key>``).
    """
    from cpr.training.sft import SFTSettings

    ws = cfg.warm_start
    settings = SFTSettings(
        max_steps=ws.max_steps,
        learning_rate=ws.learning_rate,
        per_device_train_batch_size=ws.per_device_train_batch_size,
        max_length=ws.max_length,
        warmup_ratio=ws.warmup_ratio,
        seed=cfg.seed,
        logging_steps=max(1, ws.max_steps // 20),
        save_strategy="no",
        report_to="none",
        **ws.extra,
    )
    settings.validate(prefix="warm_start")
    return settings


def warm_start_finished(adapter: Path, done: Path) -> bool:
    """Whether a previous run's warm-start adapter is whole: its marker ``done`` exists, or (runs
    from before the marker) ``adapter`` holds an ``adapter_config.json`` beside weights whose
    safetensors header reads."""
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


def train_lora(
    cfg: ExperimentConfig,
    settings: Any,
    out_dir: str | Path,
    records: Sequence[Any],
    *,
    templates: Any,
    model_path: str,
    oom_stage: str | None = None,
) -> Path:
    """Train a new LoRA adapter (``cfg.lora``) on ``records`` with :func:`cpr.training.sft.run_sft`.

    Args:
        cfg: the experiment config (model, LoRA).
        settings: :class:`~cpr.training.sft.SFTSettings`.
        out_dir: ``run_sft``'s output folder (the adapter goes to ``<out_dir>/adapter``).
        records: the training records.
        templates: prompt templates (the GRPO training prompt).
        model_path: the model folder or hub id (``model.name_or_path``).
        oom_stage: name the training in an out-of-memory error (:func:`cpr.training.oom.explain_oom`);
            ``None``: the error passes through as raised.

    Returns:
        The adapter folder. The model is dropped and its memory released.

    Raises:
        ConfigError / InputError: from ``run_sft`` (invalid settings, no records, a too long prompt).
        TrainingOutOfMemoryError: out of memory, with ``oom_stage``.
    """
    from cpr.training.oom import explain_oom
    from cpr.training.sft import run_sft

    model, processor = policy.load_policy(cfg, model_path)
    logger.info("supervised LoRA on %d records for %d steps -> %s", len(records), settings.max_steps, out_dir)
    t0 = time.time()
    guard = explain_oom(cfg, oom_stage) if oom_stage else contextlib.nullcontext()
    with guard:
        path = run_sft(
            model, processor, records, templates, settings, out_dir, peft_config=policy.lora_config(cfg, model_path)
        )
    logger.info("supervised LoRA: done in %.1f s -> %s", time.time() - t0, path)
    del model
    policy.free_memory()
    return Path(path)


def run_warm_start(
    cfg: ExperimentConfig,
    splits: DataSplits | None,
    out_dir: str | Path,
    *,
    templates: Any = None,
    model_path: str | None = None,
    resume: bool = False,
) -> Path:
    """Run ``cfg``'s warm start (its ``warm_start`` section, enabled or not) into ``out_dir``.

    Trains on a seeded subset of ``warm_start.max_records`` training records (all when unset) with
    :func:`warm_start_settings`, then writes :data:`WARM_START_DONE`. With ``resume``, an adapter
    that :func:`warm_start_finished` accepts is reused as it is.

    Args:
        cfg: a validated experiment config.
        splits: its data splits (``None``: loaded from ``cfg.data``).
        out_dir: the warm start's folder (module docstring).
        templates: prompt templates (default: loaded from ``cfg.data.prompts``).
        model_path: the model folder or hub id (default: ``model.name_or_path``).
        resume: reuse a finished adapter of an earlier attempt.

    Returns:
        ``<out_dir>/adapter``.

    Raises:
        ConfigError: invalid ``warm_start`` settings.
        TrainingOutOfMemoryError: out of memory, naming the ``warm_start`` settings to lower.
    """
    from cpr.data import load_templates
    from cpr.distributed import process_state
    from cpr.evaluation import subset
    from cpr.training.splits import load_splits

    out = Path(out_dir)
    adapter = out / "adapter"
    done = out / WARM_START_DONE
    if resume and warm_start_finished(adapter, done):
        logger.info("warm start: reusing %s", adapter)
        return adapter
    settings = warm_start_settings(cfg)
    splits = splits if splits is not None else load_splits(cfg.data)
    templates = templates if templates is not None else load_templates(cfg.data.prompts)
    model_path = model_path or cfg.model.name_or_path
    records = subset(splits.train, cfg.warm_start.max_records, cfg.seed)
    logger.info("warm start: %d records, %d steps", len(records), settings.max_steps)
    path = train_lora(cfg, settings, out, records, templates=templates, model_path=model_path, oom_stage="warm start")
    if process_state().is_main_process:
        atomic_write_json(done, {"adapter": str(path), "max_steps": settings.max_steps, "time": time.time()})
    return path
