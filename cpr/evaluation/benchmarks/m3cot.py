"""M3CoT (arXiv 2405.16473): multiple-choice accuracy by domain and topic, plus step metrics.

Records come from the ``m3cot`` adapter: the answer is an option letter, the reference steps are
the sentences of ``rationale``, and ``meta`` holds ``domain`` (science, commonsense, mathematics)
and ``topic`` (e.g. ``natural-science``, ``geometry``).

As in the M3CoT paper's tables, accuracy is reported for the whole set ("total"), per domain
and per topic (each topic listed under its domain). Every summary also carries the step metrics
of the CRYSTAL paper's Table 2 (Match F1, P, R, Steps, LIS, Ordered F1) against the rationale
steps, computed by :func:`cpr.scoring.score_records` like the CRYSTAL benchmark. Correctness uses
the configured answer mode (``crystal`` by default: the predicted letter or option text against
the gold letter). A record without a domain or topic is grouped under ``"unknown"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.data.records import Record
from cpr.evaluation.benchmarks.base import Benchmark, ScoringSettings, format_counts, grouped
from cpr.evaluation.benchmarks.crystal import reference_row, score_step_records, standard_messages_factory
from cpr.scoring import TABLE_COLUMNS, summarize

__all__ = ["M3COT", "M3COT_DOMAINS", "domain_of", "score_m3cot", "topic_of"]

M3COT_DOMAINS: tuple[str, ...] = ("science", "commonsense", "mathematics")
"""M3CoT's domains in the order of the paper's tables."""


def _meta_str(record: Record, key: str) -> str:
    value = record.meta.get(key)
    return value.strip() if isinstance(value, str) and value.strip() else "unknown"


def domain_of(record: Record) -> str:
    """``meta["domain"]`` (``"unknown"`` when absent)."""
    return _meta_str(record, "domain")


def topic_of(record: Record) -> str:
    """``meta["topic"]`` (``"unknown"`` when absent)."""
    return _meta_str(record, "topic")


def _reference(record: Record) -> dict[str, Any]:
    return {**reference_row(record), "domain": domain_of(record), "topic": topic_of(record)}


def score_m3cot(
    records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings
) -> dict[str, Any]:
    """Metrics dict of M3CoT: overall ("total"), per domain, per topic.

    Returns:
        See :mod:`cpr.evaluation.benchmarks.base`; ``groups`` has ``domain`` and ``topic``
        (topics sorted by domain, then name) and ``group_labels["topic"]`` maps each topic to its
        domain. Sample rows gain ``domain`` and ``topic``.

    Raises:
        InputError: an invalid reference record (see :func:`cpr.scoring.validate_reference`).
    """
    report = score_step_records(records, completions, settings)
    samples = report["samples"]
    topic_domain: dict[str, str] = {}
    for r in records:
        topic_domain.setdefault(topic_of(r), domain_of(r))
    domain_rank = {d: k for k, d in enumerate(M3COT_DOMAINS)}
    topic_order = sorted(topic_domain, key=lambda t: (domain_rank.get(topic_domain[t], len(domain_rank)),
                                                      topic_domain[t], t))
    groups = {
        "domain": grouped(records, samples, domain_of, summarize, first=M3COT_DOMAINS),
        "topic": grouped(records, samples, topic_of, summarize, first=topic_order),
    }
    rows = [
        {**s, "domain": domain_of(r), "topic": topic_of(r)} for r, s in zip(records, samples, strict=True)
    ]
    return {
        "benchmark": "m3cot",
        "overall": report["summary"],
        "groups": groups,
        "group_labels": {"topic": {t: topic_domain[t] for t in topic_order}},
        "formats": format_counts(samples),
        "scoring": report["config"],
        "samples": rows,
    }


M3COT = Benchmark(
    name="m3cot",
    default_source="m3cot",
    description="M3CoT: accuracy total / by domain / by topic, plus step metrics against the rationale",
    columns=tuple(TABLE_COLUMNS),
    group_kinds=("domain", "topic"),
    messages=standard_messages_factory,
    references=lambda records: [_reference(r) for r in records],
    score=score_m3cot,
)
