"""The checks of an experiment config that need more than a value's type (:func:`_validate`, run once by
:func:`cpr.training.config.load_config`), each error a :class:`cpr.errors.ConfigError` naming the dotted key."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpr.data import ADAPTERS, load_templates
from cpr.data.adapters.hf import looks_like_hub_name
from cpr.errors import ConfigError
from cpr.scoring import ScoringSettings
from cpr.training.config_sections import (
    PHASE_PRESETS,
    DataSourceConfig,
    ExperimentConfig,
    PhaseConfig,
    _check_training,
    _parse,
)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with ``over`` merged in (nested mappings merged, other values replaced)."""
    merged = copy.deepcopy(dict(base))
    for k, v in over.items():
        both = isinstance(v, Mapping) and isinstance(merged.get(k), Mapping)
        merged[k] = _merge(merged[k], v) if both else copy.deepcopy(v)
    return merged


def num_processes() -> int:
    """The number of training processes of this launch: ``WORLD_SIZE`` (torchrun, accelerate) or
    ``ACCELERATE_NUM_PROCESSES``, else 1 (an unreadable value is passed over)."""
    counts = [os.environ.get(v, "") for v in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES")]
    return max(1, int(next((n for n in counts if n.isdigit()), 1)))


def phase_training_args(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """A copy of the GRPOConfig keyword arguments of phase ``name``: shared ``training`` merged with the phase's
    own (phase wins), ``seed``, ``output_dir`` and ``run_name`` filled in if unset (:func:`_resolve_phase`)."""
    return copy.deepcopy(cfg.phase(name).training_args)


def phase_reward_weights(phase: PhaseConfig, args: Mapping[str, Any]) -> tuple[list[float] | None, str]:
    """A phase's reward weights and the config key that gave them: its ``reward_weights``, else those of its merged
    ``training`` arguments ``args``, else ``None`` (the reward set's own)."""
    key = f"phase_settings.{phase.name}"
    if phase.reward_weights is not None:
        return phase.reward_weights, f"{key}.reward_weights"
    if args.get("reward_weights") is not None:
        own = "reward_weights" in phase.training
        return args["reward_weights"], f"{key}.training.reward_weights" if own else "training.reward_weights"
    return None, f"{key}.reward_weights"


def _reward_shared(r: ScoringSettings) -> dict[str, Any]:
    """The ``rewards`` settings offered to every reward function (each takes those it has parameters for)."""
    return {k: v for k, v in dataclasses.asdict(r).items() if k != "max_cached_completions"}


def _reward_key(field_: str | None, key: str, phase: PhaseConfig) -> str:
    """The config key in phase ``key`` of an error of :func:`cpr.rewards.get_reward_set`."""
    parts = (field_ or "rewards").split(".")
    if len(parts) != 2:  # rewards / reward_weights / reward_params, or rewards.<function>.<parameter>
        return f"{key}.{parts[0]}" if len(parts) == 1 else f"{key}.reward_params.{parts[1]}.{parts[2]}"
    owner = next((f for f, params in phase.reward_params.items() if parts[1] in (params or {})), None)
    if owner:
        return f"{key}.reward_params.{owner}.{parts[1]}"
    shared = {f.name for f in dataclasses.fields(ScoringSettings)}
    return field_ if parts[1] in shared else f"{key}.reward_params.{parts[1]}"


def _resolve_path(path: str, base: Path | None) -> str:
    """``path``, relative to the working directory, else to the config file's folder ``base``."""
    p = Path(os.path.expanduser(path))
    return str(base / p) if not p.is_absolute() and base and not p.exists() and (base / p).exists() else str(p)


def _check_sources(sources: list[DataSourceConfig], key: str, base: Path | None) -> None:
    for i, src in enumerate(sources):
        if src.source not in ADAPTERS:
            raise ConfigError(f"unknown data source {src.source!r}; known: {sorted(ADAPTERS)}", field=f"{key}[{i}].source")
        try:  # the adapter checks its options (an unknown one is refused, named)
            ADAPTERS[src.source](**src.options)
        except ConfigError as e:
            raise ConfigError(e.message, field=f"{key}[{i}].{e.field or 'options'}") from None
        if not ADAPTERS[src.source].reads_path:  # a generated source (synthetic)
            continue
        if not src.path:
            raise ConfigError("missing dataset path", field=f"{key}[{i}].path")
        src.path = _resolve_path(src.path, base)
        if not Path(src.path).exists() and not (ADAPTERS[src.source].loads_hub_datasets and looks_like_hub_name(src.path)):
            raise ConfigError(f"dataset path does not exist: {src.path}", field=f"{key}[{i}].path")


def _resolve_phase(cfg: ExperimentConfig, name: str, base: Path | None) -> PhaseConfig:
    """Phase ``name``'s settings over its preset, checked with the shared ``training`` and ``rewards``."""
    from cpr.advantages import check_baseline
    from cpr.credit import check_credit
    from cpr.rewards import get_reward_set
    from cpr.training.guidance import check_guidance

    key, given = f"phase_settings.{name}", cfg.phase_settings.get(name)
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"expected a mapping, got {type(given).__name__}", field=key)
    if name not in PHASE_PRESETS and given is None:
        raise ConfigError(f"phase {name!r} is not built in ({sorted(PHASE_PRESETS)}); define it under {key}",
                          field="phases")
    preset = dict(PHASE_PRESETS.get(name, {}))
    if given and "rewards" in given and given["rewards"] != preset.get("rewards"):
        preset.pop("reward_params", None)  # the preset's parameters belong to its own rewards
    phase = _parse(PhaseConfig, {**_merge(preset, given or {}), "name": name}, key)
    _check_training(phase.training, f"{key}.training")
    args = phase._training_args = _merge(cfg.training, phase.training)
    args.setdefault("seed", cfg.seed)
    args.setdefault("output_dir", str(Path(cfg.output_dir) / phase.name))
    args.setdefault("run_name", f"{cfg.run_name}-{phase.name}")
    weights, weights_key = phase_reward_weights(phase, args)
    try:
        funcs, _ = get_reward_set(phase.rewards, weights, phase.reward_params, **_reward_shared(cfg.rewards))
    except ConfigError as e:
        if e.field == "reward_weights":
            raise ConfigError(f"phase {name}: {e.message}", field=weights_key) from None
        raise ConfigError(e.message, field=_reward_key(e.field, key, phase)) from None
    check_credit(phase.credit, phase.credit_weight, funcs, loss_type=args.get("loss_type", "dapo"),
                 off_policy_mask_threshold=args.get("off_policy_mask_threshold"),
                 dynamic_sampling=phase.dynamic_sampling.enabled, field=f"{key}.credit")
    check_baseline(phase.baseline, dynamic_sampling=phase.dynamic_sampling.enabled,
                   aggregation=args.get("multi_objective_aggregation", "sum_then_normalize"), field=f"{key}.baseline")
    check_guidance(phase.guidance, num_generations=args.get("num_generations", 8),
                   loss_type=args.get("loss_type", "dapo"), liger=bool(args.get("use_liger_kernel")),
                   off_policy_mask_threshold=args.get("off_policy_mask_threshold"), field=f"{key}.guidance")
    schedule = phase.curriculum_config.schedule  # built once, here
    if schedule != "none" and not (args.get("max_steps") or 0) > 0:
        raise ConfigError(f"a {schedule!r} curriculum needs max_steps > 0 (the schedule is a fraction of training)",
                          field=f"{key}.training.max_steps")
    if phase.init_adapter is not None:
        from cpr.training.checkpoints import adapter_folder

        phase.init_adapter = _resolve_path(phase.init_adapter, base)
        adapter_folder(Path(phase.init_adapter), field=f"{key}.init_adapter")
    # GRPO's structure: the global generation batch holds whole groups of num_generations
    per_device, num_gen = args.get("per_device_train_batch_size", 8), args.get("num_generations", 8)
    steps_per_gen = args.get("steps_per_generation") or args.get("gradient_accumulation_steps", 1)
    gen_batch = args.get("generation_batch_size") or per_device * num_processes() * steps_per_gen
    if gen_batch % num_gen:
        involved = ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                    "steps_per_generation", "generation_batch_size")
        raise ConfigError(
            f"the global generation batch ({per_device} per device x {num_processes()} processes x {steps_per_gen} "
            f"steps per generation = {gen_batch}) is not divisible by num_generations ({num_gen}); change "
            "per_device_train_batch_size, gradient_accumulation_steps or num_generations",
            field=next((f"{key}.training.{k}" for k in involved if k in phase.training), "training.num_generations"),
        )
    return phase


