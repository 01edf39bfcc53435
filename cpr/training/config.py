"""Experiment configuration: one YAML file describes a whole run (both phases).

The sections are the fields of :class:`ExperimentConfig` (examples in recipes/configs/, a table in
docs/training.md); ``phase_settings`` are merged over the built-in :data:`PHASE_PRESETS`. OmegaConf reads the YAML
and applies ``--set`` overrides; pydantic checks keys and types (the ``training`` sections against
``trl.GRPOConfig``'s field types); :func:`load_config` checks everything before any model, dataset or
encoder loads, an invalid value raising :class:`cpr.errors.ConfigError` that names its dotted key.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import logging
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from annotated_types import Ge, Gt
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model, field_validator

from cpr.data import ADAPTERS, BucketConfig, load_templates
from cpr.data.adapters.hf import looks_like_hub_name
from cpr.data.prompts import MODES
from cpr.errors import ConfigError
from cpr.scoring import ScoringSettings

__all__ = ["ExperimentConfig", "PhaseConfig", "apply_overrides", "config_from_args", "config_from_dict", "load_config",
           "phase_reward_weights", "phase_training_args", "read_run_config", "read_yaml",
           "warm_start_settings"]

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Section(BaseModel):
    model_config = _STRICT


class ModelSettings(_Section):
    """The policy model (a Hugging Face vision-language checkpoint)."""

    name_or_path: str = ""  # hub id or local model folder
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) or a name cpr.models.resolve_dtype knows
    min_pixels: int | None = Field(None, gt=0)  # image pixel bounds (Qwen2.5-VL; InternVL: tile count)
    max_pixels: int | None = Field(None, gt=0)
    gradient_checkpointing: bool | None = None  # model and every phase's trainer; None: on for GPU, off for CPU
    attn_implementation: str | None = None  # e.g. flash_attention_2, sdpa; None: transformers' default
    trust_remote_code: bool = False  # passed to from_pretrained (HF-format checkpoints do not need it)
    allow_base_mismatch: bool = False  # use an adapter (init_adapter, hand-over) trained on another base


class LoraSettings(_Section):
    """LoRA adapter settings (``peft.LoraConfig``)."""

    r: int = Field(16, ge=1)
    alpha: int = 32  # scale = alpha / r
    dropout: float = Field(0.05, ge=0, lt=1)
    include_vision: bool = False  # also adapt the vision tower and projector (default: language model only)
    target_modules: str | list[str] | None = None  # override the per-family target modules (regex or list)


class DataSourceConfig(_Section):
    """One dataset in its published layout (``cpr data inspect``)."""

    source: str = ""  # adapter: crystal, mathvision, tabmwp, scienceqa, m3cot, vlrmbench, jsonl
    path: str = ""  # file, folder, save_to_disk folder, or hub dataset name
    split: str | None = None
    limit: int | None = Field(None, ge=1)  # keep at most this many records
    options: dict[str, Any] = {}  # adapter options


class DataConfig(_Section):
    """Training, validation and test data (an empty validation / test list: a held-out share of train)."""

    train: list[DataSourceConfig] = []
    validation: list[DataSourceConfig] = []
    test: list[DataSourceConfig] = []
    validation_size: float = Field(0.1, ge=0)  # held-out share (< 1) or count (>= 1) of train
    test_size: float = Field(0.0, ge=0)
    split_seed: int = 0
    on_invalid: Literal["error", "skip"] = "error"  # skip: drop invalid records (logged with counts)
    buckets: dict[str, Any] = {}  # cpr.data.buckets.BucketConfig overrides (as given; built: bucket_config)
    prompts: str | dict[str, Any] | None = None  # prompt templates: a YAML path or a mapping of overrides
    validate_images: bool = True  # open every image once at load time
    _bucket_config: BucketConfig | None = PrivateAttr(None)

    @property
    def bucket_config(self) -> BucketConfig:
        """``buckets`` as a :class:`cpr.data.BucketConfig`, built on first use (by :func:`load_config`, which
        checks it) and the same object afterwards: what the data loaders bucket records with.

        Raises:
            ConfigError: an invalid ``buckets`` mapping (:meth:`cpr.data.BucketConfig.from_dict`).
        """
        if self._bucket_config is None:
            self._bucket_config = BucketConfig.from_dict(self.buckets)
        return self._bucket_config


class WarmStartConfig(_Section):
    """Supervised LoRA pass before GRPO (:mod:`cpr.training.warm_start`; checked as its SFTSettings)."""

    enabled: bool = False
    max_records: int | None = Field(None, ge=1)  # a seeded subset of the training records (None: all)
    # each reference step of a target kept with this probability (a teacher that states some of the steps;
    # cpr.training.warm_start.teacher_records); 1.0: the full reference
    step_keep: float = Field(1.0, gt=0.0, le=1.0)
    max_steps: int = 150
    learning_rate: float = 5e-3
    warmup_ratio: float = 0.05
    per_device_train_batch_size: int = 8
    max_length: int = 512
    save_steps: int | None = Field(None, ge=1)  # a checkpoint every this many steps (None: a quarter of max_steps)
    extra: dict[str, Any] = {}  # other SFTSettings fields


class DynamicSamplingConfig(_Section):
    """Dynamic sampling of a GRPO phase (DAPO, arXiv 2503.14476, section 3.2; :mod:`cpr.training.dynamic_sampling`):
    groups whose rewards are all equal are replaced by groups of fresh prompts, from up to ``max_resample``
    extra generation rounds of a whole generation batch each."""

    enabled: bool = False
    max_resample: int = Field(default=1, ge=0)


class PhaseConfig(_Section):
    """One GRPO phase (``phase_settings.<name>`` over its preset)."""

    name: str = ""  # folder name under output_dir
    rewards: str | list[str] = "cpr"  # a reward set (answer_only, composite, cpr) or reward function names
    reward_weights: list[float] | None = None  # None: training.reward_weights if set, else the set's
    reward_params: dict[str, dict[str, Any]] = {}  # per function, e.g. {cpr: {answer_weight: 0.65}}
    curriculum: dict[str, Any] = {}  # cpr.training.curriculum.CurriculumConfig fields
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()  # off by default
    select_best: bool = False  # score the checkpoints on the validation split; the best seeds the next phase
    select_metric: Literal["accuracy", "match_f1"] = "accuracy"
    init_adapter: str | None = None  # start from this LoRA adapter folder instead of the previous phase's
    credit: Literal["completion", "step"] = "completion"  # step: step-level credit (cpr.credit)
    credit_weight: float = 1.0  # w of credit: step (token advantage = completion advantage + w x process advantage)
    baseline: Literal["group", "greedy"] = "group"  # greedy: the greedy completion's reward replaces the group mean (cpr.advantages)
    training: dict[str, Any] = {}  # trl.GRPOConfig fields over the shared training section
    _curriculum: Any = PrivateAttr(None)
    _training_args: dict[str, Any] | None = PrivateAttr(None)

    @property
    def curriculum_config(self) -> Any:
        """``curriculum`` as a :class:`cpr.training.curriculum.CurriculumConfig`, built on first use (by
        :func:`load_config`, which checks it) and the same object afterwards: what the phase's trainer and
        curriculum sampler read.

        Raises:
            ConfigError: an unknown key or invalid value, named ``phase_settings.<name>.curriculum.<key>``.
        """
        if self._curriculum is None:
            from cpr.training.curriculum import CurriculumConfig

            key = f"phase_settings.{self.name}"
            try:
                self._curriculum = CurriculumConfig.from_dict(self.curriculum, prefix=f"{key}.curriculum")
            except ConfigError as e:
                field_ = e.field or "curriculum"
                raise ConfigError(e.message, field=field_ if field_.startswith(key) else f"{key}.{field_}") from None
        return self._curriculum

    @property
    def training_args(self) -> dict[str, Any]:
        """The phase's ``trl.GRPOConfig`` keyword arguments (:func:`phase_training_args`), merged once by
        :func:`load_config`.

        Raises:
            RuntimeError: the phase was not resolved by :func:`load_config`.
        """
        if self._training_args is None:
            raise RuntimeError(f"phase {self.name!r}: its settings were not resolved by load_config")
        return self._training_args


class EvalBenchmarkConfig(_Section):
    """A benchmark; without its own ``data``: the test split, and the validation split in the eval hook."""

    name: str = "crystal"  # crystal, m3cot or vlrmbench
    data: list[DataSourceConfig] = []
    limit: int | None = None  # at most this many records in the eval hook (the final evaluation scores all)


#: Splits an adapter can be scored on (``evaluation.final_splits``; cpr.training.evaluate).
EVAL_SPLITS: tuple[str, ...] = ("test", "validation")


class DecodingConfig(_Section):
    """Evaluation decoding (checked as :class:`cpr.evaluation.generation.DecodingSettings`): ``greedy``, or
    ``sampled``: also ``samples`` completions per item at ``temperature`` / ``top_p``, seeded with ``seed``,
    reported as mean@k and pass@k beside the greedy numbers."""

    mode: Literal["greedy", "sampled"] = "greedy"
    temperature: float = 1.0
    top_p: float = 1.0
    samples: int = 4  # k
    seed: int = 0


class EvaluationConfig(_Section):
    """Evaluation during and after training (:mod:`cpr.training.evaluate`)."""

    benchmarks: list[EvalBenchmarkConfig] = []
    eval_steps: int | None = Field(None, ge=1)  # eval hook every N optimizer steps (None: none)
    metric_for_best: str = "crystal/match_f1"  # eval hook metric that picks best_checkpoint.json
    greater_is_better: bool = True
    max_new_tokens: int = Field(256, ge=1)  # completion length (new tokens)
    batch_size: int = Field(8, ge=1)  # generation batch size (prompts; sampled: x samples rows)
    decoding: DecodingConfig = DecodingConfig()  # greedy, or sampled too (mean@k, pass@k); selection: greedy
    prompt_mode: Literal[MODES] = "train"  # train (the training prompt) or eval (CRYSTAL's evaluation prompt)
    answer_mode: str = "crystal"  # crystal (the paper's protocol, comparable tables) or strict
    final: bool = True  # score the final adapter on each of final_splits after the last phase
    final_splits: list[Literal[EVAL_SPLITS]] = ["test"]  # final_eval/<benchmark>/, final_eval/validation/...
    compare: list[str] = []  # earlier stages scored on the test split too: untrained, warm_start or a phase


#: What a divergence guard does when its condition holds (:mod:`cpr.training.divergence`).
GuardAction = Literal["warn", "skip_step", "stop"]
#: Default action of each guard condition.
DEFAULT_GUARD_ACTIONS: dict[str, str] = {"nan": "stop", "kl": "warn", "zero_std": "warn", "reward_hacking": "warn"}
#: Upper bounds of the hack monitors (:data:`cpr.guarded_matching.MONITORS`; docs/reward-hacking.md).
DEFAULT_HACKING_BOUNDS: dict[str, float] = {"hacking/duplicate_rate": 0.25, "hacking/restatement_rate": 0.25,
                                            "hacking/precision_minus_recall": 0.8, "hacking/non_answer_rate": 0.5,
                                            "steps/count": 30.0}


class _Guard(_Section):
    enabled: bool = True
    action: GuardAction | None = None  # None: guards.action, else DEFAULT_GUARD_ACTIONS


class NanGuardConfig(_Guard):
    """NaN or Inf in any reward, the loss or the gradient norm of an optimizer step."""


class KLGuardConfig(_Guard):
    """TRL's logged KL (with ``training.beta > 0``) above ``limit`` for consecutive optimizer steps."""

    limit: float = Field(10.0, gt=0)
    consecutive_steps: int = Field(5, ge=1)


