"""The process state of a (possibly distributed) run.

The first ``PartialState`` of a process fixes the distributed set-up (the trainer's ``Accelerator``
included); :func:`process_state` creates it on CPU (a gloo group, as transformers' ``use_cpu``) when
``ACCELERATE_USE_CPU`` is set or DeepSpeed is launched without CUDA. On GPUs nothing changes (NCCL).
"""

from __future__ import annotations

import os
from typing import Any

from cpr.errors import ConfigError


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to 1, true, yes or on (any case)."""
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes", "on")


def process_state(timeout_s: float | None = None) -> Any:
    """``accelerate.PartialState`` of this process (``process_index``, ``num_processes``, ``is_main_process``,
    ``device``, ``wait_for_everyone``), created as the module docstring says if it does not exist yet.

    ``timeout_s``: how long (seconds) a collective of the process group it creates waits for the other
    processes (:func:`cpr.training.preflight.process_group_timeout`; ``None``: the backend's default, 10 minutes for NCCL and
    DeepSpeed). Ignored once the state exists: the runner creates it first.
    """
    import datetime

    import torch
    from accelerate import PartialState

    deepspeed_on_cpu = env_flag("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    return PartialState(cpu=env_flag("ACCELERATE_USE_CPU") or deepspeed_on_cpu, **kwargs)


#: The file :func:`check_shared_output_dir` writes into ``output_dir`` and removes.
SHARED_TOKEN = ".cpr-shared-check"


def check_shared_output_dir(out: Any, state: Any) -> None:
    """Refuse an ``output_dir`` that the processes of a run do not all see (node-local disks of a
    multi-node run): every process reads ``selection.json``, the handover adapter and the checkpoint
    markers that only the main process writes. The main process writes a random token into
    ``out / SHARED_TOKEN``; after a barrier every process reads it back, the answers are gathered, and
    the main process removes the file. Nothing happens on a single process. Raises ``ConfigError`` on every
    process, naming the processes (and hosts) that do not see the token."""
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
            f"at the same path (NFS, Lustre, ...)", field="output_dir")
