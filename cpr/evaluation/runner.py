"""Generate and score one benchmark: :func:`evaluate_model`, shared by ``cpr eval`` and the training hook."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cpr.data.prompts import PromptTemplates
from cpr.data.records import Record
from cpr.errors import ConfigError
from cpr.evaluation.benchmarks import ScoringSettings, get_benchmark
from cpr.evaluation.generation import (
    GenerationSettings,
    Generator,
    TransformersGenerator,
    generate_completions,
)

__all__ = ["evaluate_model", "subset"]


def subset(records: Sequence[Record], max_samples: int | None, seed: int = 0) -> list[Record]:
    """At most ``max_samples`` records: a seeded random choice kept in the original order.

    The same ``(records, max_samples, seed)`` always gives the same subset, so repeated
    evaluations during training compare the policy on the same samples. ``None`` keeps all.

    Raises:
        ConfigError: ``max_samples < 1``.
    """
    if max_samples is None or max_samples >= len(records):
        return list(records)
    if max_samples < 1:
        raise ConfigError(f"must be a positive integer or None, got {max_samples}", field="max_samples")
    keep = set(random.Random(seed).sample(range(len(records)), max_samples))
    return [r for k, r in enumerate(records) if k in keep]


def evaluate_model(
    model: Any,
    processor: Any,
    benchmark: str,
    records: Sequence[Record],
    *,
    generation: GenerationSettings | None = None,
    scoring: ScoringSettings | None = None,
    templates: PromptTemplates | None = None,
    completions_path: str | Path | None = None,
    generator: Generator | None = None,
) -> dict[str, Any]:
    """Generate completions for ``records`` with the model and score them on ``benchmark``.

    Args:
        model: the model (plain, PEFT, or a trainer's unwrapped model); unused when
            ``generator`` is given.
        processor: its processor (left padding).
        benchmark: registry name (``"crystal"``, ``"m3cot"``, ``"vlrmbench"``).
        records: the records to evaluate (unique ids).
        generation: decoding settings (default :class:`GenerationSettings()`: greedy, 256 new
            tokens, evaluation prompt). The ``vllm`` backend needs ``generator``.
        scoring: scoring settings (default :class:`ScoringSettings()`: paper encoder, tau 0.35,
            answer mode ``crystal``).
        templates: prompt templates of the CRYSTAL format (default: the packaged ones).
        completions_path: JSON-lines file to resume from and append completions to.
        generator: a ready generator (e.g. :class:`cpr.evaluation.generation.VLLMGenerator`);
            default a :class:`TransformersGenerator` on ``model``.

    Returns:
        The benchmark's metrics dict (:mod:`cpr.evaluation.benchmarks.base`) plus
        ``"generation"`` (the decoding settings).

    Raises:
        ConfigError: unknown benchmark, or backend ``vllm`` without a generator.
        InputError: invalid records or a malformed completions file.
    """
    generation = generation or GenerationSettings()
    scoring = scoring or ScoringSettings()
    bench = get_benchmark(benchmark)
    if generator is None:
        if generation.backend == "vllm":
            raise ConfigError(
                "the vllm backend generates from a model path; build a VLLMGenerator and pass it as generator",
                field="backend",
            )
        generator = TransformersGenerator(model, processor, generation.max_new_tokens)
    completions = generate_completions(
        generator,
        records,
        bench.messages(templates, generation.prompt_mode),
        batch_size=generation.batch_size,
        output_path=completions_path,
        progress=generation.progress,
        description=f"{bench.name}: generating",
    )
    metrics = bench.score(records, completions, scoring)
    metrics["generation"] = {k: v for k, v in asdict(generation).items() if k != "progress"}
    return metrics