class ZeroStdGuardConfig(_Guard):
    """Every group's reward std zero (TRL's ``frac_reward_zero_std`` = 1; with ``baseline: greedy``, every group's
    samples tied with their greedy completion, ``baseline/frac_zero_signal`` = 1) for :meth:`window_for` steps."""

    window: int = Field(50, ge=1)
    fraction: float = Field(0.25, gt=0, le=1)

    def window_for(self, max_steps: int) -> int:
        """``min(window, max(1, ceil(fraction * max_steps)))``; ``window`` when ``max_steps <= 0`` (unknown)."""
        return self.window if max_steps <= 0 else min(self.window, max(1, math.ceil(self.fraction * max_steps)))


class RewardHackingGuardConfig(_Guard):
    """A hack monitor above its bound for consecutive optimizer steps; ``bounds`` replace the defaults
    one by one."""

    bounds: dict[str, float] = DEFAULT_HACKING_BOUNDS
    consecutive_steps: int = Field(20, ge=1)

    @field_validator("bounds")
    @classmethod
    def _with_defaults(cls, bounds: dict[str, float]) -> dict[str, float]:
        from cpr.guarded_matching import MONITORS

        for key in set(bounds) - set(MONITORS):
            raise ConfigError(f"unknown monitor; known: {', '.join(MONITORS)}", field=key)
        return {**DEFAULT_HACKING_BOUNDS, **bounds}


