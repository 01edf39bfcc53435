"""The policy model of an experiment: which model, how it is loaded, its LoRA adapter.

Every part of a run that needs the model (warm start, GRPO phases, checkpoint selection, final
evaluation, and the ablation's baselines) goes through these functions, so they all load the same
network with the same settings (``model`` and ``lora`` sections of the experiment config,
:mod:`cpr.training.config`).

Heavy dependencies (transformers, PEFT, torch) are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Any

from cpr.training.config import ExperimentConfig
from cpr.training.splits import DataSplits

__all__ = ["check_base", "free_memory", "load_policy", "lora_config", "resolve_model_path", "with_adapter"]


def resolve_model_path(cfg: ExperimentConfig, splits: DataSplits | None) -> str:
    """The model folder or hub id of ``cfg.model.name_or_path``.

    A ``tiny:<kind>`` name builds (or reuses from the cache) a tiny model
    (:func:`cpr.models.tiny.ensure_tiny_model`); with ``model.tiny_vocab_from_data`` its tokenizer
    is trained on the default corpus plus the training records' questions and target JSON, so every
    caller given the same ``splits`` gets the very same network. In a distributed run every process
    calls this (the main process builds the model while the others wait).

    Args:
        cfg: a validated experiment config.
        splits: the run's data splits (``None``: a tiny model's tokenizer sees the default corpus only).

    Returns:
        A local folder or a hub id, for :func:`load_policy`.
    """
    from cpr.models.tiny import default_corpus, ensure_tiny_model, parse_tiny_name

    kind = parse_tiny_name(cfg.model.name_or_path)
    if kind is None:
        return cfg.model.name_or_path
    from cpr.distributed import process_state

    texts = None
    if cfg.model.tiny_vocab_from_data and splits is not None:
        from cpr.data import render_target

        texts = default_corpus() + sorted({t for r in splits.train for t in (r.question, render_target(r))})
    # the main process builds it first: under torch.distributed only rank 0 writes a model's files
    with process_state().main_process_first():
        return str(ensure_tiny_model(kind, texts=texts))


def load_policy(cfg: ExperimentConfig, model_path: str) -> tuple[Any, Any]:
    """Load ``(model, processor)`` from ``model_path`` with the config's ``model`` settings
    (dtype, gradient checkpointing, attention implementation, pixel limits, remote code).

    Raises:
        ModelNotAvailableError: the model is neither local nor downloadable
            (:func:`cpr.models.loading.load_model_and_processor`).
    """
    from cpr.models.loading import load_model_and_processor

    return load_model_and_processor(
        model_path,
        dtype=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        attn_implementation=cfg.model.attn_implementation,
        min_pixels=cfg.model.min_pixels,
        max_pixels=cfg.model.max_pixels,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def lora_config(cfg: ExperimentConfig, model_path: str) -> Any:
    """A new LoRA adapter's ``peft.LoraConfig`` from the config's ``lora`` section: rank, alpha,
    dropout, the model family's target modules (language model only unless ``include_vision``),
    or ``lora.target_modules`` when given (:func:`cpr.models.loading.build_lora_config`)."""
    from cpr.models.loading import build_lora_config, detect_family

    lc = build_lora_config(
        detect_family(model_path),
        r=cfg.lora.r,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        include_vision=cfg.lora.include_vision,
    )
    if cfg.lora.target_modules is not None:
        lc.target_modules = cfg.lora.target_modules
    return lc


def with_adapter(model: Any, adapter: Path | None, cfg: ExperimentConfig, *, field: str = "init_adapter") -> Any:
    """Wrap ``model`` with a trainable copy of the LoRA adapter in folder ``adapter`` (a
    ``peft.PeftModel``), or return ``model`` unchanged when ``adapter`` is ``None``.

    Raises:
        ConfigError: the adapter was trained on another base model and ``model.allow_base_mismatch``
            is not set (:func:`cpr.models.loading.check_adapter_base`; ``field`` names the setting).
    """
    if adapter is None:
        return model
    from peft import PeftModel

    check_base(adapter, model.name_or_path, cfg, field=field)
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)


def check_base(adapter: str | Path, base: str, cfg: ExperimentConfig, *, field: str) -> None:
    """:func:`cpr.models.loading.check_adapter_base` with the config's ``model.allow_base_mismatch``."""
    from cpr.models.loading import check_adapter_base

    check_adapter_base(
        adapter, base, allow_mismatch=cfg.model.allow_base_mismatch, field=field, override="model.allow_base_mismatch"
    )


def free_memory() -> None:
    """Collect garbage and release PyTorch's cached GPU memory (after a model is dropped)."""
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
