"""Scoring an experiment's model or LoRA adapter on a split of its data, as a run's evaluations do.

One set of pieces serves every evaluation of a run and of the ablations, so every number of a
table is scored alike: the same model (:mod:`cpr.training.policy`), decoding (``evaluation``
section: ``max_new_tokens``, ``batch_size``, ``prompt_mode``) and scoring (``rewards`` section:
encoder, tau, matching, alpha; ``evaluation.answer_mode``), through
:func:`cpr.evaluation.evaluate_model`.

The benchmarks of a split (:func:`benchmark_records`):

* ``test``: the benchmarks of ``evaluation.benchmarks``, each on its own ``data`` or on the run's
  test split, or ``crystal`` on the test split when none is listed;
* ``validation``: ``crystal`` on the run's validation split.

The eval hook (:func:`eval_hook`) and the checkpoint choice made from it (``best_checkpoint.json``,
``evaluation.metric_for_best``) score the **validation** split only (:func:`hook_benchmarks`); the
test split is scored once, by the final evaluation, so no choice is ever made on it.

:func:`evaluate_adapter` scores one split into ``<out_dir>/<benchmark>/{completions.jsonl,
metrics.json, metrics.md}`` and ``<out_dir>/metrics.md`` (every record: the benchmarks' ``limit``
caps only the eval hook). :func:`final_evaluation` scores each split of
``evaluation.final_splits`` into the run folder (:func:`final_eval_dir`)::

    final_eval/<benchmark>/...             test (the default)
    final_eval/validation/<benchmark>/...  validation

and the run's ``summary.json`` holds the overall numbers under :func:`final_eval_key` (``final_eval``
for test, ``final_eval_validation`` for validation).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError
from cpr.io import atomic_write_json, atomic_write_text
from cpr.training import policy
from cpr.training.config import EVAL_SPLITS, ExperimentConfig
from cpr.training.splits import DataSplits

logger = logging.getLogger("cpr.training")

__all__ = [
    "FINAL_EVAL_DIRS",
    "benchmark_records",
    "eval_hook",
    "evaluate_adapter",
    "final_eval_dir",
    "final_eval_key",
    "final_evaluation",
    "generation_settings",
    "hook_benchmarks",
    "scoring_settings",
    "summary_entries",
]

#: Where a run folder keeps the final evaluation of each split (relative to the run folder).
FINAL_EVAL_DIRS: dict[str, str] = {"test": "final_eval", "validation": "final_eval/validation"}


def _check_split(split: str) -> None:
    if split not in EVAL_SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(EVAL_SPLITS)}", field="split")


def final_eval_dir(run_dir: str | Path, split: str) -> Path:
    """The folder of a run's final evaluation on ``split`` (module docstring).

    Raises:
        ConfigError: an unknown split (field ``split``).
    """
    _check_split(split)
    return Path(run_dir) / FINAL_EVAL_DIRS[split]


def final_eval_key(split: str) -> str:
    """The ``summary.json`` key of a run's final evaluation on ``split``: ``final_eval`` (test) or
    ``final_eval_<split>``.

    Raises:
        ConfigError: an unknown split (field ``split``).
    """
    _check_split(split)
    return "final_eval" if split == "test" else f"final_eval_{split}"


def benchmark_records(cfg: ExperimentConfig, splits: DataSplits, split: str) -> list[tuple[str, list, int | None]]:
    """``(benchmark, records, limit)`` scored on ``split`` by the final evaluation (module docstring);
    benchmarks without records are left out, so the list may be empty. ``limit`` is the benchmark's
    cap for the eval hook (``None`` on validation), which the final evaluation ignores.

    Raises:
        ConfigError: an unknown split.
        InputError: a benchmark's own ``data`` does not load.
    """
    from cpr.training.splits import load_sources

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


def scoring_settings(cfg: ExperimentConfig, answer_mode: str) -> Any:
    """:class:`cpr.evaluation.ScoringSettings` of the config's ``rewards`` section (encoder, tau,
    matching, alpha, device, batch size) with ``answer_mode`` (``crystal`` or ``strict``)."""
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


def generation_settings(cfg: ExperimentConfig, *, progress: bool, prompt_mode: str | None = None) -> Any:
    """:class:`cpr.evaluation.GenerationSettings` of the config's ``evaluation`` section
    (``max_new_tokens``, ``batch_size``; ``prompt_mode`` unless given)."""
    from cpr.evaluation import GenerationSettings

    ev = cfg.evaluation
    return GenerationSettings(
        max_new_tokens=ev.max_new_tokens,
        batch_size=ev.batch_size,
        prompt_mode=prompt_mode or ev.prompt_mode,
        progress=progress,
    )


def hook_benchmarks(cfg: ExperimentConfig, splits: DataSplits) -> list[tuple[str, list, int | None]]:
    """``(benchmark, records, limit)`` the eval hook scores: each benchmark of ``evaluation.benchmarks``
    without its own ``data`` (``crystal`` when none is listed) on the run's validation split, capped
    at its ``limit``; ``[]`` without validation records. A benchmark with its own ``data`` is a test
    set: only the final evaluation scores it."""
    from cpr.training.config import EvalBenchmarkConfig

    listed = [b for b in cfg.evaluation.benchmarks if not b.data] if cfg.evaluation.benchmarks else [EvalBenchmarkConfig()]
    return [(b.name, list(splits.validation), b.limit) for b in listed] if splits.validation else []


def eval_hook(cfg: ExperimentConfig, splits: DataSplits, templates: Any, output_dir: Path) -> Any:
    """The eval hook of a GRPO phase (:class:`cpr.evaluation.callback.EvalCallback`): the validation
    split's benchmarks (:func:`hook_benchmarks`), every ``evaluation.eval_steps`` steps, files in
    ``output_dir``; ``None`` when ``eval_steps`` is not set or there is nothing to score."""
    from cpr.evaluation.callback import BenchmarkSpec, EvalCallback

    ev = cfg.evaluation
    specs = hook_benchmarks(cfg, splits)
    if not ev.eval_steps or not specs:
        return None
    return EvalCallback(
        [BenchmarkSpec(name, recs, max_samples=limit, seed=cfg.seed) for name, recs, limit in specs],
        eval_steps=ev.eval_steps,
        generation=generation_settings(cfg, progress=False),
        scoring=scoring_settings(cfg, ev.answer_mode),
        templates=templates,
        output_dir=output_dir,
        metric_for_best=ev.metric_for_best,
        greater_is_better=ev.greater_is_better,
    )


def evaluate_adapter(
    cfg: ExperimentConfig,
    splits: DataSplits | None,
    *,
    adapter: str | Path | None,
    split: str,
    out_dir: str | Path,
    label: str,
    templates: Any = None,
    model_path: str | None = None,
    echo: bool = False,
) -> dict[str, dict[str, Any]]:
    """Score ``cfg``'s model, with the LoRA adapter ``adapter`` if given, on ``split``; write the files.

    Args:
        cfg: a validated experiment config (model, data, rewards, evaluation).
        splits: the data splits (``None``: loaded from ``cfg.data``).
        adapter: a LoRA adapter folder, or ``None`` for the model as loaded.
        split: ``test`` or ``validation`` (module docstring: the benchmarks of each).
        out_dir: folder of ``<benchmark>/{completions.jsonl, metrics.json, metrics.md}`` and
            ``metrics.md`` (all tables). A ``completions.jsonl`` already there is resumed (finished
            samples are not generated again). ``metrics.json`` also records ``adapter`` and ``split``.
        label: the model's name in the markdown tables.
        templates: prompt templates (default: loaded from ``cfg.data.prompts``).
        model_path: the model folder or hub id (default: ``model.name_or_path``).
        echo: also print the tables to standard output.

    Returns:
        ``{benchmark: overall summary}`` (accuracy in percent, the rest in [0, 1]). Only the main
        process evaluates; the others wait and return ``{}``.

    Raises:
        ConfigError: an unknown split, no records to score on it, an adapter folder without
            ``adapter_config.json``, or an adapter trained on another base model
            (:func:`cpr.training.policy.check_base`).
        TrainingOutOfMemoryError: out of memory (:mod:`cpr.training.oom`).
    """
    return _evaluate(
        cfg, splits, adapter=adapter, outputs=[(split, Path(out_dir))], label=label, templates=templates,
        model_path=model_path, echo=echo,
    )[split]


def final_evaluation(
    cfg: ExperimentConfig,
    splits: DataSplits,
    *,
    adapter: str | Path | None,
    run_dir: str | Path,
    label: str,
    templates: Any = None,
    model_path: str | None = None,
    skip_empty: bool = False,
    echo: bool = False,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score ``adapter`` on each split of ``cfg.evaluation.final_splits`` into
    :func:`final_eval_dir` ``(run_dir, split)``, as :func:`evaluate_adapter` does (the model is
    loaded once for all of them).

    Args:
        cfg, splits, adapter, label, templates, model_path, echo: as :func:`evaluate_adapter`.
        run_dir: the run folder.
        skip_empty: leave out (with a log line) a split with no records instead of raising.

    Returns:
        ``{split: {benchmark: overall summary}}`` for every listed split (``{}`` for a skipped one,
        and on processes other than the main one).

    Raises:
        ConfigError: a listed split without records (unless ``skip_empty``), or an invalid adapter.
        TrainingOutOfMemoryError: out of memory.
    """
    outputs = []
    for split in cfg.evaluation.final_splits:
        if skip_empty and not benchmark_records(cfg, splits, split):
            logger.info("final evaluation: no %s records, nothing to score on that split", split)
            continue
        outputs.append((split, final_eval_dir(run_dir, split)))
    results: dict[str, dict[str, dict[str, Any]]] = {split: {} for split in cfg.evaluation.final_splits}
    if outputs:
        results.update(_evaluate(
            cfg, splits, adapter=adapter, outputs=outputs, label=label, templates=templates,
            model_path=model_path, echo=echo,
        ))
    return results


