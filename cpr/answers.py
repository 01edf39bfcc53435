"""Final-answer correctness: a hard-to-game ``strict`` checker and the paper's ``crystal`` protocol.

SPEC section 5 asks for two modes (:data:`ANSWER_MODES`):

``"strict"`` (**choice**, default, used for rewards)
    Rules are tried in this order; the first that applies decides.

    1. *Non-answers are never correct*: after cleaning (below), an empty answer, one made
       only of punctuation / symbols, or one of ``"insufficient information"``, ``"none"``,
       ``"n/a"``, ``"unknown"``, ``"null"``, ``"nil"`` gives ``match_type="invalid"``,
       whatever the reference.
    2. *Multiple choice* (``match_type="choice"``) when options are known (the ``options``
       argument, else ``A) ...`` / ``(A) ...`` lines of ``question`` lettered A, B, C, ...
       consecutively) or when the reference itself is a letter form (``"B"``, ``"(B)"``,
       ``"B)"``, ``"B (60°)"``, ``"A) Yes"``). The reference is resolved to a letter: a letter
       form whose letter is among the options (its text after the letter is trusted), else
       the one option whose text is equivalent to it (rules 3-5). The prediction
       names a letter by a letter form (``"B"``, ``"(B)"``, ``"B)"``, ``"B."``, ``"B:"``,
       ``"[B]"``, ``"B (..)"``, ``"B) Paris"``, ``"option B"``; letters are case-insensitive)
       or by text equivalent to exactly one option (``"Paris"``). Text after the letter must
       be equivalent to that letter's option text (``"B) London"`` is wrong when B is Paris);
       where the option text is not known it must not name another letter or contain
       "or" / "and". A letter beyond the options is read as text (options ``S I M O N``:
       ``"O"`` names option D). So ``"A or B"``, ``"AB"``, ``"B C"``, ``"A, B"``,
       ``"A B C D"`` and text naming two options never match. Without options, a
       non-letter prediction matches only the text given in the reference (``"60°"`` for
       ``"B (60°)"``). With options known, a reference that is not one of them is compared
       by rules 3-5 (with a letter prediction replaced by its option text). A reference
       made of one letter and nothing else is always read as a choice letter; without
       options, ``"C. elegans"``-like references (letter, period, text) are read as text.
       With options ``["yes", "no"]`` the prediction ``"A"`` names ``yes``.
    3. *Yes / no* (``match_type="yes_no"``) when the normalised reference is exactly
       ``yes`` / ``true`` / ``no`` / ``false``: the normalised prediction must be exactly one
       of the tokens of the same polarity (``"Yes."`` matches ``yes``; ``"yes, it is"`` and
       ``"not yes"`` do not).
    4. *Numbers and LaTeX* (``match_type="numeric"`` for plain numbers, else ``"math"``):
       both sides are reduced to a math core (surrounding ``$``, ``\\(..\\)``, ``\\boxed{}``
       removed; ``$`` signs, degree marks, thousands separators ``1,000`` and trailing units
       - plain words after a number such as ``"318 calls"`` / ``"7 kg"``, or
       ``\\mathrm{..}`` / ``\\text{..}`` groups - removed; units are not compared), then
       parsed and compared with ``math_verify.parse`` / ``math_verify.verify`` (the
       reference is ``gold``). Tolerance policy = math-verify's: exact symbolic equality
       for integers, fractions and expressions (``\\frac{25}{3}`` == ``25/3``, ``2\\sqrt{3}``
       == ``\\sqrt{12}``), and a decimal equals a value when both agree after rounding to 6
       decimal places (``8.333333`` == ``\\frac{25}{3}`` but ``8.33`` and ``8.333`` do not);
       percentages follow math-verify (``25%`` equals both ``25`` and ``0.25``).
       Both cores must be *one* expression of at most 120 characters (1000 before
       reduction), with no word other than a function name (``sin``, ``log``, ...), no
       abbreviation (``P.M.``), no two numbers separated only by a space, no nested
       exponent and no exponent of more than 4 digits. The prediction is further held to the
       reference's vocabulary: LaTeX commands from the arithmetic list (``\\frac``,
       ``\\sqrt``, ``\\pi``, ``\\cdot``, ``\\times``, ``\\div``, ``\\infty``) or used by
       the reference (so ``\\pm`` is refused unless the reference has it), letters and
       function names only if the reference uses them, ``!`` only if the reference has one,
       a comma or semicolon only if the reference has one, and a relation only if the
       reference is one - except that ``x = 5`` is read as ``5``. So ``"3 or 4"``,
       ``"3, 4"``, ``"3 4"``, ``"6 = 90"`` are never equal to ``3`` or ``90``. A parse that
       drops a letter written in the core (math-verify reads ``"3 a b"`` as ``3``) or gives
       an undefined value (``1/0``) counts as not parsed. If either side does not reduce or
       parse, the checker goes on to rule 5.
    5. *Normalised exact match* (``match_type="exact"``): Unicode NFKC, case-folded, smart
       quotes made ASCII, whitespace collapsed, punctuation stripped from both ends, and a
       leading article (``a`` / ``an`` / ``the``) dropped. No substring matching.

    *Cleaning* applied to both sides first: surrounding whitespace; one leading ``Answer:``
    / ``Final answer:`` / ``The answer is`` prefix; then a surrounding ``$..$``,
    ``\\(..\\)``, ``\\[..\\]`` or ``\\boxed{..}`` (repeatedly).

    math-verify robustness: its timeouts use ``signal.alarm``, which only works in the main
    thread, so ``parsing_timeout`` / ``timeout_seconds`` are 5 s in the main thread and
    ``None`` elsewhere (TRL may call reward functions from worker threads); there the input
    limits of rule 4 are what keeps SymPy's work small (a reference that itself combines
    factorials and logarithms could still make a comparison slow without a timer). math-verify reports its own parse
    failures by returning no SymPy result (``fallback_mode="no_fallback"``), which counts as
    "not math". A math-verify ``TimeoutException`` (parse or compare) counts as "not
    equivalent" and is logged as a warning. Any other exception propagates
    (``raise_on_error=True``).

``"crystal"`` (paper evaluation protocol, comparable with the paper's tables)
    Reproduces ``crystal_metrics.AccuracyCalculator().evaluate_single(question, prediction,
    reference).is_correct`` (crystal-metrics 0.2.0, LLM judge off), written independently:
    numbers first (first number of each side; equal if ``|p-g| <= 0.05``, relative error
    ``<= 10 %``, ``|p-g| < 0.01``, or - when the prediction shows at most 2 decimals -
    relative error ``< 15 %`` or equality with the reference rounded to those decimals),
    then yes/no (substring based), multiple choice (letters or option text read from
    ``X) text`` in the question), normalised exact match, single-word mismatch, substring
    fallback. ``match_type`` uses crystal-metrics' labels (``numeric_exact``,
    ``numeric_rounded``, ``numeric_mismatch``, ``yes_no``, ``choice``, ``exact``). When
    ``options`` are given and the question holds no line starting with ``A)``, the options
    are appended to the question as ``"A) text"`` lines (newlines inside an option replaced
    by spaces) before the option mapping. This mode is lenient and gameable (an empty
    prediction is a substring of every reference); use it only for evaluation tables.

Source: SPEC section 5; CRYSTAL paper (arXiv 2603.13099) Eq. 2; crystal-metrics 0.2.0
``accuracy.py`` (behaviour reproduced and checked by ``tests/test_answers_parity.py``);
math-verify (HuggingFace) for equivalence of numbers and LaTeX.
"""

