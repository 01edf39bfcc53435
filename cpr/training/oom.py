"""Out of memory in a run: one error that says where it happened and which settings to lower.

:func:`explain_oom` wraps each long stage of a run (warm start, a GRPO phase, checkpoint
selection, an evaluation): an out-of-memory error raised inside (``torch.OutOfMemoryError``,
``MemoryError``, or a ``RuntimeError`` saying "out of memory", anywhere in the cause / context
chain) becomes a :class:`TrainingOutOfMemoryError` whose one-line message names the place (the
step encoder, an evaluation, the warm start, or training / generation) and the config keys to
lower with their current values; the original error is its ``__cause__``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from collections.abc import Iterator
from typing import Any

from cpr.errors import CprError
from cpr.training.config import ExperimentConfig, PhaseConfig, phase_training_args

__all__ = ["TrainingOutOfMemoryError", "explain_oom", "oom_advice", "oom_in"]


class TrainingOutOfMemoryError(CprError):
    """Out of memory during training, generation, the step encoder or an evaluation.

    The message (one line) says where and names the settings to lower with their current
    values; the original ``torch.OutOfMemoryError`` / ``RuntimeError`` is the ``__cause__``.
    """


def oom_in(exc: BaseException) -> BaseException | None:
    """The out-of-memory error in ``exc``'s cause / context chain (``exc`` included), or ``None``."""
    import torch

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (torch.OutOfMemoryError, MemoryError)):
            return cur
        if isinstance(cur, RuntimeError) and "out of memory" in str(cur).lower():
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _raised_in(exc: BaseException, *parts: str) -> bool:
    suffix = os.sep.join(parts)
    return any(frame.filename.endswith(suffix) or f"{suffix}{os.sep}" in frame.filename
               for frame in traceback.extract_tb(exc.__traceback__))


def oom_advice(cfg: ExperimentConfig, stage: str, phase: PhaseConfig | None, oom: BaseException) -> str:
    """The one-line message of a :class:`TrainingOutOfMemoryError`.

    Args:
        cfg: the run's config (the current values named in the advice).
        stage: ``"training"``, ``"evaluation"`` or ``"warm start"``; an error raised in
            ``cpr/matching.py`` is put down to the step encoder, one raised in ``cpr/evaluation``
            to an evaluation, whatever the stage.
        phase: the GRPO phase it happened in, if any (its merged ``training`` settings are named).
        oom: the out-of-memory error (:func:`oom_in`).

    Returns:
        ``"out of memory <where> (<phase or stage>): <error type>: <first line>; lower <settings>"``.
    """
    from trl import GRPOConfig

    r = cfg.rewards
    ev = cfg.evaluation
    pixels = f"model.max_pixels (now {cfg.model.max_pixels}; fewer image tokens)"
    encoder = f"rewards.batch_size (now {r.batch_size}; the step encoder's batch)"
    if _raised_in(oom, "cpr", "matching.py"):
        where = "in the step encoder"
        advice = [encoder, "or move the encoder with rewards.device"]
    elif _raised_in(oom, "cpr", "evaluation") or stage == "evaluation":
        where = "in an evaluation"
        advice = [
            f"evaluation.batch_size (now {ev.batch_size})",
            f"evaluation.max_new_tokens (now {ev.max_new_tokens})",
            pixels,
            encoder,
        ]
    elif stage == "warm start":
        ws = cfg.warm_start
        where = "in the warm start"
        advice = [
            f"warm_start.per_device_train_batch_size (now {ws.per_device_train_batch_size})",
            f"warm_start.max_length (now {ws.max_length})",
            pixels,
        ]
    else:
        args = phase_training_args(cfg, phase.name) if phase is not None else dict(cfg.training)
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}

        def now(k: str) -> Any:
            return args.get(k, defaults.get(k))

        where = "in training or generation"
        advice = [
            f"training.per_device_train_batch_size (now {now('per_device_train_batch_size')})",
            f"training.num_generations (now {now('num_generations')}; keep the generation batch divisible by it)",
            pixels,
            f"training.max_completion_length (now {now('max_completion_length')})",
            f"or turn on model.gradient_checkpointing; the encoder's batch is {encoder}",
        ]
    place = f"phase {phase.name}" if phase is not None else stage
    first = (str(oom).strip().splitlines() or [type(oom).__name__])[0][:200]
    return f"out of memory {where} ({place}): {type(oom).__name__}: {first}; lower " + ", ".join(advice)


@contextlib.contextmanager
def explain_oom(cfg: ExperimentConfig, stage: str, phase: PhaseConfig | None = None) -> Iterator[None]:
    """Turn an out-of-memory error raised in the block into a :class:`TrainingOutOfMemoryError`
    (:func:`oom_advice`); any other error passes through unchanged.

    Raises:
        TrainingOutOfMemoryError: out of memory in the block (the original is its ``__cause__``).
    """
    try:
        yield
    except TrainingOutOfMemoryError:
        raise
    except Exception as e:
        oom = oom_in(e)
        if oom is None:
            raise
        raise TrainingOutOfMemoryError(oom_advice(cfg, stage, phase, oom)) from oom
