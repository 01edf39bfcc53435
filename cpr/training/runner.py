"""Run an experiment: warm start, the GRPO phases, checkpoint selection, final evaluation.

:func:`run_experiment` is what ``recipes/cpr_curriculum.py`` and ``cpr train`` call. Output
folder of a run (``output_dir``)::

    config.yaml                 the resolved config (every default filled in)
    run.log                     the run's log
    warm_start/adapter/         supervised LoRA warm start (when enabled)
    <phase>/checkpoint-N/       TRL checkpoints (LoRA adapter, optimizer, trainer and sampler state)
    <phase>/adapter/            the phase's final LoRA adapter
    <phase>/log.jsonl           every trainer log record (reward, KL, per-reward means, step metrics)
    <phase>/scored_completions.jsonl   one row per completion scored by cpr / step_f1
    <phase>/eval_history.jsonl  the eval hook's scores (when evaluation.eval_steps is set)
    <phase>/selection.json      validation scores of each checkpoint and the one picked (select_best)
    <phase>/phase_done.json     written when the phase finished (a resumed run skips it)
    final_eval/                 completions, metrics.json and metrics.md on the test split
    summary.json                what ran, for how long, reward trends, final metrics

Phases (SPEC.md section 6): each phase trains a LoRA adapter with TRL's ``GRPOTrainer``
(:class:`cpr.curriculum.CurriculumGRPOTrainer`, which only replaces the sampler). A phase
starts from ``init_adapter`` if given, else from the adapter the previous phase handed on
(its best checkpoint on the validation split when ``select_best`` is set, else its final
adapter), else from the warm-start adapter, else from a new LoRA adapter.

Resume (``resume=True``): finished phases are skipped (their hand-over adapter is re-read),
and the current phase continues from its last checkpoint with TRL's
``resume_from_checkpoint`` (optimizer, scheduler, RNG and the curriculum position).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cpr.errors import ConfigError
from cpr.io import atomic_write_json, atomic_write_text
from cpr.training.config import ExperimentConfig, PhaseConfig, _reward_shared, phase_training_args
from cpr.training.splits import DataSplits, load_splits

logger = logging.getLogger("cpr.training")

__all__ = ["run_experiment", "last_checkpoint", "checkpoints_of", "reward_trend"]

_CKPT = re.compile(r"^checkpoint-(\d+)$")


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


def last_checkpoint(phase_dir: str | Path) -> Path | None:
    """The latest complete checkpoint (one holding ``trainer_state.json``), or ``None``."""
    for ckpt in reversed(checkpoints_of(phase_dir)):
        if (ckpt / "trainer_state.json").is_file():
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


def _setup_logging(output_dir: Path, is_main: bool) -> logging.Handler | None:
    root = logging.getLogger("cpr")
    root.setLevel(logging.INFO)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
        console = logging.StreamHandler()
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


def _train_phase(
    cfg: ExperimentConfig,
    phase: PhaseConfig,
    splits: DataSplits,
    templates: Any,
    model_path: str,
    init_adapter: Path | None,
    resume: bool,
) -> dict[str, Any]:
    from accelerate import PartialState

    from cpr.curriculum import CurriculumConfig, CurriculumGRPOTrainer
    from cpr.data import to_grpo_dataset
    from cpr.rewards import get_reward_set, set_completion_recorder
    from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, read_log

    phase_dir = Path(cfg.output_dir) / phase.name
    args = _grpo_config(cfg, phase)
    state = PartialState()
    funcs, weights = get_reward_set(phase.rewards, phase.reward_weights, phase.reward_params, **_reward_shared(cfg.rewards))
    args.reward_weights = weights
    curriculum = CurriculumConfig.from_dict(phase.curriculum, prefix=f"phase_settings.{phase.name}.curriculum")

    model, processor = _load_policy(cfg, model_path)
    model = _with_adapter(model, init_adapter)
    peft_config = None if init_adapter is not None else _lora_config(cfg, model_path)
    dataset = to_grpo_dataset(splits.train, templates, mode="train")

    callbacks = [JsonlLogCallback(phase_dir / "log.jsonl")]
    trainer = CurriculumGRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=callbacks,
        curriculum=curriculum if curriculum.schedule != "none" else None,
    )
    hook = _eval_callback(cfg, splits, templates, phase_dir)
    if hook is not None:
        hook.attach(trainer)

    ckpt = last_checkpoint(phase_dir) if resume else None
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
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    finally:
        set_completion_recorder(None)
    wall = time.time() - t0
    adapter_dir = phase_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    if state.is_main_process:
        processor.save_pretrained(str(adapter_dir))
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
    }
    if hook is not None and hook.best is not None:
        result["best_eval"] = hook.best
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
        candidates = [(int(p.name.split("-")[1]), p) for p in checkpoints_of(phase_dir)]
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
            with zero3_disabled():
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
        with zero3_disabled():
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


def _warm_start(cfg: ExperimentConfig, splits: DataSplits, templates: Any, model_path: str, resume: bool) -> Path:
    from cpr.training.sft import SFTSettings, run_sft

    out = Path(cfg.output_dir) / "warm_start"
    adapter = out / "adapter"
    if resume and (adapter / "adapter_config.json").is_file():
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
    path = run_sft(model, processor, records, templates, settings, out, peft_config=_lora_config(cfg, model_path))
    logger.info("warm start: done in %.1f s -> %s", time.time() - t0, path)
    del model
    _free_memory()
    return Path(path)


def run_experiment(cfg: ExperimentConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run every phase of ``cfg`` and return the summary (also written to ``summary.json``).

    Raises:
        ConfigError / InputError: invalid config or data (before any model is loaded).
        ModelNotAvailableError: the model or encoder is neither local nor downloadable.
    """
    from accelerate import PartialState

    from cpr.data import load_templates

    state = PartialState()
    out = Path(cfg.output_dir)
    handler = _setup_logging(out, state.is_main_process)
    t_start = time.time()
    try:
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
        logger.info("run %s -> %s", cfg.run_name, out.resolve())
        splits = load_splits(cfg.data)
        logger.info("data: %s", splits.counts())
        templates = load_templates(cfg.data.prompts)
        model_path = _resolve_model(cfg, splits)
        logger.info("model: %s", model_path)

        summary: dict[str, Any] = {
            "run_name": cfg.run_name,
            "output_dir": str(out),
            "model": cfg.model.name_or_path,
            "data": splits.counts(),
            "phases": [],
            "status": "running",
        }
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
            result = _train_phase(cfg, phase, splits, templates, model_path, init, resume)
            if phase.select_best:
                selection = _select_best(cfg, phase, splits, templates, model_path)
                result["selection"] = selection
                handover = _adapter_folder(Path(selection["picked"]))
            else:
                handover = Path(result["adapter"])
            result["handover_adapter"] = str(handover)
            if state.is_main_process:
                atomic_write_json(done_file, result)
                atomic_write_json(out / "summary.json", {**summary, "phases": summary["phases"] + [result]})
            summary["phases"].append(result)

        summary["final_adapter"] = str(handover) if handover else None
        if cfg.evaluation.final:
            summary["final_eval"] = _final_eval(cfg, splits, templates, model_path, handover)
        summary["status"] = "finished"
        summary["wall_time_s"] = round(time.time() - t_start, 1)
        if state.is_main_process:
            atomic_write_json(out / "summary.json", summary)
            _print_summary(summary)
        return summary
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
