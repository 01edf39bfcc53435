"""Scoring a run's model or LoRA adapter on a split of its data, as every evaluation of a run does
(:func:`cpr.evaluation.evaluate_model`). The eval hook and checkpoint selection score the **validation** split
only; the test split is scored once, by :func:`final_evaluation`, so no choice is ever made on it."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError, InputError
from cpr.io import atomic_write_text
from cpr.training import policy
from cpr.training.config_sections import EVAL_SPLITS, EvalBenchmarkConfig, ExperimentConfig
from cpr.training.splits import DataSplits, load_sources

logger = logging.getLogger("cpr.training")

__all__ = ["EVAL_SETTINGS_FILE", "benchmark_records", "eval_hook", "eval_settings", "final_eval_dir", "final_eval_key",
           "final_evaluation", "generation_settings", "hook_benchmarks", "on_crystal_test", "read_eval_settings",
           "run_of_adapter", "score_adapters", "scoring_settings", "summary_entries"]

FINAL_EVAL_DIRS: dict[str, str] = {"test": "final_eval", "validation": "final_eval/validation"}


def _check_split(split: str) -> None:
    if split not in EVAL_SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(EVAL_SPLITS)}", field="split")


def final_eval_dir(run_dir: str | Path, split: str) -> Path:
    """The folder of a run's final evaluation on ``split``; ``ConfigError`` for an unknown split."""
    _check_split(split)
    return Path(run_dir) / FINAL_EVAL_DIRS[split]


def final_eval_key(split: str) -> str:
    """The ``summary.json`` key of the final evaluation on ``split``: ``final_eval`` (test) or
    ``final_eval_<split>``; ``ConfigError`` for an unknown split."""
    _check_split(split)
    return "final_eval" if split == "test" else f"final_eval_{split}"