from __future__ import annotations

import functools
import logging
import re
import string
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from math_verify import LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from sympy import Basic, MatrixBase, S

__all__ = ["ANSWER_MODES", "AnswerCheck", "check_answer", "is_correct", "is_non_answer"]

logger = logging.getLogger(__name__)

ANSWER_MODES = ("strict", "crystal")

LETTERS = string.ascii_uppercase
MATH_VERIFY_TIMEOUT_S = 5


@dataclass(frozen=True)
class AnswerCheck:
    """Outcome of :func:`check_answer`.

    Attributes:
        correct: whether the prediction counts as correct.
        match_type: the rule that decided: strict mode ``"invalid" | "choice" | "yes_no" |
            "numeric" | "math" | "exact"``; crystal mode crystal-metrics' labels
            ``"numeric_exact" | "numeric_rounded" | "numeric_mismatch" | "yes_no" | "choice" |
            "exact"``.
        normalized_prediction: the prediction as that rule compared it (letter, yes/no token,
            math core, normalised text).
        normalized_reference: the reference as that rule compared it.
    """

    correct: bool
    match_type: str
    normalized_prediction: str
    normalized_reference: str


def check_answer(
    prediction: str,
    reference: str,
    *,
    options: Sequence[str] = (),
    question: str = "",
    mode: str = "strict",
) -> AnswerCheck:
    """Judge a predicted final answer against the reference answer.

    Args:
        prediction: the model's answer text (e.g. ``ParsedCompletion.answer``).
        reference: the dataset's answer: a letter (``"B"``), a letter with its option
            (``"B (60°)"``, ``"A) Yes"``), an option text, a number / LaTeX value or text.
        options: option texts in order, lettered A, B, C, ... (at most 26); empty for
            free-form questions.
        question: the question text; used for options written as ``A) ...`` lines in it
            (both modes) and by the crystal protocol.
        mode: ``"strict"`` (default, for rewards) or ``"crystal"`` (paper evaluation); see the
            module docstring for the rules of each.

    Returns:
        An :class:`AnswerCheck`.

    Raises:
        ValueError: ``mode`` is not one of :data:`ANSWER_MODES`; more than 26 options; in
            strict mode, a reference that is empty or only whitespace.
        TypeError: ``prediction``, ``reference``, ``question`` or an option is not a ``str``,
            or ``options`` is a single ``str``.
    """
    if mode not in ANSWER_MODES:
        raise ValueError(f"unknown answer mode {mode!r}; allowed modes: {', '.join(ANSWER_MODES)}")
    for name, value in (("prediction", prediction), ("reference", reference), ("question", question)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be str, got {type(value).__name__}")
    if isinstance(options, str):
        raise TypeError("options must be a sequence of option texts, got a single str")
    opts = list(options)
    for i, opt in enumerate(opts):
        if not isinstance(opt, str):
            raise TypeError(f"option {i} must be str, got {type(opt).__name__}")
    if len(opts) > len(LETTERS):
        raise ValueError(f"at most {len(LETTERS)} options can be lettered, got {len(opts)}")
    if mode == "crystal":
        return _crystal_check(prediction, reference, _render_options(question, opts))
    return _strict_check(prediction, reference, opts, question)


def is_correct(
    prediction: str,
    reference: str,
    *,
    options: Sequence[str] = (),
    question: str = "",
    mode: str = "strict",
) -> bool:
    """``check_answer(...).correct``; same arguments and errors as :func:`check_answer`."""
    return check_answer(prediction, reference, options=options, question=question, mode=mode).correct


# =================================================================================================
# crystal mode: the CRYSTAL paper's protocol (crystal-metrics 0.2.0 AccuracyCalculator)
# =================================================================================================

_CR_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "`": "'"})
_CR_LONE_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")
_CR_DROPPED = re.compile(r"""[,()"\[\]{}']""")
_CR_SPACES = re.compile(r"\s+")
# Lead-ins deleted (in this order, everywhere) before the first number is read.
_CR_LEAD_INS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"the answer is:?\s*",
        r"the result is:?\s*",
        r"answer:?\s*",
        r"result:?\s*",
        r"approximately:?\s*",
        r"about:?\s*",
    )
)
_CR_NUMBER = re.compile(r"-?\d+\.?\d*")
_CR_SINGLE_LETTER = re.compile(r"[a-z]")
# Letter patterns on normalised text. The normaliser deletes "(" and ")", so crystal-metrics'
# parenthesised patterns can never match and are left out; the order of the others is kept.
_CR_LETTER_PATTERNS = tuple(
    re.compile(p) for p in (r"^([a-z])\.", r"option\s+([a-z])", r"choice\s+([a-z])", r"answer\s+is\s+([a-z])")
)
_CR_OPTION = re.compile(r"([A-Z])\)\s*([^\n]+)")
_CR_YES_NO = ("yes", "no", "true", "false")
_CR_YES_WORDS = ("yes", "true", "correct", "affirmative")
_CR_NO_WORDS = ("no", "false", "incorrect", "negative")
_HAS_OPTION_LINE = re.compile(r"^[ \t]*A\)", re.MULTILINE)

