"""The process state of a (possibly distributed) run: accelerate's ``PartialState``, set up once.

Under ``accelerate launch`` or ``torchrun``, the first ``PartialState`` created in a process fixes
the distributed set-up for everything after it (the trainer's ``Accelerator`` included), so cpr
creates it the way transformers' ``TrainingArguments`` does for a CPU run (``use_cpu``): on CPU
processes when ``ACCELERATE_USE_CPU`` is set (``accelerate launch --cpu``; ``torchrun`` with the
variable set) or when DeepSpeed is launched (``ACCELERATE_USE_DEEPSPEED``) on a machine without
CUDA, which gives a gloo process group across CPU processes instead of independent
single-process runs that all believe they are the main one. On GPUs nothing changes (NCCL, set
up from ``LOCAL_RANK``).

:func:`check_launch` refuses, before anything loads, the launcher settings that cannot work
together (module ``accelerate`` environment variables, set by ``accelerate launch``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from cpr.errors import ConfigError

__all__ = ["check_launch", "deepspeed_launched", "process_state", "use_cpu_requested"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes", "on")


def use_cpu_requested() -> bool:
    """Whether ``ACCELERATE_USE_CPU`` asks for CPU processes (``1``, ``true``, ``yes``, ``on``)."""
    return _flag("ACCELERATE_USE_CPU")


def deepspeed_launched() -> bool:
    """Whether ``accelerate launch`` runs this process with a DeepSpeed config (``ACCELERATE_USE_DEEPSPEED``)."""
    return _flag("ACCELERATE_USE_DEEPSPEED")


def process_state() -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``,
    ``is_main_process``, ``device``, ``wait_for_everyone``): the shared one when it exists, else a
    new one created on CPU processes when :func:`use_cpu_requested`, or when
    :func:`deepspeed_launched` without CUDA (module docstring)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=use_cpu_requested() or (deepspeed_launched() and not torch.cuda.is_available()))


def check_launch(precision: Sequence[tuple[str, bool, bool]], *, use_vllm: bool = False) -> None:
    """Refuse launcher settings that fail later with another library's message.

    Args:
        precision: ``(config key, bf16, fp16)`` of each trainer the run builds (the phases'
            resolved ``training.bf16`` / ``training.fp16``).
        use_vllm: a phase generates with vLLM (``training.use_vllm``).

    Raises:
        ConfigError: ``ACCELERATE_USE_CPU`` with a DeepSpeed launch (accelerate would train plain
            DDP around a ZeRO-partitioned model); under DeepSpeed, accelerate's ``mixed_precision``
            (``ACCELERATE_MIXED_PRECISION``) differing from a trainer's ``bf16`` / ``fp16``
            (DeepSpeed's config would contradict the trainer's); ``use_vllm`` without an importable
            ``vllm`` package.
    """
    if deepspeed_launched() and use_cpu_requested():
        raise ConfigError(
            "ACCELERATE_USE_CPU=true (--cpu, use_cpu: true) with a DeepSpeed config would train plain DDP "
            "around a ZeRO-partitioned model: unset ACCELERATE_USE_CPU (without a GPU, DeepSpeed runs on CPU "
            "processes by itself), or launch without the DeepSpeed config for plain DDP on CPU",
            field="ACCELERATE_USE_CPU",
        )
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if deepspeed_launched() and mixed in ("bf16", "fp16"):
        want = (mixed == "bf16", mixed == "fp16")
        keys = list(dict.fromkeys(k for k, bf16, fp16 in precision if (bool(bf16), bool(fp16)) != want))
        if keys:
            raise ConfigError(
                f"accelerate's mixed_precision is {mixed} but {' and '.join(keys)} train without it (on CPU cpr "
                f"trains in fp32): launch with --mixed_precision no (or mixed_precision: 'no' in the accelerate "
                f"config), or set {' and '.join(f'{k}.{mixed}: true' for k in keys)}",
                field=keys[0],
            )
    if use_vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "training.use_vllm is true but vLLM is not installed (pip install vllm; it needs a CUDA GPU): "
            "install it or set training.use_vllm: false",
            field="training.use_vllm",
        )
