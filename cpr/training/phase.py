"""One GRPO phase of an experiment (:func:`train_phase`): its ``trl.GRPOConfig`` (:func:`grpo_config`), reward
functions, curriculum and a :class:`cpr.training.guards.GuardedGRPOTrainer` with LoRA."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError
from cpr.training import policy
from cpr.training.checkpoints import DIVERGED_MARKER, has_curriculum_state, prepare_resume
from cpr.training.config import (
    ExperimentConfig,
    PhaseConfig,
    _reward_shared,
    phase_reward_weights,
    phase_training_args,
)
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


def grpo_args(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """The keyword arguments of phase ``name``'s ``trl.GRPOConfig``: :func:`cpr.training.config.phase_training_args`
    with cpr's defaults where unset (CPU / bf16 by device, the data columns kept for the reward functions, no
    reports, a log row every step, a checkpoint every quarter of ``max_steps``), activation checkpointing from
    ``model.gradient_checkpointing`` (default: on GPU) and the resolved ``reward_weights``."""
    import torch

    from cpr.rewards import get_reward_set

    phase, args = cfg.phase(name), phase_training_args(cfg, name)
    on_gpu = torch.cuda.is_available()
    gc = cfg.model.gradient_checkpointing
    weights = phase_reward_weights(phase, args)[0]
    shared = _reward_shared(cfg.rewards)
    args["reward_weights"] = get_reward_set(phase.rewards, weights, phase.reward_params, **shared)[1]
    args["activation_checkpointing"] = on_gpu if gc is None else gc
    defaults = {"use_cpu": not on_gpu, "bf16": on_gpu and torch.cuda.is_bf16_supported(),
                "gradient_checkpointing": False,  # TRL's alias; the transformers 5 name is set above
                "remove_unused_columns": False, "report_to": "none", "logging_steps": 1, "save_strategy": "steps",
                "save_steps": max(1, int(args.get("max_steps") or 100) // 4), "disable_tqdm": False}
    return {**defaults, **args}


def grpo_config(cfg: ExperimentConfig, phase: PhaseConfig) -> Any:
    """The phase's ``trl.GRPOConfig`` of :func:`grpo_args`; wandb logs offline without a ``WANDB_API_KEY``.

    Raises:
        ConfigError: TRL's own consistency checks fail (field ``phase_settings.<phase>.training``).
    """
    from trl import GRPOConfig

    args = grpo_args(cfg, phase.name)
    report = args["report_to"]
    targets = [report] if isinstance(report, str) else list(report or [])
    if {"wandb", "all"} & set(targets) and not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        os.environ["WANDB_MODE"] = "offline"  # never a login prompt
        logger.info("wandb: no WANDB_API_KEY set, logging offline (sync later with `wandb sync`)")
    try:
        return GRPOConfig(**args)
    except ValueError as e:
        raise ConfigError(str(e), field=f"phase_settings.{phase.name}.training") from None


#: TrainingArguments fields that change a GRPO phase's result (besides every GRPO-specific field).
_RESULT_FIELDS = (
    "seed", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "weight_decay", "optim",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "max_steps", "num_train_epochs",
    "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "activation_checkpointing",
)
#: GRPO-specific fields that do not change the result (logging, vLLM server plumbing, ...).
_PLUMBING_PREFIXES = ("vllm_", "log_", "num_completions_to_print", "ds3_", "use_transformers_", "transformers_",
                      "model_init_kwargs", "trust_remote_code", "cache_implementation", "pad_to_multiple_of")


def effective_training_args(args: Any) -> dict[str, Any]:
    """The values of a ``trl.GRPOConfig`` that change a phase's result, as the trainer uses them: every
    GRPO-specific field but logging and vLLM plumbing, and the optimizer / batch fields of :data:`_RESULT_FIELDS`
    (enums as values, ``TrainingArguments.to_dict``; ``epsilon_high: None`` as ``epsilon``, which GRPOTrainer uses)."""
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    values = args.to_dict()
    if values.get("epsilon_high") is None:
        values["epsilon_high"] = values.get("epsilon")
    return {k: v for k, v in values.items()
            if k in _RESULT_FIELDS or (k not in base and not k.startswith(_PLUMBING_PREFIXES))}


def resolved_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The run's ``config.yaml``: the config with every default filled in, plus ``training_effective``
    (per phase, :func:`effective_training_args`, TRL's defaults included)."""
    effective = {name: effective_training_args(grpo_config(cfg, cfg.phase(name))) for name in cfg.phases}
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


