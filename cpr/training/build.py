"""Each GRPO phase of a run built once (:func:`build_phases`) into a :class:`PhaseSpec`: its ``trl.GRPOConfig``,
reward functions and weights, curriculum, ``peft.LoraConfig`` and init adapter. The launch checks, ``--check``,
``config.yaml`` and the trainer all read these objects, so what ``config.yaml`` records is what the trainer got.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError
from cpr.training import policy
from cpr.training.config_checks import _reward_shared, phase_reward_weights, phase_training_args
from cpr.training.config_sections import ExperimentConfig, PhaseConfig

logger = logging.getLogger("cpr.training")

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
    """The values of a ``trl.GRPOConfig`` that change a phase's result, as the trainer uses them: every GRPO field
    but plumbing, and :data:`_RESULT_FIELDS` (``epsilon_high: None`` as ``epsilon``, which GRPOTrainer uses)."""
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    values = args.to_dict()
    if values.get("epsilon_high") is None:
        values["epsilon_high"] = values.get("epsilon")
    return {k: v for k, v in values.items()
            if k in _RESULT_FIELDS or (k not in base and not k.startswith(_PLUMBING_PREFIXES))}


def trl_default(key: str) -> Any:
    """``trl.GRPOConfig``'s default of field ``key`` (before ``__post_init__``); ``KeyError`` for another key."""
    from trl import GRPOConfig

    f = GRPOConfig.__dataclass_fields__[key]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


@dataclass
class PhaseSpec:
    """One GRPO phase, built once by :func:`build_phases`; :attr:`args` (``trl.GRPOConfig``, which sets up
    accelerate's process state) and :attr:`lora` are built on first use. ``model_path``: the model whose family
    gives the LoRA targets and whose processor the vision placeholders (banned with ``use_vllm`` when
    ``ban_placeholders``)."""

    cfg: ExperimentConfig = field(repr=False)
    phase: PhaseConfig
    kwargs: dict[str, Any]
    reward_funcs: list[Any]
    reward_weights: list[float]
    curriculum: Any
    init_adapter: Path | None
    model_path: str
    ban_placeholders: bool = True

    @property
    def name(self) -> str:
        return self.phase.name

    def setting(self, key: str) -> Any:
        """GRPOConfig field ``key`` as given, else TRL's default, without building the GRPOConfig (the batch sizes
        TRL derives in ``__post_init__`` are ``None`` here unless set)."""
        return self.kwargs[key] if key in self.kwargs else trl_default(key)

    @functools.cached_property
    def args(self) -> Any:
        """The phase's ``trl.GRPOConfig``, built once (``use_vllm``: placeholders banned; no wandb key: offline).
        Raises ``ConfigError`` when TRL's own consistency checks fail (field
        ``phase_settings.<phase>.training``), ``ModelNotAvailableError`` when, with ``use_vllm``, the model's
        config or processor cannot be had."""
        from trl import GRPOConfig

        if self.kwargs.get("use_vllm") and self.ban_placeholders:  # TRL's vLLM path does not (cpr.training.vllm)
            self.kwargs["generation_kwargs"] = _placeholder_ban(self.cfg, self.model_path,
                                                                self.kwargs.get("generation_kwargs"))
        report = self.kwargs["report_to"]
        targets = [report] if isinstance(report, str) else list(report or [])
        if {"wandb", "all"} & set(targets) and not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
            os.environ["WANDB_MODE"] = "offline"  # never a login prompt
            logger.info("wandb: no WANDB_API_KEY set, logging offline (sync later with `wandb sync`)")
        try:
            return GRPOConfig(**self.kwargs)
        except ValueError as e:
            raise ConfigError(str(e), field=f"phase_settings.{self.name}.training") from None

    def trainer_args(self) -> Any:
        """A new ``trl.GRPOConfig`` equal to :attr:`args`, for the phase's trainer when the phase starts: accelerate
        refuses a ``DeepSpeedPlugin`` created before an earlier phase's ``Accelerator``. Raises as :attr:`args`."""
        from trl import GRPOConfig

        self.args  # noqa: B018 - TRL's checks, the placeholder ban and the wandb setting, once
        return GRPOConfig(**self.kwargs)

    @functools.cached_property
    def lora(self) -> Any | None:
        """A new adapter's ``peft.LoraConfig``, built once; ``None`` when :attr:`init_adapter` is given."""
        return None if self.init_adapter is not None else policy.lora_config(self.cfg, self.model_path)


