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


def process_state(timeout_s: float | None = None) -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``, ``is_main_process``,
    ``device``, ``wait_for_everyone``), created as the module docstring says if it does not exist yet.

    ``timeout_s``: how long (seconds) a collective of the process group it creates waits for the other
    processes (:func:`process_group_timeout`; ``None``: the backend's default, 10 minutes for NCCL and
    DeepSpeed). Ignored once the state exists: the runner creates it first.
    """
    import datetime

    import torch
    from accelerate import PartialState

    deepspeed_on_cpu = _flag("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    return PartialState(cpu=_flag("ACCELERATE_USE_CPU") or deepspeed_on_cpu, **kwargs)


def process_group_timeout(cfg: Any) -> float:
    """The process group's timeout (seconds) for a run of ``cfg``: the largest ``ddp_timeout`` of its phases'
    ``training`` and of ``warm_start.extra`` (``TrainingArguments``' default 1800 where unset), which the
    trainers would use if they created the group (cpr creates it before them)."""
    from transformers import TrainingArguments

    from cpr.training.config import phase_training_args

    default = TrainingArguments.__dataclass_fields__["ddp_timeout"].default
    values = [phase_training_args(cfg, name).get("ddp_timeout", default) for name in cfg.phases]
    if cfg.warm_start.enabled:
        values.append(cfg.warm_start.extra.get("ddp_timeout", default))
    return float(max(values, default=default))


#: The file :func:`check_shared_output_dir` writes into ``output_dir`` and removes.
SHARED_TOKEN = ".cpr-shared-check"


def check_shared_output_dir(out: Any, state: Any) -> None:
    """Refuse an ``output_dir`` that the processes of a run do not all see (node-local disks of a
    multi-node run): every process reads ``selection.json``, the handover adapter and the checkpoint
    markers that only the main process writes. The main process writes a random token into
    ``out / SHARED_TOKEN``; after a barrier every process reads it back, the answers are gathered, and
    the main process removes the file. Nothing happens on a single process.

    Raises:
        ConfigError: on every process, naming the processes (and hosts) that do not see the token.
    """
    import secrets
    import socket
    from pathlib import Path

    from accelerate.utils import broadcast_object_list, gather_object

    if state.num_processes < 2:
        return
    path = Path(out) / SHARED_TOKEN
    token = [secrets.token_hex(16) if state.is_main_process else None]
    if state.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token[0], encoding="utf-8")
    broadcast_object_list(token, from_process=0)  # also the barrier: the file is written before anyone reads
    try:
        seen = path.read_text(encoding="utf-8") == token[0]
    except OSError:
        seen = False
    answers = gather_object([(state.process_index, socket.gethostname(), seen)])
    if state.is_main_process:
        path.unlink(missing_ok=True)
    blind = [f"{rank} on {host}" for rank, host, ok in answers if not ok]
    if blind:
        raise ConfigError(
            f"output_dir {out} is not shared by every process: process {', '.join(blind)} does not see the file "
            f"the main process wrote there; a multi-node run needs output_dir on a filesystem every node mounts "
            f"at the same path (NFS, Lustre, ...)",
            field="output_dir",
        )


def check_launch(cfg: Any) -> None:
    """Refuse, before anything loads, launcher settings that would fail later with another library's message.

    Raises:
        ConfigError: ``ACCELERATE_USE_CPU`` with a DeepSpeed launch (plain DDP around a ZeRO-partitioned
            model); under DeepSpeed, accelerate's ``mixed_precision`` (``ACCELERATE_MIXED_PRECISION``) unlike
            the ``bf16`` / ``fp16`` of a trainer of the run (the warm start's follows the model's dtype on a GPU;
            a phase's, named by the key that sets it); ``training.use_vllm`` with image-size limits vLLM would
            not use (:func:`cpr.training.vllm.check_vllm_pixels`) or without an importable ``vllm``.
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
    if any(args.get("use_vllm") for args in phases.values()):
        from cpr.training.vllm import check_vllm_pixels

        check_vllm_pixels(cfg)
    if any(args.get("use_vllm") for args in phases.values()) and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "training.use_vllm is true but vLLM is not installed (pip install vllm; it needs a CUDA GPU): "
            "install it or set training.use_vllm: false",
            field="training.use_vllm",
        )
