"""The process state of a (possibly distributed) run, and the launcher settings that cannot work together.

Under ``accelerate launch`` or ``torchrun`` the first ``PartialState`` of a process fixes the distributed
set-up for everything after it (the trainer's ``Accelerator`` included). :func:`process_state` creates it on
CPU processes, as transformers' ``use_cpu`` does, when ``ACCELERATE_USE_CPU`` is set, or when DeepSpeed is
launched (``ACCELERATE_USE_DEEPSPEED``) without CUDA: a gloo group across CPU processes instead of
independent runs that each believe they are the main one. On GPUs nothing changes (NCCL).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from cpr.errors import ConfigError


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes", "on")


def process_state() -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``, ``is_main_process``,
    ``device``, ``wait_for_everyone``), created as the module docstring says if it does not exist yet."""
    import torch
    from accelerate import PartialState

    deepspeed_on_cpu = _flag("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()
    return PartialState(cpu=_flag("ACCELERATE_USE_CPU") or deepspeed_on_cpu)


def check_launch(cfg: Any) -> None:
    """Refuse, before anything loads, launcher settings that would fail later with another library's message.

    Raises:
        ConfigError: ``ACCELERATE_USE_CPU`` with a DeepSpeed launch (plain DDP around a ZeRO-partitioned
            model); under DeepSpeed, accelerate's ``mixed_precision`` (``ACCELERATE_MIXED_PRECISION``) unlike
            the ``bf16`` / ``fp16`` of a trainer of the run (the warm start's follows the model's dtype on a GPU;
            a phase's, named by the key that sets it); ``training.use_vllm`` without an importable ``vllm``.
    """
    import torch

    from cpr.models import resolve_dtype
    from cpr.training.phase import grpo_args

    deepspeed = _flag("ACCELERATE_USE_DEEPSPEED")
    if deepspeed and _flag("ACCELERATE_USE_CPU"):
        raise ConfigError(
            "ACCELERATE_USE_CPU=true (--cpu, use_cpu: true) with a DeepSpeed config would train plain DDP "
            "around a ZeRO-partitioned model: unset ACCELERATE_USE_CPU (without a GPU, DeepSpeed runs on CPU "
            "processes by itself), or launch without the DeepSpeed config for plain DDP on CPU",
            field="ACCELERATE_USE_CPU",
        )
    precision, phases = [], {name: grpo_args(cfg, name) for name in cfg.phases}
    if cfg.warm_start.enabled:
        from cpr.training.sft import sft_precision

        cuda = torch.cuda.is_available()
        sft = sft_precision(resolve_dtype(cfg.model.dtype, "cuda" if cuda else "cpu"), cfg.warm_start.extra)
        precision.append(("warm_start.extra", sft["bf16"], sft["fp16"]))
    for name, args in phases.items():
        own = cfg.phase(name).training
        key = f"phase_settings.{name}.training" if "bf16" in own or "fp16" in own else "training"
        precision.append((key, args.get("bf16"), args.get("fp16")))
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if deepspeed and mixed in ("bf16", "fp16"):
        want = (mixed == "bf16", mixed == "fp16")
        keys = list(dict.fromkeys(k for k, bf16, fp16 in precision if (bool(bf16), bool(fp16)) != want))
        if keys:
            raise ConfigError(
                f"accelerate's mixed_precision is {mixed} but {' and '.join(keys)} train without it (on CPU cpr "
                f"trains in fp32): launch with --mixed_precision no (or mixed_precision: 'no' in the accelerate "
                f"config), or set {' and '.join(f'{k}.{mixed}: true' for k in keys)}",
                field=keys[0],
            )
    if any(args.get("use_vllm") for args in phases.values()) and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "training.use_vllm is true but vLLM is not installed (pip install vllm; it needs a CUDA GPU): "
            "install it or set training.use_vllm: false",
            field="training.use_vllm",
        )
