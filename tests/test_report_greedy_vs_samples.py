"""reports/grpo_diagnosis/greedy_vs_samples.py: the group statistics on a hand-made set of groups."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "greedy_vs_samples", Path(__file__).resolve().parents[1] / "reports" / "grpo_diagnosis" / "greedy_vs_samples.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_group_stats_counts_samples_against_their_greedy_completion():
    # prompt A: one sample beats greedy (3 steps), one is the greedy text; B: both below, no variance;
    # C: one below, one above, greedy above the group mean (0.75).
    stats = bench.group_stats(
        greedy_r=[1.0, 1.0, 1.0], groups_r=[[1.5, 1.0], [0.5, 0.5], [0.0, 1.5]],
        greedy_t=["g", "h", "k"], groups_t=[["x", "g"], ["y", "z"], ["p", "q"]],
        greedy_steps=[2, 1, 2], groups_steps=[[3, 2], [1, 1], [0, 2]])
    assert stats["greedy_reward"] == pytest.approx(1.0)
    assert stats["sampled_reward"] == pytest.approx(5 / 6)
    assert (stats["above"], stats["equal"], stats["below"]) == pytest.approx((2 / 6, 1 / 6, 3 / 6))
    assert stats["greedy_above_mean"] == pytest.approx(1 / 2)  # of the two groups with variance (A, C)
    assert stats["greedy_text"] == pytest.approx(1 / 6)
    assert stats["steps_greedy"] == pytest.approx(5 / 3)
    assert stats["steps_beating"] == pytest.approx(2.5)  # A's 3-step sample and C's 2-step one
