"""A GRPO phase's (and the warm start's) ``checkpoint-N`` folders (N = optimizer step): the state cpr adds, which are whole, which one a
resume continues from. The state of cpr's callbacks (curriculum position, guard counters, TRL's position in a
generation batch) goes into the checkpoint's ``trainer_state.json`` through transformers' ``ExportableState``
(:class:`CheckpointState`); only TRL's buffered generation batch, tensors, is a file (:data:`GENERATION_BUFFER_FILE`).
"""

from __future__ import annotations

import contextlib
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

from cpr.errors import ConfigError
from cpr.io import atomic_write_json
from cpr.trl_internals import generation_buffer, micro_step, set_generation_buffer, set_micro_step

logger = logging.getLogger("cpr.training")

_CKPT = re.compile(r"^checkpoint-(\d+)$")

#: Written into a checkpoint once every process saved and every callback wrote its files.
COMPLETE_MARKER = "checkpoint_complete.json"
#: Written into the checkpoint a divergence guard stopped at (the reason, as a GuardEvent).
DIVERGED_MARKER = "diverged.json"
#: A process's buffered generation batch, in a checkpoint that falls inside one ({rank}: process index).
GENERATION_BUFFER_FILE = "generation_buffer.rank{rank}.pt"


def checkpoint_folder(args: Any, state: Any) -> Path:
    """``<output_dir>/checkpoint-<global_step>``: the checkpoint a trainer saves at this step."""
    return Path(args.output_dir) / f"checkpoint-{state.global_step}"


def checkpoint_step(ckpt: str | Path) -> int:
    """The step N of a ``checkpoint-N`` folder. Raises ``ValueError`` for another name."""
    m = _CKPT.match(Path(ckpt).name)
    if m is None:
        raise ValueError(f"not a checkpoint folder name: {Path(ckpt).name!r}")
    return int(m.group(1))


def checkpoints_of(phase_dir: str | Path) -> list[Path]:
    """``checkpoint-N`` folders of a phase, sorted by step (``[]`` when the folder does not exist)."""
    phase_dir = Path(phase_dir)
    found = [p for p in phase_dir.iterdir() if _CKPT.match(p.name) and p.is_dir()] if phase_dir.is_dir() else []
    return sorted(found, key=checkpoint_step)


def _trainer_state(ckpt: Path) -> dict[str, Any] | None:
    try:
        return json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


#: The weights a checkpoint of a LoRA run holds (PEFT's file name).
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """Why a saved checkpoint would not load, naming the file, or ``None``. Only headers are read (a truncated torch
    zip has no central directory); weights that are garbage of the right size pass."""
    import zipfile

    from safetensors import SafetensorError, safe_open

    ckpt = Path(ckpt)
    state = ckpt / "trainer_state.json"
    if not state.is_file():
        return f"{state} is missing"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{state} does not read as JSON ({type(e).__name__}: {e})"
    with contextlib.suppress(OSError, ValueError, TypeError):
        listed = json.loads((ckpt / COMPLETE_MARKER).read_text(encoding="utf-8")).get("files") or []
        if gone := [name for name in listed if not (ckpt / name).exists()]:
            return f"{ckpt / gone[0]} is missing (listed in {COMPLETE_MARKER})"
    weights = ckpt / ADAPTER_WEIGHTS
    if weights.is_file():
        try:
            with safe_open(str(weights), "pt"):
                pass
        except (SafetensorError, OSError) as e:
            return f"{weights} does not load ({e})"
    for f in sorted(ckpt.iterdir()):
        if f.suffix in (".pt", ".pth", ".bin") and f.is_file() and not zipfile.is_zipfile(f):
            return f"{f} is not a whole torch file (truncated?)"
    return None


def checkpoint_status(ckpt: str | Path) -> str:
    """``"complete"`` (holds :data:`COMPLETE_MARKER`, or in a phase without markers a ``trainer_state.json`` that
    parses), ``"diverged"`` (complete, with :data:`DIVERGED_MARKER`), ``"incomplete"`` (a kill while saving) or
    ``"corrupt"`` (complete, but :func:`checkpoint_problem` finds a damaged file)."""
    ckpt = Path(ckpt)
    unmarked_phase = not any((c / COMPLETE_MARKER).is_file() for c in checkpoints_of(ckpt.parent))
    complete = (ckpt / COMPLETE_MARKER).is_file() or (unmarked_phase and _trainer_state(ckpt) is not None)
    if not complete:
        return "incomplete"
    if checkpoint_problem(ckpt) is not None:
        return "corrupt"
    return "diverged" if (ckpt / DIVERGED_MARKER).is_file() else "complete"


def last_checkpoint(phase_dir: str | Path) -> Path | None:
    """The latest checkpoint whose :func:`checkpoint_status` is ``"complete"``, or ``None``."""
    return next((c for c in reversed(checkpoints_of(phase_dir)) if checkpoint_status(c) == "complete"), None)


def training_done(ckpt: str | Path) -> bool:
    """Whether ``ckpt`` was saved at its trainer's last step (``0 < max_steps <= global_step``), from which
    transformers' loop would still train one step; ``False`` when ``trainer_state.json`` does not read."""
    saved = _trainer_state(Path(ckpt)) or {}
    try:
        return 0 < int(saved.get("max_steps") or 0) <= int(saved.get("global_step") or 0)
    except (TypeError, ValueError):
        return False