def _evaluate(
    cfg: ExperimentConfig,
    splits: DataSplits | None,
    *,
    adapter: str | Path | None,
    outputs: list[tuple[str, Path]],
    label: str,
    templates: Any,
    model_path: str | None,
    echo: bool,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score the model (with ``adapter``) on each ``(split, out_dir)`` of ``outputs``, loading it once."""
    from cpr.distributed import process_state
    from cpr.evaluation import evaluate_model, render_markdown
    from cpr.matching import zero3_disabled
    from cpr.training.checkpoints import adapter_folder
    from cpr.training.oom import explain_oom
    from cpr.training.splits import load_splits

    if adapter is not None:
        adapter_folder(Path(adapter), field="adapter")
    splits = splits if splits is not None else load_splits(cfg.data)
    specs = {split: benchmark_records(cfg, splits, split) for split, _ in outputs}
    for split, found in specs.items():
        if not found:
            raise ConfigError(
                f"no {split} records to score: give data.{split} or data.{split}_size", field=f"data.{split}_size"
            )
    state = process_state()
    model_path = model_path or cfg.model.name_or_path
    results: dict[str, dict[str, dict[str, Any]]] = {split: {} for split, _ in outputs}
    if state.is_main_process:
        from cpr.data import load_templates

        templates = templates if templates is not None else load_templates(cfg.data.prompts)
        if adapter is not None:  # before the model loads
            policy.check_base(adapter, model_path, cfg, field="adapter")
        generation = generation_settings(cfg, progress=True)
        scoring = scoring_settings(cfg, cfg.evaluation.answer_mode)
        with zero3_disabled(), explain_oom(cfg, "evaluation"):
            model, processor = policy.load_policy(cfg, model_path)
            if adapter is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(adapter))
            for split, out_dir in outputs:
                tables = []
                for name, records, _hook_limit in specs[split]:  # every record: the limit caps only the eval hook
                    logger.info("%s: scoring %s on %d %s records", label, name, len(records), split)
                    metrics = evaluate_model(
                        model,
                        processor,
                        name,
                        records,
                        generation=generation,
                        scoring=scoring,
                        templates=templates,
                        completions_path=out_dir / name / "completions.jsonl",
                    )
                    metrics["adapter"] = None if adapter is None else str(adapter)
                    metrics["split"] = split
                    atomic_write_json(out_dir / name / "metrics.json", metrics)
                    md = render_markdown(metrics, model_label=label, title=f"{label}: {name} ({split} split)")
                    atomic_write_text(out_dir / name / "metrics.md", md)
                    tables.append(md)
                    results[split][name] = metrics["overall"]
                atomic_write_text(out_dir / "metrics.md", "\n\n".join(tables) + "\n")
                if echo:
                    print("\n" + "\n\n".join(tables))
            del model
    state.wait_for_everyone()
    return results


def summary_entries(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{final_eval_key(split): results}`` for a run's ``summary.json`` (:func:`final_evaluation`'s
    result; module docstring)."""
    return {final_eval_key(split): by_benchmark for split, by_benchmark in results.items()}
