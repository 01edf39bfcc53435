"""The LoRA fine-tuning baseline (M3CoT paper) and the ablations' shared warm start.

**Baseline** (``recipes/sft_lora.py``): supervised LoRA fine-tuning with TRL's ``SFTTrainer``
(:func:`cpr.training.sft.run_sft`) on the training split's reference steps and answers rendered
in the output JSON format (SPEC section 1), then scored on the test split exactly as the GRPO runs
are (:func:`cpr.ablation.evaluate.evaluate_adapter`: same model, decoding, scoring and columns), so
it sits in the same table. The M3CoT paper's fine-tuning baseline (arXiv 2405.16473) uses a batch
size from {2, 4, 8}, a learning rate in [1e-6, 8e-5] and a maximum length of 512 tokens;
:func:`check_m3cot_ranges` compares the settings with these ranges (the batch size counted as
``per_device_train_batch_size x gradient_accumulation_steps x processes``) and, per
``sft_ranges``, raises (``error``, the default) or logs a warning (``warn``, e.g. the tiny demo
model, which learns nothing at these rates).

The baseline's YAML is an experiment config (:mod:`cpr.training.config`) whose ``model``,
``lora``, ``data``, ``rewards`` and ``evaluation`` sections are used as they are (validated by
the experiment config's own checks), plus::

    sft:                 # cpr.training.sft.SFTSettings fields; seed defaults to the config's seed
      max_steps: 500
      learning_rate: 2.0e-5
      per_device_train_batch_size: 4
      gradient_accumulation_steps: 2
      max_length: 512
    sft_ranges: error    # error | warn: settings outside the M3CoT baseline's ranges

The GRPO sections (``training``, ``phases``, ``phase_settings``, ``warm_start``) may be present
(an experiment config can be reused as it is) and are ignored, with a log line naming them.

Output folder (``output_dir``)::

    config.yaml          the resolved config (experiment sections, sft, sft_ranges)
    run.log              the run's log
    sft/adapter/         the LoRA adapter (load with PeftModel.from_pretrained, or start a GRPO
                         phase from it: phase_settings.<phase>.init_adapter: <output_dir>/sft/adapter)
    sft/trainer_state.json   SFTTrainer's log history (loss, mean_token_accuracy, learning rate)
    final_eval/<benchmark>/  completions.jsonl, metrics.json, metrics.md (test split)
    summary.json         status, settings, range check, adapter, test metrics, wall time

**Shared warm start** (:func:`run_warm_start`): the supervised LoRA pass of an experiment
config's ``warm_start`` section, with the settings the training runner gives it, run once so
that every run of an ablation starts from the same adapter.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import ConfigError
from cpr.io import atomic_write_json, atomic_write_text

__all__ = [
    "GRPO_SECTIONS",
    "M3COT_BATCH_SIZES",
    "M3COT_LEARNING_RATES",
    "M3COT_MAX_LENGTH",
    "SFTBaselineConfig",
    "check_m3cot_ranges",
    "load_sft_baseline_config",
    "run_sft_baseline",
    "run_warm_start",
    "sft_baseline_from_dict",
    "train_adapter",
    "warm_start_settings",
]

logger = logging.getLogger("cpr.ablation")

#: The M3CoT paper's fine-tuning baseline (arXiv 2405.16473): batch sizes, learning-rate range, max length.
M3COT_BATCH_SIZES: tuple[int, ...] = (2, 4, 8)
M3COT_LEARNING_RATES: tuple[float, float] = (1e-6, 8e-5)
M3COT_MAX_LENGTH = 512
#: Experiment-config sections that only GRPO uses; ignored by the baseline.
GRPO_SECTIONS: tuple[str, ...] = ("training", "phases", "phase_settings", "warm_start", "config_path")
_SFT_KEYS = ("sft", "sft_ranges")


@dataclass
class SFTBaselineConfig:
    """A validated SFT baseline config (:func:`sft_baseline_from_dict`).

    Attributes:
        experiment: the experiment config of the shared sections (model, lora, data, rewards,
            evaluation, seed, run_name, output_dir); its GRPO sections are placeholders.
        sft: the supervised settings.
        ranges: ``error`` or ``warn`` (:func:`check_m3cot_ranges`).
        ignored: GRPO sections found in the file and ignored.
        range_problems: the settings outside the M3CoT ranges (with ``ranges: warn``).
    """

    experiment: Any
    sft: Any
    ranges: str = "error"
    ignored: list[str] = field(default_factory=list)
    range_problems: list[str] = field(default_factory=list)

    @property
    def output_dir(self) -> Path:
        """The run folder."""
        return Path(self.experiment.output_dir)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config written to ``config.yaml``."""
        exp = self.experiment.to_dict()
        keep = ("run_name", "output_dir", "seed", "model", "lora", "data", "rewards", "evaluation")
        return {**{k: exp[k] for k in keep}, "sft": dataclasses.asdict(self.sft), "sft_ranges": self.ranges}


