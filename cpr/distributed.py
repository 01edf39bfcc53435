"""The process state of a (possibly distributed) run (the launcher settings that cannot work together are
refused by :func:`cpr.training.preflight.check_launch`).

Under ``accelerate launch`` or ``torchrun`` the first ``PartialState`` of a process fixes the distributed
set-up for everything after it (the trainer's ``Accelerator`` included). :func:`process_state` creates it on
CPU processes, as transformers' ``use_cpu`` does, when ``ACCELERATE_USE_CPU`` is set, or when DeepSpeed is
launched (``ACCELERATE_USE_DEEPSPEED``) without CUDA: a gloo group across CPU processes instead of
independent runs that each believe they are the main one. On GPUs nothing changes (NCCL).
"""

from __future__ import annotations

import os
from typing import Any


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to 1, true, yes or on (any case)."""
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes", "on")


def process_state() -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``, ``is_main_process``,
    ``device``, ``wait_for_everyone``), created as the module docstring says if it does not exist yet."""
    import torch
    from accelerate import PartialState

    deepspeed_on_cpu = env_flag("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()
    return PartialState(cpu=env_flag("ACCELERATE_USE_CPU") or deepspeed_on_cpu)