_CR_ABS_TOL = 0.05
_CR_REL_TOL = 0.1
_CR_DELTA = 1e-10


def _render_options(question: str, options: list[str]) -> str:
    """Question text with ``"A) option"`` lines appended (unless it already has an ``A)`` line)."""
    if not options or _HAS_OPTION_LINE.search(question):
        return question
    lines = [f"{LETTERS[i]}) {' '.join(opt.splitlines())}" for i, opt in enumerate(options)]
    return "\n".join([question, *lines]) if question else "\n".join(lines)


def _cr_normalize(text: str) -> str:
    out = text.strip().lower().translate(_CR_QUOTES)
    out = _CR_LONE_PERIOD.sub("", out)
    out = _CR_DROPPED.sub("", out)
    return _CR_SPACES.sub(" ", out)


def _cr_first_number(text: str) -> float | None:
    out = text.strip().lower()
    for lead_in in _CR_LEAD_INS:
        out = lead_in.sub("", out)
    found = _CR_NUMBER.search(out)
    return float(found.group(0)) if found is not None else None


def _cr_decimals_shown(value: float) -> int:
    shown = str(value).rstrip("0").rstrip(".")
    return len(shown.partition(".")[2])


def _cr_numbers_match(pred: float, gold: float) -> tuple[bool, str]:
    """Paper Eq. 2 plus crystal-metrics' extra rounding rules."""
    if pred == gold:
        return True, "numeric_exact"
    diff = abs(pred - gold)
    rel = diff / max(abs(gold), _CR_DELTA)
    if diff <= _CR_ABS_TOL or rel <= _CR_REL_TOL or diff < 0.01:
        return True, "numeric_rounded"
    if gold != 0:
        decimals = _cr_decimals_shown(pred)
        if decimals <= 2 and (rel < 0.15 or abs(pred - round(gold, decimals)) < 1e-6):
            return True, "numeric_rounded"
    return False, "numeric_mismatch"


