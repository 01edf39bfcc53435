"""Difficulty buckets (easy / medium / hard) for the CPR-Curriculum (docs/method.md section 6, a **choice**).

A source with its own difficulty field is bucketed by a table on that field; any other source
by its number of reference steps. Defaults:

- MATH-Vision ``level``: 1-2 easy, 3 medium, 4-5 hard. The shared sample has 20 records per
  level, so 40 / 20 / 40.
- TabMWP ``grade``: 1-4 easy, 5-6 medium, 7-8 hard. The shared sample holds grades 3-8 only
  (19 each), so 38 / 38 / 38.
- ScienceQA ``grade``: grade1-4 easy, grade5-8 medium, grade9-12 hard (both shared sample
  records are grade5, so medium).
- Step counts (CRYSTAL, M3CoT, VLRMBench, generic): easy <= 10 steps, medium <= 18, else hard.
  CRYSTAL reports 3-42 steps, mean 11.6, and an Easy/Medium/Hard mix of 48.5/44.1/7.4 %, but
  not its per-item counts (the dataset is gated). A log-normal fitted to those three numbers
  (median 10.9, sigma 0.37: mean 11.6, and 3 / 42 as the extremes of 6,372 draws) puts 46 % of
  items at <= 10 steps and 7 % above 18, so 10/18 reproduces the reported mix; 8/16 would give
  about 25/63/12 %. The generated ``synthetic`` source (1, 3 or 4 steps an item) defaults to
  easy <= 1, medium <= 3. Override per source (``steps_by_source``) when a source's steps are much
  shorter or longer than CRYSTAL's (``cpr data inspect`` prints a source's step statistics).

YAML form (every key optional; a given ``fields`` entry replaces that source's default table)::

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
    """Maps the values of one ``Record.meta`` field to bucket names.

    Attributes:
        field: the meta key (``"level"``, ``"grade"``).
        mapping: value (as a string, so ``3`` and ``"3"`` match) -> bucket name.
    """

    field: str
    mapping: dict[str, str]

    def bucket_of(self, value: Any) -> str | None:
        """Bucket of ``value``, or ``None`` when the table does not list it."""
        return self.mapping.get(str(value))


@dataclass(frozen=True)
class StepThresholds:
    """Buckets by number of reference steps: ``n <= easy_max`` easy, ``n <= medium_max`` medium."""

    easy_max: int = 10
    medium_max: int = 18

    def __post_init__(self) -> None:
        if not (isinstance(self.easy_max, int) and isinstance(self.medium_max, int)):
            raise ConfigError("step thresholds must be integers", field="buckets.steps")
        if not 0 < self.easy_max <= self.medium_max:
            raise ConfigError(
                f"need 0 < easy_max <= medium_max, got {self.easy_max} and {self.medium_max}",
                field="buckets.steps",
            )

    def bucket_of(self, n_steps: int) -> str:
        """Bucket for a record with ``n_steps`` reference steps."""
        if n_steps <= self.easy_max:
            return "easy"
        if n_steps <= self.medium_max:
            return "medium"
        return "hard"


def _table(field_name: str, easy: list[Any], medium: list[Any], hard: list[Any]) -> FieldBuckets:
    mapping: dict[str, str] = {}
    for bucket, values in (("easy", easy), ("medium", medium), ("hard", hard)):
        for v in values:
            mapping[str(v)] = bucket
    return FieldBuckets(field=field_name, mapping=mapping)


def default_field_tables() -> dict[str, FieldBuckets]:
    """The default per-source tables (see the module docstring)."""
    return {
        "mathvision": _table("level", [1, 2], [3], [4, 5]),
        "tabmwp": _table("grade", [1, 2, 3, 4], [5, 6], [7, 8]),
        "scienceqa": _table(
            "grade",
            [f"grade{g}" for g in range(1, 5)],
            [f"grade{g}" for g in range(5, 9)],
            [f"grade{g}" for g in range(9, 13)],
        ),
    }


#: Step thresholds of sources whose items are much shorter than CRYSTAL's (module docstring).
DEFAULT_STEPS_BY_SOURCE: dict[str, StepThresholds] = {"synthetic": StepThresholds(easy_max=1, medium_max=3)}


@dataclass(frozen=True)
class BucketConfig:
    """How records are bucketed by difficulty.

    Attributes:
        fields: source name -> table on that source's difficulty field.
        steps: step-count thresholds for sources without a table.
        steps_by_source: per-source overrides of ``steps``.
    """

    fields: dict[str, FieldBuckets] = field(default_factory=default_field_tables)
    steps: StepThresholds = field(default_factory=StepThresholds)
    steps_by_source: dict[str, StepThresholds] = field(default_factory=lambda: dict(DEFAULT_STEPS_BY_SOURCE))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BucketConfig:
        """Build from a YAML-style mapping (see the module docstring).

        Raises:
            ConfigError: unknown keys, a bucket list that is not a list, a value in two
                buckets, or bad thresholds; ``field`` is the dotted key.
        """
        data = dict(data or {})
        unknown = set(data) - {"fields", "steps", "steps_by_source"}
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)}", field="buckets")
        tables = default_field_tables()
        for source, spec in (data.get("fields") or {}).items():
            tables[source] = _parse_table(source, spec)
        steps = _parse_steps(data.get("steps"), "buckets.steps")
        by_source = dict(DEFAULT_STEPS_BY_SOURCE)
        by_source |= {
            source: _parse_steps(spec, f"buckets.steps_by_source.{source}")
            for source, spec in (data.get("steps_by_source") or {}).items()
        }
        return cls(fields=tables, steps=steps, steps_by_source=by_source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> BucketConfig:
        """Read a YAML file holding the mapping (optionally under a top-level ``buckets`` key)."""
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", field="buckets", path=path)
        if "buckets" in data and isinstance(data["buckets"], Mapping):
            data = data["buckets"]
        return cls.from_dict(data)

    def thresholds_for(self, source: str) -> StepThresholds:
        """The step thresholds used for ``source``."""
        return self.steps_by_source.get(source, self.steps)


def _parse_table(source: str, spec: Any) -> FieldBuckets:
    key = f"buckets.fields.{source}"
    if not isinstance(spec, Mapping):
        raise ConfigError("expected a mapping with 'field' and bucket lists", field=key)
    unknown = set(spec) - {"field", *DIFFICULTIES}
    if unknown:
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
    return FieldBuckets(field=spec["field"], mapping=mapping)


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
    """Difficulty bucket of ``record`` under ``config`` (ignores ``record.difficulty``).

    Uses ``config.fields[record.source]`` when the source has a table, else the step-count
    thresholds for the source.

    Raises:
        InputError: the source has a table but the record lacks its field, or the value is in
            no bucket (names the record id and the field).
    """
    table = config.fields.get(record.source)
    if table is None:
        return config.thresholds_for(record.source).bucket_of(len(record.reference_steps))
    if table.field not in record.meta or record.meta[table.field] is None:
        raise InputError(
            f"no difficulty value; the bucket table for source '{record.source}' reads this field",
            record_id=record.id,
            field=table.field,
        )
    bucket = table.bucket_of(record.meta[table.field])
    if bucket is None:
        raise InputError(
            f"value {record.meta[table.field]!r} is in no bucket of the '{record.source}' table "
            f"(listed: {', '.join(sorted(table.mapping))})",
            record_id=record.id,
            field=table.field,
        )
    return bucket
