"""The closing report of a run (cpr.training.report): stage adapters, chance accuracy, bucket mix, lines."""

from __future__ import annotations

import json

import pytest

from cpr.data.records import Record
from cpr.errors import ConfigError
from cpr.training.report import bucket_mix, chance_accuracy, closing_lines, phase_bucket_mixes, stage_adapter

SUMMARY = {
    "warm_start_adapter": "run/warm_start/adapter",
    "phases": [{"phase": "answer_only", "steps": 6, "handover_adapter": "run/answer_only/checkpoint-4"},
               {"phase": "cpr", "steps": 6, "handover_adapter": "run/cpr/adapter"}],
}


def record(rid: str, difficulty: str, options: int = 3) -> Record:
    return Record(id=rid, images=[], question="q", options=["x"] * options, answer="A",
                  reference_steps=["s"], difficulty=difficulty)


def test_stage_adapters():
    assert stage_adapter("untrained", SUMMARY) is None
    assert stage_adapter("warm_start", SUMMARY) == "run/warm_start/adapter"
    assert stage_adapter("answer_only", SUMMARY) == "run/answer_only/checkpoint-4"  # the selected checkpoint
    with pytest.raises(ConfigError) as e:
        stage_adapter("composite", SUMMARY)
    assert e.value.field == "evaluation.compare" and "no 'composite' adapter" in e.value.message


def test_chance_accuracy():
    # three 3-option items and one 2-option item: (1/3 * 3 + 1/2) / 4 = 37.5 %; a free-form item counts 0
    assert chance_accuracy([record("a", "easy")] * 3 + [record("b", "easy", 2)]) == pytest.approx(37.5)
    assert chance_accuracy([record("a", "easy"), record("c", "easy", 0)]) == pytest.approx(100 / 6)
    assert chance_accuracy([]) == 0.0


def test_bucket_mix_in_thirds_of_the_phase(tmp_path):
    # 6 steps: steps 1-2 -> first third, 3-4 -> second, 5-6 -> third; the step_f1 rows are not counted twice
    rows = [{"step": 1, "id": "e1", "reward_function": "cpr"}, {"step": 2, "id": "e2", "reward_function": "cpr"},
            {"step": 2, "id": "e2", "reward_function": "step_f1"},
            {"step": 3, "id": "e1", "reward_function": "cpr"}, {"step": 4, "id": "m1", "reward_function": "cpr"},
            {"step": 5, "id": "m1", "reward_function": "cpr"}, {"step": 6, "id": "h1", "reward_function": "cpr"},
            {"step": 6, "id": "h1", "reward_function": "cpr"}, {"step": 6, "id": "e1", "reward_function": "cpr"}]
    (tmp_path / "cpr").mkdir()
    (tmp_path / "cpr" / "scored_completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = [record("e1", "easy"), record("e2", "easy"), record("m1", "medium"), record("h1", "hard")]
    mix = bucket_mix(tmp_path / "cpr", {r.id: r.difficulty for r in train}, steps=6)
    assert mix == [{"easy": 100.0, "medium": 0.0, "hard": 0.0}, {"easy": 50.0, "medium": 50.0, "hard": 0.0},
                   pytest.approx({"easy": 25.0, "medium": 25.0, "hard": 50.0})]
    assert phase_bucket_mixes(tmp_path, SUMMARY, train) == {"cpr": mix}  # answer_only scored nothing
    # a phase of 60 steps with rows in its first 6 only: one span (4 easy, 2 medium, 2 hard), no empty ones
    assert bucket_mix(tmp_path / "cpr", {r.id: r.difficulty for r in train}, steps=60) == [
        {"easy": 50.0, "medium": 25.0, "hard": 25.0}]
    with pytest.raises(ConfigError, match="unknown record 'h1'"):
        bucket_mix(tmp_path / "cpr", {"e1": "easy", "e2": "easy", "m1": "medium"}, steps=6)


def test_closing_lines():
    overall = {"n": 90, "accuracy": 62.2, "match_f1": 0.651, "precision": 0.66, "recall": 0.64, "steps": 2.6,
               "lis": 1.0, "ordered_f1": 0.651}
    summary = {"chance_accuracy": 33.333, "comparison": [
        {"stage": "untrained", "benchmark": "crystal", **dict(overall, accuracy=0.0, match_f1=0.0)},
        {"stage": "final", "benchmark": "crystal", **overall}],
        "bucket_mix": {"cpr": [{"easy": 100.0, "medium": 0.0, "hard": 0.0}, {"easy": 33.3, "medium": 66.7, "hard": 0.0}]}}
    lines = closing_lines(summary)
    assert lines[0] == "  held-out test (crystal, n 90; chance accuracy 33.3%):"
    assert lines[1].split() == ["stage", "Acc", "Match", "F1", "P", "R", "Steps", "LIS", "Ord.", "F1"]
    assert lines[2].split()[:3] == ["untrained", "0.0", "0.000"]
    assert lines[3].split() == ["final", "62.2", "0.651", "0.660", "0.640", "2.60", "1.000", "0.651"]
    assert lines[4] == "  phase cpr bucket mix (% easy/medium/hard, thirds of the phase): 100/0/0 -> 33/67/0"


def test_closing_lines_show_lucky_and_sampled_columns_when_scored():
    overall = {"n": 4, "accuracy": 75.0, "match_f1": 0.5, "precision": 0.6, "recall": 0.45, "steps": 2.0, "lis": 1.0,
               "ordered_f1": 0.5, "lucky_guess_rate": 25.0, "sampled_accuracy": 62.5, "sampled_match_f1": 0.425,
               "pass_at_k": 100.0}
    summary = {"chance_accuracy": 25.0, "comparison": [
        {"stage": "warm_start", "benchmark": "crystal", **overall},
        {"stage": "final", "benchmark": "crystal", **dict(overall, sampled_accuracy=68.75)}]}
    lines = closing_lines(summary)
    assert lines[1].split()[10:] == ["Lucky", "Acc", "m@k", "F1", "m@k", "Acc", "p@k"]
    assert lines[2].split()[8:] == ["25.0", "62.5", "0.425", "100.0"]
    assert lines[3].split()[8:] == ["25.0", "68.8", "0.425", "100.0"]
    assert "m@k: mean over the k sampled completions" in lines[4]