def check_m3cot_ranges(settings: Any, *, mode: str = "error", world_size: int = 1, prefix: str = "sft") -> list[str]:
    """Compare SFT settings with the M3CoT baseline's ranges (module docstring).

    Args:
        settings: :class:`cpr.training.sft.SFTSettings`.
        mode: ``error`` (raise on the first problem) or ``warn`` (log each problem).
        world_size: number of training processes (the batch size counts every process).
        prefix: config key prefix of the messages.

    Returns:
        One message per setting outside the ranges (empty when all are inside).

    Raises:
        ConfigError: ``mode="error"`` and a setting is outside (``field=f"{prefix}.<key>"``), or an
            unknown mode.
    """
    if mode not in ("error", "warn"):
        raise ConfigError(f"must be error or warn, got {mode!r}", field="sft_ranges")
    problems: list[tuple[str, str]] = []
    batch = settings.per_device_train_batch_size * settings.gradient_accumulation_steps * world_size
    if batch not in M3COT_BATCH_SIZES:
        problems.append((
            "per_device_train_batch_size",
            f"batch size {batch} (per_device_train_batch_size {settings.per_device_train_batch_size} x "
            f"gradient_accumulation_steps {settings.gradient_accumulation_steps} x {world_size} processes) is not "
            f"one of the M3CoT baseline's {list(M3COT_BATCH_SIZES)}",
        ))
    low, high = M3COT_LEARNING_RATES
    if not low <= settings.learning_rate <= high:
        problems.append((
            "learning_rate",
            f"learning rate {settings.learning_rate:g} is outside the M3CoT baseline's range [{low:g}, {high:g}]",
        ))
    if settings.max_length != M3COT_MAX_LENGTH:
        problems.append((
            "max_length", f"max_length {settings.max_length} is not the M3CoT baseline's {M3COT_MAX_LENGTH}"
        ))
    if problems and mode == "error":
        key, message = problems[0]
        raise ConfigError(message + " (set sft_ranges: warn to run anyway)", field=f"{prefix}.{key}")
    for _key, message in problems:
        logger.warning("SFT baseline: %s", message)
    return [m for _, m in problems]


def _world_size() -> int:
    import os

    for var in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        value = os.environ.get(var)
        if value and value.isdigit():
            return max(1, int(value))
    return 1


