"""Score a model (with or without a LoRA adapter) on a split of an experiment's data.

The ablation needs evaluations the training runner does not make: the base model with no
training, the SFT baseline's adapter, and a finished run's final adapter on the *validation*
split (the weights table, as the paper's Table 6, is read on validation; the runner's final
evaluation is on the test split). :func:`evaluate_adapter` makes them with the same pieces and the
same files as the runner's final evaluation (:func:`cpr.evaluation.evaluate_model`,
:func:`cpr.evaluation.render_markdown`; ``<out_dir>/<benchmark>/{completions.jsonl, metrics.json,
metrics.md}`` and ``<out_dir>/metrics.md``), so every row of a table is scored alike:

* ``split="test"``: the benchmarks of ``evaluation.benchmarks`` (each on its own ``data`` or on the
  run's test split, every record: no ``limit``), or ``crystal`` on the test split when none is listed;
* ``split="validation"``: ``crystal`` on the run's validation split.

Decoding and scoring follow the config's ``evaluation`` section (``max_new_tokens``,
``batch_size``, ``prompt_mode``, ``answer_mode``) and ``rewards`` section (encoder, tau, matching).

:func:`resolve_model_path` builds ``tiny:*`` models exactly as the runner does (tokenizer trained on
the default corpus plus the training records' questions and target JSON), so the base model and
the SFT baseline are the same network the GRPO runs start from.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError
from cpr.io import atomic_write_json, atomic_write_text

__all__ = ["SPLITS", "evaluate_adapter", "load_policy", "resolve_model_path", "split_benchmarks"]

logger = logging.getLogger("cpr.ablation")

SPLITS = ("validation", "test")


def resolve_model_path(cfg: Any, splits: Any) -> str:
    """The model folder or hub id of ``cfg.model``; a ``tiny:*`` model is built (cached) with its
    tokenizer trained on the training records' texts when ``model.tiny_vocab_from_data`` is set.

    Args:
        cfg: an :class:`cpr.training.config.ExperimentConfig`.
        splits: its :class:`cpr.training.splits.DataSplits`.
    """
    from cpr.models.tiny import default_corpus, ensure_tiny_model, parse_tiny_name

    kind = parse_tiny_name(cfg.model.name_or_path)
    if kind is None:
        return cfg.model.name_or_path
    texts = None
    if cfg.model.tiny_vocab_from_data and splits is not None:
        from cpr.data import render_target

        texts = default_corpus() + sorted({t for r in splits.train for t in (r.question, render_target(r))})
    return str(ensure_tiny_model(kind, texts=texts))


def load_policy(cfg: Any, model_path: str) -> tuple[Any, Any]:
    """Load the model and processor of ``cfg.model`` from ``model_path`` (dtype, pixel limits, ...)."""
    from cpr.models.loading import load_model_and_processor

    return load_model_and_processor(
        model_path,
        dtype=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        attn_implementation=cfg.model.attn_implementation,
        min_pixels=cfg.model.min_pixels,
        max_pixels=cfg.model.max_pixels,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def split_benchmarks(cfg: Any, splits: Any, split: str) -> list[tuple[str, list[Any]]]:
    """``(benchmark, records)`` pairs scored on ``split`` (module docstring).

    Raises:
        ConfigError: an unknown split, or a split with no records.
    """
    from cpr.training.splits import load_sources

    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", field="split")
    if split == "validation":
        specs = [("crystal", list(splits.validation))] if splits.validation else []
    else:
        specs = []
        for b in cfg.evaluation.benchmarks:
            recs = load_sources(b.data, cfg.data, key=f"evaluation.{b.name}") if b.data else splits.test
            if recs:
                specs.append((b.name, list(recs)))
        if not cfg.evaluation.benchmarks and splits.test:
            specs.append(("crystal", list(splits.test)))
    if not specs:
        raise ConfigError(
            f"no {split} records to score: give data.{split} or data.{split}_size", field=f"data.{split}_size"
        )
    return specs


def evaluate_adapter(
    cfg: Any,
    *,
    adapter: str | Path | None,
    split: str,
    out_dir: str | Path,
    label: str,
    splits: Any = None,
    model_path: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Score ``cfg``'s model, with ``adapter`` if given, on ``split``; write the files.

    Args:
        cfg: an :class:`cpr.training.config.ExperimentConfig` (model, data, rewards, evaluation).
        adapter: a LoRA adapter folder, or ``None`` for the model as loaded.
        split: ``validation`` or ``test``.
        out_dir: folder of ``<benchmark>/metrics.json`` etc. A ``completions.jsonl`` already there is
            resumed (as the runner's final evaluation does).
        label: the model's name in the markdown tables.
        splits: the data splits (default: loaded from ``cfg.data``).
        model_path: the resolved model (default: :func:`resolve_model_path`).

    Returns:
        ``{benchmark: overall summary}`` (accuracy in percent, the rest in [0, 1]). Only the main
        process evaluates; the others wait and return ``{}``.

    Raises:
        ConfigError: an unknown split, no records, or an adapter folder without ``adapter_config.json``.
    """
    from accelerate import PartialState

    from cpr.data import load_templates
    from cpr.evaluation import GenerationSettings, ScoringSettings, evaluate_model, render_markdown
    from cpr.matching import zero3_disabled
    from cpr.training.splits import load_splits

    if adapter is not None and not Path(adapter, "adapter_config.json").is_file():
        raise ConfigError(f"no LoRA adapter (adapter_config.json) in {adapter}", field="adapter")
    state = PartialState()
    out_dir = Path(out_dir)
    splits = splits if splits is not None else load_splits(cfg.data)
    specs = split_benchmarks(cfg, splits, split)
    results: dict[str, dict[str, Any]] = {}
    if state.is_main_process:
        templates = load_templates(cfg.data.prompts)
        model_path = model_path or resolve_model_path(cfg, splits)
        ev, r = cfg.evaluation, cfg.rewards
        generation = GenerationSettings(
            max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, prompt_mode=ev.prompt_mode, progress=True
        )
        scoring = ScoringSettings(
            encoder=r.encoder, threshold=r.threshold, alpha=r.alpha, matching=r.matching,
            answer_mode=ev.answer_mode, device=r.device, batch_size=r.batch_size,
        )
        with zero3_disabled():
            model, processor = load_policy(cfg, model_path)
            if adapter is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(adapter))
            tables = []
            for name, records in specs:
                logger.info("%s: scoring %s on %d %s records", label, name, len(records), split)
                metrics = evaluate_model(
                    model, processor, name, records, generation=generation, scoring=scoring,
                    templates=templates, completions_path=out_dir / name / "completions.jsonl",
                )
                metrics["adapter"] = None if adapter is None else str(adapter)
                metrics["split"] = split
                atomic_write_json(out_dir / name / "metrics.json", metrics)
                md = render_markdown(metrics, model_label=label, title=f"{label}: {name} ({split} split)")
                atomic_write_text(out_dir / name / "metrics.md", md)
                tables.append(md)
                results[name] = metrics["overall"]
            atomic_write_text(out_dir / "metrics.md", "\n\n".join(tables) + "\n")
            del model
    state.wait_for_everyone()
    return results