def _cr_yes_no(text: str) -> str:
    norm = _cr_normalize(text)
    if any(word in norm for word in _CR_YES_WORDS):
        return "yes"
    if any(word in norm for word in _CR_NO_WORDS):
        return "no"
    return norm


def _cr_option_letter(answer: str, problem: str) -> str | None:
    answer_norm = _cr_normalize(answer)
    for letter, option_text in _CR_OPTION.findall(problem):
        option_norm = _cr_normalize(option_text)
        if answer_norm == option_norm:
            return letter
        if answer_norm in option_norm or option_norm in answer_norm:
            short, long = sorted((len(answer_norm), len(option_norm)))
            if long > 0 and short / long >= 0.8:
                return letter
    return None


def _cr_choice(text: str, problem: str) -> str | None:
    norm = _cr_normalize(text)
    if len(norm) <= 3 and _CR_SINGLE_LETTER.fullmatch(norm):
        return norm.upper()
    for pattern in _CR_LETTER_PATTERNS:
        found = pattern.search(norm)
        if found is not None:
            return found.group(1).upper()
    return _cr_option_letter(text, problem) if problem else None


def _crystal_check(prediction: str, reference: str, problem: str) -> AnswerCheck:
    pred_num = _cr_first_number(prediction)
    gold_num = _cr_first_number(reference)
    if pred_num is not None and gold_num is not None:
        ok, kind = _cr_numbers_match(pred_num, gold_num)
        return AnswerCheck(ok, kind, str(pred_num), str(gold_num))

    pred_norm = _cr_normalize(prediction)
    gold_norm = _cr_normalize(reference)
    if _cr_normalize(gold_norm) in _CR_YES_NO:
        pred_yn, gold_yn = _cr_yes_no(prediction), _cr_yes_no(reference)
        return AnswerCheck(pred_yn == gold_yn, "yes_no", pred_yn, gold_yn)

    pred_letter = _cr_choice(prediction, problem)
    gold_letter = _cr_choice(reference, problem)
    if pred_letter is not None and gold_letter is not None:
        return AnswerCheck(pred_letter == gold_letter, "choice", pred_letter, gold_letter)

    if pred_norm == gold_norm:
        return AnswerCheck(True, "exact", pred_norm, gold_norm)
    if len(pred_norm.split()) == 1 and len(gold_norm.split()) == 1:
        return AnswerCheck(False, "exact", pred_norm, gold_norm)
    return AnswerCheck(pred_norm in gold_norm or gold_norm in pred_norm, "exact", pred_norm, gold_norm)


# =================================================================================================
# strict mode
# =================================================================================================

NON_ANSWERS = frozenset({"insufficient information", "none", "n/a", "unknown", "null", "nil"})
_YES_TOKENS = frozenset({"yes", "true"})
_NO_TOKENS = frozenset({"no", "false"})

_PREFIX = re.compile(r"(?:the\s+)?(?:final\s+|correct\s+)?answer\b(?:\s+is\b)?\s*[:：]?\s*", re.IGNORECASE)
_WRAPPERS = (
    re.compile(r"\$\$(.*)\$\$", re.DOTALL),
    re.compile(r"\$(.*)\$", re.DOTALL),
    re.compile(r"\\\((.*)\\\)", re.DOTALL),
    re.compile(r"\\\[(.*)\\\]", re.DOTALL),
    re.compile(r"\\boxed\s*\{(.*)\}", re.DOTALL),
)
_ARTICLE = re.compile(r"(?:a|an|the)\s+")
_SPACES = re.compile(r"\s+")
_TEXT_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "`": "'"})

