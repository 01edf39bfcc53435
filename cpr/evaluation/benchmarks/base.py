"""What every benchmark shares: the registry entry and grouped summaries.

A benchmark's scorer returns a *metrics dict* (what ``metrics.json`` holds and the eval hook logs)::

    {"benchmark": "crystal",
     "overall": {"n": 12, "accuracy": 41.67, "match_f1": 0.47, ...},   # the report columns plus n
     "groups": {"source": {"MathVision": {...}}, "difficulty": {"easy": {...}}},
     "group_labels": {"topic": {"geometry": "mathematics"}},          # optional
     "formats": {"json": 10, "none": 2},    # which parser read each completion
     "scoring": {...},                      # encoder, threshold, answer mode, ...
     "samples": [{"id": ..., ...}, ...]}    # one row per record, in record order
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpr.data.prompts import PromptTemplates
from cpr.data.records import DIFFICULTIES, Record
from cpr.scoring import ScoringSettings

Column = tuple[str, str, int]
"""A report column: ``(title, summary key, decimals)``."""

DIFFICULTY_ORDER: tuple[str, ...] = (*DIFFICULTIES, "unknown")


@dataclass(frozen=True)
class Benchmark:
    """A registry entry: how to prompt, score and report one benchmark.

    Attributes:
        default_source: the ``load_records`` adapter ``cpr eval`` uses by default.
        description: one line for help texts and reports.
        columns: the report columns of every summary (``n`` comes first).
        group_kinds: the keys of ``metrics["groups"]``.
        messages: ``(templates or None, prompt_mode) -> (record -> conversational prompt)``, the
            image blocks holding the images.
        references: records -> rows of ``references.jsonl``.
        score: ``(records, completions, settings) -> metrics dict``.
        references_format: ``"cpr-score"`` when ``cpr score`` reads ``references.jsonl`` as its REFS file.
    """

    name: str
    default_source: str
    description: str
    columns: tuple[Column, ...]
    group_kinds: tuple[str, ...]
    messages: Callable[[PromptTemplates | None, str], Callable[[Record], list[dict[str, Any]]]]
    references: Callable[[Sequence[Record]], list[dict[str, Any]]]
    score: Callable[[Sequence[Record], Mapping[str, str], ScoringSettings], dict[str, Any]]
    references_format: str = "cpr-score"

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """Keys of an overall summary: ``n``, then the columns' keys."""
        return ("n", *(key for _, key, _ in self.columns))


def grouped(records: Sequence[Record], samples: Sequence[Mapping[str, Any]], key: Callable[[Record], str],
            summarize: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]], *,
            first: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Summaries of the samples grouped by ``key(record)`` (records and samples aligned), the groups
    named in ``first`` first (in that order), the rest sorted.

    Raises:
        ValueError: ``records`` and ``samples`` differ in length or ids.
    """
    if len(records) != len(samples):
        raise ValueError(f"{len(records)} records but {len(samples)} scored samples")
    buckets: dict[str, list[Mapping[str, Any]]] = {}
    for record, sample in zip(records, samples, strict=True):
        if str(sample["id"]) != record.id:
            raise ValueError(f"sample id {sample['id']!r} does not match record id {record.id!r}")
        buckets.setdefault(key(record), []).append(sample)
    head = [k for k in first if k in buckets]
    return {k: summarize(buckets[k]) for k in head + sorted(set(buckets) - set(head))}


def difficulty_of(record: Record) -> str:
    """The record's difficulty bucket, ``"unknown"`` when none was assigned."""
    return record.difficulty or "unknown"


def format_counts(samples: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many samples each completion parser (``format``) read, most frequent first."""
    return dict(Counter(str(s["format"]) for s in samples).most_common())
