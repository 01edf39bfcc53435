"""The sections of an experiment config (:class:`ExperimentConfig`; docs/training.md, "The config's sections") as
strict pydantic models, the built-in :data:`PHASE_PRESETS`, and pydantic's errors as :class:`cpr.errors.ConfigError`
naming the dotted key (:func:`_parse`); a section held as a dataclass's mapping (``training``, ``rewards``) is
checked against that dataclass's fields (:func:`_fields_schema`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from collections.abc import Mapping
from typing import Any, Literal

from annotated_types import Ge, Gt
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model, field_validator

from cpr.data import BucketConfig
from cpr.data.prompts import MODES
from cpr.errors import ConfigError
from cpr.scoring import ScoringSettings

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
        """``buckets`` as a :class:`cpr.data.BucketConfig`, built once (by :func:`~cpr.training.config.load_config`,
        which so checks it: ``ConfigError``)."""
        if self._bucket_config is None:
            self._bucket_config = BucketConfig.from_dict(self.buckets)
        return self._bucket_config


class WarmStartConfig(_Section):
    """Supervised LoRA pass before GRPO (:mod:`cpr.training.warm_start`; checked as its SFTSettings)."""

    enabled: bool = False
    max_records: int | None = Field(None, ge=1)  # a seeded subset of the training records (None: all)
    step_keep: float = Field(1.0, gt=0.0, le=1.0)  # each reference step's keep probability (teacher_records)
    max_steps: int = 150
    learning_rate: float = 5e-3
    warmup_ratio: float = 0.05
    per_device_train_batch_size: int = 8
    max_length: int = 512
    save_steps: int | None = Field(None, ge=1)  # a checkpoint every this many steps (None: a quarter of max_steps)
    extra: dict[str, Any] = {}  # other SFTSettings fields


class DynamicSamplingConfig(_Section):
    """Dynamic sampling of a GRPO phase (DAPO, arXiv 2503.14476, section 3.2; :mod:`cpr.training.dynamic_sampling`):
    zero-variance groups replaced from up to ``max_resample`` extra generation rounds."""

    enabled: bool = False
    max_resample: int = Field(default=1, ge=0)


class GuidanceConfig(_Section):
    """Reference-guided GRPO of a phase (:mod:`cpr.training.guidance`): ``mode`` ``reference`` puts the record's
    reference completion into each group as ``members`` of its completions, trained with LUFFY's shaped ratio
    f(p) = p / (p + ``gamma``) (arXiv 2504.14945, section 3.3); ``prefix`` starts every completion of a group from
    the first ``prefix_share`` of the reference steps, the share falling linearly to 0 over the first
    ``anneal_share`` of the phase's steps (QuestA, arXiv 2507.13266; UFT, arXiv 2505.16984)."""

    mode: Literal["none", "reference", "prefix"] = "none"
    members: int = Field(1, ge=1)
    gamma: float = Field(0.1, gt=0.0)
    prefix_share: float = Field(0.5, gt=0.0, le=1.0)
    anneal_share: float = Field(0.5, gt=0.0, le=1.0)


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
    guidance: GuidanceConfig = GuidanceConfig()  # reference-guided GRPO, off by default
    training: dict[str, Any] = {}  # trl.GRPOConfig fields over the shared training section
    _curriculum: Any = PrivateAttr(None)
    _training_args: dict[str, Any] | None = PrivateAttr(None)

    @property
    def curriculum_config(self) -> Any:
        """``curriculum`` as a :class:`cpr.training.curriculum.CurriculumConfig`, built once (by ``load_config``,
        which so checks it: ``ConfigError`` naming ``phase_settings.<name>.curriculum.<key>``)."""
        if self._curriculum is None:
            from cpr.training.curriculum import CurriculumConfig

            prefix = f"phase_settings.{self.name}.curriculum"
            self._curriculum = CurriculumConfig.from_dict(self.curriculum, prefix=prefix)
        return self._curriculum

    @property
    def training_args(self) -> dict[str, Any]:
        """The phase's ``trl.GRPOConfig`` keyword arguments, merged once by :func:`~cpr.training.config.load_config`
        (``RuntimeError`` before)."""
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
    """Evaluation decoding (checked as :class:`cpr.evaluation.generation.DecodingSettings`): ``greedy``, or also
    ``samples`` completions per item (``sampled``), reported as mean@k and pass@k beside the greedy numbers."""

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
    """A hack monitor over its bound for consecutive steps; ``bounds`` replace the defaults one by one."""

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
        """The action of ``condition``: its own, else ``guards.action``, else :data:`DEFAULT_GUARD_ACTIONS`."""
        return getattr(self, condition).action or self.action or DEFAULT_GUARD_ACTIONS[condition]