# Letter forms (matched in full on the cleaned answer, after an optional "option"/"choice").
_CHOICE_WORD = re.compile(r"(?:option|choice)\b\s*[:#]?\s*", re.IGNORECASE)
_LETTER_PAREN = re.compile(r"\(\s*([A-Za-z])\s*\)\s*(.*)", re.DOTALL)
_LETTER_BRACKET = re.compile(r"\[\s*([A-Za-z])\s*\]\s*(.*)", re.DOTALL)
_LETTER_CLOSE = re.compile(r"([A-Za-z])\s*\)\s*(.*)", re.DOTALL)
_LETTER_DOT = re.compile(r"([A-Za-z])\s*[.:]\s*(.*)", re.DOTALL)
_LETTER_ALONE = re.compile(r"([A-Za-z])")
_LETTER_THEN_PAREN = re.compile(r"([A-Za-z])\s+(\(.*\))", re.DOTALL)
_OTHER_LETTER = re.compile(r"\(\s*[A-Za-z]\s*\)|(?<![A-Za-z])[A-Z](?![A-Za-z])")
_OR_AND = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)
_QUESTION_OPTION = re.compile(r"^[ \t]*\(?([A-Z])[).:][ \t]*(\S[^\n]*)$", re.MULTILINE)


@dataclass(frozen=True)
class _LetterForm:
    letter: str  # upper case
    rest: str  # text after the letter (may be empty)


def _strict_check(prediction: str, reference: str, options: list[str], question: str) -> AnswerCheck:
    ref = _clean(reference)
    if not ref:
        raise ValueError(f"reference answer is empty: {reference!r}")
    pred = _clean(prediction)
    if _is_non_answer(pred):
        return AnswerCheck(False, "invalid", _norm_text(pred), _norm_text(ref))
    if not options:
        options = _options_from_question(question)

    ref_choice = _reference_choice(ref, options)
    if ref_choice is not None:
        return _check_choice(pred, ref_choice[0], ref_choice[1], options)

    form = _letter_form(pred) if options else None
    if form is not None and _letter_index(form.letter) < len(options):
        text = options[_letter_index(form.letter)]
        if form.rest and not _values_equal(form.rest, text).correct:
            return AnswerCheck(False, "choice", form.letter, _norm_text(ref))
        return _values_equal(text, ref)
    return _values_equal(pred, ref)


def _clean(text: str) -> str:
    out = text.strip()
    prefix = _PREFIX.match(out)
    if prefix is not None:
        out = out[prefix.end():].strip()
    for _ in range(4):
        before = out
        for wrapper in _WRAPPERS:
            found = wrapper.fullmatch(out)
            if found is not None:
                out = found.group(1).strip()
                break
        if out == before:
            break
    return out


def _strip_punctuation(text: str) -> str:
    start, end = 0, len(text)
    while start < end and _is_edge_char(text[start]):
        start += 1
    while end > start and _is_edge_char(text[end - 1]):
        end -= 1
    return text[start:end]


def _is_edge_char(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch).startswith("P")


def _norm_text(text: str) -> str:
    """NFKC, case-folded, ASCII quotes, collapsed spaces, outer punctuation and a leading article gone."""
    out = unicodedata.normalize("NFKC", text).casefold().translate(_TEXT_QUOTES)
    out = _strip_punctuation(_SPACES.sub(" ", out))
    article = _ARTICLE.match(out)
    if article is not None:
        out = _strip_punctuation(out[article.end():])
    return out


def _is_non_answer(cleaned: str) -> bool:
    norm = _norm_text(cleaned)
    return not any(ch.isalnum() for ch in norm) or norm in NON_ANSWERS


def is_non_answer(text: str) -> bool:
    """True for an empty answer, one made only of punctuation / symbols, or a non-answer such as
    ``"insufficient information"`` (strict rule 1 of the module docstring): never a correct answer."""
    return _is_non_answer(_clean(text))


def _options_from_question(question: str) -> list[str]:
    """Options written as ``A) text`` / ``(A) text`` / ``A. text`` lines, lettered from A without gaps."""
    found: list[str] = []
    for letter, text in _QUESTION_OPTION.findall(question):
        if _letter_index(letter) == len(found):
            found.append(text.strip())
        elif _letter_index(letter) == 0:
            found = [text.strip()]
    return found if len(found) >= 2 else []


def _letter_index(letter: str) -> int:
    return LETTERS.index(letter.upper())