def summary_entries(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{final_eval_key(split): by_benchmark}`` of :func:`final_evaluation`'s result, for ``summary.json``."""
    return {final_eval_key(split): by_benchmark for split, by_benchmark in results.items()}


def benchmark_records(cfg: ExperimentConfig, splits: DataSplits, split: str) -> list[tuple[str, list, int | None]]:
    """``(benchmark, records, limit)`` the final evaluation scores on ``split`` (``test``: each benchmark on its own
    ``data`` or the test split; ``validation``: ``crystal``), those with records; ``limit`` caps only the hook.
    Raises ``ConfigError`` for an unknown split, ``InputError`` when a benchmark's own ``data`` does not load.
    """
    _check_split(split)
    if split == "validation":
        return [("crystal", list(splits.validation), None)] if splits.validation else []
    specs = []
    for b in cfg.evaluation.benchmarks:
        recs = load_sources(b.data, cfg.data, key=f"evaluation.{b.name}") if b.data else splits.test
        if recs:
            specs.append((b.name, list(recs), b.limit))
    if not cfg.evaluation.benchmarks and splits.test:
        specs.append(("crystal", list(splits.test), None))
    return specs


def on_crystal_test(cfg: ExperimentConfig, benchmark: str, split: str) -> bool:
    """Whether the final evaluation's ``benchmark`` records on ``split`` are CRYSTAL's test set (its own ``data``,
    else ``data.test``; a held-out share never is): where its report shows the paper's rows."""
    from cpr.evaluation.report import is_crystal_test

    if benchmark != "crystal" or split != "test":
        return False
    own = next((b.data for b in cfg.evaluation.benchmarks if b.name == benchmark and b.data), None)
    return is_crystal_test([(s.source, s.split) for s in (own or cfg.data.test)])


def hook_benchmarks(cfg: ExperimentConfig, splits: DataSplits) -> list[tuple[str, list, int | None]]:
    """``(benchmark, records, limit)`` the eval hook scores: each benchmark without its own ``data`` (a test set) on
    the validation split (``crystal`` when none is listed); ``[]`` without validation records."""
    listed = [b for b in cfg.evaluation.benchmarks if not b.data] if cfg.evaluation.benchmarks else [EvalBenchmarkConfig()]
    return [(b.name, list(splits.validation), b.limit) for b in listed] if splits.validation else []


def scoring_settings(cfg: ExperimentConfig, answer_mode: str) -> Any:
    """The ``rewards`` section's :class:`cpr.scoring.ScoringSettings` with ``answer_mode``."""
    return dataclasses.replace(cfg.rewards, answer_mode=answer_mode)


def generation_settings(cfg: ExperimentConfig, *, progress: bool, prompt_mode: str | None = None,
                        greedy: bool = False) -> Any:
    """:class:`cpr.evaluation.GenerationSettings` of the ``evaluation`` section (``prompt_mode`` unless given;
    ``evaluation.decoding`` unless ``greedy``)."""
    from cpr.evaluation import GenerationSettings
    from cpr.evaluation.generation import DecodingSettings

    ev = cfg.evaluation
    decoding = DecodingSettings() if greedy else DecodingSettings(**ev.decoding.model_dump())
    return GenerationSettings(max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size,
                              prompt_mode=prompt_mode or ev.prompt_mode, progress=progress, decoding=decoding)


#: The file ``cpr export`` writes beside a merged model: :func:`eval_settings` of the run it comes from.
EVAL_SETTINGS_FILE = "cpr_eval_settings.json"


def eval_settings(cfg: ExperimentConfig, *, self_contained: bool = False) -> dict[str, Any]:
    """What scoring a model of the run needs to score it as the run's evaluations do (``cpr eval`` takes each
    one a flag leaves unset; docs/evaluation.md), as plain JSON; with ``self_contained`` every prompt template is
    written out, so no file outside is needed. Raises ``ConfigError`` when, with ``self_contained``, prompt
    templates do not load."""
    from cpr.data import load_templates

    m, ev, r = cfg.model, cfg.evaluation, cfg.rewards
    prompts = dataclasses.asdict(load_templates(cfg.data.prompts)) if self_contained else cfg.data.prompts
    return {"dtype": m.dtype, "attn_implementation": m.attn_implementation, "trust_remote_code": m.trust_remote_code,
            "min_pixels": m.min_pixels, "max_pixels": m.max_pixels, "prompts": prompts,
            "prompt_mode": ev.prompt_mode, "max_new_tokens": ev.max_new_tokens, "batch_size": ev.batch_size,
            "backend": "transformers", "decoding": ev.decoding.model_dump(), "encoder": r.encoder,
            "threshold": r.threshold, "alpha": r.alpha, "matching": r.matching, "answer_mode": ev.answer_mode,
            "encoder_batch_size": r.batch_size}


def read_eval_settings(model_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """``(file, settings)`` of the :data:`EVAL_SETTINGS_FILE` in a model folder, or ``None`` when it holds none.
    Raises ``InputError`` (file and field named) when the file is not valid JSON or its ``settings`` is not
    an object."""
    path = Path(model_dir).expanduser() / EVAL_SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at line {e.lineno})", path=path) from None
    settings = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        raise InputError("must be an object (what cpr export records for evaluating the model)", path=path,
                         field="settings")
    return path, settings


def run_of_adapter(adapter: str | Path | None) -> Path | None:
    """The ``config.yaml`` of the run ``adapter`` belongs to (in its parent or grandparent folder: a warm start's
    or a phase's ``adapter`` and ``checkpoint-N``); ``None`` for no adapter or one outside a run folder."""
    for folder in Path(adapter).resolve().parents[:2] if adapter else ():
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def eval_hook(cfg: ExperimentConfig, splits: DataSplits, templates: Any, output_dir: Path) -> Any:
    """The eval hook of a GRPO phase (:class:`cpr.evaluation.callback.EvalCallback`) on :func:`hook_benchmarks`;
    ``None`` when ``eval_steps`` is unset or there is nothing to score."""
    from cpr.evaluation.callback import BenchmarkSpec, EvalCallback

    ev = cfg.evaluation
    specs = hook_benchmarks(cfg, splits)
    if not ev.eval_steps or not specs:
        return None
    return EvalCallback(
        [BenchmarkSpec(name, recs, max_samples=limit, seed=cfg.seed) for name, recs, limit in specs],
        eval_steps=ev.eval_steps, generation=generation_settings(cfg, progress=False),
        scoring=scoring_settings(cfg, ev.answer_mode), templates=templates, output_dir=output_dir,
        metric_for_best=ev.metric_for_best, greater_is_better=ev.greater_is_better,
    )


def score_adapters(
    cfg: ExperimentConfig, model_path: str, adapters: Sequence[str | Path | None], score: Callable[[Any, Any], Any],
    *, field: str = "adapter", phase: Any = None,
) -> list[Any]:
    """Load the policy once (a whole model on every process, ZeRO-3 off) and return ``score(model, processor)``
    with each LoRA adapter of ``adapters`` put on it in turn (``None``: the model as loaded). Raises
    ``ConfigError`` for an adapter trained on another base model (``field`` named), before the model loads;
    ``TrainingOutOfMemoryError`` when out of memory."""
    from peft import PeftModel

    from cpr.distributed import process_state
    from cpr.matching import zero3_disabled
    from cpr.training.oom import explain_oom

    for adapter in adapters:
        if adapter is not None:
            policy.check_base(adapter, model_path, cfg, field=field)
    results = []
    with zero3_disabled(), explain_oom(cfg, "evaluation", phase):
        device = process_state().device
        logger.info("evaluation: device %s", policy.device_memory(device))
        model, processor = policy.load_policy(cfg, model_path, device=device)
        for adapter in adapters:
            if adapter is None:
                results.append(score(model, processor))
                continue
            adapted = PeftModel.from_pretrained(model, str(adapter))
            results.append(score(adapted, processor))
            model = adapted.unload()
        del model
    policy.free_memory()  # the evaluation model's cached blocks go before the next phase or engine needs them
    return results


def final_evaluation(
    cfg: ExperimentConfig, splits: DataSplits | None, *, adapter: str | Path | None, run_dir: str | Path, label: str,
    templates: Any = None, model_path: str | None = None, on: Sequence[str] | None = None, skip_empty: bool = False,
    echo: bool = False,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score ``cfg``'s model with the LoRA adapter ``adapter`` (or none) on each split of ``on`` (default
    ``evaluation.final_splits``) into :func:`final_eval_dir` (``<benchmark>/``, resumed, and ``metrics.md``). Every
    process generates its share; the main one returns ``{split: {benchmark: overall summary}}`` (others ``{}``).
    Raises ``ConfigError`` for an unknown split, a split without records, an adapter folder without
    ``adapter_config.json`` or trained on another base model; ``TrainingOutOfMemoryError`` when out of memory.
    """
    from cpr.distributed import process_state
    from cpr.evaluation import evaluate_model
    from cpr.training.checkpoints import adapter_folder
    from cpr.training.splits import load_splits

    on = list(cfg.evaluation.final_splits if on is None else on)
    if adapter is not None:
        adapter_folder(Path(adapter), field="adapter")
    splits = splits if splits is not None else load_splits(cfg.data)
    specs = {split: benchmark_records(cfg, splits, split) for split in on}
    for split in [s for s in on if not specs[s]]:
        if not skip_empty:
            raise ConfigError(f"no {split} records to score: give data.{split} or data.{split}_size",
                              field=f"data.{split}_size")
        logger.info("final evaluation: no %s records, nothing to score on that split", split)
        del specs[split]
    state = process_state()
    results: dict[str, dict[str, dict[str, Any]]] = {split: {} for split in on}

    def score(model: Any, processor: Any) -> None:
        from cpr.data import load_templates

        generation = generation_settings(cfg, progress=True)
        scoring = scoring_settings(cfg, cfg.evaluation.answer_mode)
        prompts = templates if templates is not None else load_templates(cfg.data.prompts)
        for split, found in specs.items():
            out, tables = final_eval_dir(run_dir, split), []
            for name, records, _hook_limit in found:
                logger.info("%s: scoring %s on %d %s records (%d processes)", label, name, len(records), split,
                            state.num_processes)
                metrics = evaluate_model(
                    model, processor, name, records, generation=generation, scoring=scoring, templates=prompts,
                    out_dir=out / name, label=label, title=f"{label}: {name} ({split} split)", shard=state,
                    extra={"adapter": None if adapter is None else str(adapter), "split": split},
                    paper_rows=on_crystal_test(cfg, name, split))
                if metrics is None:  # another process: the main one scores and writes
                    continue
                tables.append((out / name / "metrics.md").read_text(encoding="utf-8"))
                results[split][name] = metrics["overall"]
            if state.is_main_process:
                atomic_write_text(out / "metrics.md", "\n\n".join(tables) + "\n")
                if echo:
                    print("\n" + "\n\n".join(tables))

    if specs:
        logger.info("%s: final evaluation of %s on the %s split(s)", label, adapter or "the base model", ", ".join(specs))
        score_adapters(cfg, model_path or cfg.model.name_or_path, [adapter], score)
    state.wait_for_everyone()
    return results
