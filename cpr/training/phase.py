"""One GRPO phase of an experiment: TRL's ``GRPOTrainer`` with LoRA on the phase's rewards.

:func:`train_phase` builds the phase's ``trl.GRPOConfig`` (:func:`grpo_config`: the shared
``training`` section merged with the phase's own, with cpr's defaults), its reward functions and
weights (:func:`cpr.rewards.get_reward_set`), its curriculum sampler, and a
:class:`cpr.training.guards.GuardedGRPOTrainer` (:class:`cpr.curriculum.CurriculumGRPOTrainer`
with the divergence guards). The policy starts from ``init_adapter`` (trainable) or from a new
LoRA adapter (``lora`` section). Files in ``<output_dir>/<phase>/``: see :mod:`cpr.training.runner`.
"""

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

__all__ = [
    "check_launch_settings", "effective_training_args", "grpo_args", "grpo_config", "resolved_config",
    "reward_trend", "train_phase",
]


def reward_trend(log_rows: Sequence[dict[str, Any]], share: float = 0.1) -> dict[str, float]:
    """Mean logged reward of the first and the last ``share`` of a phase's logged steps.

    Returns ``{"first": ..., "last": ..., "delta": last - first, "n_logged": n}`` (NaN when
    there are no training logs).
    """
    rows = [r for r in log_rows if isinstance(r.get("reward"), (int, float))]
    if not rows:
        return {"first": math.nan, "last": math.nan, "delta": math.nan, "n_logged": 0}
    k = max(1, int(round(len(rows) * share)))
    first = sum(r["reward"] for r in rows[:k]) / k
    last = sum(r["reward"] for r in rows[-k:]) / k
    return {"first": first, "last": last, "delta": last - first, "n_logged": len(rows)}