def _letter_form(text: str, *, as_reference: bool = False) -> _LetterForm | None:
    """Read ``B``, ``(B)``, ``[B]``, ``B)``, ``B.``, ``B:``, ``B (..)``, ``B) text`` (+ ``option``)."""
    body = unicodedata.normalize("NFKC", text).strip()
    word = _CHOICE_WORD.match(body)
    if word is not None and word.end() < len(body):
        body = body[word.end():]
    patterns = [_LETTER_ALONE, _LETTER_PAREN, _LETTER_BRACKET, _LETTER_CLOSE, _LETTER_THEN_PAREN, _LETTER_DOT]
    for pattern in patterns:
        found = pattern.fullmatch(body)
        if found is None:
            continue
        rest = found.group(2).strip() if pattern.groups > 1 else ""
        if as_reference and pattern is _LETTER_DOT and rest:
            return None  # "C. elegans" is text, not option C (without options known)
        if rest.startswith("(") and rest.endswith(")"):
            rest = rest[1:-1].strip()
        return _LetterForm(found.group(1).upper(), rest)
    return None


def _reference_choice(ref: str, options: list[str]) -> tuple[str, str | None] | None:
    """(letter, that option's text if known) when the reference is a multiple-choice answer."""
    if options:
        form = _letter_form(ref)
        if form is not None and _letter_index(form.letter) < len(options):
            return form.letter, options[_letter_index(form.letter)]
        index = _matching_option(ref, options)
        return (LETTERS[index], options[index]) if index is not None else None
    form = _letter_form(ref, as_reference=True)
    if form is None:
        return None
    return form.letter, (form.rest or None)


def _matching_option(text: str, options: list[str]) -> int | None:
    """Index of the single option equivalent to ``text``; None for no match or several."""
    hits = [i for i, opt in enumerate(options) if opt.strip() and _values_equal(text, opt).correct]
    return hits[0] if len(hits) == 1 else None


def _check_choice(pred: str, ref_letter: str, ref_text: str | None, options: list[str]) -> AnswerCheck:
    form = _letter_form(pred)
    pred_letter: str | None = None
    if form is not None and (not options or _letter_index(form.letter) < len(options)):
        if options:
            text: str | None = options[_letter_index(form.letter)]
        else:
            text = ref_text if form.letter == ref_letter else None
        if form.rest:
            if text is not None:
                consistent = _values_equal(form.rest, text).correct
            else:
                consistent = _OTHER_LETTER.search(form.rest) is None and _OR_AND.search(form.rest) is None
            if not consistent:
                return AnswerCheck(False, "choice", _norm_text(pred), ref_letter)
        pred_letter = form.letter
    elif options:
        index = _matching_option(pred, options)
        pred_letter = LETTERS[index] if index is not None else None
    elif ref_text is not None and _values_equal(pred, ref_text).correct:
        pred_letter = ref_letter
    if pred_letter is None:
        return AnswerCheck(False, "choice", _norm_text(pred), ref_letter)
    return AnswerCheck(pred_letter == ref_letter, "choice", pred_letter, ref_letter)


def _values_equal(pred: str, ref: str) -> AnswerCheck:
    """Rules 3-5 (yes/no, numbers and LaTeX, normalised exact text) on cleaned answers."""
    pred, ref = _clean(pred), _clean(ref)
    pred_norm, ref_norm = _norm_text(pred), _norm_text(ref)
    if ref_norm in _YES_TOKENS or ref_norm in _NO_TOKENS:
        polarity = _YES_TOKENS if ref_norm in _YES_TOKENS else _NO_TOKENS
        return AnswerCheck(pred_norm in polarity, "yes_no", _yes_no_token(pred_norm), _yes_no_token(ref_norm))

    ref_math = _math_value(ref, None)
    if ref_math is not None:
        pred_math = _math_value(pred, ref_math)
        if pred_math is not None:
            kind = "numeric" if _PLAIN_NUMBER.fullmatch(pred_math.core) and _PLAIN_NUMBER.fullmatch(
                ref_math.core
            ) else "math"
            return AnswerCheck(_math_equal(ref_math, pred_math), kind, pred_math.core, ref_math.core)

    return AnswerCheck(pred_norm == ref_norm, "exact", pred_norm, ref_norm)


def _yes_no_token(norm: str) -> str:
    if norm in _YES_TOKENS:
        return "yes"
    if norm in _NO_TOKENS:
        return "no"
    return norm


# --- numbers and LaTeX via math-verify -------------------------------------------------------------

MAX_MATH_CHARS = 120
MAX_RAW_MATH_CHARS = 1000
MAX_EXPONENT_DIGITS = 4