def _rekey(key: str, check: Any, *args: Any) -> None:
    """``check(*args)``, its ConfigError naming config key ``key``."""
    try:
        check(*args)
    except ConfigError as e:
        raise ConfigError(e.message, field=key) from None


def warm_start_settings(cfg: ExperimentConfig) -> Any:
    """The :class:`~cpr.training.sft.SFTSettings` of an experiment's warm start, built and checked once (by
    :func:`~cpr.training.config.load_config`). Raises ``ConfigError`` (field ``warm_start.<key>``)."""
    from cpr.training.sft import SFTSettings

    if cfg._warm_start_settings is None:
        ws = cfg.warm_start
        for k in set(ws.extra) - {f.name for f in dataclasses.fields(SFTSettings)}:
            raise ConfigError("not a cpr.training.sft.SFTSettings field", field=f"warm_start.extra.{k}")
        own = dict(
            max_steps=ws.max_steps, learning_rate=ws.learning_rate, per_device_train_batch_size=ws.per_device_train_batch_size,
            max_length=ws.max_length, warmup_ratio=ws.warmup_ratio, seed=cfg.seed, logging_steps=max(1, ws.max_steps // 20),
            save_strategy="steps", save_steps=ws.save_steps or max(1, ws.max_steps // 4), report_to="none")
        for key in sorted(set(ws.extra) & set(own)):
            where = "the run's seed" if key == "seed" else f"warm_start.{key}" if key in type(ws).model_fields else "the warm start"
            raise ConfigError(f"set by {where}, not in extra", field=f"warm_start.extra.{key}")
        settings = SFTSettings(**own, **ws.extra)
        settings.validate(prefix="warm_start")
        cfg._warm_start_settings = settings
    return cfg._warm_start_settings


def _validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check every value that needs more than its type; resolve the phases and relative paths."""
    from cpr.answers import check_answer_mode
    from cpr.evaluation.benchmarks import get_benchmark
    from cpr.evaluation.generation import DecodingSettings
    from cpr.models import resolve_dtype
    from cpr.rewards import import_reward_modules

    base = Path(cfg.config_path).resolve().parent if cfg.config_path else None
    if not cfg.model.name_or_path:
        raise ConfigError("missing model name or path", field="model.name_or_path")
    _rekey("model.dtype", resolve_dtype, cfg.model.dtype, "cpu")
    warm_start_settings(cfg)  # built once, here
    if not cfg.data.train:
        raise ConfigError("no training data: give at least one {source, path}", field="data.train")
    for split in ("train", "validation", "test"):
        _check_sources(getattr(cfg.data, split), f"data.{split}", base)
    for i, src in enumerate(cfg.data.train):
        if src.options.get("text_only") == "keep":
            raise ConfigError("text-only questions cannot be trained with GRPO: TRL cannot generate for a batch "
                              "mixing text-only and image prompts; use text_only: skip",
                              field=f"data.train[{i}].options.text_only")
    cfg.data.bucket_config  # noqa: B018 - built once, here
    if isinstance(cfg.data.prompts, str):
        cfg.data.prompts = _resolve_path(cfg.data.prompts, base)
    load_templates(cfg.data.prompts)

    if len(set(cfg.phases)) != len(cfg.phases):
        raise ConfigError(f"a phase is listed twice: {cfg.phases}", field="phases")
    if set(cfg.phase_settings) - set(cfg.phases):
        raise ConfigError(f"settings given for phases that are not run: {sorted(set(cfg.phase_settings) - set(cfg.phases))} "
                          f"(phases: {cfg.phases})", field="phase_settings")
    _check_training(cfg.training, "training")
    cfg.reward_modules = [_resolve_path(m, base) if m.endswith(".py") else m for m in cfg.reward_modules]
    import_reward_modules(cfg.reward_modules, field="reward_modules")  # registers the names the phases may list
    cfg.phase_settings = {name: _resolve_phase(cfg, name, base) for name in cfg.phases}

    ev = cfg.evaluation
    for i, b in enumerate(ev.benchmarks):
        _rekey(f"evaluation.benchmarks[{i}].name", get_benchmark, b.name)
        _check_sources(b.data, f"evaluation.benchmarks[{i}].data", base)
    hooked = [b.name for b in ev.benchmarks if not b.data] if ev.benchmarks else ["crystal"]
    if ev.eval_steps is not None and ev.metric_for_best.partition("/")[0] not in hooked:
        raise ConfigError(
            f"{ev.metric_for_best!r} would pick the best checkpoint on a benchmark the eval hook does not score: the "
            f"hook scores the validation split ({', '.join(hooked) or 'no benchmark without its own data'}); a "
            "benchmark with its own data is a test set, scored once by the final evaluation",
            field="evaluation.metric_for_best",
        )
    if ev.eval_steps is not None and not (cfg.data.validation or cfg.data.validation_size):
        raise ConfigError("the eval hook scores the validation split, which is empty: set data.validation or "
                          "data.validation_size, or evaluation.eval_steps: null", field="evaluation.eval_steps")
    check_answer_mode(ev.answer_mode, "evaluation.answer_mode")
    try:
        DecodingSettings(**ev.decoding.model_dump())
    except ConfigError as e:
        raise ConfigError(e.message, field=f"evaluation.decoding.{e.field}") from None
    metric = ev.metric_for_best.partition("/")[2]
    if ev.eval_steps is not None and ev.decoding.mode == "greedy" and (metric.startswith("sampled_") or metric == "pass_at_k"):
        raise ConfigError(f"{ev.metric_for_best!r} is a metric of sampled decoding; set evaluation.decoding.mode: "
                          "sampled or pick a greedy metric", field="evaluation.metric_for_best")
    if len(set(ev.final_splits)) != len(ev.final_splits):
        raise ConfigError(f"a split is listed twice: {ev.final_splits}", field="evaluation.final_splits")
    stages = ["untrained", *(["warm_start"] if cfg.warm_start.enabled else []), *cfg.phases]
    for i, stage in enumerate(ev.compare):
        if stage not in stages:
            raise ConfigError(f"unknown stage {stage!r}; expected one of {', '.join(stages)}", field=f"evaluation.compare[{i}]")
    if ev.compare and not (ev.final and "test" in ev.final_splits):
        raise ConfigError("the comparison scores the test split: set evaluation.final and list test in final_splits",
                          field="evaluation.compare")
    if ev.final and not ev.final_splits:
        raise ConfigError("no split to score: list test and / or validation, or set evaluation.final: false",
                          field="evaluation.final_splits")
    return cfg
