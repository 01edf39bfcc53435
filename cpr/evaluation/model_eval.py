"""Score a model on one benchmark: :func:`evaluate_model`, used by ``cpr eval``, the eval hook, the
final evaluation and checkpoint selection alike."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cpr.data.prompts import PromptTemplates
from cpr.data.records import Record
from cpr.errors import ConfigError
from cpr.evaluation.benchmarks import get_benchmark
from cpr.evaluation.generation import GenerationSettings, TransformersGenerator, generate_completions
from cpr.evaluation.sampled_metrics import (
    SAMPLED_COMPLETIONS,
    SAMPLED_SAMPLES,
    add_sampled_metrics,
    generate_samples,
)
from cpr.scoring import ScoringSettings

__all__ = ["ROW_KEYS", "evaluate_model", "subset"]

#: Keys of a metrics dict holding per-completion rows (written as JSON lines, not into metrics.json).
ROW_KEYS = ("samples", "sampled_samples")


def subset(records: Sequence[Record], max_samples: int | None, seed: int = 0) -> list[Record]:
    """At most ``max_samples`` records (``None``: all), a seeded random choice kept in the original
    order, so repeated evaluations during training see the same samples. Raises ``ConfigError`` when
    ``max_samples < 1``."""
    if max_samples is None or max_samples >= len(records):
        return list(records)
    if max_samples < 1:
        raise ConfigError(f"must be a positive integer or None, got {max_samples}", field="max_samples")
    keep = set(random.Random(seed).sample(range(len(records)), max_samples))
    return [r for k, r in enumerate(records) if k in keep]


def evaluate_model(model: Any, processor: Any, benchmark: str, records: Sequence[Record], *,
                   generation: GenerationSettings | None = None, scoring: ScoringSettings | None = None,
                   templates: PromptTemplates | None = None, out_dir: str | Path | None = None,
                   label: str = "this model", title: str | None = None,
                   extra: Mapping[str, Any] | None = None, generator: Any = None, shard: Any = None,
                   paper_rows: bool = False) -> dict[str, Any] | None:
    """Generate completions for ``records`` with ``model`` (plain, PEFT or a trainer's unwrapped model) or a
    ready ``generator`` (e.g. a :class:`~cpr.evaluation.generation.VLLMGenerator`), and score them on
    ``benchmark``. Defaults: greedy decoding of 256 new tokens, the paper's scoring, the packaged templates;
    ``sampled`` decoding adds mean@k and pass@k (:mod:`cpr.evaluation.sampled_metrics`).

    With ``out_dir`` it writes the files of ``cpr eval`` (docs/evaluation.md, "Evaluate and score";
    ``metrics.md`` by :func:`~cpr.evaluation.report.render_markdown` with ``label``, ``title`` and
    ``paper_rows``, for CRYSTAL's test set only), resuming ``completions.jsonl``. With ``shard`` every process
    of the group calls this alike and generates its share
    (:func:`~cpr.evaluation.generation.generate_completions`); the main process scores and writes.

    Returns:
        The benchmark's metrics dict (:mod:`cpr.evaluation.benchmarks.base`; step-scoring benchmarks
        include ``lucky_guess_rate``, :func:`cpr.scoring.lucky_guess_rate`), the sampled numbers
        (:func:`~cpr.evaluation.sampled_metrics.add_sampled_metrics`), ``extra``, ``"generation"`` (the
        decoding settings) and ``"seconds"``; ``None`` on the other processes of a ``shard``.

    Raises ``ConfigError`` for an unknown benchmark, or backend ``vllm`` without a generator; ``InputError``
    for invalid records or a malformed completions file."""
    from cpr.evaluation.report import render_markdown
    from cpr.io import atomic_write_json, atomic_write_jsonl, atomic_write_text

    start = time.perf_counter()
    generation, scoring = generation or GenerationSettings(), scoring or ScoringSettings()
    bench = get_benchmark(benchmark)
    if generator is None:
        if generation.backend == "vllm":
            raise ConfigError("the vllm backend generates from a model path; pass a VLLMGenerator as generator",
                              field="backend")
        generator = TransformersGenerator(model, processor, generation.max_new_tokens)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None and (shard is None or shard.is_main_process):
        atomic_write_jsonl(out / "references.jsonl", bench.references(records))
    messages, decoding, samples = bench.messages(templates, generation.prompt_mode), generation.decoding, None
    completions = generate_completions(
        generator, records, messages, batch_size=generation.batch_size, shard=shard,
        output_path=None if out is None else out / "completions.jsonl", progress=generation.progress,
        description=f"{bench.name}: generating")
    if decoding.sampled:  # every process of a shard samples its share too
        samples = generate_samples(
            generator, records, messages, decoding, batch_size=generation.batch_size, shard=shard,
            output_path=None if out is None else out / SAMPLED_COMPLETIONS, progress=generation.progress,
            description=f"{bench.name}: sampling {decoding.samples} per item")
    if shard is not None and not shard.is_main_process:
        return None
    metrics = bench.score(records, completions, scoring)
    if samples is not None:
        scored = [bench.score(records, {rid: s[j] for rid, s in samples.items()}, scoring)
                  for j in range(decoding.samples)]
        add_sampled_metrics(metrics, scored, decoding)
    metrics.update(extra or {})
    metrics["generation"] = {k: v for k, v in asdict(generation).items() if k != "progress"}
    metrics["seconds"] = round(time.perf_counter() - start, 3)
    if out is not None:
        atomic_write_json(out / "metrics.json", {k: v for k, v in metrics.items() if k not in ROW_KEYS})
        for key, name in (("samples", "samples.jsonl"), ("sampled_samples", SAMPLED_SAMPLES)):
            if key in metrics:
                atomic_write_jsonl(out / name, metrics[key])
        atomic_write_text(out / "metrics.md", render_markdown(metrics, model_label=label, title=title,
                                                                  paper_rows=paper_rows))
    return metrics
