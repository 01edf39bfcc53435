"""The process state of a (possibly distributed) run: accelerate's ``PartialState``, set up once.

Under ``accelerate launch`` or ``torchrun``, the first ``PartialState`` created in a process fixes
the distributed set-up for everything after it (the trainer's ``Accelerator`` included), so cpr
creates it the way transformers' ``TrainingArguments`` does: on CPU processes when
``ACCELERATE_USE_CPU`` is set (``accelerate launch --cpu``; ``torchrun`` with the variable set),
which gives a gloo process group across CPU processes instead of independent single-process runs.
On GPUs nothing changes (NCCL, set up from ``LOCAL_RANK``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["process_state", "use_cpu_requested"]


def use_cpu_requested() -> bool:
    """Whether ``ACCELERATE_USE_CPU`` asks for CPU processes (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("ACCELERATE_USE_CPU", "false").strip().lower() in ("1", "true", "yes", "on")


def process_state() -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``,
    ``is_main_process``, ``device``, ``wait_for_everyone``): the shared one when it exists, else a
    new one created with ``cpu=use_cpu_requested()`` (module docstring)."""
    from accelerate import PartialState

    return PartialState(cpu=use_cpu_requested())