class GuardsConfig(_Section):
    """Divergence guards of the GRPO phases (:mod:`cpr.training.divergence`)."""

    enabled: bool = True
    action: GuardAction | None = None  # for every condition that sets none
    nan: NanGuardConfig = NanGuardConfig()
    kl: KLGuardConfig = KLGuardConfig()
    zero_std: ZeroStdGuardConfig = ZeroStdGuardConfig()
    reward_hacking: RewardHackingGuardConfig = RewardHackingGuardConfig()

    def action_for(self, condition: str) -> str:
        """The action of ``condition`` (nan, kl, zero_std, reward_hacking): its own, else ``guards.action``,
        else :data:`DEFAULT_GUARD_ACTIONS`."""
        return getattr(self, condition).action or self.action or DEFAULT_GUARD_ACTIONS[condition]


class ExperimentConfig(_Section):
    """A whole experiment (module docstring)."""

    run_name: str = "cpr"
    output_dir: str = "outputs/cpr"
    seed: int = 42  # data splits, sampling order and initialisation
    torch_threads: int | None = Field(1, ge=1)  # torch.set_num_threads at the start; null: torch's default
    model: ModelSettings = ModelSettings()
    lora: LoraSettings = LoraSettings()
    data: DataConfig = DataConfig()
    rewards: ScoringSettings = ScoringSettings(answer_mode="strict")  # shared by every reward, phase and evaluation
    # reward functions of your own: .py files (relative to the working directory or the config's folder) or
    # module names, imported before the phases are checked (cpr.rewards.import_reward_modules)
    reward_modules: list[str] = []
    warm_start: WarmStartConfig = WarmStartConfig()
    training: dict[str, Any] = {}
    phases: list[str] = ["answer_only", "cpr"]
    phase_settings: dict[str, Any] = {}  # after validation: the resolved PhaseConfig of each phase
    evaluation: EvaluationConfig = EvaluationConfig()
    guards: GuardsConfig = GuardsConfig()
    config_path: str | None = None  # set by load_config
    _warm_start_settings: Any = PrivateAttr(None)

    @field_validator("rewards", mode="before")
    @classmethod
    def _scoring_settings(cls, value: Any) -> Any:
        """The ``rewards`` mapping as :class:`cpr.scoring.ScoringSettings` (its keys and types checked
        here, its values by the class; ``answer_mode`` defaults to ``strict``, the reward checker)."""
        if not isinstance(value, Mapping):
            return value
        given = _parse(_settings_schema(ScoringSettings), value).model_dump(exclude_unset=True)
        return ScoringSettings(**{"answer_mode": "strict", **given})

    def phase(self, name: str) -> PhaseConfig:
        """The resolved settings of phase ``name`` (preset merged with ``phase_settings``)."""
        return self.phase_settings[name]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (the resolved config written to the run folder)."""
        return self.model_dump()


#: Built-in phases: answer_only (paper phase 1; its best checkpoint seeds the next phase), cpr (paper
#: phase 2: CPR with a_w 0.65, s_w 0.35, lambda 0.3 and the staged curriculum) and composite (the
#: additive baseline). ``phase_settings`` entries are merged over these.
PHASE_PRESETS: dict[str, dict[str, Any]] = {
    "answer_only": {"rewards": "answer_only", "curriculum": {"schedule": "none"}, "select_best": True},
    "cpr": {
        "rewards": "cpr",
        "reward_params": {"cpr": {"answer_weight": 0.65, "step_weight": 0.35, "wrong_answer_scale": 0.3}},
        "curriculum": {"schedule": "staged"},
    },
    "composite": {"rewards": "composite", "curriculum": {"schedule": "none"}},
}

# --------------------------------------------------------------------------------------
# pydantic errors -> ConfigError naming the dotted key
# --------------------------------------------------------------------------------------

_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
             "list": "a list", "dict": "a mapping", "model": "a mapping", "finite": "a finite number"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_UNION_MEMBER = re.compile(r"str|int|float|bool|[\w-]+\[.*\]")  # pydantic's loc entry of a union member


def _parse(cls: type[BaseModel], data: Any, prefix: str = "", unknown: str | None = None) -> Any:
    """``cls.model_validate(data)``, its first error raised as a ConfigError naming ``<prefix>.<key>``
    (``unknown``: the message of an unknown key, ``{!r}`` standing for the key)."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
    kind, value, ctx, key = err["type"], err["input"], err.get("ctx", {}), prefix
    for p in err["loc"]:
        if isinstance(p, int):
            key += f"[{p}]"
        elif not _UNION_MEMBER.fullmatch(p):
            key = f"{key}.{p}" if key else p
    expected = _EXPECTED.get(kind.split("_")[0])
    if kind == "extra_forbidden":
        msg = unknown.format(err["loc"][-1]) if unknown else f"unknown key; known keys here: {_known(cls, err['loc'])}"
    elif kind == "value_error":  # a validator's ConfigError may name a key below loc
        msg, below = getattr(ctx["error"], "message", str(ctx["error"])), getattr(ctx["error"], "field", None)
        key = f"{key}.{below}" if below else key
    elif kind == "literal_error":
        msg = f"must be {ctx['expected']}, got {value!r}"
    elif kind in _BOUNDS:
        msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values())):g}, got {value!r}"
    elif expected:
        msg = f"expected {expected}, got " + (type(value).__name__ if expected in ("a list", "a mapping") else repr(value))
    else:
        msg = err["msg"]
    raise ConfigError(msg, field=key or None)


