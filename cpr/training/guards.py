"""Divergence guards for the GRPO phases, the generation-batch state and the checkpoint completion marker.

docs/method.md section 4 notes that the paper's Composite and Answer-Only runs diverge to NaN gradients;
the guards notice that (and two quieter failures) at the optimizer step where it happens, and
act as the ``guards:`` section of the experiment config says (:class:`cpr.training.config.GuardsConfig`).

Conditions, checked once per optimizer step (after the gradients of all its micro-steps are
accumulated and clipped, before ``optimizer.step()``):

``nan``
    a NaN or Inf in any reward of the step's generation batch (every reward function's output,
    gathered over processes), in the loss of any micro-step, or in the gradient norm
    (``Trainer._get_grad_norm``, the value logged as ``grad_norm``). A reward function's ``None``
    (no reward for that completion, which TRL turns into NaN) is not counted: the NaNs of a
    column are reduced by the ``None`` the function returned (:attr:`cpr.rewards.RewardFunction.none_count`,
    summed over processes).
``kl``
    the step's mean KL to the reference model (TRL's ``kl`` metric, computed when ``beta > 0``)
    above ``guards.kl.limit`` for ``guards.kl.consecutive_steps`` steps in a row.
``zero_std``
    no learning signal: every group of the step's generation batches has a reward standard
    deviation of zero (TRL's ``frac_reward_zero_std`` = 1) for a window of steps in a row:
    ``guards.zero_std.window`` (50), or in a shorter phase ``guards.zero_std.fraction`` (0.25) of its
    ``max_steps``, at least 1 (:meth:`cpr.training.config.ZeroStdGuardConfig.window_for`). A step
    that reuses buffered completions (``steps_per_generation`` or ``num_iterations`` > 1) keeps the
    value of the generation batch it trains on.

Actions (per condition, or ``guards.action`` for all):

``warn``
    log a warning (logger ``cpr.training.guards``, so also ``run.log``) and record the event.
    ``kl`` and ``zero_std`` warn when their run reaches its length and again every further run
    length while it lasts; ``nan`` at every step where it occurs.
``skip_step``
    zero the step's update: every parameter the optimizer holds gets ``grad = None`` in
    ``on_pre_optimizer_step``. torch's optimizers (Adam, AdamW, SGD, ...) skip parameters without a
    gradient entirely, so with Adam-type optimizers the parameters, both moment estimates, the
    bias-correction step count and weight decay are all left exactly as they were (not a zero
    gradient, which would still decay the moments and move the parameters by momentum). The
    learning-rate scheduler still advances and the step counts toward ``max_steps``. Counted in
    ``skipped_steps``. Not available with DeepSpeed (its engine steps inside ``backward``) or fp16
    loss scaling (torch's ``GradScaler`` needs gradients to check): refused at start with a
    :class:`ConfigError`.
``stop``
    the step's update is not applied either (the saved weights are the last finite ones; under
    DeepSpeed the engine has already stepped inside ``backward``, so they include it); the
    trainer saves ``checkpoint-N`` at once, with ``diverged.json`` (the reason) beside its files,
    and stops. The runner then writes ``summary.json`` with status ``"diverged"`` and raises
    :class:`TrainingDivergedError` (the recipe and ``cpr train`` print its one-line message and
    exit with its :attr:`~TrainingDivergedError.exit_code`, 3).
    ``--resume`` never resumes from a diverged checkpoint. If the eval hook is on, it scores the
    policy once at the stop (as at any end of training).

Every event goes to ``<phase>/guard_events.jsonl``; the counters go to the trainer logs
(``guards/*``), to ``guard_state.json`` in every checkpoint (so a resumed run continues its runs
of KL / zero-std steps) and to the phase's entry in ``summary.json``.

:class:`GenerationStateCallback` keeps TRL's position inside a generation batch (and the buffered
batch) in the checkpoints, so a resumed run continues it exactly.

:class:`CheckpointCompleteCallback` writes ``checkpoint_complete.json`` into a checkpoint after
every process has saved and every other callback has written its files: transformers 5.24's
``Trainer._save_checkpoint`` writes the folder in place (no temporary folder and rename), so a
run killed while saving leaves an incomplete folder, which ``--resume`` skips
(:func:`cpr.training.checkpoints.last_checkpoint`).

The hooks are small overrides of :class:`cpr.curriculum.CurriculumGRPOTrainer` (TRL's
``GRPOTrainer``): ``_calculate_rewards``, ``training_step`` and ``_get_grad_norm`` call the parent
and hand the result to the guard; ``log`` adds the counters. The KL and zero-std values are read
from the lists TRL accumulates in ``GRPOTrainer._metrics["train"]`` between two logging steps.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cpr.curriculum import CurriculumGRPOTrainer
from cpr.errors import ConfigError, CprError
from cpr.io import append_jsonl, atomic_write_json
from cpr.training.checkpoints import (
    COMPLETE_MARKER,
    DIVERGED_MARKER,
    GENERATION_BUFFER_FILE,
    GUARD_STATE_FILE,
)
from cpr.training.config import DEFAULT_GUARD_ACTIONS, GuardsConfig

logger = logging.getLogger("cpr.training.guards")

__all__ = [
    "EVENTS_FILE",
    "CheckpointCompleteCallback",
    "DivergenceGuard",
    "GenerationStateCallback",
    "GuardEvent",
    "GuardedGRPOTrainer",
    "TrainingDivergedError",
    "drop_update",
]

EVENTS_FILE = "guard_events.jsonl"
_SEVERITY = {"warn": 0, "skip_step": 1, "stop": 2}
_CONDITIONS = tuple(DEFAULT_GUARD_ACTIONS)


class TrainingDivergedError(CprError):
    """A guard with action ``stop`` ended a phase.

    Args:
        message: one line: phase, step, condition and reason, the diverged checkpoint.
        event: the :class:`GuardEvent` as a dict.
        checkpoint: the checkpoint folder marked ``diverged.json`` (``None`` if none was saved).
        summary: the run summary written to ``summary.json`` (status ``"diverged"``).

    Attributes:
        exit_code: the process exit code of the recipe and ``cpr train`` when this ends a run (3;
            other :class:`~cpr.errors.CprError` exit with 2), so a scheduler can tell a diverged
            run (a result) from a failed one.
    """

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        event: dict[str, Any] | None = None,
        checkpoint: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.event = event
        self.checkpoint = checkpoint
        self.summary = summary


@dataclass
class GuardEvent:
    """One occurrence of a guard condition.

    Attributes:
        step: the optimizer step it happened in (``global_step`` after that step, 1-based).
        condition: ``"nan"``, ``"kl"`` or ``"zero_std"``.
        action: the action taken: ``"warn"``, ``"skip_step"`` or ``"stop"``.
        reason: one line, e.g. ``"non-finite loss (nan), grad_norm (nan)"``.
        values: the numbers behind it (JSON-serialisable; non-finite floats as strings).
    """

    step: int
    condition: str
    action: str
    reason: str
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (written to ``guard_events.jsonl`` and ``diverged.json``)."""
        return asdict(self)


