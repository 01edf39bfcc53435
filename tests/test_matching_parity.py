"""Parity of cpr.matching with the CRYSTAL authors' crystal-metrics 0.2.0 (the oracle).

Per sample, our precision, recall, Match F1, LIS ratio and Ordered F1 (score_batch, one
batched encode) must equal ``MLLMReasoningEvaluator.evaluate_single`` (two encodes per
sample, numpy cosine) within 1e-6 on 200 real prediction/reference pairs
(cpr_tools/step_pairs.py), plus a handful at tau = 0.5. The matcher and LIS are also checked
directly against the oracle's own ``_find_matches`` / ``_compute_lis_ratio`` on random
matrices full of exact ties.

What is guaranteed, and asserted: on a sample where no float-noise tie decides the greedy
matching, the results are identical. A predicted step that occurs twice has two similarity
entries that are equal up to float noise (we embed the string once, the oracle embeds each
copy; BLAS, batch composition and thread count move the last bits), so which copy the greedy
matcher takes is decided by noise, in our matrix as in the oracle's. Such samples are detected
on our matrix (candidates within ``EPS`` of each other or of tau), every outcome over all
tie-breaks is enumerated, and both our result and the oracle's must be among them.
"""

from __future__ import annotations

import copy
import itertools
import random
import types

import numpy as np
import pytest

from cpr.matching import StepEncoder, lis_ratio, match_pairs, score_batch
from cpr_tools.step_pairs import build_pairs

reasoning = pytest.importorskip("crystal_metrics.reasoning")

TOL = 1e-6
# Float noise between two computations of one cosine: a few float32 ulps (ulp(1.0) = 1.2e-7;
# our and the oracle's matrices differ by at most 2.4e-7 on these pairs).
EPS = 1e-6

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


def _lis(pairs) -> float:
    return reasoning.MLLMReasoningEvaluator._compute_lis_ratio([(i, j, 0.0) for i, j in pairs])


def tie_outcomes(sim: np.ndarray, tau: float) -> set[tuple[int, float]]:
    """Every ``(n_matched, LIS ratio)`` the greedy matcher can give on ``sim`` moved by float noise.

    Candidates whose similarities lie within ``EPS`` of each other (chained) may be taken in any
    order, and a similarity within ``EPS`` of tau may fall on either side of it. Greedy over any
    order of a group of tied candidates yields a maximal matching of the still-free ones, and every
    maximal matching is reachable, so the search walks the groups in descending order and branches
    on each free candidate of a group (each state visited once).
    """
    above = np.nonzero(sim > tau + EPS)
    near = np.nonzero(np.abs(sim - tau) <= EPS)
    firm = [(float(sim[i, j]), int(i), int(j)) for i, j in zip(*above, strict=True)]
    maybe = [(float(sim[i, j]), int(i), int(j)) for i, j in zip(*near, strict=True)]
    assert len(maybe) <= 8, "too many similarities at the threshold to enumerate"
    found: set[tuple[int, float]] = set()
    for k in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, k):
            groups: list[list[tuple[float, int, int]]] = []
            for c in sorted(firm + list(extra), reverse=True):
                if groups and groups[-1][-1][0] - c[0] <= EPS:
                    groups[-1].append(c)
                else:
                    groups.append([c])
            stack, seen = [(0, frozenset())], set()
            while stack:
                g, chosen = stack.pop()
                if (g, chosen) in seen:
                    continue
                seen.add((g, chosen))
                if g == len(groups):
                    found.add((len(chosen), _lis(chosen)))
                    continue
                used_p, used_r = {i for i, _ in chosen}, {j for _, j in chosen}
                free = [(i, j) for _, i, j in groups[g] if i not in used_p and j not in used_r]
                stack.extend([(g, chosen | {e}) for e in free] or [(g + 1, chosen)])
    return found


def _check_sample(sid, pred, ref, mine, theirs, encoder, tau) -> bool:
    """Assert parity of one sample; True when a float-noise tie decided it (either outcome accepted)."""
    outcomes = tie_outcomes(encoder.encode(pred) @ encoder.encode(ref).T, tau) if pred else {(0, 1.0)}
    if len(outcomes) == 1:
        _assert_same(sid, mine, theirs)
        return False
    assert (mine.n_pred, mine.n_ref) == (theirs.num_predicted_steps, theirs.num_reference_steps), sid
    assert (mine.n_matched, mine.lis) in outcomes, (sid, outcomes)
    assert (theirs.num_matched_predictions, theirs.lis_ratio) in outcomes, (sid, outcomes)
    assert len(set(pred)) < len(pred), f"{sid}: decided by float noise without a duplicated step"
    return True