def train_phase(cfg: ExperimentConfig, phase: PhaseConfig, splits: DataSplits, templates: Any, model_path: str,
                init_adapter: Path | None, resume: bool, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train one GRPO phase from ``init_adapter`` (trainable; ``None``: a new LoRA adapter), resuming from its
    last complete checkpoint with ``resume``, with extra ``callbacks``; save its final adapter in ``<phase>/adapter``.

    Returns:
        The phase's entry in ``summary.json``: ``phase``, ``steps``, ``wall_time_s``, ``rewards``,
        ``reward_weights``, ``curriculum``, ``init_adapter``, ``adapter``, ``frac_reward_zero_std``,
        ``reward_trend``, ``kl_max``, ``guards``, with dynamic sampling ``dynamic_sampling`` (``max_resample`` and
        the phase's totals: generation batches, groups, dropped groups, extra rounds, refilled groups) and, when
        the eval hook ran, ``best_eval``; a phase a guard
        stopped has ``status: "diverged"``, ``adapter: None`` and ``diverged`` (phase, the event, the checkpoint).

    Raises:
        ConfigError: an invalid ``training`` section (TRL's checks).
        TrainingOutOfMemoryError: out of memory in training or generation.
    """
    from cpr.data import to_grpo_dataset
    from cpr.distributed import process_state
    from cpr.rewards import get_reward_set, set_completion_recorder
    from cpr.training import guards
    from cpr.training.checkpoints import CheckpointCallback
    from cpr.training.curriculum import CurriculumConfig, empty_buckets_message
    from cpr.training.evaluate import eval_hook
    from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, quiet_console, read_log
    from cpr.training.oom import explain_oom
    from cpr.training.vllm import vllm_generation_kwargs

    phase_dir = Path(cfg.output_dir) / phase.name
    args = grpo_config(cfg, phase)
    state = process_state()
    shared = _reward_shared(cfg.rewards)
    funcs, weights = get_reward_set(phase.rewards, args.reward_weights, phase.reward_params, **shared)
    curriculum = CurriculumConfig.from_dict(phase.curriculum, prefix=f"phase_settings.{phase.name}.curriculum")
    if empty := empty_buckets_message(curriculum, splits.train.column("difficulty"), phase.name):
        logger.warning("%s", empty)
    ckpt = prepare_resume(phase_dir, resume, state)

    logger.info("phase %s: device %s", phase.name, policy.device_memory(state.device))
    model, processor = policy.load_policy(cfg, model_path)
    if args.use_vllm:  # TRL's vLLM path does not suppress the vision placeholders (cpr.training.vllm)
        args.generation_kwargs = vllm_generation_kwargs(model.config, processor.tokenizer, args.generation_kwargs)
    model = policy.with_adapter(model, init_adapter, cfg, field=f"phase_settings.{phase.name}.init_adapter")
    sampler_curriculum: CurriculumConfig | None = curriculum  # schedule none too: TRL's order, resumed exactly
    if ckpt is not None and curriculum.schedule == "none" and not has_curriculum_state(ckpt):
        logger.warning("phase %s: %s was saved before schedule 'none' used the curriculum sampler; resuming with "
                       "TRL's RepeatSampler (its order is not continued exactly past an epoch boundary)",
                       phase.name, ckpt.name)
        sampler_curriculum = None
    trainer = guards.GuardedGRPOTrainer(
        model=model, reward_funcs=funcs, args=args, processing_class=processor, curriculum=sampler_curriculum,
        dynamic_sampling=phase.dynamic_sampling, dynamic_sampling_field=f"phase_settings.{phase.name}.dynamic_sampling",
        train_dataset=to_grpo_dataset(splits.train, templates, mode="train"),
        peft_config=None if init_adapter is not None else policy.lora_config(cfg, model_path),
        callbacks=[JsonlLogCallback(phase_dir / "log.jsonl")],
        guards=cfg.guards, guard_events_path=phase_dir / guards.EVENTS_FILE,
        credit=phase.credit, credit_weight=phase.credit_weight,
    )
    hook = eval_hook(cfg, splits, templates, phase_dir)
    if hook is not None:
        hook.attach(trainer)
    quiet_console(trainer)
    for cb in [*callbacks, CheckpointCallback(trainer)]:  # last: after every writer of checkpoint files
        trainer.add_callback(cb)

    if ckpt is not None:
        logger.info("phase %s: resuming from %s", phase.name, ckpt)
    logger.info("phase %s: %s steps, rewards %s (weights %s), credit %s, curriculum %s, from %s", phase.name,
                args.max_steps, [f.__name__ for f in funcs], weights,
                phase.credit if phase.credit == "completion" else f"step (weight {phase.credit_weight:g})",
                curriculum.schedule, init_adapter or "a new LoRA adapter")
    set_completion_recorder(ScoredCompletionLog(phase_dir / "scored_completions.jsonl", rank=state.process_index))
    t0 = time.time()
    try:
        with explain_oom(cfg, "training", phase):
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
    if trainer.dynamic_sampling is not None:
        result["dynamic_sampling"] = {"max_resample": phase.dynamic_sampling.max_resample,
                                      **trainer.dynamic_sampling_totals}
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
