"""CRYSTAL-format benchmark: the paper's Table 2 columns overall, per source and per difficulty.

Records may come from any adapter (``crystal``, ``mathvision``, ``tabmwp``, ``scienceqa``,
``jsonl``, ...). Columns (docs/method.md section 3, paper Table 2, in this order): Accuracy (%), Match F1,
Precision, Recall, Steps (mean predicted steps), LIS, Ordered F1. Scoring is
:func:`cpr.scoring.score_records` (one encoder call for all samples; a missing completion counts
as Match F1 0 and a wrong answer), answer mode ``crystal`` by default (paper protocol).

Groups:

``source``
    the CRYSTAL item's own ``source`` field (``MathVision``, ``ScienceQA``, ``RealWorldQA``,
    ``MMVP``, ``PlotQA``; the ``crystal`` adapter keeps it in ``meta["source"]``), else the adapter
    name (``Record.source``).
``difficulty``
    the record's difficulty bucket (``easy`` / ``medium`` / ``hard``, :mod:`cpr.data.buckets`).

``references.jsonl`` rows are ``cpr score``'s REFS records (``id``, ``question``, ``answer``,
``reference_steps``, ``options``) plus ``source`` and ``difficulty``, which ``cpr score`` ignores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.data.prompts import PromptTemplates, load_templates
from cpr.data.records import Record
from cpr.evaluation.benchmarks.base import (
    DIFFICULTY_ORDER,
    Benchmark,
    ScoringSettings,
    difficulty_of,
    format_counts,
    grouped,
)
from cpr.evaluation.generation import MessagesFn, standard_messages
from cpr.scoring import TABLE_COLUMNS, score_records, summarize

__all__ = [
    "CRYSTAL",
    "CRYSTAL_SOURCES",
    "reference_row",
    "score_crystal",
    "score_step_records",
    "source_of",
    "standard_messages_factory",
]

CRYSTAL_SOURCES: tuple[str, ...] = ("MathVision", "ScienceQA", "RealWorldQA", "MMVP", "PlotQA")
"""CRYSTAL's sources, largest first (docs/method.md section 8); reports list them in this order."""


def source_of(record: Record) -> str:
    """The record's source for per-source tables (see the module docstring)."""
    value = record.meta.get("source")
    return value if isinstance(value, str) and value.strip() else record.source


def reference_row(record: Record) -> dict[str, Any]:
    """The ``cpr score`` REFS record of ``record`` (plus ``source`` and ``difficulty``)."""
    return {
        "id": record.id,
        "question": record.question,
        "answer": record.answer,
        "reference_steps": list(record.reference_steps),
        "options": list(record.options),
        "source": source_of(record),
        "difficulty": record.difficulty,
    }


def score_step_records(
    records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings
) -> dict[str, Any]:
    """:func:`cpr.scoring.score_records` on the records' REFS rows (completions of other ids ignored).

    Returns:
        ``cpr score``'s report ``{"config", "summary", "samples"}``, samples in record order.

    Raises:
        InputError: an invalid reference record (e.g. a blank answer; the id is named).
    """
    refs = [reference_row(r) for r in records]
    mine = {r.id: completions[r.id] for r in records if r.id in completions}
    return score_records(
        refs,
        mine,
        encoder=settings.get_encoder(),
        threshold=settings.threshold,
        alpha=settings.alpha,
        matching=settings.matching,
        answer_mode=settings.answer_mode,
    )


def score_crystal(
    records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings
) -> dict[str, Any]:
    """Metrics dict of the CRYSTAL-format benchmark (overall, per source, per difficulty).

    Args:
        records: the evaluated records.
        completions: id -> completion text (a record without one scores as missing).
        settings: encoder, threshold, answer mode, ...

    Returns:
        See :mod:`cpr.evaluation.benchmarks.base`; each summary has :func:`cpr.scoring.summarize`'s
        keys (accuracy in percent, the rest in [0, 1], steps a mean count). Sample rows gain
        ``source`` and ``difficulty``.
    """
    report = score_step_records(records, completions, settings)
    samples = report["samples"]
    groups = {
        "source": grouped(records, samples, source_of, summarize, first=CRYSTAL_SOURCES),
        "difficulty": grouped(records, samples, difficulty_of, summarize, first=DIFFICULTY_ORDER),
    }
    rows = [
        {**s, "source": source_of(r), "difficulty": r.difficulty} for r, s in zip(records, samples, strict=True)
    ]
    return {
        "benchmark": "crystal",
        "overall": report["summary"],
        "groups": groups,
        "formats": format_counts(samples),
        "scoring": report["config"],
        "samples": rows,
    }


def standard_messages_factory(templates: PromptTemplates | None, prompt_mode: str) -> MessagesFn:
    """Prompt builder of the CRYSTAL output format (:func:`cpr.data.prompts.build_messages`)."""
    return standard_messages(templates if templates is not None else load_templates(), prompt_mode)


CRYSTAL = Benchmark(
    name="crystal",
    default_source="crystal",
    description="CRYSTAL format: Acc, Match F1, P, R, Steps, LIS, Ord. F1 overall, per source and difficulty",
    columns=tuple(TABLE_COLUMNS),
    group_kinds=("source", "difficulty"),
    messages=standard_messages_factory,
    references=lambda records: [reference_row(r) for r in records],
    score=score_crystal,
)
