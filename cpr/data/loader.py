"""``load_records``: read a source with its adapter, validate, bucket, and report what was skipped.
Rows are converted and validated one at a time and written straight to a memory-mapped record
dataset (:func:`cpr.data.records.write_records`), so loading holds no image bytes."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpr.data.adapters import Adapter, RawRow, SkipRow, get_adapter
from cpr.data.buckets import BucketConfig, assign_bucket
from cpr.data.records import Record, Records, write_records
from cpr.data.validation import BAD_VALUE, DUPLICATE_ID, RecordError, validate_record
from cpr.errors import InputError

logger = logging.getLogger("cpr.data")


@dataclass
class LoadReport:
    """What a load did: ``rows`` read (after split filtering), records ``loaded``, invalid records
    ``skipped`` (``on_invalid="skip"``) and valid rows the adapter ``filtered`` out by policy, both
    counted by reason, and the ``first_errors`` message of each skip reason."""

    source: str
    path: str
    rows: int = 0
    loaded: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    filtered: Counter[str] = field(default_factory=Counter)
    first_errors: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: counts, and skipped / filtered rows by reason."""
        text = f"{self.source}: {self.loaded} records from {self.path} ({self.rows} rows read)"
        for label, counts in (("skipped {} invalid", self.skipped), ("left out {}", self.filtered)):
            if counts:
                reasons = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
                text += f"; {label.format(sum(counts.values()))}: {reasons}"
        return text


def load_records(source: str, path: str | Path, **kwargs: Any) -> Records:
    """:func:`load_records_with_report` without the report (same arguments and errors)."""
    return load_records_with_report(source, path, **kwargs)[0]


def load_records_with_report(source: str, path: str | Path, *, split: str | None = None,
                             on_invalid: str = "error", buckets: BucketConfig | None = None,
                             limit: int | None = None, validate_images: bool = True,
                             options: Mapping[str, Any] | None = None) -> tuple[Records, LoadReport]:
    """Load a dataset in its published layout as validated, bucketed records, with a :class:`LoadReport`.

    ``source`` names a registered adapter, ``options`` its options; ``path`` is a file, folder, saved dataset
    or hub name. ``on_invalid="skip"`` drops and logs invalid records, ``"error"`` raises the first.
    ``buckets`` buckets records without a difficulty; ``limit`` caps the valid records; ``validate_images``
    opens and verifies every image.

    Returns:
        The records in file order (:class:`Records`, memory-mapped) and the report.

    Raises:
        RecordError / InputError: invalid input (file, line or id, and field in the message).
        ValueError: ``on_invalid`` is neither ``"error"`` nor ``"skip"``, or ``limit`` < 0.
        ConfigError: unknown source or adapter option.
    """
    if on_invalid not in ("error", "skip"):
        raise ValueError(f"on_invalid must be one of ('error', 'skip'), got {on_invalid!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    adapter = get_adapter(source, **dict(options or {}))
    report = LoadReport(source=source, path=str(path))
    rows = adapter.rows(path, split)
    records = write_records(_valid(adapter, rows, on_invalid, buckets or BucketConfig(), limit, validate_images, report))
    report.loaded = len(records)
    if report.skipped:
        logger.warning("%s", report.summary())
        for reason, message in report.first_errors.items():
            logger.warning("first %s: %s", reason, message)
    elif report.filtered:
        logger.info("%s", report.summary())
    return records, report


def _valid(adapter: Adapter, rows: Iterator[RawRow], on_invalid: str, buckets: BucketConfig, limit: int | None,
           validate_images: bool, report: LoadReport) -> Iterator[Record]:
    """The valid records of ``rows``, counting the others in ``report``."""
    seen: dict[str, str] = {}
    for row in rows:
        if limit is not None and len(seen) >= limit:
            break
        report.rows += 1
        try:
            record = _record(adapter, row, buckets, validate_images, seen)
        except SkipRow as e:
            report.filtered[e.reason] += 1
        except RecordError as e:
            if on_invalid == "error":
                raise
            report.skipped[e.reason] += 1
            report.first_errors.setdefault(e.reason, str(e))
        else:
            seen[record.id] = f"line {row.line}" if row.line is not None else f"row {row.index}"
            yield record


def _record(adapter: Adapter, row: RawRow, buckets: BucketConfig, validate_images: bool, seen: dict[str, str]) -> Record:
    """One row converted, validated and bucketed; ``RecordError`` / ``SkipRow`` otherwise."""
    if row.problem is not None:
        raise row.problem
    record = adapter.convert(row)
    validate_record(record, path=row.path, line=row.line, allow_empty_answer=adapter.allows_empty_answer,
                    validate_images=validate_images)
    where = {"path": row.path, "line": row.line, "record_id": record.id}
    if record.id in seen:
        raise RecordError(f"duplicate id (first seen at {seen[record.id]})", reason=DUPLICATE_ID, field="id", **where)
    if record.difficulty is None:
        try:
            record.difficulty = assign_bucket(record, buckets)
        except InputError as e:
            raise RecordError(e.message, reason=BAD_VALUE, field=e.field, **where) from None
    return record
