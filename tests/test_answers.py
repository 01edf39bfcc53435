"""Tests for cpr.answers in strict mode (rewards) and the strict / crystal contrasts (docs/method.md section 5).

Every expectation below was worked out by hand from the rules in the module docstring;
crystal-mode parity with crystal-metrics itself is in test_answers_parity.py.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

import cpr.answers as answers
from cpr.answers import ANSWER_MODES, AnswerCheck, check_answer, is_non_answer

CITIES = ["London", "Paris", "Rome", "Berlin"]
SIMON = ["S", "I", "M", "O", "N"]
RECTANGLES = [  # MATH-V options, answer A
    "$18 \\mathrm{~cm}$",
    "$17 \\mathrm{~cm}$",
    "$20 \\mathrm{~cm}$",
    "$19 \\mathrm{~cm}$",
    "It depends upon the sizes of the rectangles",
]
WAIT = ["45 minutes", "15 minutes", "1 hour", "30 minutes"]  # TabMWP choices


def _case(pred, ref, correct, kind, options=(), question=""):
    return pytest.param(pred, ref, list(options), question, correct, kind, id=f"{ref!r}<-{pred!r}")


CHOICE_CASES = [
    # reference letter B with options: every accepted form
    _case("B", "B", True, "choice", CITIES),
    _case("(B)", "B", True, "choice", CITIES),
    _case("B)", "B", True, "choice", CITIES),
    _case("B.", "B", True, "choice", CITIES),
    _case("[B]", "B", True, "choice", CITIES),
    _case("b", "B", True, "choice", CITIES),
    _case("B) Paris", "B", True, "choice", CITIES),
    _case("B: paris", "B", True, "choice", CITIES),
    _case("Paris", "B", True, "choice", CITIES),
    _case("  paris. ", "B", True, "choice", CITIES),
    _case("option B", "B", True, "choice", CITIES),
    _case("Option (B)", "B", True, "choice", CITIES),
    _case("The answer is B.", "B", True, "choice", CITIES),
    _case("Answer: (B)", "B", True, "choice", CITIES),
    # ... and every form that must not match
    _case("A or B", "B", False, "choice", CITIES),
    _case("AB", "B", False, "choice", CITIES),
    _case("B C", "B", False, "choice", CITIES),
    _case("A, B", "B", False, "choice", CITIES),
    _case("A B C D", "B", False, "choice", CITIES),
    _case("A/B", "B", False, "choice", CITIES),
    _case("(A) or (B)", "B", False, "choice", CITIES),
    _case("Paris or London", "B", False, "choice", CITIES),
    _case("Paris and Rome", "B", False, "choice", CITIES),
    _case("B) London", "B", False, "choice", CITIES),
    _case("A", "B", False, "choice", CITIES),
    _case("E", "B", False, "choice", CITIES),
    _case("Lyon", "B", False, "choice", CITIES),
    # reference given as option text or letter with text
    _case("B", "Paris", True, "choice", CITIES),
    _case("paris", "Paris", True, "choice", CITIES),
    _case("C", "Paris", False, "choice", CITIES),
    _case("B", "B (Paris)", True, "choice", CITIES),
    # CRYSTAL gallery references without an options list
    _case("B", "B (60°)", True, "choice"),
    _case("(B)", "B (60°)", True, "choice"),
    _case("60°", "B (60°)", True, "choice"),
    _case("60", "B (60°)", True, "choice"),
    _case("B) 60°", "B (60°)", True, "choice"),
    _case("A", "B (60°)", False, "choice"),
    _case("50°", "B (60°)", False, "choice"),
    _case("B) 50°", "B (60°)", False, "choice"),
    _case("B) or C", "B (60°)", False, "choice"),
    _case("Yes", "A) Yes", True, "choice"),
    _case("A", "A) Yes", True, "choice"),
    _case("yes.", "A) Yes", True, "choice"),
    _case("No", "A) Yes", False, "choice"),
    _case("B", "A) Yes", False, "choice"),
    _case("A", "A", True, "choice"),
    _case("(a)", "A", True, "choice"),
    _case("B", "A", False, "choice"),
    _case("A or B", "A", False, "choice"),
    _case("A) or B", "A", False, "choice"),
    # options written in the question
    _case("Paris", "B", True, "choice", (), "Which city?\nA) London\nB) Paris\nC) Rome"),
    _case("Rome", "B", False, "choice", (), "Which city?\nA) London\nB) Paris\nC) Rome"),
    _case("(B)", "B", True, "choice", (), "Which city?\n(A) London\n(B) Paris"),
    # letters beyond the options are read as option text (MATH-V options S I M O N, answer D)
    _case("O", "D", True, "choice", SIMON),
    _case("D", "D", True, "choice", SIMON),
    _case("A", "D", False, "choice", SIMON),
    _case("N", "D", False, "choice", SIMON),
    # option texts compared as values (units dropped, LaTeX)
    _case("18 cm", "A", True, "choice", RECTANGLES),
    _case("18", "A", True, "choice", RECTANGLES),
    _case("$18 \\mathrm{~cm}$", "A", True, "choice", RECTANGLES),
    _case("17", "A", False, "choice", RECTANGLES),
    _case("it depends upon the sizes of the rectangles", "A", False, "choice", RECTANGLES),
    _case("15 minutes", "15 minutes", True, "choice", WAIT),
    _case("15", "15 minutes", True, "choice", WAIT),
    _case("B", "15 minutes", True, "choice", WAIT),
    _case("1 hour", "15 minutes", False, "choice", WAIT),
    _case("60 minutes", "15 minutes", False, "choice", WAIT),
    _case("yes", "yes", True, "choice", ["yes", "no"]),
    _case("True", "yes", True, "choice", ["yes", "no"]),
    _case("A", "yes", True, "choice", ["yes", "no"]),
    _case("no", "yes", False, "choice", ["yes", "no"]),
    _case("yes or no", "yes", False, "choice", ["yes", "no"]),
]

YES_NO_CASES = [
    _case("Yes", "yes", True, "yes_no"),
    _case("yes.", "yes", True, "yes_no"),
    _case("TRUE", "yes", True, "yes_no"),
    _case("no", "yes", False, "yes_no"),
    _case("yes, it is", "yes", False, "yes_no"),
    _case("not yes", "yes", False, "yes_no"),
    _case("yesterday", "yes", False, "yes_no"),
    _case("y", "yes", False, "yes_no"),
    _case("false", "No", True, "yes_no"),
    _case("no", "No", True, "yes_no"),
    _case("No way", "No", False, "yes_no"),
    _case("incorrect", "yes", False, "yes_no"),
]

NUMBER_CASES = [
    _case("318", "318", True, "numeric"),
    _case("318 calls", "318", True, "numeric"),
    _case("318", "318 calls", True, "numeric"),
    _case("318.0", "318", True, "numeric"),
    _case("$318", "318", True, "numeric"),
    _case("319", "318", False, "numeric"),
    _case("3 or 318", "318", False, "exact"),
    _case("318 or 319", "318", False, "exact"),
    _case("318, 319", "318", False, "exact"),
    _case("318 319", "318", False, "exact"),
    _case("318 or more", "318", False, "exact"),
    _case("1471", "1,471", True, "numeric"),
    _case("1,471", "1,471", True, "numeric"),
    _case("1.471", "1,471", False, "numeric"),
    _case("1,000", "1000", True, "numeric"),
    _case("25/3", "\\frac{25}{3}", True, "math"),
    _case("$\\dfrac{25}{3}$", "\\frac{25}{3}", True, "math"),
    _case("8.333333", "\\frac{25}{3}", True, "math"),
    _case("8.333", "\\frac{25}{3}", False, "math"),
    _case("8.33", "\\frac{25}{3}", False, "math"),
    _case("8", "\\frac{25}{3}", False, "math"),
    _case("0.466019", "48/103", True, "numeric"),
    _case("0.466", "48/103", False, "numeric"),
    _case("25", "25%", True, "numeric"),
    _case("0.25", "25%", True, "numeric"),
    _case("0.5", "25%", False, "numeric"),
    _case("$5.86", "5.86", True, "numeric"),
    _case("5.860", "5.86", True, "numeric"),
    _case("5.87", "5.86", False, "numeric"),
    _case("4\\pi+24", "24+4\\pi", True, "math"),
    _case("24 + 4π", "24+4\\pi", True, "math"),
    _case("36.566", "24+4\\pi", False, "math"),
    _case("5.830952", "\\sqrt{34}", True, "math"),
    _case("5.83", "\\sqrt{34}", False, "math"),
    _case("2/21", "$\\frac{2}{21}$", True, "math"),
    _case("0.75", "$\\boxed{\\frac{3}{4}}$", True, "math"),
    _case("x = 90", "90", True, "numeric"),
    _case("90°", "90", True, "numeric"),
    _case("90^\\circ", "90", True, "numeric"),
    _case("6 = 90", "90", False, "exact"),
    _case("\\pm 90", "90", False, "exact"),
    _case("\u22123", "-3", True, "numeric"),
    _case("3", "-3", False, "numeric"),
    _case("1.5e3", "1500", True, "math"),
    _case("\\frac{1}{", "5", False, "exact"),
    _case("1/0", "5", False, "exact"),
    _case("10^{10^{10}}", "5", False, "exact"),
    _case("3 a b", "3", False, "exact"),
]

# math-verify's reading (normalisation, whole answer only) and the rewrites it lacks
MATH_VERIFY_CASES = [
    _case("\\boxed{3} or \\boxed{4}", "4", False, "exact"),  # two boxes make a list
    _case("3 answer: \\frac{8}{2}", "4", False, "exact"),  # a value read from a part only
    _case("$3$ apples $4$", "4", False, "exact"),
    _case("4 \\text{ or } 3", "4", False, "exact"),
    _case("3 \\boxed{4}", "4", True, "numeric"),  # math-verify: the box holds the answer
    _case("18 \\text{ cm}", "18", True, "numeric"),
    _case("1,471 vehicles", "1,471", True, "numeric"),
    _case("\\frac12", "0.5", True, "math"),
    _case("The answer is 5.", "5", True, "numeric"),
    _case("($\\frac{2}{21}$)", "$\\frac{2}{21}$", True, "math"),
]

TEXT_CASES = [
    _case("Atlantic Zoo", "Atlantic Zoo", True, "exact"),
    _case("atlantic zoo.", "Atlantic Zoo", True, "exact"),
    _case("the Atlantic Zoo", "Atlantic Zoo", True, "exact"),
    _case("“Atlantic  Zoo”", "Atlantic Zoo", True, "exact"),
    _case("Atlantic", "Atlantic Zoo", False, "exact"),
    _case("Atlantic Zoo and Pacific Zoo", "Atlantic Zoo", False, "exact"),
    _case("africa", "Africa", True, "exact"),
    _case("Africa, Europe", "Africa", False, "exact"),
    _case("3:15 p.m.", "3:15 P.M.", True, "exact"),
    _case("3:15 PM", "3:15 P.M.", False, "exact"),
    _case("2 hours and 45 minutes", "2 hours and 45 minutes", True, "exact"),
    _case("2 hours", "2 hours and 45 minutes", False, "exact"),
    _case("45", "2 hours and 45 minutes", False, "exact"),
    _case("Ｐａｒｉｓ", "Paris", True, "exact"),
]

NON_ANSWERS = ["", "   ", "insufficient information", "Insufficient information.", "none", "None", "N/A",
               "unknown", "...", "?!", "Answer:", "\\boxed{}", "$$", "(none)", "null"]
REFERENCES = [("B", CITIES), ("yes", []), ("5", []), ("none", []), ("unknown", []),
              ("insufficient information", []), ("Atlantic Zoo", [])]


@pytest.mark.parametrize(
    ("pred", "ref", "options", "question", "correct", "kind"),
    CHOICE_CASES + YES_NO_CASES + NUMBER_CASES + MATH_VERIFY_CASES + TEXT_CASES,
)
def test_strict_rules(pred: str, ref: str, options: list, question: str, correct: bool, kind: str) -> None:
    result = check_answer(pred, ref, options=options, question=question)
    assert (result.correct, result.match_type) == (correct, kind)
    assert check_answer(pred, ref, options=options, question=question).correct is correct


@pytest.mark.parametrize("mode", ANSWER_MODES)
@pytest.mark.parametrize("pred", NON_ANSWERS)
@pytest.mark.parametrize(("ref", "options"), REFERENCES)
def test_non_answers_are_never_correct(pred: str, ref: str, options: list, mode: str) -> None:
    assert is_non_answer(pred)
    result = check_answer(pred, ref, options=options, mode=mode)
    assert result.correct is False
    assert result.match_type == "invalid"


def test_non_answer_against_a_reference_that_contains_it() -> None:
    # crystal-metrics' substring fallback accepts both; the non-answer rule holds in crystal mode too
    assert check_answer("", "Atlantic Zoo", mode="crystal") == AnswerCheck(False, "invalid", "", "atlantic zoo")
    ref = "There is insufficient information in the chart"
    assert check_answer("insufficient information", ref, mode="crystal").correct is False
    assert [is_non_answer(p) for p in ("0", "B", "no", "x = 5", "none of them")] == [False] * 5


def test_normalised_fields() -> None:
    assert check_answer("B) Paris", "B", options=CITIES) == AnswerCheck(True, "choice", "B", "B")
    assert check_answer("Paris", "B", options=CITIES) == AnswerCheck(True, "choice", "B", "B")
    assert check_answer("TRUE", "Yes") == AnswerCheck(True, "yes_no", "yes", "yes")
    assert check_answer("318 calls", "1,471") == AnswerCheck(False, "numeric", "318", "1471")
    assert check_answer("The Atlantic Zoo.", "atlantic zoo") == AnswerCheck(True, "exact", "atlantic zoo", "atlantic zoo")
    assert check_answer("N/A", "5") == AnswerCheck(False, "invalid", "n/a", "5")


# --- where the paper's protocol says correct and strict mode does not ------------------------------

CONTRASTS = [
    # (prediction, reference, options, why crystal accepts it)
    ("A B C D", "B", CITIES, "substring: 'b' in 'a b c d'"),
    ("A or B", "B", CITIES, "substring: 'b' in 'a or b'"),
    ("Paris", "Paris France", [], "substring fallback"),
    ("11", "10", [], "relative error 0.1 <= 10%"),
    ("10.049", "10", [], "|p-g| = 0.049 <= 0.05"),
    ("incorrect", "yes", [], "'incorrect' contains 'correct' -> yes"),
    ("no idea", "No", [], "'no idea' contains 'no'"),
]


@pytest.mark.parametrize(("pred", "ref", "options", "why"), CONTRASTS, ids=[c[3] for c in CONTRASTS])
def test_crystal_accepts_but_strict_rejects(pred: str, ref: str, options: list, why: str) -> None:
    assert check_answer(pred, ref, options=options, mode="crystal").correct is True, why
    assert check_answer(pred, ref, options=options, mode="strict").correct is False


# --- arguments and errors ---------------------------------------------------------------------------


def test_modes() -> None:
    assert ANSWER_MODES == ("strict", "crystal")


def test_unknown_mode_names_allowed_modes() -> None:
    with pytest.raises(ValueError, match=r"field 'mode': must be one of strict, crystal, got 'lenient'"):
        check_answer("B", "B", mode="lenient")


def test_empty_reference_is_an_error_in_strict_mode() -> None:
    with pytest.raises(ValueError, match=r"reference answer is empty: '  '"):
        check_answer("B", "  ")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prediction": 3, "reference": "3"}, "prediction must be str, got int"),
        ({"prediction": "3", "reference": None}, "reference must be str, got NoneType"),
        ({"prediction": "3", "reference": "3", "question": 1.5}, "question must be str, got float"),
        ({"prediction": "3", "reference": "3", "options": "ABC"}, "got a single str"),
        ({"prediction": "3", "reference": "3", "options": ["a", 2]}, "option 1 must be str, got int"),
    ],
)
def test_type_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        check_answer(**kwargs)


def test_too_many_options() -> None:
    with pytest.raises(ValueError, match="at most 26 options can be lettered, got 27"):
        check_answer("A", "A", options=[str(i) for i in range(27)])


# --- math-verify integration -------------------------------------------------------------------------


def test_math_in_worker_thread_uses_no_signal_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list] = {"parse": [], "verify": []}
    real_parse, real_verify = answers.parse, answers.verify

    def spy_parse(*args, **kwargs):
        seen["parse"].append(kwargs["parsing_timeout"])
        return real_parse(*args, **kwargs)

    def spy_verify(*args, **kwargs):
        seen["verify"].append(kwargs["timeout_seconds"])
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(answers, "parse", spy_parse)
    monkeypatch.setattr(answers, "verify", spy_verify)
    answers._parse_math.cache_clear()
    results: list = []
    errors: list = []

    def work() -> None:
        try:
            results.append(check_answer("25/3", "\\frac{25}{3}"))
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(60)
    assert errors == []
    assert results == [AnswerCheck(True, "math", "25/3", "\\frac{25}{3}")]
    assert seen["parse"] and set(seen["parse"]) == {None}
    assert seen["verify"] == [None]

    seen["parse"].clear()
    seen["verify"].clear()
    answers._parse_math.cache_clear()
    assert check_answer("25/3", "\\frac{25}{3}").correct is True
    assert set(seen["parse"]) == {answers.MATH_VERIFY_TIMEOUT_S}
    assert seen["verify"] == [answers.MATH_VERIFY_TIMEOUT_S]
    answers._parse_math.cache_clear()


def test_unexpected_math_verify_error_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_verify(*args, **kwargs):
        raise RuntimeError("bug inside verify")

    monkeypatch.setattr(answers, "verify", broken_verify)
    with pytest.raises(RuntimeError, match="bug inside verify"):
        check_answer("25/3", "\\frac{25}{3}")


def test_math_verify_timeouts_count_as_not_equivalent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def slow_verify(*args, **kwargs):
        raise answers.TimeoutException("Operation timed out!")

    monkeypatch.setattr(answers, "verify", slow_verify)
    with caplog.at_level(logging.WARNING, logger="cpr.answers"):
        result = check_answer("25/3", "\\frac{25}{3}")
    assert result == AnswerCheck(False, "math", "25/3", "\\frac{25}{3}")
    assert "timed out comparing '25/3' with '\\\\frac{25}{3}'" in caplog.text


def test_math_verify_parse_timeout_means_not_math(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def slow_parse(*args, **kwargs):
        raise answers.TimeoutException("Operation timed out!")

    monkeypatch.setattr(answers, "parse", slow_parse)
    answers._parse_math.cache_clear()
    with caplog.at_level(logging.WARNING, logger="cpr.answers"):
        result = check_answer("25/3", "8.5")
    answers._parse_math.cache_clear()
    assert result == AnswerCheck(False, "exact", "25/3", "8.5")
    assert "timed out parsing '8.5'" in caplog.text


@pytest.mark.parametrize("pattern", [" ", "\\mathrm{cm} ", "1,000,", "(B) ", "A) x\n", "$", "yes ", "answer is "])
@pytest.mark.parametrize("mode", ANSWER_MODES)
def test_100_kb_answers_are_fast(pattern: str, mode: str) -> None:
    text = (pattern * (100_000 // len(pattern) + 1))[:100_000]
    start = time.perf_counter()
    for pred, ref in ((text, "B"), ("B", text + "x"), (text + "x", text + "x")):
        check_answer(pred, ref, options=CITIES, question=text, mode=mode)
    assert time.perf_counter() - start < 10.0  # a catastrophic backtrack takes minutes; 10 s holds on a loaded 2-core machine