def test_pairs_cover_the_cases(pairs):
    assert len(pairs) >= 200
    assert {p[0].split("-")[0] for p in pairs} == {"mathvision", "tabmwp", "crystal"}
    assert sum(1 for _, pred, _ in pairs if not pred) >= 5  # empty predictions
    assert sum(1 for _, pred, _ in pairs if len(set(pred)) < len(pred)) >= 20  # exact duplicates (ties)
    assert sum(1 for _, pred, ref in pairs if pred == ref) >= 5


@pytest.mark.slow
def test_parity_with_crystal_metrics_tau_035(pairs, oracle, parity_encoder):
    ours = score_batch(
        [p[1] for p in pairs], [p[2] for p in pairs], encoder=parity_encoder, threshold=0.35, alpha=0.3
    )
    lis_below_one = tie_decided = 0
    for (sid, pred, ref), mine in zip(pairs, ours, strict=True):
        theirs = oracle.evaluate_single(pred, ref, alpha=0.3, order_metric="lis")
        tie_decided += _check_sample(sid, pred, ref, mine, theirs, parity_encoder, 0.35)
        lis_below_one += mine.lis < 1.0
    # duplicated steps make a few samples tie-decided (16 of 200 here); all others are exact
    assert 1 <= tie_decided <= len(pairs) // 10
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
        theirs = strict.evaluate_single(pred, ref, alpha=0.3, order_metric="lis")
        _check_sample(sid, pred, ref, mine, theirs, parity_encoder, 0.5)
    # a higher threshold never matches more pairs, and here it matches fewer at least once
    assert all(a.n_matched <= b.n_matched for a, b in zip(ours, ours_035, strict=True))
    assert any(a.n_matched < b.n_matched for a, b in zip(ours, ours_035, strict=True))


def test_tie_outcomes_accept_either_tie_break(pairs, parity_encoder):
    # The oracle's matcher on our matrix moved by float32 noise below EPS / 2 stands for the
    # oracle's own encoding: every noisy outcome is among the enumerated ones, and on some
    # sample it differs from ours (an exact comparison would reject a correct oracle there).
    rng = np.random.default_rng(0)
    fake_self = types.SimpleNamespace(debug_mode=False)
    differs = 0
    for sid, pred, ref in pairs:
        if not pred:
            continue
        sim = parity_encoder.encode(pred) @ parity_encoder.encode(ref).T
        outcomes = tie_outcomes(sim, 0.35)
        mine = match_pairs(sim, 0.35)
        assert (len(mine), lis_ratio(mine)) in outcomes, sid
        if len(outcomes) == 1:
            continue
        for _ in range(10):
            noisy = (sim + rng.uniform(-4e-7, 4e-7, sim.shape)).astype(np.float32)
            _, _, theirs = reasoning.MLLMReasoningEvaluator._find_matches(fake_self, noisy, 0.35)
            got = (len(theirs), _lis((i, j) for i, j, _ in theirs))
            assert got in outcomes, (sid, got, outcomes)
            differs += got != (len(mine), lis_ratio(mine))
    assert differs > 0


def test_tie_outcomes_on_a_hand_made_matrix():
    # pred = [A, B, A], ref = [A, B]: the two copies of A tie for ref 0. Taking pred 0 keeps the
    # order (LIS 1); taking pred 2 crosses pred 1 -> ref 1 (LIS 1/2).
    sim = np.array([[1.0, 0.5], [0.5, 0.99], [1.0000001, 0.5]], dtype=np.float32)
    assert tie_outcomes(sim, 0.35) == {(2, 1.0), (2, 0.5)}
    sim[2, 0] = 0.9  # no tie: one outcome, the greedy one
    assert tie_outcomes(sim, 0.35) == {(2, 1.0)}
    # a similarity within EPS of tau may fall on either side of it
    assert tie_outcomes(np.array([[0.35000004, 0.1]], dtype=np.float32), 0.35) == {(0, 1.0), (1, 1.0)}


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