def sft_baseline_from_dict(data: Mapping[str, Any], *, config_path: str | None = None) -> SFTBaselineConfig:
    """Build and validate an SFT baseline config (module docstring).

    Raises:
        ConfigError: a missing ``sft`` section, an unknown key (of the experiment sections or of
            ``sft``), an invalid value (dotted key named), or settings outside the M3CoT ranges
            with ``sft_ranges: error``.
    """
    from cpr.training.config import config_from_dict
    from cpr.training.sft import SFTSettings

    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", path=config_path)
    data = copy.deepcopy(dict(data))
    if "sft" not in data:
        raise ConfigError("missing the sft section (cpr.training.sft.SFTSettings fields)", field="sft", path=config_path)
    raw_sft = data.pop("sft") or {}
    ranges = data.pop("sft_ranges", "error")
    if not isinstance(raw_sft, Mapping):
        raise ConfigError(f"expected a mapping, got {type(raw_sft).__name__}", field="sft", path=config_path)
    ignored = [k for k in GRPO_SECTIONS if k in data]
    for k in ignored:
        data.pop(k)
    exp = config_from_dict(
        {**data, "phases": ["answer_only"], "warm_start": {"enabled": False}}, config_path=config_path
    )
    known = {f.name for f in dataclasses.fields(SFTSettings)}
    for k in raw_sft:
        if k not in known:
            raise ConfigError(f"unknown key; known keys here: {sorted(known)}", field=f"sft.{k}", path=config_path)
    sft_kwargs = {"seed": exp.seed, **raw_sft}
    for k in ("learning_rate",):
        if isinstance(sft_kwargs.get(k), str):  # YAML reads 1e-5 (no dot) as a string
            try:
                sft_kwargs[k] = float(sft_kwargs[k])
            except ValueError:
                pass
    settings = SFTSettings(**sft_kwargs)
    try:
        settings.validate(prefix="sft")
        problems = check_m3cot_ranges(settings, mode=ranges, world_size=_world_size())
    except ConfigError as e:
        raise ConfigError(e.message, field=e.field, path=config_path) from None
    if ignored:
        logger.info("SFT baseline: ignoring the GRPO sections %s of the config", ignored)
    return SFTBaselineConfig(experiment=exp, sft=settings, ranges=ranges, ignored=ignored, range_problems=problems)


def load_sft_baseline_config(path: str | Path, overrides: Sequence[str] = ()) -> SFTBaselineConfig:
    """Read an SFT baseline YAML file, apply ``key=value`` overrides (as ``--set``), validate it.

    Raises:
        ConfigError: invalid YAML or an invalid value (file and dotted key named).
        FileNotFoundError: ``path`` does not exist.
    """
    from cpr.training.config import apply_overrides

    path = Path(path)
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid YAML: {e}", path=path) from None
    if overrides:
        data = apply_overrides(data, overrides)
    return sft_baseline_from_dict(data, config_path=str(path))


