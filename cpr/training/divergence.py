"""Divergence guards of the GRPO phases (``guards:``; docs/training.md, "Divergence guards, resume and failures";
the paper's Composite and Answer-Only runs diverge to NaN gradients, docs/method.md section 4). They check each
optimizer step before ``optimizer.step()``, reading TRL's KL and monitors from ``GRPOTrainer._metrics["train"]``
(:func:`cpr.trl_internals.logged_metrics`), which TRL hands to callbacks only after the update.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from cpr.errors import ConfigError, CprError
from cpr.io import append_jsonl, atomic_write_json
from cpr.training.checkpoints import DIVERGED_MARKER, CheckpointState, checkpoint_folder
from cpr.training.config_sections import DEFAULT_GUARD_ACTIONS, GuardsConfig
from cpr.training.greedy_baseline import ZERO_SIGNAL_METRIC
from cpr.trl_internals import logged_metrics

logger = logging.getLogger("cpr.training.divergence")

EVENTS_FILE = "guard_events.jsonl"
_SEVERITY = {"warn": 0, "skip_step": 1, "stop": 2}


class TrainingDivergedError(CprError):
    """A guard with action ``stop`` ended a phase (``event`` a :class:`GuardEvent` dict, ``checkpoint`` the folder
    marked ``diverged.json`` or ``None``); ``exit_code`` 3 tells a scheduler a diverged run from a failed one."""

    exit_code = 3

    def __init__(self, message: str, *, event: dict | None = None, checkpoint: str | None = None,
                 summary: dict | None = None) -> None:
        super().__init__(message)
        self.event, self.checkpoint, self.summary = event, checkpoint, summary


@dataclass
class GuardEvent:
    """One occurrence of a condition: ``step`` (``global_step`` after it, 1-based), ``condition``, ``action``,
    ``reason`` (one line) and the ``values`` behind it (non-finite floats as strings)."""

    step: int
    condition: str
    action: str
    reason: str
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (a line of ``guard_events.jsonl``, ``diverged.json``)."""
        return asdict(self)


