"""One GRPO phase of an experiment (:func:`train_phase`): a :class:`cpr.training.trainer.CprGRPOTrainer` with
LoRA of the phase's :class:`cpr.training.build.PhaseSpec` (its ``trl.GRPOConfig``, reward functions, curriculum)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpr.training import policy
from cpr.training.build import PhaseSpec, effective_training_args
from cpr.training.checkpoints import DIVERGED_MARKER, has_curriculum_state, prepare_resume, training_done
from cpr.training.config_sections import ExperimentConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")


def _mean(values: Sequence[Any]) -> float:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return sum(numbers) / len(numbers) if numbers else math.nan


def reward_trend(log_rows: Sequence[dict[str, Any]], share: float = 0.1) -> dict[str, float]:
    """``{"first", "last", "delta", "n_logged"}``: the mean logged reward of the first and the last ``share``
    of a phase's logged steps (NaN without training logs)."""
    rewards = [r["reward"] for r in log_rows if isinstance(r.get("reward"), (int, float))]
    k = max(1, round(len(rewards) * share))
    first, last = _mean(rewards[:k]), _mean(rewards[-k:])
    return {"first": first, "last": last, "delta": last - first, "n_logged": len(rewards)}


def resolved_config(cfg: ExperimentConfig, phases: Mapping[str, PhaseSpec]) -> dict[str, Any]:
    """The run's ``config.yaml``: the config with every default filled in, plus ``training_effective`` (per phase,
    :func:`cpr.training.build.effective_training_args` of the GRPOConfig its trainer is given)."""
    effective = {name: effective_training_args(spec.args) for name, spec in phases.items()}
    return {**cfg.to_dict(), "training_effective": effective}


def _save_adapter(trainer: Any, processor: Any, adapter_dir: Path, state: Any) -> None:
    """Save the phase's final adapter into a temporary folder, then move it into place."""
    partial = adapter_dir.with_name(adapter_dir.name + ".partial")
    if state.is_main_process and partial.exists():
        shutil.rmtree(partial)
    state.wait_for_everyone()
    trainer.save_model(str(partial))
    if state.is_main_process:
        processor.save_pretrained(str(partial))
        if adapter_dir.exists():
            shutil.rmtree(adapter_dir)
        os.replace(partial, adapter_dir)
    state.wait_for_everyone()


def restore_trained(trainer: Any, ckpt: Path, hook: Any = None) -> None:
    """:func:`cpr.training.checkpoints.restore_trained`, with the state of the callbacks the phase's result reads
    (the divergence guard, the dynamic-sampling totals, the eval hook ``hook``)."""
    from cpr.training import checkpoints

    checkpoints.restore_trained(trainer, ckpt)
    for cb in trainer.callback_handler.callbacks:
        if cb is trainer.guard or cb is hook or cb is trainer.sampling:
            cb.on_train_begin(trainer.args, trainer.state, trainer.control)