def warm_start_settings(exp: Any) -> Any:
    """The :class:`~cpr.training.sft.SFTSettings` the training runner gives an experiment's warm
    start (``warm_start`` section: steps, learning rate, batch size, max length, warm-up, ``extra``;
    the experiment's seed; logging every 1/20 of the steps; no intermediate checkpoints)."""
    from cpr.training.sft import SFTSettings

    ws = exp.warm_start
    settings = SFTSettings(
        max_steps=ws.max_steps,
        learning_rate=ws.learning_rate,
        per_device_train_batch_size=ws.per_device_train_batch_size,
        max_length=ws.max_length,
        warmup_ratio=ws.warmup_ratio,
        seed=exp.seed,
        logging_steps=max(1, ws.max_steps // 20),
        save_strategy="no",
        report_to="none",
        **ws.extra,
    )
    settings.validate(prefix="warm_start")
    return settings


def train_adapter(
    exp: Any,
    settings: Any,
    out_dir: str | Path,
    *,
    max_records: int | None = None,
    splits: Any = None,
    model_path: str | None = None,
) -> Path:
    """Train a new LoRA adapter (``exp.lora``) on ``exp``'s training split with :func:`run_sft`.

    Args:
        exp: the experiment config (model, LoRA, data).
        settings: :class:`~cpr.training.sft.SFTSettings`.
        out_dir: ``run_sft``'s output folder (the adapter goes to ``<out_dir>/adapter``).
        max_records: train on a seeded subset of this many records (``None``: all).
        splits, model_path: already loaded splits / resolved model (default: loaded here).

    Returns:
        The adapter folder.
    """
    from cpr.ablation.evaluate import load_policy, resolve_model_path
    from cpr.data import load_templates
    from cpr.evaluation import subset
    from cpr.models.loading import build_lora_config, detect_family
    from cpr.training.sft import run_sft
    from cpr.training.splits import load_splits

    splits = splits if splits is not None else load_splits(exp.data)
    model_path = model_path or resolve_model_path(exp, splits)
    records = subset(splits.train, max_records, exp.seed)
    lora = build_lora_config(
        detect_family(model_path), r=exp.lora.r, alpha=exp.lora.alpha, dropout=exp.lora.dropout,
        include_vision=exp.lora.include_vision,
    )
    if exp.lora.target_modules is not None:
        lora.target_modules = exp.lora.target_modules
    model, processor = load_policy(exp, model_path)
    logger.info("supervised LoRA on %d records for %s steps -> %s", len(records), settings.max_steps, out_dir)
    path = run_sft(model, processor, records, load_templates(exp.data.prompts), settings, out_dir, peft_config=lora)
    del model
    return Path(path)


def run_warm_start(exp: Any, out_dir: str | Path) -> Path:
    """Run ``exp``'s warm start (its ``warm_start`` section, enabled or not) into ``out_dir``.

    Returns:
        ``<out_dir>/adapter``.
    """
    return train_adapter(exp, warm_start_settings(exp), out_dir, max_records=exp.warm_start.max_records)


def _add_file_log(folder: Path) -> logging.Handler:
    root = logging.getLogger("cpr")
    root.setLevel(logging.INFO)
    folder.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(folder / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return handler


def _loss_trend(state_path: Path) -> dict[str, Any]:
    import json

    if not state_path.is_file():
        return {}
    history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
    losses = [(h["step"], h["loss"]) for h in history if isinstance(h.get("loss"), (int, float))]
    if not losses:
        return {}
    return {"first_loss": losses[0][1], "last_loss": losses[-1][1], "logged": len(losses)}


def run_sft_baseline(cfg: SFTBaselineConfig, *, resume: bool = False) -> dict[str, Any]:
    """Train the LoRA baseline and score it on the test split (module docstring: the folder).

    Args:
        cfg: the validated config.
        resume: reuse a trained ``sft/adapter`` and a partial final evaluation of an earlier attempt.

    Returns:
        The summary (also written to ``summary.json``).

    Raises:
        ConfigError: the folder already holds a run and ``resume`` is not set.
    """
    from accelerate import PartialState

    from cpr.ablation.evaluate import evaluate_adapter, resolve_model_path
    from cpr.training.splits import load_splits

    state = PartialState()
    exp = cfg.experiment
    out = cfg.output_dir
    if not resume and ((out / "summary.json").is_file() or (out / "sft").exists() or (out / "final_eval").exists()):
        raise ConfigError(
            f"{out} already holds an SFT run: pass --resume to continue it, or choose another output_dir",
            field="output_dir",
        )
    handler = _add_file_log(out) if state.is_main_process else None
    t0 = time.time()
    try:
        if state.is_main_process:
            atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
        splits = load_splits(exp.data)
        model_path = resolve_model_path(exp, splits)
        logger.info("SFT baseline %s: model %s, data %s", exp.run_name, model_path, splits.counts())
        adapter = out / "sft" / "adapter"
        if resume and (adapter / "adapter_config.json").is_file():
            logger.info("SFT baseline: reusing %s", adapter)
        else:
            adapter = train_adapter(exp, cfg.sft, out / "sft", splits=splits, model_path=model_path)
        final = {}
        if exp.evaluation.final:
            final = evaluate_adapter(
                exp, adapter=adapter, split="test", out_dir=out / "final_eval", label=exp.run_name,
                splits=splits, model_path=model_path,
            )
        summary = {
            "run_name": exp.run_name,
            "kind": "sft",
            "output_dir": str(out),
            "model": exp.model.name_or_path,
            "data": splits.counts(),
            "sft": dataclasses.asdict(cfg.sft),
            "sft_ranges": cfg.ranges,
            "outside_m3cot_ranges": cfg.range_problems,
            "ignored_sections": cfg.ignored,
            "training": _loss_trend(out / "sft" / "trainer_state.json"),
            "adapter": str(adapter),
            "final_adapter": str(adapter),
            "final_eval": final,
            "status": "finished",
            "wall_time_s": round(time.time() - t0, 1),
        }
        if state.is_main_process:
            atomic_write_json(out / "summary.json", summary)
        return summary
    finally:
        if handler is not None:
            logging.getLogger("cpr").removeHandler(handler)
            handler.close()
