"""The policy model of an experiment, its LoRA configuration and adapters: every part of a run that loads the
model goes through these functions, so all load the same network with the config's ``model`` and ``lora``."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from cpr.training.config_sections import ExperimentConfig


def load_policy(cfg: ExperimentConfig, model_path: str, device: Any = None) -> tuple[Any, Any]:
    """Load ``(model, processor)`` from ``model_path`` with the config's ``model`` settings, moved to ``device``
    (``None``: where ``from_pretrained`` puts it). Raises ``ModelNotAvailableError``."""
    from cpr.models import load_model_and_processor

    m = cfg.model
    return load_model_and_processor(
        model_path, dtype=m.dtype, gradient_checkpointing=m.gradient_checkpointing,
        attn_implementation=m.attn_implementation, min_pixels=m.min_pixels, max_pixels=m.max_pixels,
        trust_remote_code=m.trust_remote_code, device=None if device is None else str(device))


def lora_config(cfg: ExperimentConfig, model_path: str) -> Any:
    """A new adapter's ``peft.LoraConfig`` from the ``lora`` section, for the model's family."""
    from cpr.models import build_lora_config, detect_family

    lc = cfg.lora
    config = build_lora_config(detect_family(model_path), r=lc.r, alpha=lc.alpha, dropout=lc.dropout,
                               include_vision=lc.include_vision)
    if lc.target_modules is not None:
        config.target_modules = lc.target_modules
    return config


def with_adapter(model: Any, adapter: Path | None, cfg: ExperimentConfig, *, zero3: bool,
                 field: str = "init_adapter") -> Any:
    """``model`` wrapped with a trainable copy of the LoRA adapter in folder ``adapter`` (``None``: unchanged). Its
    dtype follows TRL 1.16's rule for a new adapter: under ZeRO-3 the base model's (DeepSpeed keeps fp32 master
    weights; a bf16 base with an fp32 adapter fails on DeepSpeed 0.19.2-0.19.7, DeepSpeed #8072), else PEFT's
    fp32 upcast (no master weights: an update below bf16's resolution would be lost). ``ConfigError``: another base.
    """
    if adapter is None:
        return model
    from peft import PeftModel

    check_base(adapter, model.name_or_path, cfg, field=field)
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True, autocast_adapter_dtype=not zero3)


def deepspeed_zero3(args: Any) -> bool:
    """Whether a trainer with ``TrainingArguments`` ``args`` runs under DeepSpeed ZeRO-3."""
    plugin = getattr(args, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def check_base(adapter: str | Path, base: str, cfg: ExperimentConfig, *, field: str) -> None:
    """:func:`cpr.models.check_adapter_base` with the config's ``model.allow_base_mismatch``, then
    :func:`cpr.models.check_adapter_weights`; ``field`` names the setting that gave the adapter."""
    from cpr.models import check_adapter_base, check_adapter_weights

    check_adapter_base(adapter, base, allow_mismatch=cfg.model.allow_base_mismatch, field=field,
                       override="model.allow_base_mismatch")
    check_adapter_weights(adapter, field=field)


def device_memory(device: Any) -> str:
    """``device`` in words for the run log: ``"cuda:0, 61.2 of 79.2 GiB free"``, else its name (``"cpu"``)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return str(device)
    free, total = torch.cuda.mem_get_info(device)
    return f"{device}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def free_vllm_engine(trainer: Any) -> bool:
    """Release the vLLM engine (colocate) or weight-sync communicator (server, which TRL closes only at exit) of a
    finished phase's trainer, so that the next phase's can start its own; ``False`` when it holds nothing."""
    generation = getattr(trainer, "vllm_generation", None)
    released = False
    client = getattr(generation, "vllm_client", None)
    if client is not None and getattr(client, "communicator", None) is not None:
        client.close_communicator()
        released = True
    engine = getattr(generation, "llm", None)
    if engine is not None:
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        generation.llm = None  # the trainer and its callbacks may live on a while: the engine goes now
        del engine
        released = True
    if released:
        free_memory()
    return released


def free_memory() -> None:
    """Collect garbage and release PyTorch's cached GPU memory (after a model is dropped)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
