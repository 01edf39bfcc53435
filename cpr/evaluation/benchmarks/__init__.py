"""Benchmarks the evaluator scores, registered by name: ``crystal`` (CRYSTAL format, any adapter),
``m3cot`` (accuracy by domain and topic plus step metrics) and ``vlrmbench`` (step-error F1);
:func:`register_benchmark` adds another."""

from __future__ import annotations

from cpr.errors import ConfigError
from cpr.evaluation.benchmarks.base import Benchmark, Column
from cpr.evaluation.benchmarks.crystal import CRYSTAL
from cpr.evaluation.benchmarks.m3cot import M3COT
from cpr.evaluation.benchmarks.vlrmbench import VLRMBENCH
from cpr.scoring import ScoringSettings

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (CRYSTAL, M3COT, VLRMBENCH)}

__all__ = ["BENCHMARKS", "Benchmark", "Column", "ScoringSettings", "get_benchmark", "register_benchmark"]


def register_benchmark(benchmark: Benchmark, *, replace: bool = False) -> Benchmark:
    """Register ``benchmark`` under its name; ``ValueError`` if the name is taken (unless ``replace``)."""
    if not replace and BENCHMARKS.get(benchmark.name, benchmark) is not benchmark:
        raise ValueError(f"a benchmark named {benchmark.name!r} is already registered")
    BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark ``name``; ``ConfigError`` (field ``benchmark``) naming the known ones."""
    if name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {name!r} (known: {', '.join(sorted(BENCHMARKS))})", field="benchmark")
    return BENCHMARKS[name]
