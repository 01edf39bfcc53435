"""Difficulty buckets (cpr.data.buckets) on the real samples, counted from the raw files."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cpr.data import BucketConfig, Record, StepThresholds, assign_bucket, load_records
from cpr.errors import ConfigError, InputError


def _counts(records) -> dict[str, int]:
    return dict(Counter(r.difficulty for r in records))


def _mathvision_expected(path) -> dict[str, int]:
    levels = [
        json.loads(line)["level"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return dict(Counter("easy" if lv <= 2 else "medium" if lv == 3 else "hard" for lv in levels))


def _tabmwp_expected(path) -> dict[str, int]:
    grades = [p["grade"] for p in json.loads(path.read_text(encoding="utf-8")).values()]
    return dict(Counter("easy" if g <= 4 else "medium" if g <= 6 else "hard" for g in grades))


def test_mathvision_levels(samples_dir):
    path = samples_dir / "mathvision" / "test_subset.jsonl"
    records = load_records("mathvision", path, validate_images=False)
    assert _counts(records) == _mathvision_expected(path) == {"easy": 40, "medium": 20, "hard": 40}
    assert all(
        r.difficulty == ("easy" if r.meta["level"] <= 2 else "medium" if r.meta["level"] == 3 else "hard")
        for r in records
    )


def test_tabmwp_grades(samples_dir):
    path = samples_dir / "tabmwp" / "problems_test1k_subset.json"
    records = load_records("tabmwp", path, validate_images=False)
    assert _counts(records) == _tabmwp_expected(path) == {"easy": 38, "medium": 38, "hard": 38}


def test_scienceqa_grades(samples_dir):
    path = samples_dir / "scienceqa" / "data" / "scienceqa" / "problems_subset.json"
    grades = [
        int(p["grade"].removeprefix("grade")) for p in json.loads(path.read_text(encoding="utf-8")).values()
    ]
    expected = dict(Counter("easy" if g <= 4 else "medium" if g <= 8 else "hard" for g in grades))
    assert _counts(load_records("scienceqa", path)) == expected == {"medium": 2}


def test_step_count_sources(samples_dir):
    gallery = samples_dir / "crystal_gallery" / "gallery.jsonl"
    n_steps = [
        len(json.loads(line)["reference_steps"]) for line in gallery.read_text(encoding="utf-8").splitlines()
    ]
    records = load_records("crystal", gallery)
    assert [len(r.reference_steps) for r in records] == n_steps
    assert _counts(records) == dict(
        Counter("easy" if n <= 10 else "medium" if n <= 18 else "hard" for n in n_steps)
    )
    tight = BucketConfig.from_dict({"steps": {"easy_max": 8, "medium_max": 9}})
    records = load_records("crystal", gallery, buckets=tight)
    assert _counts(records) == dict(
        Counter("easy" if n <= 8 else "medium" if n <= 9 else "hard" for n in n_steps)
    )

    vlrm = samples_dir / "vlrmbench" / "benchmark_data" / "location_error_subset.jsonl"
    lengths = [len(json.loads(line)["step_list"]) for line in vlrm.read_text(encoding="utf-8").splitlines()]
    assert lengths == [6, 11, 19, 15, 16]
    assert [r.difficulty for r in load_records("vlrmbench", vlrm)] == [
        "easy",
        "medium",
        "hard",
        "medium",
        "medium",
    ]


def _record(n_steps: int, source: str = "m3cot", **meta) -> Record:
    return Record(
        id="r",
        images=[],
        question="q",
        options=[],
        answer="a",
        reference_steps=[f"s{i}" for i in range(n_steps)],
        source=source,
        meta=meta,
    )


@pytest.mark.parametrize(
    ("n", "bucket"), [(1, "easy"), (10, "easy"), (11, "medium"), (18, "medium"), (19, "hard")]
)
def test_default_step_thresholds(n, bucket):
    assert assign_bucket(_record(n), BucketConfig()) == bucket


def test_overrides_from_dict_and_yaml(tmp_path):
    cfg = BucketConfig.from_dict(
        {
            "fields": {"mathvision": {"field": "level", "easy": [1], "medium": [2, 3], "hard": [4, 5]}},
            "steps_by_source": {"m3cot": {"easy_max": 2, "medium_max": 4}},
        }
    )
    assert assign_bucket(_record(3, "mathvision", level=2), cfg) == "medium"
    assert assign_bucket(_record(3, "mathvision", level="1"), cfg) == "easy"  # values compare as strings
    assert assign_bucket(_record(3, "tabmwp", grade=5), cfg) == "medium"  # default table kept
    assert [assign_bucket(_record(n), cfg) for n in (2, 3, 5)] == ["easy", "medium", "hard"]
    assert assign_bucket(_record(5, "jsonl"), cfg) == "easy"  # default thresholds for other sources
    path = tmp_path / "b.yaml"
    path.write_text("buckets:\n  steps: {easy_max: 1, medium_max: 2}\n", encoding="utf-8")
    assert BucketConfig.from_yaml(path).steps == StepThresholds(1, 2)


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"colour": 1}, "buckets", "unknown keys ['colour']"),
        (
            {"steps": {"easy_max": 10, "medium_max": 5}},
            "buckets.steps",
            "need 0 < easy_max <= medium_max, got 10 and 5",
        ),
        ({"steps": {"easy": 1}}, "buckets.steps", "expected a mapping with easy_max and medium_max"),
        (
            {"fields": {"x": {"easy": [1]}}},
            "buckets.fields.x.field",
            "'field' (the meta key holding the difficulty) is required",
        ),
        (
            {"fields": {"x": {"field": "g", "easy": 1}}},
            "buckets.fields.x.easy",
            "expected a list of field values",
        ),
        (
            {"fields": {"x": {"field": "g", "easy": [1], "hard": [1]}}},
            "buckets.fields.x.hard",
            "value 1 is listed in two buckets",
        ),
        (
            {"steps_by_source": {"m3cot": {"easy_max": 0, "medium_max": 3}}},
            "buckets.steps_by_source.m3cot",
            "need 0 < easy_max <= medium_max, got 0 and 3",
        ),
    ],
)
def test_config_errors(data, field, message):
    with pytest.raises(ConfigError) as e:
        BucketConfig.from_dict(data)
    assert e.value.field == field and e.value.message == message


def test_missing_or_unlisted_field_value():
    with pytest.raises(InputError) as e:
        assign_bucket(_record(3, "mathvision"), BucketConfig())
    assert str(e.value) == (
        "(id r) field 'level': no difficulty value; the bucket table for source 'mathvision' reads this field"
    )
    with pytest.raises(
        InputError, match=r"field 'grade': value 'grade13' is in no bucket of the 'scienceqa' table"
    ):
        assign_bucket(_record(3, "scienceqa", grade="grade13"), BucketConfig())
