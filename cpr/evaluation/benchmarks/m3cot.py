"""M3CoT (arXiv 2405.16473): multiple-choice accuracy total, per domain and per topic (each topic
under its domain, as in the M3CoT paper's tables), plus the CRYSTAL step metrics against the
rationale's sentences, all scored like the CRYSTAL benchmark. Records come from the ``m3cot``
adapter (``meta["domain"]``, ``meta["topic"]``; ``"unknown"`` when absent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.data.records import Record
from cpr.evaluation.benchmarks.base import Benchmark
from cpr.evaluation.benchmarks.crystal import reference_row, score_step_records, standard_messages
from cpr.scoring import TABLE_COLUMNS, ScoringSettings

__all__ = ["M3COT", "score_m3cot"]

M3COT_DOMAINS: tuple[str, ...] = ("science", "commonsense", "mathematics")
"""M3CoT's domains in the order of the paper's tables."""


def _meta(record: Record) -> dict[str, str]:
    values = {k: record.meta.get(k) for k in ("domain", "topic")}
    return {k: v.strip() if isinstance(v, str) and v.strip() else "unknown" for k, v in values.items()}


def score_m3cot(records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings) -> dict[str, Any]:
    """Metrics dict of M3CoT: ``groups`` ``domain`` and ``topic`` (topics ordered by domain, then name),
    ``group_labels["topic"]`` maps each topic to its domain; sample rows gain ``domain`` and ``topic``.

    Raises:
        InputError: an invalid reference record (:func:`cpr.scoring.validate_reference`).
    """
    topic_domain: dict[str, str] = {}
    for r in records:
        topic_domain.setdefault(_meta(r)["topic"], _meta(r)["domain"])
    rank = {d: k for k, d in enumerate(M3COT_DOMAINS)}
    topics = sorted(topic_domain, key=lambda t: (rank.get(topic_domain[t], len(rank)), topic_domain[t], t))
    metrics = score_step_records(records, completions, settings, _meta, "m3cot", {
        "domain": (lambda r: _meta(r)["domain"], M3COT_DOMAINS), "topic": (lambda r: _meta(r)["topic"], topics)})
    metrics["group_labels"] = {"topic": {t: topic_domain[t] for t in topics}}
    return metrics


M3COT = Benchmark(
    name="m3cot", default_source="m3cot",
    description="M3CoT: accuracy total / by domain / by topic, plus step metrics against the rationale",
    columns=TABLE_COLUMNS, group_kinds=("domain", "topic"), messages=standard_messages,
    references=lambda records: [{**reference_row(r), **_meta(r)} for r in records], score=score_m3cot)
