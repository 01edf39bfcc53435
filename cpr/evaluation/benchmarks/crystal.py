"""CRYSTAL-format benchmark: the paper's Table 2 columns (docs/method.md section 3) overall, per source
and per difficulty, scored by :func:`cpr.scoring.score_records` (``cpr score``'s scorer).

Records may come from any adapter (per-source groups: :func:`source_of`). ``references.jsonl`` rows are
``cpr score``'s REFS records plus ``source`` and ``difficulty`` (which ``cpr score`` ignores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.data.prompts import PromptTemplates, build_messages, load_templates
from cpr.data.records import Record, open_image
from cpr.evaluation.benchmarks.base import DIFFICULTY_ORDER, Benchmark, difficulty_of, format_counts, grouped
from cpr.scoring import TABLE_COLUMNS, ScoringSettings, score_records, summarize

__all__ = ["CRYSTAL", "score_crystal", "score_step_records", "source_of", "standard_messages"]

CRYSTAL_SOURCES: tuple[str, ...] = ("MathVision", "ScienceQA", "RealWorldQA", "MMVP", "PlotQA")
"""CRYSTAL's sources, largest first (docs/method.md section 8); reports list them in this order."""


def source_of(record: Record) -> str:
    """The record's source for per-source tables: ``meta["source"]``, else the adapter name."""
    value = record.meta.get("source")
    return value if isinstance(value, str) and value.strip() else record.source


def reference_row(record: Record) -> dict[str, Any]:
    """The ``cpr score`` REFS record of ``record`` (plus ``source`` and ``difficulty``)."""
    return {"id": record.id, "question": record.question, "answer": record.answer,
            "reference_steps": list(record.reference_steps), "options": list(record.options),
            "source": source_of(record), "difficulty": record.difficulty}


def standard_messages(templates: PromptTemplates | None, prompt_mode: str) -> Any:
    """Prompt builder of the CRYSTAL output format: :func:`cpr.data.prompts.build_messages` with the
    record's images put in by ``trl.data_utils.prepare_multimodal_messages``, as GRPO training does."""
    from trl.data_utils import prepare_multimodal_messages

    templates = templates if templates is not None else load_templates()
    return lambda record: prepare_multimodal_messages(build_messages(record, templates, mode=prompt_mode),
                                                      [open_image(ref) for ref in record.images])


def score_step_records(records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings,
                       extra: Any, name: str, groups: dict[str, tuple[Any, Sequence[str]]]) -> dict[str, Any]:
    """Metrics dict of a benchmark scored like ``cpr score``: :func:`cpr.scoring.score_records` on the
    records' REFS rows, summaries per group kind (``kind -> (key function, groups listed first)``),
    sample rows extended with ``extra(record)``.

    Raises:
        InputError: an invalid reference record (e.g. a blank answer; the id is named).
    """
    report = score_records([reference_row(r) for r in records],
                           {r.id: completions[r.id] for r in records if r.id in completions}, settings)
    samples = report["samples"]
    return {"benchmark": name, "overall": report["summary"],
            "groups": {kind: grouped(records, samples, key, summarize, first=first)
                       for kind, (key, first) in groups.items()},
            "formats": format_counts(samples), "scoring": report["config"],
            "samples": [{**s, **extra(r)} for r, s in zip(records, samples, strict=True)]}


def score_crystal(records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings) -> dict[str, Any]:
    """Metrics dict of the CRYSTAL-format benchmark (:mod:`cpr.evaluation.benchmarks.base`): overall, per
    source, per difficulty; sample rows gain ``source`` and ``difficulty``."""
    return score_step_records(
        records, completions, settings, lambda r: {"source": source_of(r), "difficulty": r.difficulty}, "crystal",
        {"source": (source_of, CRYSTAL_SOURCES), "difficulty": (difficulty_of, DIFFICULTY_ORDER)},
    )


CRYSTAL = Benchmark(
    name="crystal", default_source="crystal",
    description="CRYSTAL format: Acc, Match F1, P, R, Steps, LIS, Ord. F1 overall, per source and difficulty",
    columns=TABLE_COLUMNS, group_kinds=("source", "difficulty"), messages=standard_messages,
    references=lambda records: [reference_row(r) for r in records], score=score_crystal)
