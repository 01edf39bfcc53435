"""Parity of ``check_answer(..., mode="crystal")`` with crystal-metrics 0.2.0 (the paper authors' code).

The oracle is ``crystal_metrics.AccuracyCalculator().evaluate_single(question, predicted, gt)``
with the LLM judge off. When options are passed to ``check_answer`` and the question has no
``A)`` line, the oracle gets the question with the options appended as ``"A) text"`` lines
(the rendering rule documented in cpr.answers). Besides ``is_correct`` the match type and the
normalised strings must agree too. The one departure: a non-answer (empty, only punctuation,
"insufficient information", ...) is wrong in crystal mode too (``match_type="invalid"``), where
the oracle's substring fallback may accept it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpr.answers import check_answer, is_non_answer

crystal_accuracy = pytest.importorskip("crystal_metrics.accuracy")
ORACLE = crystal_accuracy.AccuracyCalculator(use_llm_grader=False)


def oracle_question(question: str, options: list[str]) -> str:
    if not options or re.search(r"^[ \t]*A\)", question, re.MULTILINE):
        return question
    lines = [f"{chr(ord('A') + i)}) {' '.join(text.splitlines())}" for i, text in enumerate(options)]
    return "\n".join(([question] if question else []) + lines)


def assert_parity(pred: str, ref: str, options: list[str], question: str) -> None:
    ours = check_answer(pred, ref, options=options, question=question, mode="crystal")
    if is_non_answer(pred):  # the documented departure: a non-answer is wrong whatever the oracle says
        assert (ours.correct, ours.match_type) == (False, "invalid"), (pred, ref)
        return
    theirs = ORACLE.evaluate_single(oracle_question(question, options), pred, ref)
    assert (ours.correct, ours.match_type, ours.normalized_prediction, ours.normalized_reference) == (
        theirs.is_correct,
        theirs.match_type,
        theirs.normalized_prediction,
        theirs.normalized_ground_truth,
    ), (pred, ref, options, question)


def mismatches(cases: list[tuple[str, str, list[str], str]]) -> list[tuple]:
    bad = []
    for pred, ref, options, question in cases:
        try:
            assert_parity(pred, ref, options, question)
        except AssertionError:
            bad.append((pred, ref, options, question))
    return bad


# --- hand-written cases (real answers copied from data/samples plus tricky forms) -----------------

CITIES = ["London", "Paris", "Rome", "Berlin"]
ANGLES = ["$50^{\\circ}$", "$60^{\\circ}$", "$65^{\\circ}$", "$70^{\\circ}$", "$75^{\\circ}$"]  # MATH-V, answer B
AREAS = ["$9 \\mathrm{~cm}^{2}$", "$10 \\mathrm{~cm}^{2}$", "$11 \\mathrm{~cm}^{2}$", "$12 \\mathrm{~cm}^{2}$"]
WAIT = ["45 minutes", "15 minutes", "1 hour", "30 minutes"]  # TabMWP, answer "15 minutes"
ZOOS = ["Pacific Zoo", "Atlantic Zoo", "Mountain Zoo", "Eastern Zoo"]  # TabMWP, answer "Atlantic Zoo"
YES_NO = ["yes", "no"]
SIMON = ["S", "I", "M", "O", "N"]  # MATH-V, answer D
LICHEN = ["bilberry", "mushroom"]  # ScienceQA, answer index 1
CITY_Q = "Which city is the capital?\nA) London\nB) Paris\nC) Rome"
EQUATOR_Q = "Which of these continents does the equator intersect? (North America, Africa, Europe)"
SHARK_Q = "Is the shark's belly visible in this image?"

HAND_CASES: list[tuple[str, str, list[str], str]] = [
    # letters and option text
    ("B", "B", CITIES, ""), ("(B)", "B", CITIES, ""), ("B)", "B", CITIES, ""), ("b.", "B", CITIES, ""),
    ("B) Paris", "B", CITIES, ""), ("Paris", "B", CITIES, ""), ("option B", "B", CITIES, ""),
    ("The answer is C", "B", CITIES, ""), ("choice b", "B", CITIES, ""), ("A or B", "B", CITIES, ""),
    ("AB", "B", CITIES, ""), ("B C", "B", CITIES, ""), ("A, B", "B", CITIES, ""), ("A B C D", "B", CITIES, ""),
    ("Paris or London", "B", CITIES, ""), ("B) London", "B", CITIES, ""), ("Lyon", "B", CITIES, ""),
    ("B", "Paris", CITIES, ""), ("paris", "Paris", CITIES, ""), ("Parisian", "Paris", CITIES, ""),
    ("Paris", "B", [], CITY_Q), ("Rome", "B", [], CITY_Q), ("(b)", "B", [], CITY_Q), ("B", "B", [], CITY_Q),
    ("B", "B (60°)", [], ""), ("60°", "B (60°)", [], ""), ("(B)", "B (60°)", [], ""), ("A", "B (60°)", [], ""),
    ("B", "B (60°)", ANGLES, ""), ("$60^{\\circ}$", "B", ANGLES, ""), ("60", "B", ANGLES, ""),
    ("Yes", "A) Yes", [], SHARK_Q), ("A", "A) Yes", [], SHARK_Q), ("No", "A) Yes", [], SHARK_Q),
    ("A) Yes", "A) Yes", [], SHARK_Q), ("B) No", "A) Yes", [], SHARK_Q),
    ("O", "D", SIMON, ""), ("D", "D", SIMON, ""), ("A", "D", SIMON, ""),
    ("$10 \\mathrm{~cm}^{2}$", "B", AREAS, ""), ("10 cm^2", "B", AREAS, ""), ("B", "B", AREAS, ""),
    ("15 minutes", "15 minutes", WAIT, ""), ("B", "15 minutes", WAIT, ""), ("1 hour", "15 minutes", WAIT, ""),
    ("Atlantic Zoo", "Atlantic Zoo", ZOOS, ""), ("B", "Atlantic Zoo", ZOOS, ""), ("the Atlantic Zoo", "Atlantic Zoo", ZOOS, ""),
    ("Pacific Zoo", "Atlantic Zoo", ZOOS, ""), ("zoo", "Atlantic Zoo", ZOOS, ""),
    ("mushroom", "mushroom", LICHEN, ""), ("B", "mushroom", LICHEN, ""), ("bilberry", "mushroom", LICHEN, ""),
    ("Africa", "Africa", [], EQUATOR_Q), ("africa.", "Africa", [], EQUATOR_Q), ("Europe", "Africa", [], EQUATOR_Q),
    ("North America and Africa", "Africa", [], EQUATOR_Q),
    # yes / no variants
    ("yes", "yes", YES_NO, ""), ("Yes.", "yes", [], ""), ("true", "yes", [], ""), ("no", "yes", [], ""),
    ("yes, it is", "yes", [], ""), ("incorrect", "yes", [], ""), ("no idea", "No", [], ""),
    ("false", "no", YES_NO, ""), ("not sure", "no", [], ""), ("affirmative", "Yes", [], ""), ("", "yes", [], ""),
    # numbers: commas, percent, units, LaTeX, tolerance edges
    ("318", "318", [], ""), ("318 calls", "318", [], ""), ("1,471", "1,471", [], ""), ("1471", "1,471", [], ""),
    ("1,000", "1000", [], ""), ("25%", "25", [], ""), ("0.25", "25%", [], ""), ("$5.86", "5.86", [], ""),
    ("5.86 dollars", "5.86", [], ""), ("\\frac{25}{3}", "\\frac{25}{3}", [], ""), ("8.333", "\\frac{25}{3}", [], ""),
    ("25/3", "\\frac{25}{3}", [], ""), ("24+4\\pi", "24+4\\pi", [], ""), ("\\sqrt{34}", "\\sqrt{34}", [], ""),
    ("$\\frac{2}{21}$", "$\\frac{2}{21}$", [], ""), ("0.75", "$\\boxed{\\frac{3}{4}}$", [], ""),
    ("10.049", "10", [], ""), ("10.051", "10", [], ""), ("0.049", "0", [], ""), ("0.051", "0", [], ""),
    ("109", "100", [], ""), ("91", "100", [], ""), ("111", "100", [], ""), ("89", "100", [], ""),
    ("114", "100", [], ""), ("116", "100", [], ""), ("114.123", "100", [], ""), ("1.4", "1.35", [], ""),
    ("62.8", "62.80", [], ""), ("0.03", "0.024", [], ""), ("0.03", "0.02", [], ""), ("0.5", "0.54", [], ""),
    ("-3", "3", [], ""), ("\u22123", "-3", [], ""), ("1e5", "100000", [], ""), ("3 or 4", "4", [], ""),
    ("about 12", "12.5", [], ""), ("the answer is 7", "7", [], ""), ("resultanswer 3", "3", [], ""),
    ("1" * 400, "1" * 400, [], ""), ("1" * 400, "5", [], ""), ("5", "1" * 400, [], ""),
    ("3:15 P.M.", "3:15 P.M.", [], ""), ("2:15 P.M.", "3:15 P.M.", [], ""), ("7:30 P.M.", "7:30 P.M.", WAIT, ""),
    # empty / non-answers / text
    ("", "B", CITIES, ""), ("", "Atlantic Zoo", [], ""), ("", "318", [], ""), ("insufficient information", "B", CITIES, ""),
    ("insufficient information", "There is insufficient information", [], ""), ("none", "none", [], ""),
    ("n/a", "B", [], ""), ("unknown", "2 hours and 45 minutes", [], ""),
    ("2 hours and 45 minutes", "2 hours and 45 minutes", [], ""), ("2 hours", "2 hours and 45 minutes", [], ""),
    ("It depends upon the sizes of the rectangles", "E", ["1", "2", "3", "4", "It depends upon the sizes of the rectangles"], ""),
    ("‘quoted’", "'quoted'", [], ""), ("`tick`", "'tick'", [], ""), ("  spaced   out ", "spaced out", [], ""),
    ("b.5", "B", CITIES, ""), ("x) y", "X", [], ""), ("f(X) = 3", "X", [], "f(X) = 3 is given"),
]


def test_hand_written_case_count() -> None:
    assert len(HAND_CASES) >= 100


@pytest.mark.parametrize(("pred", "ref", "options", "question"), HAND_CASES)
def test_crystal_parity_hand_written(pred: str, ref: str, options: list[str], question: str) -> None:
    assert_parity(pred, ref, options, question)


# --- cases derived from every record of data/samples ----------------------------------------------

def _perturbed(value: str) -> list[str]:
    try:
        number = float(value.replace(",", ""))
    except ValueError:
        return []
    return [
        f"{number + 0.049:g}",
        f"{number - 0.06:g}",
        f"{number * 1.09:.3f}",
        f"{number * 1.11:.3f}",
        f"{number * 1.14:.0f}",
        f"{number:,.0f}" if number >= 1000 else f"{number:.2f}",
    ]


def _mathvision_cases(root: Path) -> list[tuple[str, str, list[str], str]]:
    cases = []
    for line in (root / "mathvision" / "test_subset.jsonl").read_text().splitlines():
        rec = json.loads(line)
        question, options, answer = rec["question"], rec["options"], rec["answer"]
        preds = [answer, f"({answer})", "", "insufficient information", f"The answer is {answer}."]
        if options and len(answer) == 1 and "A" <= answer <= "E":
            index = ord(answer) - ord("A")
            wrong = chr(ord("A") + (index + 1) % len(options))
            preds += [options[index], wrong, f"{answer}) {options[index]}", f"{wrong} or {answer}", "A B C D E"]
        preds += _perturbed(answer)
        cases += [(pred, answer, options, question) for pred in preds]
    return cases


def _tabmwp_cases(root: Path) -> list[tuple[str, str, list[str], str]]:
    cases = []
    for rec in json.loads((root / "tabmwp" / "problems_test1k_subset.json").read_text()).values():
        question, choices, answer, unit = rec["question"], rec["choices"] or [], rec["answer"], rec["unit"]
        preds = [answer, answer.replace(",", ""), ""]
        if unit:
            preds += [f"{answer} {unit}", f"{unit}{answer}"]
        if choices:
            index = choices.index(answer)
            preds += [chr(ord("A") + index), choices[(index + 1) % len(choices)], " or ".join(choices)]
        preds += _perturbed(answer)
        cases += [(pred, answer, choices, question) for pred in preds]
    return cases


def _scienceqa_cases(root: Path) -> list[tuple[str, str, list[str], str]]:
    cases = []
    problems = json.loads((root / "scienceqa" / "data" / "scienceqa" / "problems_subset.json").read_text())
    for rec in problems.values():
        question, choices, index = rec["question"], rec["choices"], rec["answer"]
        letter, text = chr(ord("A") + index), choices[index]
        other = choices[(index + 1) % len(choices)]
        for ref in (letter, text):
            for pred in (letter, text, f"({letter})", other, text.upper(), "", f"{letter}) {text}"):
                cases.append((pred, ref, choices, question))
    return cases


def _gallery_cases(root: Path) -> list[tuple[str, str, list[str], str]]:
    cases = []
    for line in (root / "crystal_gallery" / "gallery.jsonl").read_text().splitlines():
        rec = json.loads(line)
        question, answer = rec["question"], rec["answer"]
        preds = [answer, answer.lower(), "", "insufficient information", "A", "B", "(B)", "Yes", "no", "60°", "3",
                 "4", "Africa", "Europe", "A or B"]
        cases += [(pred, answer, [], question) for pred in preds]
    return cases


def test_crystal_parity_on_samples(samples_dir: Path) -> None:
    cases = (
        _mathvision_cases(samples_dir)
        + _tabmwp_cases(samples_dir)
        + _scienceqa_cases(samples_dir)
        + _gallery_cases(samples_dir)
    )
    assert len(cases) >= 100
    # the real answers cover every branch of the protocol
    kinds = {check_answer(p, r, options=o, question=q, mode="crystal").match_type for p, r, o, q in cases}
    assert kinds == {"numeric_exact", "numeric_rounded", "numeric_mismatch", "yes_no", "choice", "exact", "invalid"}
    assert mismatches(cases) == []


# --- random strings ----------------------------------------------------------------------------------

_TOKENS = st.sampled_from(
    ["A", "B", "b", "(", ")", ".", ",", " ", "\n", "yes", "no", "true", "incorrect", "option ", "answer is ",
     "the answer is", "about", "1", "0.05", "-", "2.5", "10", "%", "Paris", "paris", "’", "“", "`", "'", "\\frac{1}{2}"]
)
_TEXT = st.lists(_TOKENS, max_size=8).map("".join)


@settings(max_examples=400, deadline=None)
@given(pred=_TEXT, ref=_TEXT, options=st.lists(_TEXT, max_size=4), question=_TEXT)
def test_crystal_parity_random(pred: str, ref: str, options: list[str], question: str) -> None:
    assert_parity(pred, ref, options, question)
