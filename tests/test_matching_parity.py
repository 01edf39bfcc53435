"""Parity of cpr.matching with the CRYSTAL authors' crystal-metrics 0.2.0 (the oracle).

Per sample, our precision, recall, Match F1, LIS ratio and Ordered F1 (score_batch, one
batched encode) must equal ``MLLMReasoningEvaluator.evaluate_single`` (two encodes per
sample, numpy cosine) within 1e-6 on 200 real prediction/reference pairs
(tests/step_pairs.py), plus a handful at tau = 0.5. The matcher and LIS are also checked
directly against the oracle's own ``_find_matches`` / ``_compute_lis_ratio`` on random
matrices full of exact ties.
"""

from __future__ import annotations

import copy
import random
import types

import numpy as np
import pytest
from step_pairs import build_pairs

from cpr.matching import StepEncoder, lis_ratio, match_pairs, score_batch

reasoning = pytest.importorskip("crystal_metrics.reasoning")

TOL = 1e-6

# With 2 intra-op threads on the shared 2 cores the oracle's many tiny encode calls stall on
# thread barriers (minutes instead of seconds); 1 thread is stable.
pytestmark = pytest.mark.usefixtures("one_thread_module")


@pytest.fixture(scope="session")
def oracle(offline_encoder_path: str):
    return reasoning.MLLMReasoningEvaluator(
        model_name=offline_encoder_path, similarity_threshold=0.35, device="cpu"
    )


@pytest.fixture(scope="session")
def parity_encoder(offline_encoder_path: str) -> StepEncoder:
    return StepEncoder(offline_encoder_path, device="cpu", batch_size=64)


@pytest.fixture(scope="session")
def pairs(samples_dir):
    # 200 pairs over all three sources; every other MATH-V / TabMWP record and at most 8
    # steps a reference keep the oracle's per-sample encoding within the time budget.
    return build_pairs(samples_dir, n=200, seed=0, every=2, max_steps=8)


def _assert_same(sid, ours, theirs):
    got = (ours.precision, ours.recall, ours.match_f1, ours.lis, ours.ordered_f1)
    want = (theirs.precision, theirs.recall, theirs.match_f1, theirs.lis_ratio, theirs.ordered_match_f1)
    assert (ours.n_pred, ours.n_ref, ours.n_matched) == (
        theirs.num_predicted_steps,
        theirs.num_reference_steps,
        theirs.num_matched_predictions,
    ), sid
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=str(sid))


def test_pairs_cover_the_cases(pairs):
    assert len(pairs) >= 200
    assert {p[0].split("-")[0] for p in pairs} == {"mathvision", "tabmwp", "crystal"}
    assert sum(1 for _, pred, _ in pairs if not pred) >= 5  # empty predictions
    assert sum(1 for _, pred, _ in pairs if len(set(pred)) < len(pred)) >= 20  # exact duplicates (ties)
    assert sum(1 for _, pred, ref in pairs if pred == ref) >= 5


def test_parity_with_crystal_metrics_tau_035(pairs, oracle, parity_encoder):
    ours = score_batch(
        [p[1] for p in pairs], [p[2] for p in pairs], encoder=parity_encoder, threshold=0.35, alpha=0.3
    )
    lis_below_one = 0
    for (sid, pred, ref), mine in zip(pairs, ours, strict=True):
        theirs = oracle.evaluate_single(pred, ref, alpha=0.3, order_metric="lis")
        _assert_same(sid, mine, theirs)
        lis_below_one += mine.lis < 1.0
    # the sample exercises the order metric and the whole F1 range
    assert lis_below_one >= 30
    f1 = [s.match_f1 for s in ours]
    assert min(f1) == 0.0 and max(f1) == 1.0 and sum(0 < v < 1 for v in f1) >= 100


def test_parity_with_crystal_metrics_tau_05(pairs, oracle, parity_encoder):
    strict = copy.copy(oracle)  # shares the loaded model; only the threshold differs
    strict.similarity_threshold = 0.5
    subset = [p for p in pairs if p[1]][:12]
    ours = score_batch([p[1] for p in subset], [p[2] for p in subset], encoder=parity_encoder, threshold=0.5)
    ours_035 = score_batch([p[1] for p in subset], [p[2] for p in subset], encoder=parity_encoder)
    for (sid, pred, ref), mine in zip(subset, ours, strict=True):
        _assert_same(sid, mine, strict.evaluate_single(pred, ref, alpha=0.3, order_metric="lis"))
    # a higher threshold never matches more pairs, and here it matches fewer at least once
    assert all(a.n_matched <= b.n_matched for a, b in zip(ours, ours_035, strict=True))
    assert any(a.n_matched < b.n_matched for a, b in zip(ours, ours_035, strict=True))


def test_greedy_matcher_equals_oracle_on_tied_matrices():
    # Values on a coarse grid make many exact ties; the pairs (and their order) must be
    # those of the oracle's reverse tuple sort.
    rng = np.random.default_rng(3)
    fake_self = types.SimpleNamespace(debug_mode=False)
    for _ in range(300):
        n, m = rng.integers(1, 9, size=2)
        sim = (rng.integers(0, 11, size=(n, m)) / 10).astype(np.float32)
        tau = float(rng.choice([0.3, 0.35, 0.5]))
        _, _, want = reasoning.MLLMReasoningEvaluator._find_matches(fake_self, sim, tau)
        got = match_pairs(sim, tau, "greedy")
        assert [(i, j) for i, j, _ in got] == [(int(i), int(j)) for i, j, _ in want]
        assert [s for *_, s in got] == [float(s) for *_, s in want]


def test_lis_equals_oracle_on_random_matchings():
    rnd = random.Random(4)
    for _ in range(300):
        k = rnd.randint(0, 12)
        preds = rnd.sample(range(20), k)
        refs = rnd.sample(range(20), k)
        pairs = [(p, r, 0.9) for p, r in zip(preds, refs, strict=True)]
        assert lis_ratio(pairs) == reasoning.MLLMReasoningEvaluator._compute_lis_ratio(pairs)
