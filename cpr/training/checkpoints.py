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
mixes with the lost interval. :class:`GenerationStateCallback` saves TRL's position inside a
generation batch, so a checkpoint that falls inside one resumes exactly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cpr.errors import ConfigError

logger = logging.getLogger("cpr.training")

__all__ = [
    "COMPLETE_MARKER",
    "DIVERGED_MARKER",
    "GENERATION_BUFFER_FILE",
    "GUARD_STATE_FILE",
    "GenerationStateCallback",
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


class GenerationStateCallback(TrainerCallback, ExportableState):
    """Saves TRL's position inside a generation batch in each checkpoint and restores it on resume.

    ``trl.GRPOTrainer`` generates completions for a whole generation batch once every
    ``steps_per_generation x num_iterations`` micro-steps (its ``_step`` counter), keeps them in
    ``_buffered_inputs`` and trains the following micro-steps on slices of that buffer. Neither is in
    TRL's checkpoints, so a run resumed from a checkpoint inside a generation batch would generate
    again at once, one generation early, and train on different completions from then on.

    Restoring the buffer is the only exact way: between the generation and the checkpoint at least one
    optimizer step changed the policy, so generating again, even from the RNG state of the generation,
    would sample from other weights (and recompute other ``old_per_token_logps``). So:

    - ``_step`` is kept in ``trainer_state.json`` (``ExportableState``: ``{"micro_step": N}``);
    - a checkpoint inside a generation batch (``_step % (steps_per_generation x num_iterations) != 0``)
      also holds each process's buffer, ``torch.save``'d as :data:`GENERATION_BUFFER_FILE`
      (the generation batch's tensors: prompt and completion ids, masks, advantages, old and
      reference log-probabilities, pixel values; a few MB at the paper's batch sizes); a checkpoint at
      a generation boundary holds none, the resumed run generates there as the uninterrupted one does;
    - ``on_train_begin`` of a resumed run sets ``_step`` and ``_buffered_inputs`` back (torch's and the
      sampler's RNG states come back with transformers' and the curriculum's checkpoint state).

    Add it before :class:`cpr.training.guards.CheckpointCompleteCallback`, so that the completion
    marker is written after the buffer.

    Args:
        trainer: the ``GRPOTrainer`` (for ``_step``, ``_buffered_inputs`` and the accelerator).

    Raises:
        FileNotFoundError: on resume, a checkpoint inside a generation batch without the buffer of
            this process (saved with another number of processes).
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def state(self) -> dict[str, Any]:  # noqa: D102
        return {"args": {}, "attributes": {"micro_step": int(self.trainer._step)}}

    def _inside(self, step: int) -> bool:
        return step % (self.trainer.args.steps_per_generation * self.trainer.num_iterations) != 0

    def _buffer_path(self, folder: Path) -> Path:
        return folder / GENERATION_BUFFER_FILE.format(rank=self.trainer.accelerator.process_index)

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        if self._inside(self.trainer._step) and self.trainer._buffered_inputs is not None:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            path = self._buffer_path(folder)
            torch.save(self.trainer._buffered_inputs, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        if state.global_step <= 0 or not saved:  # a fresh run, or a checkpoint from before this state
            state.stateful_callbacks[name] = self.state()
            return
        step = int((saved[-1] if isinstance(saved, list) else saved)["attributes"]["micro_step"])
        self.trainer._step = step
        if self._inside(step):
            path = self._buffer_path(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if not path.is_file():
                raise FileNotFoundError(f"{path} not found: the checkpoint falls inside a generation batch")
            self.trainer._buffered_inputs = torch.load(path, map_location=self.trainer.accelerator.device)
