"""Out of memory in a run: one error that says where it happened and which settings to lower."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from typing import Any

from cpr.errors import CprError
from cpr.training.build import PhaseSpec, trl_default
from cpr.training.config_sections import ExperimentConfig


class TrainingOutOfMemoryError(CprError):
    """Out of memory in training, generation, the step encoder or an evaluation: the one-line message says
    where and names the settings to lower with their current values; the original error is the ``__cause__``."""


def _oom_in(exc: BaseException) -> BaseException | None:
    """The out-of-memory error in ``exc``'s cause / context chain (``exc`` included), or ``None``."""
    import torch

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
            isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
        ):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _raised_in(exc: BaseException, *parts: str) -> bool:
    suffix = os.sep.join(parts)
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.filename.endswith(suffix) or f"{suffix}{os.sep}" in f.filename for f in frames)


def _advice(cfg: ExperimentConfig, stage: str, phase: Any, oom: BaseException) -> str:
    """``"out of memory <where> (<phase or stage>): <error type>: <first line>; lower <settings>"``."""
    pixels = f"model.max_pixels (now {cfg.model.max_pixels}; fewer image tokens)"
    encoder = f"rewards.batch_size (now {cfg.rewards.batch_size}; the step encoder's batch)"
    if _raised_in(oom, "cpr", "matching.py"):
        where, advice = "in the step encoder", [encoder, "or move the encoder with rewards.device"]
    elif _raised_in(oom, "cpr", "evaluation") or stage == "evaluation":
        ev = cfg.evaluation
        where = "in an evaluation"
        advice = [f"evaluation.batch_size (now {ev.batch_size})",
                  f"evaluation.max_new_tokens (now {ev.max_new_tokens})", pixels, encoder]
    elif stage == "warm start":
        ws = cfg.warm_start
        where = "in the warm start"
        advice = [f"warm_start.per_device_train_batch_size (now {ws.per_device_train_batch_size})",
                  f"warm_start.max_length (now {ws.max_length})", pixels]
    else:
        def value(key: str) -> Any:  # the phase's trainer's setting, else the shared training section's
            return phase.setting(key) if isinstance(phase, PhaseSpec) else cfg.training.get(key, trl_default(key))

        where = "in training or generation"
        advice = [f"training.per_device_train_batch_size (now {value('per_device_train_batch_size')})",
                  f"training.num_generations (now {value('num_generations')}; keep the generation batch divisible "
                  "by it)",
                  pixels, f"training.max_completion_length (now {value('max_completion_length')})",
                  f"or turn on model.gradient_checkpointing; the encoder's batch is {encoder}"]
    first = (str(oom).strip().splitlines() or [type(oom).__name__])[0][:200]
    place = f"phase {phase.name}" if phase is not None else stage
    return f"out of memory {where} ({place}): {type(oom).__name__}: {first}; lower " + ", ".join(advice)


@contextlib.contextmanager
def explain_oom(cfg: ExperimentConfig, stage: str, phase: Any = None) -> Iterator[None]:
    """Turn an out-of-memory error (``torch.OutOfMemoryError``, ``MemoryError`` or a ``RuntimeError`` saying
    "out of memory", anywhere in the cause chain) raised in the block into a :class:`TrainingOutOfMemoryError`.
    ``stage``: ``"training"``, ``"evaluation"`` or ``"warm start"``; ``phase``: in training its
    :class:`cpr.training.build.PhaseSpec` (its trainer's settings are named), else a ``PhaseConfig`` or ``None``.
    """
    try:
        yield
    except TrainingOutOfMemoryError:
        raise
    except Exception as e:
        oom = _oom_in(e)
        if oom is None:
            raise
        raise TrainingOutOfMemoryError(_advice(cfg, stage, phase, oom)) from oom
