"""The LoRA fine-tuning baseline (M3CoT paper) and the ablations' shared warm start.

**Baseline** (``recipes/sft_lora.py``): supervised LoRA fine-tuning with TRL's ``SFTTrainer``
(:func:`cpr.training.sft.run_sft`) on the training split's reference steps and answers rendered
in the output JSON format (docs/method.md section 1), then scored exactly as the GRPO runs are
(:func:`cpr.training.evaluate.final_evaluation`: same model, decoding, scoring and columns, on each
split of ``evaluation.final_splits``, test by default), so it sits in the same table. The M3CoT paper's fine-tuning baseline (arXiv 2405.16473) uses a batch
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
    final_eval/validation/<benchmark>/   the same on the validation split, when evaluation.final_splits lists it
    summary.json         status, settings, range check, adapter, final metrics (final_eval: test,
                         final_eval_validation), wall time

The ablations' shared warm start is the training runner's own (:func:`cpr.training.warm_start.run_warm_start`).
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
    "sft_baseline_from_dict",
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


def sft_baseline_from_dict(data: Mapping[str, Any], *, config_path: str | None = None) -> SFTBaselineConfig:
    """Build and validate an SFT baseline config (module docstring).

    Raises:
        ConfigError: a missing ``sft`` section, an unknown key (of the experiment sections or of
            ``sft``), an invalid value (dotted key named), or settings outside the M3CoT ranges
            with ``sft_ranges: error``.
    """
    from cpr.training.config import config_from_dict, num_processes
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
        problems = check_m3cot_ranges(settings, mode=ranges, world_size=num_processes())
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
    from cpr.training.config import apply_overrides, read_yaml

    path = Path(path)
    data = read_yaml(path) or {}
    if overrides:
        data = apply_overrides(data, overrides)
    return sft_baseline_from_dict(data, config_path=str(path))


def _loss_trend(state_path: Path) -> dict[str, Any]:
    import json

    if not state_path.is_file():
        return {}
    history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
    losses = [(h["step"], h["loss"]) for h in history if isinstance(h.get("loss"), (int, float))]
    if not losses:
        return {}
    return {"first_loss": losses[0][1], "last_loss": losses[-1][1], "logged": len(losses)}


def run_sft_baseline(cfg: SFTBaselineConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train the LoRA baseline and score it on ``evaluation.final_splits`` (module docstring: the folder).

    Args:
        cfg: the validated config.
        resume: reuse a trained ``sft/adapter`` and a partial final evaluation of an earlier attempt.
        overwrite: delete an earlier run in ``output_dir``, once the model, encoder, data and templates
            have passed their checks (:func:`cpr.training.runner.check_before_training`).

    Returns:
        The summary (also written to ``summary.json``).

    Raises:
        ConfigError: the folder already holds a run and neither ``resume`` nor ``overwrite`` is set
            (:func:`cpr.training.runner.claim_output_dir`).
    """
    from cpr.distributed import process_state
    from cpr.training.evaluate import final_evaluation, summary_entries
    from cpr.training.logs import close_run_log, open_run_log
    from cpr.training.runner import check_before_training, claim_output_dir, delete_previous_run
    from cpr.training.warm_start import train_lora

    state = process_state()
    exp = cfg.experiment
    out = cfg.output_dir
    checked = None
    if claim_output_dir(out, resume=resume, overwrite=overwrite, state=state):
        checked = check_before_training(exp, state, grpo=False)  # the previous run stays until every check passed
        delete_previous_run(out, state)
    handler = open_run_log(out, write=state.is_main_process)
    t0 = time.time()
    try:
        if state.is_main_process:
            atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
        splits, templates, model_path = checked or check_before_training(exp, state, grpo=False)
        logger.info("SFT baseline %s: model %s, data %s", exp.run_name, model_path, splits.counts())
        adapter = out / "sft" / "adapter"
        if resume and (adapter / "adapter_config.json").is_file():
            logger.info("SFT baseline: reusing %s", adapter)
        else:
            adapter = train_lora(exp, cfg.sft, out / "sft", splits.train, templates=templates, model_path=model_path)
        final = {}
        if exp.evaluation.final:
            final = final_evaluation(
                exp, splits, adapter=adapter, run_dir=out, label=exp.run_name, templates=templates,
                model_path=model_path,
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
            "final_eval": {},
            **summary_entries(final),
            "status": "finished",
            "wall_time_s": round(time.time() - t0, 1),
        }
        if state.is_main_process:
            atomic_write_json(out / "summary.json", summary)
        return summary
    finally:
        close_run_log(handler)