def _mean_of(log_rows: Sequence[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in log_rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else math.nan


def _report_to(args: dict[str, Any]) -> None:
    """wandb never blocks on a login prompt: offline mode when no API key is configured."""
    report = args.get("report_to", "none")
    targets = [report] if isinstance(report, str) else list(report or [])
    if "wandb" in targets or "all" in targets:
        if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
            os.environ["WANDB_MODE"] = "offline"
            logger.info("wandb: no WANDB_API_KEY set, logging offline (sync later with `wandb sync`)")


def grpo_args(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """The keyword arguments of phase ``name``'s ``trl.GRPOConfig``:
    :func:`cpr.training.config.phase_training_args` with cpr's defaults where unset (CPU / bf16 by
    device, the data columns kept for the reward functions, no reports, a log row every step, a
    checkpoint every quarter of ``max_steps``), activation checkpointing from
    ``model.gradient_checkpointing`` (default: on GPU; the ``training`` sections may not set it), and
    ``reward_weights`` resolved (:func:`cpr.training.config.phase_reward_weights`, else the reward
    set's weights)."""
    import torch

    from cpr.rewards import get_reward_set

    phase = cfg.phase(name)
    args = phase_training_args(cfg, name)
    on_gpu = torch.cuda.is_available()
    args.setdefault("use_cpu", not on_gpu)
    args.setdefault("bf16", on_gpu and torch.cuda.is_bf16_supported())
    gc = cfg.model.gradient_checkpointing
    args.setdefault("gradient_checkpointing", False)  # TRL's alias; we pass the transformers 5 name
    args["activation_checkpointing"] = on_gpu if gc is None else gc
    weights = phase_reward_weights(phase, args)[0]
    args["reward_weights"] = get_reward_set(phase.rewards, weights, phase.reward_params, **_reward_shared(cfg.rewards))[1]
    args.setdefault("remove_unused_columns", False)  # the reward functions need the data columns
    args.setdefault("report_to", "none")
    args.setdefault("logging_steps", 1)
    args.setdefault("save_strategy", "steps")
    args.setdefault("save_steps", max(1, int(args.get("max_steps") or 100) // 4))
    args.setdefault("disable_tqdm", False)
    return args


def check_launch_settings(cfg: ExperimentConfig) -> None:
    """:func:`cpr.distributed.check_launch` for the run's trainers: the warm start (mixed precision
    from the model's dtype on a GPU, :func:`cpr.training.sft.build_sft_config`) and the GRPO phases
    (their resolved ``bf16`` / ``fp16``, named by the config key that sets them; ``use_vllm``).

    Raises:
        ConfigError: see :func:`cpr.distributed.check_launch`.
    """
    import torch

    from cpr.distributed import check_launch
    from cpr.models import resolve_dtype

    precision, vllm = [], False
    if cfg.warm_start.enabled:
        cuda = torch.cuda.is_available()
        dtype = resolve_dtype(cfg.model.dtype, "cuda" if cuda else "cpu")
        extra = cfg.warm_start.extra
        precision.append(("warm_start.extra", extra.get("bf16", cuda and dtype == torch.bfloat16),
                          extra.get("fp16", cuda and dtype == torch.float16)))
    for name in cfg.phases:
        args = grpo_args(cfg, name)
        own = cfg.phase(name).training
        key = f"phase_settings.{name}.training" if "bf16" in own or "fp16" in own else "training"
        precision.append((key, bool(args.get("bf16")), bool(args.get("fp16"))))
        vllm = vllm or bool(args.get("use_vllm"))
    check_launch(precision, use_vllm=vllm)


def grpo_config(cfg: ExperimentConfig, phase: PhaseConfig) -> Any:
    """The phase's ``trl.GRPOConfig`` of :func:`grpo_args`. wandb logs offline when no
    ``WANDB_API_KEY`` is set.

    Raises:
        ConfigError: TRL's own consistency checks fail (field ``phase_settings.<phase>.training``).
    """
    from trl import GRPOConfig

    args = grpo_args(cfg, phase.name)
    _report_to(args)
    try:
        return GRPOConfig(**args)
    except ValueError as e:  # TRL's own consistency checks
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
    GRPO-specific field (``loss_type``, ``scale_rewards``, ``beta``, ``epsilon`` / ``epsilon_high``,
    ``importance_sampling_level``, ``mask_truncated_completions``, ``num_iterations``,
    ``steps_per_generation``, ``temperature``, ``top_p``, ``reward_weights``, ...; logging and vLLM
    plumbing left out) and the optimizer / batch fields of ``transformers.TrainingArguments``
    (:data:`_RESULT_FIELDS`). Enums are given as their values (``TrainingArguments.to_dict``);
    ``epsilon_high: None`` as the value GRPOTrainer uses for it (``epsilon``)."""
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    values = args.to_dict()
    if values.get("epsilon_high") is None:  # GRPOTrainer clips at epsilon on both sides then
        values["epsilon_high"] = values.get("epsilon")
    return {
        k: v for k, v in values.items()
        if k in _RESULT_FIELDS or (k not in base and not k.startswith(_PLUMBING_PREFIXES))
    }


def resolved_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The run's ``config.yaml``: the config with every default filled in, plus ``training_effective``:
    per phase, :func:`effective_training_args` of the ``trl.GRPOConfig`` the phase trains with (TRL's own
    defaults included, so a TRL release that changes one shows in the record)."""
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


def train_phase(
    cfg: ExperimentConfig,
    phase: PhaseConfig,
    splits: DataSplits,
    templates: Any,
    model_path: str,
    init_adapter: Path | None,
    resume: bool,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Train one GRPO phase (module docstring) and save its final adapter.

    Args:
        cfg: the run's config.
        phase: the phase's resolved settings.
        splits: the run's data splits (training records; the eval hook's validation records).
        templates: prompt templates.
        model_path: the model folder or hub id (``model.name_or_path``).
        init_adapter: the LoRA adapter the phase starts from (trainable), or ``None`` for a new one.
        resume: continue from the phase's last complete checkpoint
            (:func:`cpr.training.checkpoints.prepare_resume`).
        callbacks: extra ``transformers.TrainerCallback`` objects (added before the checkpoint
            completion marker).

    Returns:
        The phase's entry in ``summary.json``: ``phase``, ``steps``, ``wall_time_s``, ``rewards``,
        ``reward_weights``, ``curriculum``, ``init_adapter``, ``adapter``, ``frac_reward_zero_std``,
        ``reward_trend`` (:func:`reward_trend`), ``kl_max``, ``guards``, and ``best_eval`` when the
        eval hook ran; a phase a guard stopped has ``status: "diverged"``, ``adapter: None`` and
        ``diverged`` (phase, step, condition, reason, the checkpoint marked ``diverged.json``).

    Raises:
        ConfigError: an invalid ``training`` section (TRL's checks).
        TrainingOutOfMemoryError: out of memory in training or generation.
    """
    from cpr.curriculum import CurriculumConfig
    from cpr.data import to_grpo_dataset
    from cpr.distributed import process_state
    from cpr.rewards import get_reward_set, set_completion_recorder
    from cpr.training.evaluate import eval_hook
    from cpr.training.guards import (
        EVENTS_FILE,
        CheckpointCompleteCallback,
        GenerationStateCallback,
        GuardedGRPOTrainer,
    )
    from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, quiet_console, read_log
    from cpr.training.oom import explain_oom
    from cpr.training.vllm import vllm_generation_kwargs

    phase_dir = Path(cfg.output_dir) / phase.name
    args = grpo_config(cfg, phase)
    state = process_state()
    funcs, weights = get_reward_set(phase.rewards, args.reward_weights, phase.reward_params, **_reward_shared(cfg.rewards))
    curriculum = CurriculumConfig.from_dict(phase.curriculum, prefix=f"phase_settings.{phase.name}.curriculum")
    ckpt = prepare_resume(phase_dir, resume, state)

    model, processor = policy.load_policy(cfg, model_path)
    if args.use_vllm:  # TRL's vLLM path does not suppress the vision placeholders (cpr.training.vllm)
        args.generation_kwargs = vllm_generation_kwargs(model.config, processor.tokenizer, args.generation_kwargs)
    model = policy.with_adapter(model, init_adapter, cfg, field=f"phase_settings.{phase.name}.init_adapter")
    peft_config = None if init_adapter is not None else policy.lora_config(cfg, model_path)
    dataset = to_grpo_dataset(splits.train, templates, mode="train")

    sampler_curriculum: CurriculumConfig | None = curriculum
    if ckpt is not None and curriculum.schedule == "none" and not has_curriculum_state(ckpt):
        logger.warning(
            "phase %s: %s was saved before schedule 'none' used the curriculum sampler; resuming with TRL's "
            "RepeatSampler (its order is not continued exactly past an epoch boundary)",
            phase.name,
            ckpt.name,
        )
        sampler_curriculum = None
    trainer = GuardedGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=[JsonlLogCallback(phase_dir / "log.jsonl")],
        # schedule "none" too: the sampler then draws TRL's RepeatSampler order, and resumes it exactly
        curriculum=sampler_curriculum,
        guards=cfg.guards,
        guard_events_path=phase_dir / EVENTS_FILE,
    )
    hook = eval_hook(cfg, splits, templates, phase_dir)
    if hook is not None:
        hook.attach(trainer)
    quiet_console(trainer)
    for cb in callbacks:
        trainer.add_callback(cb)
    trainer.add_callback(GenerationStateCallback(trainer))
    trainer.add_callback(CheckpointCompleteCallback(trainer))  # last: after every writer of checkpoint files

    if ckpt is not None:
        logger.info("phase %s: resuming from %s", phase.name, ckpt)
    logger.info(
        "phase %s: %s steps, rewards %s (weights %s), curriculum %s, from %s",
        phase.name,
        args.max_steps,
        [f.__name__ for f in funcs],
        weights,
        curriculum.schedule,
        init_adapter or "a new LoRA adapter",
    )
    set_completion_recorder(ScoredCompletionLog(phase_dir / "scored_completions.jsonl", rank=state.process_index))
    t0 = time.time()
    try:
        with explain_oom(cfg, "training", phase):
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    finally:
        set_completion_recorder(None)
    wall = time.time() - t0
    guard = trainer.guard
    adapter_dir = phase_dir / "adapter"
    if guard is None or guard.stopped is None:
        _save_adapter(trainer, processor, adapter_dir, state)
    rows = read_log(phase_dir / "log.jsonl")
    train_rows = [r for r in rows if "reward" in r]
    result = {
        "phase": phase.name,
        "steps": trainer.state.global_step,
        "wall_time_s": round(wall, 1),
        "rewards": [f.__name__ for f in funcs],
        "reward_weights": weights,
        "curriculum": curriculum.schedule,
        "init_adapter": str(init_adapter) if init_adapter else None,
        "adapter": str(adapter_dir),
        "frac_reward_zero_std": _mean_of(train_rows, "frac_reward_zero_std"),
        "reward_trend": reward_trend(train_rows),
        "kl_max": max((r["kl"] for r in train_rows if isinstance(r.get("kl"), (int, float))), default=math.nan),
        "guards": guard.report() if guard is not None else None,
    }
    if hook is not None and hook.best is not None:
        result["best_eval"] = hook.best
    if guard is not None and guard.stopped is not None:
        folder = phase_dir / f"checkpoint-{guard.stopped.step}"
        result["status"] = "diverged"
        result["adapter"] = None
        result["diverged"] = {
            "phase": phase.name,
            **guard.stopped.to_dict(),
            "checkpoint": str(folder) if (folder / DIVERGED_MARKER).is_file() else None,
        }
    del trainer, model
    policy.free_memory()
    return result