_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*\d+)?\s*%?")
_NUMBER_WITH_UNIT = re.compile(
    r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*\d+)?\s*%?)\s*"
    r"([^\W\d_](?:[^\W\d_]|[ .'/\-])*?(?:\^\s*\{?\s*[23]\s*\}?|[23²³])?)"
)
_UNIT_WORD = re.compile(r"[^\W\d_]+")
_ONE_LETTER_UNITS = frozenset("m g s l h K N J W V L".split())
_NOT_UNIT_WORDS = frozenset(
    """or and nor to not maybe either neither plus minus times than between more less fewer least
    most about around approx approximately roughly nearly almost over under above below except but
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred thousand million billion half halves third thirds quarter quarters""".split()
)
_SCIENTIFIC = re.compile(r"([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d{1,3})")
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?!\d)(?!\.\d*,)")
_LATEX_SPACING = re.compile(r"\\[,;:! ]|\\q?quad\b|\\displaystyle\b|\\(?:left|right)(?![A-Za-z])|~")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ\b|\\circ\b|\\degree\b|°")
_TRAILING_UNIT_GROUP = re.compile(
    r"\s*\\(?:mathrm|text|textrm|textnormal|mbox|rm|operatorname)\s*\{[^{}]*\}"
    r"(?:\s*\^\s*(?:\{\s*\d+\s*\}|\d))?\s*$"
)
# "x = 5", "x_1 = 5", "\theta = 30": a named value; the part after "=" is the answer.
_ASSIGNMENT = re.compile(r"\s*(?:[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?|\\[A-Za-z]+)\s*=\s*([^=<>≤≥]+)")
_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+)")
_LETTER_RUN = re.compile(r"[A-Za-z]+")
_ALLOWED_CHARS = frozenset(string.digits + string.ascii_letters + " +-*/^_()[]{}.,=:;%\\|<>!π√∞×÷≤≥")
# Commands a prediction may always use (plus any its reference uses).
_ARITHMETIC_COMMANDS = frozenset("frac dfrac tfrac cfrac sqrt pi cdot times div infty".split())
# Commands that mark text rather than math; never part of a math core.
_TEXT_COMMANDS = frozenset("text textrm textnormal mathrm mbox rm operatorname".split())
_RELATION_COMMANDS = frozenset("le ge leq geq lt gt neq ne approx in".split())
_FUNCTION_NAMES = frozenset(
    "sin cos tan cot sec csc log ln exp arcsin arccos arctan sinh cosh tanh sqrt pi".split()
)
_SPACED_NUMBERS = re.compile(r"[\d}\)\]]\s+[\d.]")
_NESTED_EXPONENT = re.compile(r"\^\s*\{[^{}]*\^|\^\s*[\d.]*\s*\^|\*\*")
_EXPONENT_DIGITS = re.compile(r"\^\s*\{?\s*[-+]?(\d+)")
_ABBREVIATION = re.compile(r"[A-Za-z]\.")


@dataclass(frozen=True)
class _MathValue:
    core: str  # the reduced text that was parsed
    expr: Basic | MatrixBase
    commands: frozenset[str]  # LaTeX commands used in ``core``
    words: frozenset[str]  # letter runs outside commands (variables, function names)
    relation: bool  # ``core`` states a relation (=, <, \le, ...)
    factorial: bool


def _reduce(text: str) -> str | None:
    """Strip delimiters, currency, degrees, thousands separators and units (rule 4)."""
    core = _clean(text)
    if len(core) > MAX_RAW_MATH_CHARS:  # checked first: keeps the regular expressions below cheap
        return None
    core = core.replace("\u2212", "-")
    core = _LATEX_SPACING.sub(" ", core)
    core = _DEGREES.sub("", core)
    core = core.replace("\\$", "").replace("$", "").replace("\\%", "%")
    core = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), core)
    for _ in range(3):
        core, removed = _TRAILING_UNIT_GROUP.subn("", core)
        if not removed:
            break
    core = core.strip()
    if core.endswith(".") and not core.endswith(".."):
        core = core[:-1].rstrip()
    if not core or len(core) > MAX_MATH_CHARS:
        return None
    scientific = _SCIENTIFIC.fullmatch(core)
    if scientific is not None:
        core = f"{scientific.group(1)}\\times 10^{{{scientific.group(2)}}}"
    with_unit = _NUMBER_WITH_UNIT.fullmatch(core)
    if with_unit is not None:
        unit = with_unit.group(2).strip()
        words = [w.lower() for w in _UNIT_WORD.findall(unit)]
        if set(words) & _NOT_UNIT_WORDS:
            return None
        if all(len(w) > 1 for w in words) or unit.rstrip(".") in _ONE_LETTER_UNITS:
            core = with_unit.group(1).strip()
    return core


