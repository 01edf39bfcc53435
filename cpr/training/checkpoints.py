"""The checkpoints of a GRPO phase: which are whole, which one a resumed run continues from.

A phase folder holds TRL's ``checkpoint-N`` folders (N = optimizer step). The runner writes
:data:`COMPLETE_MARKER` into a checkpoint once every process saved and every callback wrote its
files (:class:`cpr.training.guards.CheckpointCompleteCallback`); a divergence guard that stops a
phase writes :data:`DIVERGED_MARKER` into the checkpoint it saved at the stop. Every checkpoint
holds the guard's counters in :data:`GUARD_STATE_FILE`.

Resume (:func:`prepare_resume`): a phase continues from its last *complete*, not diverged
checkpoint (:func:`last_checkpoint`); the phase's JSON lines logs are cut back to that
checkpoint's step (:func:`cpr.training.logs.rollback_logs`) and the later checkpoint folders
(incomplete or diverged) are renamed ``abandoned-checkpoint-N-<time>``, so the resumed run never
mixes with the lost interval. A checkpoint that falls inside a generation batch also holds TRL's
buffered generation batch (:data:`GENERATION_BUFFER_FILE`, written by
:class:`cpr.training.guards.GenerationStateCallback`), so it resumes exactly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError

logger = logging.getLogger("cpr.training")

__all__ = [
    "COMPLETE_MARKER",
    "DIVERGED_MARKER",
    "GENERATION_BUFFER_FILE",
    "GUARD_STATE_FILE",
    "adapter_folder",
    "checkpoint_status",
    "checkpoint_step",
    "checkpoints_of",
    "has_curriculum_state",
    "last_checkpoint",
    "prepare_resume",
]

_CKPT = re.compile(r"^checkpoint-(\d+)$")

#: Written into a checkpoint once every process saved and every callback wrote its files.
COMPLETE_MARKER = "checkpoint_complete.json"
#: Written into the checkpoint a divergence guard stopped at (the reason, as a GuardEvent).
DIVERGED_MARKER = "diverged.json"
#: The divergence guard's counters, in every checkpoint.
GUARD_STATE_FILE = "guard_state.json"
#: A process's buffered generation batch, in a checkpoint that falls inside one ({rank}: process index).
GENERATION_BUFFER_FILE = "generation_buffer.rank{rank}.pt"


def checkpoint_step(ckpt: str | Path) -> int:
    """The optimizer step N of a ``checkpoint-N`` folder.

    Raises:
        ValueError: the folder name is not ``checkpoint-<N>``.
    """
    m = _CKPT.match(Path(ckpt).name)
    if m is None:
        raise ValueError(f"not a checkpoint folder name: {Path(ckpt).name!r}")
    return int(m.group(1))


def checkpoints_of(phase_dir: str | Path) -> list[Path]:
    """``checkpoint-N`` folders of a phase, sorted by step (``[]`` when the folder does not exist)."""
    phase_dir = Path(phase_dir)
    if not phase_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in phase_dir.iterdir() if (m := _CKPT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _valid_json(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def checkpoint_status(ckpt: str | Path) -> str:
    """``"complete"``, ``"diverged"`` or ``"incomplete"``.

    A checkpoint is complete when it holds :data:`COMPLETE_MARKER` (written last, after every
    process saved). Checkpoints of runs made before the marker existed (no checkpoint of the
    phase has one) count as complete when their ``trainer_state.json`` (which transformers
    writes after the weights, optimizer, scheduler and RNG states) parses. A complete checkpoint
    holding :data:`DIVERGED_MARKER` is ``"diverged"``.
    """
    ckpt = Path(ckpt)
    if (ckpt / COMPLETE_MARKER).is_file():
        complete = True
    else:
        siblings_marked = any((c / COMPLETE_MARKER).is_file() for c in checkpoints_of(ckpt.parent))
        complete = not siblings_marked and _valid_json(ckpt / "trainer_state.json")
    if not complete:
        return "incomplete"
    return "diverged" if (ckpt / DIVERGED_MARKER).is_file() else "complete"


def last_checkpoint(phase_dir: str | Path) -> Path | None:
    """The latest complete checkpoint that is not marked diverged (see :func:`checkpoint_status`), or ``None``."""
    for ckpt in reversed(checkpoints_of(phase_dir)):
        if checkpoint_status(ckpt) == "complete":
            return ckpt
    return None


def has_curriculum_state(ckpt: Path) -> bool:
    """Whether a checkpoint's ``trainer_state.json`` holds the curriculum sampler's state
    (:class:`cpr.curriculum.CurriculumStateCallback`); ``False`` when it is missing or unreadable."""
    try:
        saved = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "CurriculumStateCallback" in (saved.get("stateful_callbacks") or {})


def adapter_folder(path: Path, *, field: str = "init_adapter") -> Path:
    """``path`` itself when it holds a LoRA adapter (a checkpoint holds it at its top level: TRL
    saves PEFT adapters there).

    Raises:
        ConfigError: no ``adapter_config.json`` in ``path``, naming ``field`` (the setting or step
            that gave the folder).
    """
    if (Path(path) / "adapter_config.json").is_file():
        return Path(path)
    raise ConfigError(f"no LoRA adapter (adapter_config.json) in {path}", field=field)


def prepare_resume(phase_dir: Path, resume: bool, state: Any) -> Path | None:
    """The checkpoint a resumed phase continues from (module docstring); cut the phase's logs back
    to it and set aside the checkpoints after it (incomplete or diverged) as
    ``abandoned-checkpoint-N-<time>``.

    Args:
        phase_dir: the phase folder.
        resume: whether the run resumes (``False``: nothing is done, ``None`` returned).
        state: ``accelerate.PartialState`` (only the main process moves files; all wait).

    Returns:
        :func:`last_checkpoint` of the phase, or ``None`` (no resume, or nothing to resume from).
    """
    if not resume:
        return None
    from cpr.training.logs import rollback_logs

    ckpt = last_checkpoint(phase_dir)
    start = checkpoint_step(ckpt) if ckpt is not None else 0
    if state.is_main_process and phase_dir.is_dir():
        stamp = int(time.time())
        for other in checkpoints_of(phase_dir):
            if checkpoint_step(other) > start:
                target = phase_dir / f"abandoned-{other.name}-{stamp}"
                logger.warning(
                    "phase %s: %s is %s; moved aside to %s",
                    phase_dir.name,
                    other.name,
                    checkpoint_status(other),
                    target.name,
                )
                os.replace(other, target)
        dropped = {k: v[1] for k, v in rollback_logs(phase_dir, start).items() if v[1]}
        if dropped:
            logger.info("phase %s: dropped log rows written after step %d: %s", phase_dir.name, start, dropped)
    state.wait_for_everyone()
    return ckpt
