"""The numbers of the ablation tables (cpr.ablation.metrics), against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cpr.ablation.metrics import (
    as_number,
    discrimination,
    first_nonfinite,
    kl_max,
    reward_f1_correlation,
    stability,
)
from cpr.errors import InputError


def _rows(*triples):
    return [{"reward": r, "correct": c, "match_f1": f} for r, c, f in triples]


# rewards 1.0 / 0.8 (correct), 0.12 / 0.0 (wrong); step F1 1.0, 0.6, 0.4, 0.0
ROWS = _rows((1.0, True, 1.0), (0.8, True, 0.6), (0.12, False, 0.4), (0.0, False, 0.0))


def test_as_number_reads_logged_nonfinite_strings():
    assert as_number(0.5) == 0.5 and as_number(3) == 3.0
    assert math.isnan(as_number("nan")) and as_number("inf") == math.inf and as_number("-inf") == -math.inf
    assert as_number(None) is None and as_number(True) is None and as_number("abc") is None


def test_discrimination_by_hand():
    d = discrimination(ROWS)
    # (1.0 + 0.8) / 2 - (0.12 + 0.0) / 2 = 0.9 - 0.06
    assert d["value"] == pytest.approx(0.84)
    assert (d["mean_correct"], d["mean_wrong"]) == (pytest.approx(0.9), pytest.approx(0.06))
    assert (d["n_correct"], d["n_wrong"], d["reason"]) == (2, 2, None)


def test_discrimination_undefined_when_a_class_is_empty():
    d = discrimination(_rows((1.0, True, 1.0), (0.5, True, 0.2)))
    assert d["value"] is None and d["mean_wrong"] is None and d["mean_correct"] == pytest.approx(0.75)
    assert d["reason"] == "no completion with a wrong answer"
    assert discrimination([])["reason"] == "no scored completions"


def test_discrimination_rejects_rows_without_correctness():
    with pytest.raises(InputError, match=r"row 1 \('step_f1'\) has correct=None, not true/false"):
        discrimination([ROWS[0], {"reward": 0.2, "correct": None, "match_f1": 0.2, "reward_function": "step_f1"}])
    with pytest.raises(InputError, match="row 0 has reward 'nan'"):
        discrimination([{"reward": "nan", "correct": True, "match_f1": 1.0}])
    with pytest.raises(InputError, match="row 0 has no 'correct'"):
        discrimination([{"reward": 1.0}])


def test_pearson_by_hand_and_against_numpy():
    c = reward_f1_correlation(ROWS)
    # means 0.48 and 0.5; deviations (0.52, 0.32, -0.36, -0.48) and (0.5, 0.1, -0.1, -0.5):
    # sum of products 0.568, sums of squares 0.7328 and 0.52
    assert c["r"] == pytest.approx(0.568 / math.sqrt(0.7328 * 0.52), abs=1e-12)
    assert c["r"] == pytest.approx(np.corrcoef([1.0, 0.8, 0.12, 0.0], [1.0, 0.6, 0.4, 0.0])[0, 1], abs=1e-12)
    assert c["n"] == 4 and 0 < c["p_value"] < 1 and c["reason"] is None


def test_pearson_undefined_cases_say_why():
    assert reward_f1_correlation(ROWS[:1])["reason"] == "1 scored completion(s): a correlation needs at least 2"
    const = reward_f1_correlation(_rows((0.5, True, 1.0), (0.5, False, 0.0)))
    assert const["r"] is None and const["reason"] == "every reward equals 0.5: the correlation is undefined"
    flat = reward_f1_correlation(_rows((1.0, True, 0.0), (0.0, False, 0.0)))
    assert flat["reason"] == "every Match F1 equals 0: the correlation is undefined"


def test_kl_max_skips_nonfinite_and_reports_step():
    rows = [{"step": 1, "kl": 0.1}, {"step": 2, "kl": "nan"}, {"step": 3, "kl": 0.7}, {"step": 4}, {"step": 5, "kl": 0.2}]
    assert kl_max(rows) == {"value": 0.7, "step": 3, "n": 3}
    assert kl_max([{"step": 1}]) == {"value": None, "step": None, "n": 0}


def test_first_nonfinite_watches_loss_grad_kl_and_rewards():
    rows = [{"step": 1, "loss": 0.1, "learning_rate": "nan"},  # not a watched key
            {"step": 2, "rewards/cpr/mean": "inf"},
            {"step": 3, "grad_norm": "nan"}]
    assert first_nonfinite(rows) == {"step": 2, "key": "rewards/cpr/mean", "value": "inf"}
    assert first_nonfinite(rows[:1]) is None


def test_stability_flags_nan_and_kl_over_limit():
    ok = stability([{"step": 1, "kl": 0.5, "loss": 0.1}], kl_limit=2.0)
    assert ok["stable"] is True and ok["reason"] is None
    nan = stability([{"step": 1, "kl": 0.5}, {"step": 2, "grad_norm": "nan"}], kl_limit=2.0)
    assert nan["stable"] is False and nan["reason"] == "grad_norm = nan at step 2"
    kl = stability([{"step": 1, "kl": 0.5}, {"step": 2, "kl": 2.5}, {"step": 3, "kl": 3.0}], kl_limit=2.0)
    assert kl["stable"] is False and kl["reason"] == "KL 2.5 > 2 at step 2" and kl["kl_over"] == {"step": 2, "value": 2.5}
    assert stability([{"step": 2, "kl": 2.5}], kl_limit=None)["stable"] is True
    both = stability([{"step": 1, "kl": 2.5, "loss": "nan"}], kl_limit=2.0)
    assert both["reason"] == "loss = nan at step 1; KL 2.5 > 2 at step 1"


def test_stability_reads_guard_events():
    events = [{"step": 3, "condition": "zero_std", "action": "warn", "reason": "no signal"},
              {"step": 5, "condition": "kl", "action": "warn", "reason": "KL 12 > 10 for 5 steps"}]
    s = stability([{"step": 1, "kl": 0.5}], kl_limit=20.0, guard_events=events)
    assert s["stable"] is False and s["reason"] == "guard kl (warn) at step 5: KL 12 > 10 for 5 steps"
    assert stability([{"step": 1, "kl": 0.5}], kl_limit=20.0, guard_events=events[:1])["stable"] is True
