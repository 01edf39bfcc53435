"""Difficulty buckets (easy / medium / hard) for the CPR-Curriculum (docs/method.md section 6, a **choice**):
a table on a source's own difficulty field, else the number of reference steps (the tables, thresholds
and their fit to CRYSTAL: docs/data.md section 5). YAML form, every key optional (a ``fields`` entry
replaces that source's default table)::

    fields:
      mathvision: {field: level, easy: [1, 2], medium: [3], hard: [4, 5]}
    steps: {easy_max: 10, medium_max: 18}
    steps_by_source:
      m3cot: {easy_max: 3, medium_max: 6}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.data.records import DIFFICULTIES, Record
from cpr.errors import ConfigError, InputError


@dataclass(frozen=True)
class FieldBuckets:
    """Maps values of the ``Record.meta`` key ``field`` (compared as strings) to bucket names."""

    field: str
    mapping: dict[str, str]


@dataclass(frozen=True)
class StepThresholds:
    """Buckets by number of reference steps: ``n <= easy_max`` easy, ``n <= medium_max`` medium, else hard."""

    easy_max: int = 10
    medium_max: int = 18

    def __post_init__(self) -> None:
        if not (isinstance(self.easy_max, int) and isinstance(self.medium_max, int)):
            raise ConfigError("step thresholds must be integers", field="buckets.steps")
        if not 0 < self.easy_max <= self.medium_max:
            message = f"need 0 < easy_max <= medium_max, got {self.easy_max} and {self.medium_max}"
            raise ConfigError(message, field="buckets.steps")

    def bucket_of(self, n_steps: int) -> str:
        """Bucket of a record with ``n_steps`` reference steps."""
        return "easy" if n_steps <= self.easy_max else "medium" if n_steps <= self.medium_max else "hard"


_GRADES = [f"grade{g}" for g in range(1, 13)]
_DEFAULT_FIELDS = {
    "mathvision": {"field": "level", "easy": [1, 2], "medium": [3], "hard": [4, 5]},
    "tabmwp": {"field": "grade", "easy": [1, 2, 3, 4], "medium": [5, 6], "hard": [7, 8]},
    "scienceqa": {"field": "grade", "easy": _GRADES[:4], "medium": _GRADES[4:8], "hard": _GRADES[8:]},
}


def default_field_tables() -> dict[str, FieldBuckets]:
    """The default per-source tables (docs/data.md section 5)."""
    return {source: _parse_table(spec, f"buckets.fields.{source}") for source, spec in _DEFAULT_FIELDS.items()}


#: Step thresholds of sources whose items are much shorter than CRYSTAL's (docs/data.md section 5).
DEFAULT_STEPS_BY_SOURCE: dict[str, StepThresholds] = {"synthetic": StepThresholds(easy_max=1, medium_max=3)}


@dataclass(frozen=True)
class BucketConfig:
    """How records are bucketed: ``fields`` (source -> table on its difficulty field), ``steps``
    (step-count thresholds for sources without a table) and ``steps_by_source`` (their overrides)."""

    fields: dict[str, FieldBuckets] = field(default_factory=default_field_tables)
    steps: StepThresholds = field(default_factory=StepThresholds)
    steps_by_source: dict[str, StepThresholds] = field(default_factory=lambda: dict(DEFAULT_STEPS_BY_SOURCE))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BucketConfig:
        """Build from the YAML-style mapping (module docstring).

        Raises ``ConfigError`` (``field`` the dotted key) for unknown keys, a bucket list that is not
        a list, a value in two buckets, or bad thresholds.
        """
        data = dict(data or {})
        if unknown := set(data) - {"fields", "steps", "steps_by_source"}:
            raise ConfigError(f"unknown keys {sorted(unknown)}", field="buckets")
        tables = default_field_tables()
        for source, spec in (data.get("fields") or {}).items():
            tables[source] = _parse_table(spec, f"buckets.fields.{source}")
        by_source = dict(DEFAULT_STEPS_BY_SOURCE) | {s: _parse_steps(v, f"buckets.steps_by_source.{s}") for s, v in (data.get("steps_by_source") or {}).items()}
        return cls(tables, _parse_steps(data.get("steps"), "buckets.steps"), by_source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> BucketConfig:
        """Read a YAML file holding the mapping (optionally under a top-level ``buckets`` key)."""
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", field="buckets", path=path)
        return cls.from_dict(data["buckets"] if isinstance(data.get("buckets"), Mapping) else data)


def _parse_table(spec: Any, key: str) -> FieldBuckets:
    if not isinstance(spec, Mapping):
        raise ConfigError("expected a mapping with 'field' and bucket lists", field=key)
    if unknown := set(spec) - {"field", *DIFFICULTIES}:
        raise ConfigError(f"unknown keys {sorted(unknown)}", field=key)
    if not isinstance(spec.get("field"), str) or not spec["field"]:
        raise ConfigError("'field' (the meta key holding the difficulty) is required", field=f"{key}.field")
    mapping: dict[str, str] = {}
    for bucket in DIFFICULTIES:
        values = spec.get(bucket, [])
        if not isinstance(values, list):
            raise ConfigError("expected a list of field values", field=f"{key}.{bucket}")
        for v in values:
            if str(v) in mapping:
                raise ConfigError(f"value {v!r} is listed in two buckets", field=f"{key}.{bucket}")
            mapping[str(v)] = bucket
    return FieldBuckets(spec["field"], mapping)


def _parse_steps(spec: Any, key: str) -> StepThresholds:
    if spec is None:
        return StepThresholds()
    if not isinstance(spec, Mapping) or set(spec) - {"easy_max", "medium_max"}:
        raise ConfigError("expected a mapping with easy_max and medium_max", field=key)
    try:
        return StepThresholds(**dict(spec))
    except ConfigError as e:
        raise ConfigError(e.message, field=key) from None


def assign_bucket(record: Record, config: BucketConfig) -> str:
    """Difficulty bucket of ``record`` under ``config`` (``record.difficulty`` is ignored): the
    source's table when it has one, else the source's step thresholds. Raises ``InputError`` (record id
    and field named) when the record lacks the table's field or its value is in no bucket."""
    table = config.fields.get(record.source)
    if table is None:
        return config.steps_by_source.get(record.source, config.steps).bucket_of(len(record.reference_steps))
    value = record.meta.get(table.field)
    if value is None:
        message = f"no difficulty value; the bucket table for source '{record.source}' reads this field"
    elif str(value) not in table.mapping:
        listed = ", ".join(sorted(table.mapping))
        message = f"value {value!r} is in no bucket of the '{record.source}' table (listed: {listed})"
    else:
        return table.mapping[str(value)]
    raise InputError(message, record_id=record.id, field=table.field)