def train_phase(cfg: ExperimentConfig, spec: PhaseSpec, splits: DataSplits, templates: Any, model_path: str,
                init_adapter: Path | None, resume: bool, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train the GRPO phase ``spec`` from ``init_adapter`` (``None``: a new LoRA adapter), resuming from its last
    complete checkpoint with ``resume``; save its final adapter in ``<phase>/adapter`` and return the phase's entry
    in ``summary.json`` (a phase a guard stopped: ``status: "diverged"``, ``adapter: None`` and ``diverged``).
    Raises ``ConfigError`` for an invalid ``training`` section (TRL's checks), ``TrainingOutOfMemoryError``
    when out of memory in training or generation."""
    from cpr.data import to_grpo_dataset
    from cpr.distributed import process_state
    from cpr.rewards import set_completion_recorder
    from cpr.training import divergence
    from cpr.training import trainer as grpo_trainer
    from cpr.training.checkpoints import CheckpointCallback
    from cpr.training.curriculum import CurriculumConfig, empty_buckets_message
    from cpr.training.evaluate import eval_hook
    from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, quiet_console, read_log
    from cpr.training.oom import explain_oom

    phase = spec.phase
    phase_dir = Path(cfg.output_dir) / phase.name
    args = spec.trainer_args()  # its DeepSpeed plugin made now, after the previous phase's accelerator
    state = process_state()
    funcs, weights, curriculum = spec.reward_funcs, spec.reward_weights, spec.curriculum
    if empty := empty_buckets_message(curriculum, splits.train.column("difficulty"), phase.name):
        logger.warning("%s", empty)
    ckpt = prepare_resume(phase_dir, resume, state)

    logger.info("phase %s: device %s", phase.name, policy.device_memory(state.device))
    model, processor = policy.load_policy(cfg, model_path)
    model = policy.with_adapter(model, init_adapter, cfg, zero3=policy.deepspeed_zero3(args),
                                field=f"phase_settings.{phase.name}.init_adapter")
    sampler_curriculum: CurriculumConfig | None = curriculum  # schedule none too: TRL's order, resumed exactly
    if ckpt is not None and curriculum.schedule == "none" and not has_curriculum_state(ckpt):
        logger.warning("phase %s: %s was saved before schedule 'none' used the curriculum sampler; resuming with "
                       "TRL's RepeatSampler (its order is not continued exactly past an epoch boundary)",
                       phase.name, ckpt.name)
        sampler_curriculum = None
    trainer = grpo_trainer.CprGRPOTrainer(
        model=model, reward_funcs=funcs, args=args, processing_class=processor, curriculum=sampler_curriculum,
        dynamic_sampling=phase.dynamic_sampling, dynamic_sampling_field=f"phase_settings.{phase.name}.dynamic_sampling",
        train_dataset=to_grpo_dataset(splits.train, templates, mode="train"),
        peft_config=None if init_adapter is not None else spec.lora,
        callbacks=[JsonlLogCallback(phase_dir / "log.jsonl")],
        guards=cfg.guards, guard_events_path=phase_dir / divergence.EVENTS_FILE,
        credit=phase.credit, credit_weight=phase.credit_weight, baseline=phase.baseline,
        guidance=phase.guidance, guidance_field=f"phase_settings.{phase.name}.guidance",
    )
    hook = eval_hook(cfg, splits, templates, phase_dir)
    if hook is not None:
        hook.attach(trainer)
    quiet_console(trainer)
    for cb in [*callbacks, CheckpointCallback(trainer)]:  # last: after every writer of checkpoint files
        trainer.add_callback(cb)

    if ckpt is not None:
        logger.info("phase %s: resuming from %s", phase.name, ckpt)
    logger.info("phase %s: %s steps, rewards %s (weights %s), credit %s, baseline %s, guidance %s, curriculum %s, "
                "from %s", phase.name, args.max_steps, [f.__name__ for f in funcs], weights,
                phase.credit if phase.credit == "completion" else f"step (weight {phase.credit_weight:g})",
                phase.baseline, phase.guidance.mode, curriculum.schedule, init_adapter or "a new LoRA adapter")
    set_completion_recorder(ScoredCompletionLog(phase_dir / "scored_completions.jsonl", rank=state.process_index))
    t0 = time.time()
    try:
        if ckpt is not None and training_done(ckpt):  # killed after its last checkpoint: on to the adapter
            logger.info("phase %s: %s is the last step (max_steps): nothing left to train", phase.name, ckpt.name)
            restore_trained(trainer, ckpt, hook)
        else:
            with explain_oom(cfg, "training", spec):
                trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    finally:
        set_completion_recorder(None)
    wall = time.time() - t0
    guard = trainer.guard
    stopped = guard.stopped if guard is not None else None
    adapter_dir = phase_dir / "adapter"
    if stopped is None:
        _save_adapter(trainer, processor, adapter_dir, state)
    rows = [r for r in read_log(phase_dir / "log.jsonl") if "reward" in r]
    result = {
        "phase": phase.name, "steps": trainer.state.global_step, "wall_time_s": round(wall, 1),
        "rewards": [f.__name__ for f in funcs], "reward_weights": weights, "curriculum": curriculum.schedule,
        "init_adapter": str(init_adapter) if init_adapter else None, "adapter": str(adapter_dir),
        "frac_reward_zero_std": _mean([r.get("frac_reward_zero_std") for r in rows]),
        "reward_trend": reward_trend(rows),
        "kl_max": max((r["kl"] for r in rows if isinstance(r.get("kl"), (int, float))), default=math.nan),
        "guards": guard.report() if guard is not None else None,
    }
    if trainer.sampling.config is not None:
        result["dynamic_sampling"] = {"max_resample": phase.dynamic_sampling.max_resample, **trainer.sampling.totals}
    if hook is not None and hook.best is not None:
        result["best_eval"] = hook.best
    if stopped is not None:
        folder = phase_dir / f"checkpoint-{stopped.step}"
        marked = str(folder) if (folder / DIVERGED_MARKER).is_file() else None
        result.update(status="diverged", adapter=None,
                      diverged={"phase": phase.name, **stopped.to_dict(), "checkpoint": marked})
    policy.free_vllm_engine(trainer)  # before the next phase builds its own
    del trainer, model
    policy.free_memory()
    return result