def drop_update(optimizer: Any) -> int:
    """Set ``grad = None`` on every parameter of ``optimizer`` (torch's optimizers skip such parameters: no update,
    moments, step count or weight decay); returns the number cleared."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    for p in params:
        p.grad = None
    return len(params)


def _json_float(v: float | None) -> float | str | None:
    return v if v is None or math.isfinite(v) else str(v)


class _WatchedReward:
    """A reward function whose rewards the guard sees (TRL names it by ``__name__``, as the function)."""

    def __init__(self, func: Any, guard: DivergenceGuard) -> None:
        self.func, self.guard, self.__name__ = func, guard, func.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        rewards = self.func(*args, **kwargs)
        self.guard.observe_rewards(self.__name__, rewards)
        return rewards


class DivergenceGuard(CheckpointState):
    """Checks each optimizer step for ``nan`` (a NaN / Inf reward, micro-step loss or gradient norm on any
    process), ``kl``, ``zero_std`` (with ``baseline`` ``greedy``: :data:`ZERO_SIGNAL_METRIC`) and
    ``reward_hacking`` and acts. ``counts``: per condition, ``{"steps": steps where it held, "skipped": updates
    it dropped}``; ``stopped``: the :class:`GuardEvent` that stopped training, or ``None``."""

    def __init__(self, config: GuardsConfig, *, events_path: str | Path | None = None, baseline: str = "group") -> None:
        self.config = config
        self.zero_std_metric = ZERO_SIGNAL_METRIC if baseline == "greedy" else "frac_reward_zero_std"
        self.events_path = Path(events_path) if events_path is not None else None
        self.trainer: Any = None
        self.counts = {c: {"steps": 0, "skipped": 0} for c in DEFAULT_GUARD_ACTIONS}
        self.skipped_steps: list[int] = []
        self.kl_streak = self.zero_std_run = 0
        self.last_frac_zero_std: float | None = None
        self.zero_std_window = config.zero_std.window  # scaled to the phase's length in on_train_begin
        self.hack_runs: dict[str, int] = {}
        self.hack_last: dict[str, float] = {}
        self.stopped: GuardEvent | None = None
        self.events: list[GuardEvent] = []
        self._reward_names: list[str] = []
        self._marks: dict[str, int] = {}
        self._reset_step()

    def bind(self, trainer: Any) -> DivergenceGuard:
        """Give the guard its trainer (``_metrics``, ``accelerator``, ``model_wrapped``). Returns ``self``."""
        self.trainer = trainer
        return self

    def watch(self, funcs: list[Any]) -> list[Any]:
        """The reward functions, each wrapped so that the guard counts its NaN / Inf rewards."""
        self._reward_names = [f.__name__ for f in funcs]
        self._reset_step()
        return [_WatchedReward(f, self) for f in funcs]

    def actions(self) -> dict[str, str]:
        """The resolved action of each enabled condition."""
        return {c: self.config.action_for(c) for c in DEFAULT_GUARD_ACTIONS if getattr(self.config, c).enabled}

    def check_supported(self, *, deepspeed: bool, fp16_scaler: bool) -> None:
        """Raises :class:`ConfigError` (naming the key) for ``skip_step`` under DeepSpeed or fp16 loss scaling."""
        for cond, action in self.actions().items():
            key = f"guards.{cond}.action" if getattr(self.config, cond).action else "guards.action"
            if action == "skip_step" and deepspeed:
                raise ConfigError("skip_step cannot drop an update under DeepSpeed (its engine steps the optimizer "
                                  "inside backward); use warn or stop", field=key)
            if action == "skip_step" and fp16_scaler:
                raise ConfigError("skip_step is not available with fp16 loss scaling (torch's GradScaler skips "
                                  "non-finite steps itself); use bf16 or fp32, or warn / stop", field=key)

    def _reset_step(self) -> None:
        self._bad_rewards = dict.fromkeys(self._reward_names, 0)
        self._bad_loss: float | None = None

    def observe_rewards(self, name: str, rewards: list[float | None]) -> None:
        """Count the NaN / Inf among a reward function's rewards of this process (``None`` is no reward)."""
        bad = sum(1 for r in rewards if r is not None and not math.isfinite(r))
        self._bad_rewards[name] = self._bad_rewards.get(name, 0) + bad

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Keep a micro-step's loss if it is the step's first NaN / Inf one."""
        flat = loss.detach().float().reshape(-1)
        if self._bad_loss is None and not bool(torch.isfinite(flat).all()):
            self._bad_loss = float(flat[~torch.isfinite(flat)][0])

    def _grad_norm(self, optimizer: Any) -> float | None:
        engine = getattr(self.trainer, "model_wrapped", None)
        if hasattr(engine, "get_global_grad_norm"):  # DeepSpeed keeps the gradients (and the norm) in its engine
            norm = engine.get_global_grad_norm()
        else:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
        return None if norm is None else float(norm)

    def _new_values(self, key: str) -> list[float]:
        values = logged_metrics(self.trainer).get(key, [])
        return [float(v) for v in values[self._marks.get(key, 0):]]

    def _nonfinite(self, grad_norm: float | None) -> tuple[list[str], dict[str, Any]]:
        flags = [float(self._bad_loss is not None), float(grad_norm is not None and not math.isfinite(grad_norm))]
        counts = [*flags, *map(float, self._bad_rewards.values())]
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1:  # every process takes the same decision
            counts = accelerator.reduce(torch.tensor(counts, device=accelerator.device), reduction="sum").tolist()
        rewards = {name: int(n) for name, n in zip(self._bad_rewards, counts[2:], strict=True) if n > 0}
        reasons = [f"reward {name} ({n} of the batch)" for name, n in rewards.items()]
        if counts[0]:
            reasons.append(f"loss ({self._bad_loss if self._bad_loss is not None else 'on another process'})")
        if counts[1]:
            reasons.append(f"grad_norm ({grad_norm})")
        return reasons, {"rewards": rewards, "loss": _json_float(self._bad_loss), "grad_norm": _json_float(grad_norm)}

    def _run(self, run: int, length: int, condition: str, reason: str, values: dict) -> list[tuple]:
        """A run holds from ``length`` steps on, announced at ``length`` and every further ``length``."""
        return [(condition, reason, values, (run - length) % length == 0)] if run >= length else []

    def _check(self, grad_norm: float | None) -> list[tuple[str, str, dict[str, Any], bool]]:
        """The conditions holding at this step: ``(condition, reason, values, announce)``."""
        cfg, held = self.config, []
        if cfg.nan.enabled:
            reasons, values = self._nonfinite(grad_norm)
            if reasons:
                held.append(("nan", "non-finite " + ", ".join(reasons), values, True))
        kl_values = self._new_values("kl") if cfg.kl.enabled else []
        if kl_values:
            kl = sum(kl_values) / len(kl_values)
            self.kl_streak = self.kl_streak + 1 if math.isfinite(kl) and kl > cfg.kl.limit else 0
            held += self._run(self.kl_streak, cfg.kl.consecutive_steps, "kl",
                              f"KL {kl:.4g} above the limit {cfg.kl.limit:g} for {self.kl_streak} steps in a row",
                              {"kl": _json_float(kl), "limit": cfg.kl.limit, "streak": self.kl_streak})
        if cfg.zero_std.enabled:
            fracs = self._new_values(self.zero_std_metric)
            self.last_frac_zero_std = min(fracs) if fracs else self.last_frac_zero_std
            if self.last_frac_zero_std is not None:
                self.zero_std_run = self.zero_std_run + 1 if self.last_frac_zero_std >= 1.0 - 1e-9 else 0
                what = ("every group's samples tied their greedy completion's reward"
                        if self.zero_std_metric == ZERO_SIGNAL_METRIC else "every group's reward std was zero")
                held += self._run(self.zero_std_run, self.zero_std_window, "zero_std",
                                  f"{what} for {self.zero_std_run} steps in a row (no learning signal)",
                                  {self.zero_std_metric: self.last_frac_zero_std, "run": self.zero_std_run})
        if cfg.reward_hacking.enabled:
            held += self._check_hacking()
        return held

    def _check_hacking(self) -> list[tuple[str, str, dict[str, Any], bool]]:
        cfg = self.config.reward_hacking
        for key, bound in cfg.bounds.items():
            values = [v for v in self._new_values(key) if math.isfinite(v)]
            if values:
                self.hack_last[key] = sum(values) / len(values)
            self.hack_runs[key] = self.hack_runs.get(key, 0) + 1 if self.hack_last.get(key, -math.inf) > bound else 0
        over = {k: r for k, r in sorted(self.hack_runs.items()) if r >= cfg.consecutive_steps}
        if not over:
            return []
        reason = "; ".join(f"{k} {self.hack_last[k]:.4g} above {cfg.bounds[k]:g} for {r} steps in a row"
                           for k, r in over.items())
        values = {k: {"value": self.hack_last[k], "bound": cfg.bounds[k], "run": r} for k, r in over.items()}
        n = cfg.consecutive_steps
        return [("reward_hacking", reason, values, any((r - n) % n == 0 for r in over.values()))]

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        self.zero_std_window = self.config.zero_std.window_for(state.max_steps)
        saved = self.saved_state(state)
        if saved is not None:
            self.load_state_dict(saved)

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102
        self._reset_step()
        metrics = logged_metrics(self.trainer)
        keys = ("kl", self.zero_std_metric, *self.config.reward_hacking.bounds)
        self._marks = {k: len(metrics.get(k, [])) for k in keys}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):  # noqa: D102
        step = state.global_step + 1
        needed = optimizer is not None and self.config.nan.enabled  # only the NaN guard reads the norm
        held = self._check(self._grad_norm(optimizer) if needed else None)
        actions = [self.config.action_for(condition) for condition, *_ in held]
        for (condition, reason, values, announce), action in zip(held, actions, strict=True):
            self.counts[condition]["steps"] += 1
            if action != "warn" or announce:
                self._record(GuardEvent(step, condition, action, reason, values), state)
        worst = max(actions, key=_SEVERITY.__getitem__, default="warn")
        if worst != "warn":
            if optimizer is None:
                raise RuntimeError("the guard needs the optimizer to drop an update")
            drop_update(optimizer)
        if worst == "skip_step":
            self.skipped_steps.append(step)
            for (condition, *_), action in zip(held, actions, strict=True):
                self.counts[condition]["skipped"] += action == "skip_step"

    def _record(self, event: GuardEvent, state: Any) -> None:
        self.events.append(event)
        if event.action == "stop" and self.stopped is None:
            self.stopped = event
        verb = {"warn": "warning", "skip_step": "update skipped", "stop": "stopping"}[event.action]
        logger.warning("guard %s at step %d (%s): %s", event.condition, event.step, verb, event.reason)
        if self.events_path is not None and state.is_world_process_zero:
            append_jsonl(self.events_path, {**event.to_dict(), "time": time.time()})

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.stopped is not None and self.stopped.step == state.global_step:
            control.should_save = control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        if args.should_save and self.stopped is not None and self.stopped.step == state.global_step:
            marker = {**self.stopped.to_dict(), "note": "the update of this step was not applied"}
            atomic_write_json(checkpoint_folder(args, state) / DIVERGED_MARKER, marker)

    def state_dict(self) -> dict[str, Any]:
        """The running counters (kept in each checkpoint's ``trainer_state.json``)."""
        keys = ("kl_streak", "zero_std_run", "last_frac_zero_std", "hack_runs", "hack_last", "counts", "skipped_steps")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore the counters of :meth:`state_dict` (a resumed run)."""
        self.kl_streak, self.zero_std_run = int(saved["kl_streak"]), int(saved["zero_std_run"])
        self.last_frac_zero_std = saved["last_frac_zero_std"]
        self.hack_runs = {k: int(v) for k, v in saved["hack_runs"].items()}
        self.hack_last = {k: float(v) for k, v in saved["hack_last"].items()}
        self.counts.update({c: dict(v) for c, v in saved["counts"].items() if c in self.counts})
        self.skipped_steps = [int(s) for s in saved["skipped_steps"]]

    def report(self) -> dict[str, Any]:
        """Summary for ``summary.json``: actions, counters, skipped steps, number of events, the stop event."""
        return {"actions": self.actions(), "counts": self.counts, "skipped_steps": list(self.skipped_steps),
                "n_events": len(self.events), "stopped": self.stopped.to_dict() if self.stopped else None}

    def log_values(self) -> dict[str, float]:
        """Counters for the trainer logs: ``guards/<condition>_steps``, ``guards/skipped_steps``."""
        out = {f"guards/{c}_steps": float(v["steps"]) for c, v in self.counts.items()}
        return {**out, "guards/skipped_steps": float(len(self.skipped_steps))}