def drop_update(optimizer: Any) -> int:
    """Zero the coming optimizer step's update: set ``grad = None`` on every parameter it holds.

    torch's optimizers skip parameters whose ``grad`` is ``None`` (no parameter change, no
    moment or step-count update, no weight decay). Returns the number of parameters cleared.
    """
    n = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad = None
                n += 1
    return n


def _json_float(v: float | None) -> float | str | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else str(v)


class DivergenceGuard(TrainerCallback):
    """Checks each optimizer step for the guard conditions and acts (see the module docstring).

    Args:
        config: the ``guards`` section of the experiment config.
        events_path: JSON lines file receiving every event (main process); ``None``: not written.

    The trainer feeds it through :meth:`observe_rewards`, :meth:`observe_loss` and
    :meth:`observe_grad_norm` (:class:`GuardedGRPOTrainer` does), and :meth:`bind` gives it the
    trainer whose ``_metrics`` hold TRL's KL and zero-std values.

    Attributes:
        counts: per condition, ``{"steps": steps where it held, "skipped": steps it skipped}``.
        skipped_steps: the optimizer steps whose update was dropped (``skip_step``).
        stopped: the :class:`GuardEvent` that stopped training, or ``None``.
        events: every event of this process's run (warnings included).
    """

    def __init__(self, config: GuardsConfig, *, events_path: str | Path | None = None) -> None:
        self.config = config
        self.events_path = Path(events_path) if events_path is not None else None
        self.trainer: Any = None
        self.counts: dict[str, dict[str, int]] = {c: {"steps": 0, "skipped": 0} for c in _CONDITIONS}
        self.skipped_steps: list[int] = []
        self.kl_streak = 0
        self.zero_std_run = 0
        self.last_frac_zero_std: float | None = None
        self.zero_std_window = config.zero_std.window  # scaled to the phase's length in on_train_begin
        self.stopped: GuardEvent | None = None
        self.events: list[GuardEvent] = []
        self._reset_step()
        self._marks: dict[str, int] = {}

    # -- wiring -----------------------------------------------------------------------------

    def bind(self, trainer: Any) -> DivergenceGuard:
        """Give the guard its trainer (for TRL's per-step metrics and the accelerator). Returns ``self``."""
        self.trainer = trainer
        return self

    def actions(self) -> dict[str, str]:
        """The resolved action of each enabled condition."""
        return {c: self.config.action_for(c) for c in _CONDITIONS if getattr(self.config, c).enabled}

    def check_supported(self, *, deepspeed: bool, fp16_scaler: bool) -> None:
        """Refuse ``skip_step`` where it cannot zero an update.

        Raises:
            ConfigError: ``skip_step`` under DeepSpeed or with fp16 loss scaling, naming the key.
        """
        for cond, action in self.actions().items():
            if action != "skip_step":
                continue
            key = f"guards.{cond}.action" if getattr(self.config, cond).action else "guards.action"
            if deepspeed:
                raise ConfigError(
                    "skip_step cannot drop an update under DeepSpeed (its engine steps the optimizer inside "
                    "backward); use warn or stop",
                    field=key,
                )
            if fp16_scaler:
                raise ConfigError(
                    "skip_step is not available with fp16 loss scaling (torch's GradScaler skips non-finite "
                    "steps itself); use bf16 or fp32, or warn / stop",
                    field=key,
                )

    # -- observations (called by the trainer) -----------------------------------------------

    def _reset_step(self) -> None:
        self._bad_rewards: dict[str, int] = {}
        self._bad_loss: float | None = None
        self._grad_norm: float | None = None

    def observe_rewards(
        self, rewards_per_func: torch.Tensor, names: Sequence[str], none_counts: Sequence[int] | None = None
    ) -> None:
        """Record non-finite rewards of a generation batch.

        Args:
            rewards_per_func: ``(n_completions, n_reward_functions)``, as TRL's ``_calculate_rewards``
                returns it (gathered over processes).
            names: the reward functions' names, one per column.
            none_counts: per column, how many of its NaNs are a ``None`` the function returned
                (no reward, not a fault); default none.
        """
        bad = (~torch.isfinite(rewards_per_func)).sum(dim=0).tolist()
        for name, n, k in zip(names, bad, none_counts or [0] * len(names), strict=True):
            if n > k:
                self._bad_rewards[name] = self._bad_rewards.get(name, 0) + int(n - k)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Record a micro-step's loss if it is NaN or Inf (the first such value of the step is kept)."""
        loss = loss.detach()
        if self._bad_loss is None and not bool(torch.isfinite(loss).all()):
            flat = loss.float().reshape(-1)
            self._bad_loss = float(flat[~torch.isfinite(flat)][0])

    def observe_grad_norm(self, value: Any) -> None:
        """Record the step's gradient norm (a float, a 0-d tensor, or ``None`` when not computed)."""
        if value is None:
            self._grad_norm = None
            return
        self._grad_norm = float(value.item() if hasattr(value, "item") else value)

    # -- decisions --------------------------------------------------------------------------

    def _train_metrics(self) -> dict[str, list[float]]:
        metrics = getattr(self.trainer, "_metrics", None) if self.trainer is not None else None
        if metrics is None:
            return {}
        return metrics.get("train", {})

    def _new_values(self, key: str) -> list[float]:
        values = self._train_metrics().get(key, [])
        start = self._marks.get(key, 0)
        return [float(v) for v in values[start:]] if len(values) > start else []

    def _nonfinite_reasons(self) -> tuple[list[str], dict[str, Any]]:
        bad_rewards = dict(self._bad_rewards)
        loss_bad = self._bad_loss is not None
        grad_bad = self._grad_norm is not None and not math.isfinite(self._grad_norm)
        trainer = self.trainer
        accelerator = getattr(trainer, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1:
            # The loss is per process; make every process take the same decision.
            flags = torch.tensor([float(loss_bad), float(grad_bad)], device=accelerator.device)
            flags = accelerator.reduce(flags, reduction="sum")
            loss_bad, grad_bad = bool(flags[0] > 0), bool(flags[1] > 0)
        reasons = [f"reward {name} ({n} of the batch)" for name, n in bad_rewards.items()]
        if loss_bad:
            reasons.append(f"loss ({self._bad_loss if self._bad_loss is not None else 'on another process'})")
        if grad_bad:
            reasons.append(f"grad_norm ({self._grad_norm})")
        values = {
            "rewards": bad_rewards,
            "loss": _json_float(self._bad_loss),
            "grad_norm": _json_float(self._grad_norm),
        }
        return reasons, values

    def _check(self, step: int) -> list[tuple[str, str, dict[str, Any], bool]]:
        """Conditions holding at ``step``: ``(condition, reason, values, announce)``."""
        held: list[tuple[str, str, dict[str, Any], bool]] = []
        cfg = self.config
        if cfg.nan.enabled:
            reasons, values = self._nonfinite_reasons()
            if reasons:
                held.append(("nan", "non-finite " + ", ".join(reasons), values, True))
        if cfg.kl.enabled:
            kl_values = self._new_values("kl")
            if kl_values:
                kl = sum(kl_values) / len(kl_values)
                self.kl_streak = self.kl_streak + 1 if (math.isfinite(kl) and kl > cfg.kl.limit) else 0
                k = cfg.kl.consecutive_steps
                if self.kl_streak >= k:
                    held.append(
                        (
                            "kl",
                            f"KL {kl:.4g} above the limit {cfg.kl.limit:g} for {self.kl_streak} steps in a row",
                            {"kl": _json_float(kl), "limit": cfg.kl.limit, "streak": self.kl_streak},
                            (self.kl_streak - k) % k == 0,
                        )
                    )
        if cfg.zero_std.enabled:
            fracs = self._new_values("frac_reward_zero_std")
            if fracs:
                self.last_frac_zero_std = min(fracs)
            if self.last_frac_zero_std is not None:
                no_signal = self.last_frac_zero_std >= 1.0 - 1e-9
                self.zero_std_run = self.zero_std_run + 1 if no_signal else 0
                w = self.zero_std_window
                if self.zero_std_run >= w:
                    held.append(
                        (
                            "zero_std",
                            f"every group's reward std was zero for {self.zero_std_run} steps in a row "
                            "(no learning signal)",
                            {"frac_reward_zero_std": self.last_frac_zero_std, "run": self.zero_std_run},
                            (self.zero_std_run - w) % w == 0,
                        )
                    )
        return held

    # -- callback events --------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        self.zero_std_window = self.config.zero_std.window_for(state.max_steps)
        if state.global_step > 0:
            path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / GUARD_STATE_FILE
            if path.is_file():
                import json

                self.load_state_dict(json.loads(path.read_text(encoding="utf-8")))

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102
        self._reset_step()
        metrics = self._train_metrics()
        self._marks = {k: len(metrics.get(k, [])) for k in ("kl", "frac_reward_zero_std")}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):  # noqa: D102
        step = state.global_step + 1
        held = self._check(step)
        if not held:
            return
        worst = "warn"
        for condition, reason, values, announce in held:
            action = self.config.action_for(condition)
            self.counts[condition]["steps"] += 1
            if _SEVERITY[action] > _SEVERITY[worst]:
                worst = action
            if action == "warn" and not announce:
                continue
            event = GuardEvent(step, condition, action, reason, values)
            self._record(event, state)
            if action == "stop" and self.stopped is None:
                self.stopped = event
        if worst in ("skip_step", "stop"):
            if optimizer is None:
                raise RuntimeError("the guard needs the optimizer to drop an update")
            drop_update(optimizer)
        if worst == "skip_step":
            self.skipped_steps.append(step)
            for condition, *_ in held:
                if self.config.action_for(condition) == "skip_step":
                    self.counts[condition]["skipped"] += 1

    def _record(self, event: GuardEvent, state: Any) -> None:
        self.events.append(event)
        verb = {"warn": "warning", "skip_step": "update skipped", "stop": "stopping"}[event.action]
        logger.warning("guard %s at step %d (%s): %s", event.condition, event.step, verb, event.reason)
        if self.events_path is not None and state.is_world_process_zero:
            append_jsonl(self.events_path, {**event.to_dict(), "time": time.time()})

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.stopped is not None and self.stopped.step == state.global_step:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        if not args.should_save:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} not found; cannot write {GUARD_STATE_FILE}")
        atomic_write_json(folder / GUARD_STATE_FILE, self.state_dict())
        if self.stopped is not None and self.stopped.step == state.global_step:
            atomic_write_json(
                folder / DIVERGED_MARKER,
                {**self.stopped.to_dict(), "note": "the update of this step was not applied"},
            )

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The running counters (written to ``guard_state.json`` in each checkpoint)."""
        return {
            "kl_streak": self.kl_streak,
            "zero_std_run": self.zero_std_run,
            "last_frac_zero_std": self.last_frac_zero_std,
            "counts": self.counts,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters saved by :meth:`state_dict` (a resumed run)."""
        self.kl_streak = int(state.get("kl_streak", 0))
        self.zero_std_run = int(state.get("zero_std_run", 0))
        self.last_frac_zero_std = state.get("last_frac_zero_std")
        for cond, counts in (state.get("counts") or {}).items():
            if cond in self.counts:
                self.counts[cond] = {k: int(v) for k, v in counts.items()}
        self.skipped_steps = [int(s) for s in state.get("skipped_steps", [])]

    def report(self) -> dict[str, Any]:
        """Summary for ``summary.json``: actions, counters, skipped steps, the stop event if any."""
        return {
            "actions": self.actions(),
            "counts": self.counts,
            "skipped_steps": list(self.skipped_steps),
            "n_events": len(self.events),
            "stopped": self.stopped.to_dict() if self.stopped is not None else None,
        }

    def log_values(self) -> dict[str, float]:
        """Counters for the trainer logs (``guards/<condition>_steps``, ``guards/skipped_steps``)."""
        out = {f"guards/{c}_steps": float(v["steps"]) for c, v in self.counts.items()}
        out["guards/skipped_steps"] = float(len(self.skipped_steps))
        return out


