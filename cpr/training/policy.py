"""The policy model of an experiment: how it is loaded, its LoRA configuration and adapters.

Every part of a run that loads the model (warm start, GRPO phases, checkpoint selection, evaluation,
the ablation's baselines) goes through these functions, so all load the same network with the
config's ``model`` and ``lora`` sections.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from cpr.training.config import ExperimentConfig


def load_policy(cfg: ExperimentConfig, model_path: str) -> tuple[Any, Any]:
    """Load ``(model, processor)`` from ``model_path`` with the config's ``model`` settings.

    Raises:
        ModelNotAvailableError: neither local nor downloadable (:func:`cpr.models.load_model_and_processor`).
    """
    from cpr.models import load_model_and_processor

    m = cfg.model
    return load_model_and_processor(
        model_path, dtype=m.dtype, gradient_checkpointing=m.gradient_checkpointing,
        attn_implementation=m.attn_implementation, min_pixels=m.min_pixels, max_pixels=m.max_pixels,
        trust_remote_code=m.trust_remote_code,
    )


def lora_config(cfg: ExperimentConfig, model_path: str) -> Any:
    """A new adapter's ``peft.LoraConfig`` from the ``lora`` section (:func:`cpr.models.build_lora_config`
    for the model's family), with ``lora.target_modules`` when given."""
    from cpr.models import build_lora_config, detect_family

    lc = cfg.lora
    config = build_lora_config(detect_family(model_path), r=lc.r, alpha=lc.alpha, dropout=lc.dropout,
                               include_vision=lc.include_vision)
    if lc.target_modules is not None:
        config.target_modules = lc.target_modules
    return config


def with_adapter(model: Any, adapter: Path | None, cfg: ExperimentConfig, *, field: str = "init_adapter") -> Any:
    """``model`` wrapped with a trainable copy of the LoRA adapter in folder ``adapter`` (a
    ``peft.PeftModel``), or ``model`` unchanged when ``adapter`` is ``None``.

    Raises:
        ConfigError: the adapter was trained on another base model (:func:`check_base`).
    """
    if adapter is None:
        return model
    from peft import PeftModel

    check_base(adapter, model.name_or_path, cfg, field=field)
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)


def check_base(adapter: str | Path, base: str, cfg: ExperimentConfig, *, field: str) -> None:
    """:func:`cpr.models.check_adapter_base` with the config's ``model.allow_base_mismatch``; ``field``
    names the setting that gave the adapter."""
    from cpr.models import check_adapter_base

    check_adapter_base(
        adapter, base, allow_mismatch=cfg.model.allow_base_mismatch, field=field, override="model.allow_base_mismatch"
    )


def free_memory() -> None:
    """Collect garbage and release PyTorch's cached GPU memory (after a model is dropped)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