def _known(cls: Any, loc: tuple[Any, ...]) -> list[str]:
    """The keys of the section at ``loc[:-1]`` of model ``cls``."""
    for p in loc[:-1]:
        ann = cls.model_fields[p].annotation if isinstance(p, str) and p in cls.model_fields else None
        cls = next((a for a in (*typing.get_args(ann), ann) if isinstance(a, type) and issubclass(a, BaseModel)), cls)
    return sorted(cls.model_fields)


#: Bounds cpr adds to trl.GRPOConfig's field types (TRL would fail on such values only in training).
_GRPO_BOUNDS = {
    **dict.fromkeys(("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                     "steps_per_generation", "num_iterations"), Ge(1)),
    **dict.fromkeys(("save_steps", "logging_steps", "learning_rate", "temperature"), Gt(0)),  # steps < 1: a share
    "beta": Ge(0),
}


@functools.cache
def _grpo_schema() -> type[BaseModel]:
    """A pydantic model of ``trl.GRPOConfig``'s fields and types (a value is checked only where given)."""
    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    fields = {f.name: (typing.Annotated[hints[f.name], _GRPO_BOUNDS[f.name]] if f.name in _GRPO_BOUNDS
                       else hints[f.name], None) for f in dataclasses.fields(GRPOConfig) if f.init}
    return create_model("GRPOConfigFields", __config__=ConfigDict(_STRICT, arbitrary_types_allowed=True), **fields)


@functools.cache
def _settings_schema(cls: type) -> type[BaseModel]:
    """A strict pydantic model of dataclass ``cls``'s fields and types (a value is checked only where given)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: (hints[f.name], None) for f in dataclasses.fields(cls)}
    return create_model(f"{cls.__name__}Fields", __config__=ConfigDict(_STRICT, arbitrary_types_allowed=True), **fields)


def _check_training(section: Mapping[str, Any], prefix: str) -> None:
    for k in ("gradient_checkpointing", "activation_checkpointing"):
        if k in section:
            raise ConfigError("set model.gradient_checkpointing instead (one switch for the model and every "
                              "phase's trainer)", field=f"{prefix}.{k}")
    _parse(_grpo_schema(), section, prefix, unknown="not a trl.GRPOConfig field ({!r})")


# --------------------------------------------------------------------------------------
# phases, validation
# --------------------------------------------------------------------------------------


def _merge(*dicts: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merged left to right (nested mappings merged, other values replaced)."""
    return OmegaConf.to_container(OmegaConf.merge(*dicts))


def num_processes() -> int:
    """The number of training processes of this launch: ``WORLD_SIZE`` (torchrun, accelerate) or
    ``ACCELERATE_NUM_PROCESSES``, else 1 (an unreadable value is passed over)."""
    counts = [os.environ.get(v, "") for v in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES")]
    return max(1, int(next((n for n in counts if n.isdigit()), 1)))


def phase_training_args(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """The GRPOConfig keyword arguments of phase ``name``: shared ``training`` merged with the
    phase's own (phase wins), with ``seed``, ``output_dir`` and ``run_name`` filled in if unset; a copy
    of :attr:`PhaseConfig.training_args`, merged once by :func:`load_config`."""
    return copy.deepcopy(cfg.phase(name).training_args)


def _merge_training(cfg: ExperimentConfig, phase: PhaseConfig) -> dict[str, Any]:
    """:func:`phase_training_args` of ``phase``, merged (by :func:`_resolve_phase`, once a phase)."""
    args = _merge(cfg.training, phase.training)
    args.setdefault("seed", cfg.seed)
    args.setdefault("output_dir", str(Path(cfg.output_dir) / phase.name))
    args.setdefault("run_name", f"{cfg.run_name}-{phase.name}")
    return args


def phase_reward_weights(phase: PhaseConfig, args: Mapping[str, Any]) -> tuple[list[float] | None, str]:
    """A phase's reward weights and the config key that gave them: ``phase_settings.<phase>.reward_weights``
    if set, else TRL's ``reward_weights`` of the phase's merged ``training`` arguments ``args``, else
    ``None`` (the reward set's own weights)."""
    key = f"phase_settings.{phase.name}"
    if phase.reward_weights is not None:
        return phase.reward_weights, f"{key}.reward_weights"
    if args.get("reward_weights") is not None:
        own = "reward_weights" in phase.training
        return args["reward_weights"], f"{key}.training.reward_weights" if own else "training.reward_weights"
    return None, f"{key}.reward_weights"


def _reward_shared(r: ScoringSettings) -> dict[str, Any]:
    """The ``rewards`` settings offered to every reward function (:func:`cpr.rewards.get_reward_set`; each
    takes those it has parameters for)."""
    return {k: v for k, v in dataclasses.asdict(r).items() if k != "max_cached_completions"}


def _reward_key(field_: str | None, key: str, phase: PhaseConfig) -> str:
    """The config key of an error of :func:`cpr.rewards.get_reward_set` (naming ``rewards``,
    ``reward_weights``, ``reward_params`` or ``rewards.<function>[.<parameter>]``) in phase ``key``."""
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
    args = phase._training_args = _merge_training(cfg, phase)
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
    """The :class:`~cpr.training.sft.SFTSettings` of an experiment's warm start: the ``warm_start``
    section's values and ``extra`` fields, the experiment's seed, a log line every 1/20 of the steps,
    a checkpoint every ``warm_start.save_steps`` (default: a quarter of ``max_steps``, as a phase), no reports.
    Built and checked once (by :func:`load_config`), the same object afterwards: what the warm start trains
    with and the launch checks read (``extra``: its ``trl.SFTConfig`` fields). Raises ``ConfigError`` (field
    ``warm_start.<key>``)."""
    from cpr.training.sft import SFTSettings

    if cfg._warm_start_settings is None:
        ws = cfg.warm_start
        settings = SFTSettings(
            max_steps=ws.max_steps, learning_rate=ws.learning_rate, per_device_train_batch_size=ws.per_device_train_batch_size,
            max_length=ws.max_length, warmup_ratio=ws.warmup_ratio, seed=cfg.seed, logging_steps=max(1, ws.max_steps // 20),
            save_strategy="steps", save_steps=ws.save_steps or max(1, ws.max_steps // 4), report_to="none", **ws.extra,
        )
        settings.validate(prefix="warm_start")
        cfg._warm_start_settings = settings
    return cfg._warm_start_settings


def _validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check every value that needs more than its type, in the owning module's check where there is
    one; resolve the phases and relative paths."""
    from cpr.answers import check_answer_mode
    from cpr.evaluation.benchmarks import get_benchmark
    from cpr.evaluation.generation import DecodingSettings
    from cpr.models import resolve_dtype
    from cpr.rewards import import_reward_modules
    from cpr.training.sft import SFTSettings

    base = Path(cfg.config_path).resolve().parent if cfg.config_path else None
    if not cfg.model.name_or_path:
        raise ConfigError("missing model name or path", field="model.name_or_path")
    _rekey("model.dtype", resolve_dtype, cfg.model.dtype, "cpu")
    for k in set(cfg.warm_start.extra) - {f.name for f in dataclasses.fields(SFTSettings)}:
        raise ConfigError("not a cpr.training.sft.SFTSettings field", field=f"warm_start.extra.{k}")
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


# --------------------------------------------------------------------------------------
# reading, overrides
# --------------------------------------------------------------------------------------


def config_from_dict(data: Mapping[str, Any], *, config_path: str | None = None) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from a mapping. A run's resolved ``config.yaml``
    loads too: its ``training_effective`` block is derived from the rest and ignored.

    Raises:
        ConfigError: an unknown key or an invalid value (dotted key named; ``config_path`` as the file).
    """
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if k != "training_effective"}
    try:
        cfg = _parse(ExperimentConfig, data)
        cfg.config_path = config_path
        return _validate(cfg)
    except ConfigError as e:
        raise ConfigError(e.message, field=e.field, path=e.path or config_path) from None


def read_run_config(path: str | Path) -> ExperimentConfig:
    """A run's resolved ``config.yaml`` as an :class:`ExperimentConfig`, each value type-checked, with the
    defaults the run had for keys it does not hold, but not cross-checked by :func:`config_from_dict`
    (a recipe's own reward functions need not be registered, its datasets need not be at hand): what
    ``cpr eval`` reads of the run an adapter belongs to.

    Raises:
        ConfigError: unreadable YAML, not a mapping, an unknown key or a value of the wrong type (file
            and dotted key named).
        FileNotFoundError: ``path`` does not exist.
    """
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", path=path)
    try:
        return _parse(ExperimentConfig, {k: v for k, v in data.items() if k != "training_effective"})
    except ConfigError as e:
        raise ConfigError(e.message, field=e.field, path=path) from None


def load_config(path: str | Path, overrides: Sequence[str] = (), *, warn_dropped: bool = True) -> ExperimentConfig:
    """Read a YAML experiment config, apply ``key=value`` overrides (:func:`apply_overrides`), validate it.

    An override of ``phases`` (``--phases cpr``) also leaves out, with a warning (unless ``warn_dropped`` is
    false), the ``phase_settings`` and ``evaluation.compare`` entries of the file's phases it drops (a phase
    name the file does not run stays, and is refused).

    Raises:
        ConfigError: unreadable YAML, an unknown key or an invalid value; the message names the file
            (and the override that set the value) and the dotted key.
        FileNotFoundError: ``path`` does not exist.
    """
    data = read_yaml(path)
    if overrides and isinstance(data, dict):
        file_phases = data.get("phases", ExperimentConfig.model_fields["phases"].default)
        data = apply_overrides(data, overrides)
        phases, settings, evaluation = data.get("phases"), data.get("phase_settings"), data.get("evaluation")
        if "phases" in map(_name, overrides) and isinstance(phases, list) and isinstance(file_phases, list):
            gone = [p for p in file_phases if p not in phases]
            if isinstance(settings, dict) and any(k in gone for k in settings):
                logging.getLogger("cpr.training").log(logging.WARNING if warn_dropped else logging.DEBUG,"phases %s: leaving out phase_settings of %s", phases,
                                                          sorted(str(k) for k in settings if k in gone))
                data["phase_settings"] = {k: v for k, v in settings.items() if k not in gone}
            if isinstance(evaluation, dict) and isinstance(evaluation.get("compare"), list):
                evaluation["compare"] = [c for c in evaluation["compare"] if c not in gone]
    try:
        return config_from_dict(data, config_path=str(path))
    except ConfigError as e:  # name the last override that set the key, a key above it or one below it
        key = (e.field or "").replace("[", ".").replace("]", "")
        given = [o for o in overrides if e.field and (f"{key}.".startswith(f"{_name(o)}.") or _name(o).startswith(f"{key}."))]
        if not given or e.path != str(path):
            raise
        raise ConfigError(e.message, field=e.field, path=f"{path} (--set {given[-1]})") from None


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """Load and validate the config named by parsed arguments (``--config``, ``--set``, ``--output-dir``,
    ``--phases`` of :func:`cpr.training.cli.add_arguments`; :func:`load_config`)."""
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.phases:
        overrides.append(f"phases=[{args.phases}]")
    return load_config(args.config, overrides)


def _name(override: str) -> str:
    return override.partition("=")[0].strip().replace("[", ".").replace("]", "")


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with ``key.sub=value`` / ``key[i].sub=value`` overrides applied in order (OmegaConf's
    dotlist; values parsed as YAML); a value replaces what was there, a mapping included.

    Raises:
        ConfigError: an override without ``=`` or that cannot be applied (naming it).
    """
    conf = OmegaConf.create(dict(data))
    for item in overrides:
        if "=" not in item or not _name(item):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value", field=item)
        key = item.partition("=")[0].strip()
        try:
            OmegaConf.update(conf, key, None, merge=False)  # replace rather than merge a mapping
            conf.merge_with_dotlist([f"{key}={item.partition('=')[2]}"])
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            raise ConfigError(f"cannot apply override {item!r}: {' '.join(str(e).split())}", field=key) from None
    return OmegaConf.to_container(conf)


def read_yaml(path: str | Path) -> Any:
    """The content of a YAML file as plain dicts and lists (``{}`` when empty), read by OmegaConf.

    Raises:
        ConfigError: invalid YAML (a one-line message naming the file).
        FileNotFoundError: ``path`` does not exist.
    """
    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except yaml.YAMLError as e:
        raise ConfigError("invalid YAML: " + " ".join(str(e).split()), path=path) from None