class CheckpointCompleteCallback(TrainerCallback):
    """Writes ``checkpoint_complete.json`` into each checkpoint once it is whole.

    Add it *after* every other callback that writes into checkpoints (the curriculum state, the
    guard): its ``on_save`` waits for every process (``accelerator.wait_for_everyone()``), then the
    main process writes the marker atomically: ``{"step", "files", "time"}``.

    Args:
        trainer: the trainer (for its accelerator).
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.trainer.accelerator.wait_for_everyone()
        if not args.should_save:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} not found; cannot mark it complete")
        atomic_write_json(
            folder / COMPLETE_MARKER,
            {"step": state.global_step, "files": sorted(os.listdir(folder)), "time": time.time()},
        )


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
      (the process's share of the generation batch: prompt and completion ids, masks, advantages, old
      and reference log-probabilities, pixel values); a checkpoint at a generation boundary holds
      none, the resumed run generates there as the uninterrupted one does;
    - ``on_train_begin`` of a resumed run sets ``_step`` and ``_buffered_inputs`` back (torch's and the
      sampler's RNG states come back with transformers' and the curriculum's checkpoint state).

    Add it before :class:`CheckpointCompleteCallback`, so that the completion marker is written after
    the buffer.

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


class GuardedGRPOTrainer(CurriculumGRPOTrainer):
    """:class:`cpr.curriculum.CurriculumGRPOTrainer` with the divergence guards wired in.

    Args:
        *args, **kwargs: as ``CurriculumGRPOTrainer``.
        guards: the ``guards`` config; ``None`` or ``enabled: false``: no guard.
        guard_events_path: where the guard appends its events (``None``: not written).

    Attributes:
        guard: the :class:`DivergenceGuard` (also in the callbacks), or ``None``.

    Raises:
        ConfigError: ``skip_step`` under DeepSpeed or fp16 loss scaling.
        RuntimeError: TRL no longer keeps ``_metrics`` (the guards read KL / zero-std there).
    """

    def __init__(
        self,
        *args: Any,
        guards: GuardsConfig | None = None,
        guard_events_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.guard: DivergenceGuard | None = None
        if guards is None or not guards.enabled:
            return
        if not isinstance(getattr(self, "_metrics", None), dict) or "train" not in self._metrics:
            raise RuntimeError("this TRL version keeps no GRPOTrainer._metrics['train']; the guards cannot read KL")
        self.guard = DivergenceGuard(guards, events_path=guard_events_path).bind(self)
        self.guard.check_supported(
            deepspeed=bool(getattr(self, "is_deepspeed_enabled", False)),
            fp16_scaler=getattr(self.accelerator, "scaler", None) is not None,
        )
        self.add_callback(self.guard)

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)
        if self.guard is not None and self.model.training:
            nones = torch.tensor(
                [float(getattr(f, "none_count", 0)) for f in self.reward_funcs], device=rewards_per_func.device
            )
            if self.accelerator.num_processes > 1:  # rewards_per_func is gathered: so are the counts
                nones = self.accelerator.reduce(nones, reduction="sum")
            self.guard.observe_rewards(rewards_per_func, self.reward_func_names, [int(k) for k in nones.tolist()])
        return rewards_per_func

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        if self.guard is not None:
            self.guard.observe_loss(loss)
        return loss

    def _get_grad_norm(self, *args: Any, **kwargs: Any) -> Any:
        grad_norm = super()._get_grad_norm(*args, **kwargs)
        if self.guard is not None:
            self.guard.observe_grad_norm(grad_norm)
        return grad_norm

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self.guard is not None and "loss" in logs:
            logs.update(self.guard.log_values())
        super().log(logs, *args, **kwargs)
