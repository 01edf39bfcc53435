"""Benchmarks the evaluator scores, registered by name.

Each entry (:class:`Benchmark`) bundles the prompt builder, the scorer and the report columns:

``crystal``
    CRYSTAL-format records from any adapter: Acc, Match F1, P, R, Steps, LIS, Ord. F1 overall,
    per source and per difficulty (:mod:`cpr.evaluation.benchmarks.crystal`).
``m3cot``
    M3CoT: accuracy total / by domain / by topic, plus the step metrics against the rationale
    (:mod:`cpr.evaluation.benchmarks.m3cot`).
``vlrmbench``
    VLRMBench step-error tasks: F1 of the predicted erroneous steps, overall and per task
    (:mod:`cpr.evaluation.benchmarks.vlrmbench`).

:func:`register_benchmark` adds another.
"""

from __future__ import annotations

from cpr.errors import ConfigError
from cpr.evaluation.benchmarks.base import Benchmark, Column, ScoringSettings
from cpr.evaluation.benchmarks.crystal import CRYSTAL
from cpr.evaluation.benchmarks.m3cot import M3COT
from cpr.evaluation.benchmarks.vlrmbench import VLRMBENCH

BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(benchmark: Benchmark, *, replace: bool = False) -> Benchmark:
    """Register ``benchmark`` under its name; ``ValueError`` if the name is taken (unless ``replace``)."""
    if not replace and benchmark.name in BENCHMARKS and BENCHMARKS[benchmark.name] is not benchmark:
        raise ValueError(f"a benchmark named {benchmark.name!r} is already registered")
    BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark ``name``; ``ConfigError`` (field ``benchmark``) naming the known ones."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ConfigError(
            f"unknown benchmark {name!r} (known: {', '.join(sorted(BENCHMARKS))})", field="benchmark"
        ) from None


for _bench in (CRYSTAL, M3COT, VLRMBENCH):
    register_benchmark(_bench)

__all__ = ["BENCHMARKS", "Benchmark", "Column", "ScoringSettings", "get_benchmark", "register_benchmark"]