def restore_trained(trainer: Any, ckpt: str | Path) -> None:
    """Put ``trainer`` (LoRA) where it stood when it saved ``ckpt`` (its ``TrainerState`` and adapter weights),
    without training: for a checkpoint of the last step (:func:`training_done`)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState

    ckpt = Path(ckpt)
    trainer.state = TrainerState.load_from_json(str(ckpt / "trainer_state.json"))
    set_peft_model_state_dict(trainer.model, load_file(str(ckpt / ADAPTER_WEIGHTS)))


def has_curriculum_state(ckpt: Path) -> bool:
    """Whether a checkpoint's ``trainer_state.json`` holds the curriculum sampler's state."""
    return "CurriculumStateCallback" in ((_trainer_state(ckpt) or {}).get("stateful_callbacks") or {})


def adapter_folder(path: Path, *, field: str = "init_adapter") -> Path:
    """``path`` when it holds a LoRA adapter (as a checkpoint does), else a :class:`ConfigError` naming ``field``."""
    if (Path(path) / "adapter_config.json").is_file():
        return Path(path)
    raise ConfigError(f"no LoRA adapter (adapter_config.json) in {path}", field=field)


def prepare_resume(phase_dir: Path, resume: bool, state: Any) -> Path | None:
    """The checkpoint a resumed phase continues from (:func:`last_checkpoint`; ``None`` without ``resume`` or one),
    the phase's logs cut back to its step and later checkpoints renamed ``abandoned-checkpoint-N-<time>``."""
    if not resume:
        return None
    from cpr.training.logs import rollback_logs

    ckpt = last_checkpoint(phase_dir)
    start = checkpoint_step(ckpt) if ckpt is not None else 0
    if state.is_main_process and phase_dir.is_dir():
        for other in checkpoints_of(phase_dir):
            if checkpoint_step(other) > start:
                target = phase_dir / f"abandoned-{other.name}-{int(time.time())}"
                status = checkpoint_status(other)
                if status == "corrupt":
                    status = f"corrupt ({checkpoint_problem(other)})"
                logger.warning("phase %s: %s is %s; moved aside to %s; resuming from %s", phase_dir.name, other.name,
                               status, target.name, ckpt.name if ckpt is not None else "the start")
                os.replace(other, target)
        dropped = {k: v[1] for k, v in rollback_logs(phase_dir, start).items() if v[1]}
        if dropped:
            logger.info("phase %s: dropped log rows written after step %d: %s", phase_dir.name, start, dropped)
    state.wait_for_everyone()
    return ckpt


def mark_complete(args: Any, state: Any) -> None:
    """Write :data:`COMPLETE_MARKER` into the checkpoint just saved (``args.should_save``), once every process has
    written its files. Raises ``FileNotFoundError`` when the checkpoint folder is missing."""
    folder = checkpoint_folder(args, state)
    if not args.should_save:
        return
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {folder} not found; cannot mark it complete")
    marker = {"step": state.global_step, "files": sorted(os.listdir(folder)), "time": time.time()}
    atomic_write_json(folder / COMPLETE_MARKER, marker)


class CompleteMarkerCallback(TrainerCallback):
    """Marks each checkpoint of the warm start's trainer complete (:func:`mark_complete`)."""

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        from cpr.distributed import process_state

        process_state().wait_for_everyone()
        mark_complete(args, state)


class CheckpointState(TrainerCallback, ExportableState):
    """A callback whose ``state_dict()`` transformers saves in every checkpoint's ``trainer_state.json``
    (``ExportableState``); a resumed run gets it back from :meth:`saved_state` in ``on_train_begin``."""

    def state(self) -> dict[str, Any]:  # noqa: D102
        return {"args": {}, "attributes": self.state_dict()}

    def saved_state(self, state: Any) -> dict[str, Any] | None:
        """The attributes the resumed checkpoint saved for this callback (``None``: a fresh run, or a
        checkpoint saved without it, whose state transformers is then told to save from now on)."""
        if state.global_step <= 0:
            return None
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        saved = saved[-1] if isinstance(saved, list) else saved
        if saved is None:  # transformers' checkpoints update only the states they hold
            state.stateful_callbacks[name] = self.state()
        return saved["attributes"] if saved else None


class CheckpointCallback(CheckpointState):
    """Completes each checkpoint of a ``GRPOTrainer`` (add it last): TRL's micro-step counter and, inside a
    generation batch, each process's buffered batch (:data:`GENERATION_BUFFER_FILE`), both restored on resume
    (a resumed run would generate again, from other weights), then :data:`COMPLETE_MARKER`. Raises
    ``FileNotFoundError`` when the checkpoint folder is missing when saving, or on resume for a checkpoint
    inside a generation batch without this process's buffer (saved with another number of processes)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"micro_step": micro_step(self.trainer)}

    def _buffer(self, args: Any, state: Any, step: int) -> Path | None:
        """This process's buffer file when micro-step ``step`` falls inside a generation batch, else ``None``."""
        if step % (self.trainer.args.steps_per_generation * self.trainer.num_iterations) == 0:
            return None
        rank = self.trainer.accelerator.process_index
        return checkpoint_folder(args, state) / GENERATION_BUFFER_FILE.format(rank=rank)

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        path = self._buffer(args, state, micro_step(self.trainer))
        if path is not None and generation_buffer(self.trainer) is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(generation_buffer(self.trainer), path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
        self.trainer.accelerator.wait_for_everyone()
        mark_complete(args, state)

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        saved = self.saved_state(state)
        if saved is None:
            return
        step = int(saved["micro_step"])
        set_micro_step(self.trainer, step)
        path = self._buffer(args, state, step)
        if path is not None:
            if not path.is_file():
                raise FileNotFoundError(f"{path} not found: the checkpoint falls inside a generation batch")
            set_generation_buffer(self.trainer, torch.load(path, map_location=self.trainer.accelerator.device))