def _letter_runs(core: str) -> list[str]:
    return _LETTER_RUN.findall(_LATEX_COMMAND.sub(" ", core))


def _math_core(text: str, reference: _MathValue | None) -> str | None:
    """Reduce an answer to one math expression (rule 4), or None if it is not one.

    ``reference`` is None when reducing the reference itself (trusted: any LaTeX command but
    text groups). A prediction is held to its reference's vocabulary: LaTeX commands from
    the arithmetic list or used by the reference, variables and function names used by the
    reference, ``!`` only if the reference has one, a relation only if the reference is one
    (``x = 5`` against ``5`` is read as ``5``), commas / semicolons only if the reference has
    one. This keeps SymPy's work small, which matters where no timer can run.
    """
    core = _reduce(text)
    if core is None or any(ch not in _ALLOWED_CHARS for ch in core):
        return None
    if reference is not None and not reference.relation:
        assignment = _ASSIGNMENT.fullmatch(core)
        if assignment is not None:
            core = assignment.group(1).strip()
    commands = set(_LATEX_COMMAND.findall(core))
    runs = _letter_runs(core)
    if commands & _TEXT_COMMANDS or _ABBREVIATION.search(_LATEX_COMMAND.sub(" ", core)):
        return None
    if _SPACED_NUMBERS.search(core) or _NESTED_EXPONENT.search(core):
        return None
    if any(len(d) > MAX_EXPONENT_DIGITS for d in _EXPONENT_DIGITS.findall(core)):
        return None
    if reference is None:
        if any(len(run) > 1 and run not in _FUNCTION_NAMES for run in runs):
            return None
        return core
    if not commands <= (_ARITHMETIC_COMMANDS | reference.commands):
        return None
    if not set(runs) <= reference.words:
        return None
    if "!" in core and not reference.factorial:
        return None
    if _is_relation(core, commands) and not reference.relation:
        return None
    if ("," in core or ";" in core) and not ("," in reference.core or ";" in reference.core):
        return None
    return core


def _is_relation(core: str, commands: set[str]) -> bool:
    return any(ch in core for ch in "=<>≤≥") or bool(commands & _RELATION_COMMANDS)


def _math_value(text: str, reference: _MathValue | None) -> _MathValue | None:
    core = _math_core(text, reference)
    if core is None:
        return None
    expr = _parse_math(core)
    if expr is None:
        return None
    commands = frozenset(_LATEX_COMMAND.findall(core))
    return _MathValue(
        core=core,
        expr=expr,
        commands=commands,
        words=frozenset(_letter_runs(core)),
        relation=_is_relation(core, set(commands)),
        factorial="!" in core,
    )


def _timeout_s() -> int | None:
    """math-verify's signal-based timeout only works in the main thread."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_math(core: str) -> Basic | MatrixBase | None:
    """SymPy value of ``core`` via math-verify, or None if math-verify could not parse it.

    None also when the parse lost a variable written in ``core`` or the value is undefined.
    """
    try:
        parsed = parse(
            f"${core}$",
            extraction_config=[LatexExtractionConfig()],
            fallback_mode="no_fallback",
            parsing_timeout=_timeout_s(),
            raise_on_error=True,
        )
    except TimeoutException:
        logger.warning("math-verify timed out parsing %r; treated as not a math answer", core[:80])
        return None
    exprs = [p for p in parsed if isinstance(p, (Basic, MatrixBase))]
    if not exprs:
        return None
    expr = exprs[0]
    if expr.has(S.NaN, S.ComplexInfinity):
        return None
    written = {run for run in _LETTER_RUN.findall(_LATEX_COMMAND.sub(" ", core)) if len(run) == 1} - {"e", "i"}
    symbol_letters = {ch for symbol in expr.free_symbols for ch in str(symbol)}
    if not written <= symbol_letters:
        return None
    return expr


def _math_equal(reference: _MathValue, prediction: _MathValue) -> bool:
    try:
        return bool(
            verify(
                reference.expr,
                prediction.expr,
                timeout_seconds=_timeout_s(),
                raise_on_error=True,
            )
        )
    except TimeoutException:
        logger.warning(
            "math-verify timed out comparing %r with %r; treated as not equivalent",
            prediction.core[:80],
            reference.core[:80],
        )
        return False