class ExperimentConfig(_Section):
    """A whole experiment (one YAML file; :mod:`cpr.training.config`)."""

    run_name: str = "cpr"
    output_dir: str = "outputs/cpr"
    seed: int = 42  # data splits, sampling order and initialisation
    torch_threads: int | None = Field(1, ge=1)  # torch.set_num_threads at the start; null: torch's default
    model: ModelSettings = ModelSettings()
    lora: LoraSettings = LoraSettings()
    data: DataConfig = DataConfig()
    rewards: ScoringSettings = ScoringSettings(answer_mode="strict")  # shared by every reward, phase and evaluation
    reward_modules: list[str] = []  # .py files or modules of your own reward functions (docs/rewards.md)
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
        """The ``rewards`` mapping as :class:`cpr.scoring.ScoringSettings` (default ``strict`` answers)."""
        if not isinstance(value, Mapping):
            return value
        given = _parse(_fields_schema(ScoringSettings), value).model_dump(exclude_unset=True)
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

# pydantic errors -> ConfigError naming the dotted key

_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
             "list": "a list", "dict": "a mapping", "model": "a mapping", "finite": "a finite number"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_UNION_MEMBER = re.compile(r"str|int|float|bool|[\w-]+\[.*\]")  # pydantic's loc entry of a union member


def _parse(cls: type[BaseModel], data: Any, prefix: str = "", unknown: str | None = None) -> Any:
    """``cls.model_validate(data)``, its first error raised as a ConfigError naming ``<prefix>.<key>``."""
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
_GRPO_BOUNDS = (
    *((k, Ge(1)) for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                           "steps_per_generation", "num_iterations")),
    *((k, Gt(0)) for k in ("save_steps", "logging_steps", "learning_rate", "temperature")),  # steps < 1: a share
    ("beta", Ge(0)),
)


@functools.cache
def _fields_schema(cls: type, bounds: tuple[tuple[str, Any], ...] = ()) -> type[BaseModel]:
    """A strict pydantic model of dataclass ``cls``'s init fields and ``bounds``, each default None."""
    hints, limits = typing.get_type_hints(cls), dict(bounds)
    fields = {f.name: (typing.Annotated[hints[f.name], limits[f.name]] if f.name in limits else hints[f.name], None)
              for f in dataclasses.fields(cls) if f.init}
    return create_model(f"{cls.__name__}Fields", __config__=ConfigDict(_STRICT, arbitrary_types_allowed=True), **fields)


def _check_training(section: Mapping[str, Any], prefix: str) -> None:
    """Check a ``training`` section against ``trl.GRPOConfig``'s fields and :data:`_GRPO_BOUNDS`."""
    from trl import GRPOConfig

    for k in ("gradient_checkpointing", "activation_checkpointing"):
        if k in section:
            raise ConfigError("set model.gradient_checkpointing instead (one switch for the model and every "
                              "phase's trainer)", field=f"{prefix}.{k}")
    _parse(_fields_schema(GRPOConfig, _GRPO_BOUNDS), section, prefix, unknown="not a trl.GRPOConfig field ({!r})")