def grpo_kwargs(cfg: ExperimentConfig, phase: PhaseConfig, reward_weights: list[float]) -> dict[str, Any]:
    """The keyword arguments of ``phase``'s ``trl.GRPOConfig``: its ``training`` arguments over cpr's defaults,
    activation checkpointing from ``model.gradient_checkpointing`` and the resolved ``reward_weights``."""
    import torch

    args = phase_training_args(cfg, phase.name)
    on_gpu = torch.cuda.is_available()
    gc = cfg.model.gradient_checkpointing
    args["reward_weights"] = reward_weights
    args["activation_checkpointing"] = on_gpu if gc is None else gc
    defaults = {"use_cpu": not on_gpu, "bf16": on_gpu and torch.cuda.is_bf16_supported(),
                "gradient_checkpointing": False,  # TRL's alias; the transformers 5 name is set above
                "remove_unused_columns": False, "report_to": "none", "logging_steps": 1, "save_strategy": "steps",
                "save_steps": max(1, int(args.get("max_steps") or 100) // 4), "disable_tqdm": False}
    return {**defaults, **args}


def _placeholder_ban(cfg: ExperimentConfig, model_path: str, generation_kwargs: Any) -> dict[str, Any]:
    """``generation_kwargs`` with the model's vision placeholders banned in vLLM; may raise ModelNotAvailable."""
    from transformers import AutoConfig, AutoProcessor

    from cpr.models import _not_available, resolve_model_path
    from cpr.training.vllm import vllm_generation_kwargs

    path, remote = resolve_model_path(model_path), cfg.model.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
        tokenizer = AutoProcessor.from_pretrained(path, trust_remote_code=remote).tokenizer
    except (OSError, ValueError) as err:
        raise _not_available(model_path, "processor of model", err) from None
    return vllm_generation_kwargs(config, tokenizer, generation_kwargs)


def build_phase(cfg: ExperimentConfig, name: str, model_path: str | None = None, *,
                ban_placeholders: bool = True) -> PhaseSpec:
    """Phase ``name`` of ``cfg`` as a :class:`PhaseSpec` (``model_path`` default ``model.name_or_path``); reads no
    file. Raises ``ConfigError`` for an invalid reward set or curriculum."""
    from cpr.rewards import get_reward_set

    phase, model_path = cfg.phase(name), model_path or cfg.model.name_or_path
    weights = phase_reward_weights(phase, phase.training_args)[0]
    funcs, weights = get_reward_set(phase.rewards, weights, phase.reward_params, **_reward_shared(cfg.rewards))
    return PhaseSpec(
        cfg=cfg, phase=phase, kwargs=grpo_kwargs(cfg, phase, weights), reward_funcs=funcs, reward_weights=weights,
        curriculum=phase.curriculum_config, init_adapter=Path(phase.init_adapter) if phase.init_adapter else None,
        model_path=model_path, ban_placeholders=ban_placeholders)


def build_phases(cfg: ExperimentConfig, model_path: str | None = None, *,
                 ban_placeholders: bool = True) -> dict[str, PhaseSpec]:
    """``{phase name: PhaseSpec}`` for every phase of ``cfg`` in order (:func:`build_phase`); called once a run."""
    return {name: build_phase(cfg, name, model_path, ban_placeholders=ban_placeholders) for name in cfg.phases}
