"""warm_start.step_keep: the warm start's targets from a teacher that states some of the reference steps
(cpr.training.warm_start.teacher_records), checked on generated records."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpr.data.synthetic import generate
from cpr.errors import ConfigError
from cpr.training import warm_start
from cpr.training.config import load_config
from cpr.training.warm_start import teacher_records

DEMO = str(Path(__file__).resolve().parents[1] / "recipes" / "configs" / "demo.yaml")


def _is_subsequence(kept: list[str], steps: list[str]) -> bool:
    it = iter(steps)
    return all(any(s == t for t in it) for s in kept)


def test_each_record_keeps_an_ordered_non_empty_subset_of_its_steps_at_the_expected_rate():
    records = list(generate(300, seed=0, split="train"))
    taught = teacher_records(records, 0.5, seed=42)
    assert [r.id for r in taught] == [r.id for r in records]
    assert [r.answer for r in taught] == [r.answer for r in records]
    multi_kept = multi_total = 0
    expected = 0.0
    for before, after in zip(records, taught, strict=True):
        steps, kept = list(before.reference_steps), list(after.reference_steps)
        assert kept and _is_subsequence(kept, steps)
        if len(steps) == 1:
            assert kept == steps
            continue
        multi_kept, multi_total = multi_kept + len(kept), multi_total + len(steps)
        # each step kept with p = 0.5, drawn again until one is: E[kept] = n p / (1 - (1 - p) ** n)
        expected += len(steps) * 0.5 / (1 - 0.5 ** len(steps))
    assert multi_total > 600  # 3-step and 4-step records (two thirds of 300)
    assert multi_kept / multi_total == pytest.approx(expected / multi_total, abs=0.05)
    assert 0.5 < expected / multi_total < 0.6


def test_the_draw_is_fixed_by_seed_and_record_and_step_keep_one_changes_nothing():
    records = list(generate(60, seed=0, split="train"))
    first = [r.reference_steps for r in teacher_records(records, 0.5, seed=1)]
    assert first == [r.reference_steps for r in teacher_records(records, 0.5, seed=1)]
    assert first != [r.reference_steps for r in teacher_records(records, 0.5, seed=2)]
    # one record's draw does not depend on the others
    assert [r.reference_steps for r in teacher_records(records[10:20], 0.5, seed=1)] == first[10:20]
    assert teacher_records(records, 1.0, seed=1) == records
    assert records[2].reference_steps == list(generate(60, seed=0, split="train"))[2].reference_steps  # not mutated


@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_step_keep_outside_zero_one_is_refused(value):
    with pytest.raises(ConfigError, match="warm_start.step_keep"):
        load_config(DEMO, [f"warm_start.step_keep={value}"])


def test_run_warm_start_trains_on_the_teachers_targets(tmp_path, monkeypatch):
    cfg = load_config(DEMO, ["warm_start.step_keep=0.5", "data.train[0].options.size=30", "seed=7"])
    seen = {}

    def fake_train_lora(cfg_, settings, out, records, **kw):
        seen["records"] = list(records)
        (out / "adapter").mkdir(parents=True)
        return out / "adapter"

    monkeypatch.setattr(warm_start, "train_lora", fake_train_lora)
    warm_start.run_warm_start(cfg, None, tmp_path / "ws")
    full = list(generate(30, seed=0, split="train"))
    assert [r.reference_steps for r in seen["records"]] == [r.reference_steps
                                                           for r in teacher_records(full, 0.5, seed=7)]
    assert any(len(a.reference_steps) < len(b.reference_steps) for a, b in zip(seen["records"], full, strict=True))
