"""Final-answer correctness (docs/method.md section 5 gives every rule with examples).

``"strict"`` (**choice**, default, for rewards): multiple choice, yes / no, one number or LaTeX value
read and compared by math-verify (with its own normalisation, held to the reference's vocabulary),
normalised exact text; the first rule that applies decides. ``"crystal"``: the paper's lenient
evaluation protocol, crystal-metrics 0.2.0 ``AccuracyCalculator().evaluate_single`` (LLM judge off;
parity: tests/test_answers_parity.py). In both modes a *non-answer* (empty, only punctuation,
``insufficient information``, ``none``, ``n/a``, ...) is never correct (``match_type="invalid"``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import string
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
from math_verify import LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from math_verify.grader import is_assignment_relation, is_relation, take_last_relation
from sympy import Basic, MatrixBase, S, Set, Tuple

from cpr.errors import check_choice

logger = logging.getLogger(__name__)

ANSWER_MODES = ("strict", "crystal")
LETTERS = string.ascii_uppercase
MATH_VERIFY_TIMEOUT_S = 5


def check_answer_mode(mode: object, field: str = "answer_mode") -> str:
    """Check an answer mode: one of :data:`ANSWER_MODES`. Raises ``ConfigError`` naming ``field``."""
    return check_choice(mode, ANSWER_MODES, field)


@dataclass(frozen=True)
class AnswerCheck:
    """Outcome of :func:`check_answer`.

    Attributes:
        match_type: the deciding rule: ``"invalid"`` (a non-answer); strict ``"choice" | "yes_no" |
            "numeric" | "math" | "exact"``; crystal-metrics' ``"numeric_exact" | "numeric_rounded" |
            "numeric_mismatch" | "yes_no" | "choice" | "exact"``.
        normalized_prediction, normalized_reference: both sides as that rule compared them.
    """

    correct: bool
    match_type: str
    normalized_prediction: str
    normalized_reference: str


def check_answer(prediction: str, reference: str, *, options: Sequence[str] = (), question: str = "",
                 mode: str = "strict") -> AnswerCheck:
    """Judge a predicted final answer (e.g. ``ParsedCompletion.answer``) against the ``reference``: a
    letter (``"B"``), a letter with its option (``"B (60°)"``), an option text, a number / LaTeX value
    or text. ``options``: option texts lettered A, B, ... (at most 26); ``question``: its text (options
    as ``A) ...`` lines; the crystal protocol); ``mode``: ``"strict"`` (rewards) or ``"crystal"``.

    Raises:
        ValueError: unknown ``mode``; more than 26 options; in strict mode, an empty reference.
        TypeError: a text argument or option is not a ``str``, or ``options`` is a single ``str``.
    """
    check_answer_mode(mode, "mode")
    if isinstance(options, str):
        raise TypeError("options must be a sequence of option texts, got a single str")
    opts = list(options)
    texts = {"prediction": prediction, "reference": reference, "question": question}
    for name, value in [*texts.items(), *((f"option {i}", o) for i, o in enumerate(opts))]:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be str, got {type(value).__name__}")
    if len(opts) > len(LETTERS):
        raise ValueError(f"at most {len(LETTERS)} options can be lettered, got {len(opts)}")
    ref = _clean(reference)
    if mode == "strict" and not ref:
        raise ValueError(f"reference answer is empty: {reference!r}")
    pred = _clean(prediction)
    if _is_non_answer(pred):
        return AnswerCheck(False, "invalid", _norm_text(pred), _norm_text(ref))
    if mode == "crystal":
        return _crystal_check(prediction, reference, _render_options(question, opts))
    return _strict_check(pred, ref, opts, question)


def is_non_answer(prediction: str) -> bool:
    """Whether ``prediction`` is no answer at all (module docstring), after cleaning; such a
    prediction is wrong in every mode."""
    return _is_non_answer(_clean(prediction))


# --- crystal mode: crystal-metrics 0.2.0 AccuracyCalculator -------------------------------------------

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "`": "'"})
_SPACES = re.compile(r"\s+")
_CR_LONE_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")
_CR_DROPPED = re.compile(r"""[,()"\[\]{}']""")
# Lead-ins deleted (in this order, everywhere) before the first number is read.
_CR_LEAD_INS = tuple(re.compile(rf"{w}:?\s*", re.IGNORECASE) for w in (
    "the answer is", "the result is", "answer", "result", "approximately", "about"))
_CR_NUMBER = re.compile(r"-?\d+\.?\d*")
_CR_SINGLE_LETTER = re.compile(r"[a-z]")
# Letter patterns on normalised text. The normaliser deletes "(" and ")", so crystal-metrics'
# parenthesised patterns can never match and are left out; the order of the others is kept.
_CR_LETTER_PATTERNS = tuple(re.compile(p) for p in (r"^([a-z])\.", r"option\s+([a-z])", r"choice\s+([a-z])",
                                                    r"answer\s+is\s+([a-z])"))
_CR_OPTION = re.compile(r"([A-Z])\)\s*([^\n]+)")
_CR_YES_NO = ("yes", "no", "true", "false")
_CR_YES_WORDS = ("yes", "true", "correct", "affirmative")
_CR_NO_WORDS = ("no", "false", "incorrect", "negative")
_HAS_OPTION_LINE = re.compile(r"^[ \t]*A\)", re.MULTILINE)


def _render_options(question: str, options: list[str]) -> str:
    """The question with ``"A) option"`` lines appended (unless it has an ``A)`` line)."""
    if not options or _HAS_OPTION_LINE.search(question):
        return question
    lines = [f"{LETTERS[i]}) {' '.join(opt.splitlines())}" for i, opt in enumerate(options)]
    return "\n".join([question, *lines]) if question else "\n".join(lines)


def _cr_normalize(text: str) -> str:
    out = _CR_LONE_PERIOD.sub("", text.strip().lower().translate(_QUOTES))
    return _SPACES.sub(" ", _CR_DROPPED.sub("", out))


def _cr_first_number(text: str) -> float | None:
    out = text.strip().lower()
    for lead_in in _CR_LEAD_INS:
        out = lead_in.sub("", out)
    found = _CR_NUMBER.search(out)
    return float(found.group(0)) if found is not None else None


def _cr_numbers_match(pred: float, gold: float) -> tuple[bool, str]:
    """Paper Eq. 2 plus crystal-metrics' extra rounding rules."""
    if pred == gold:
        return True, "numeric_exact"
    diff = abs(pred - gold)
    rel = diff / max(abs(gold), 1e-10)
    if diff <= 0.05 or rel <= 0.1 or diff < 0.01:
        return True, "numeric_rounded"
    if gold != 0:
        decimals = len(str(pred).rstrip("0").rstrip(".").partition(".")[2])  # decimals shown
        if decimals <= 2 and (rel < 0.15 or abs(pred - round(gold, decimals)) < 1e-6):
            return True, "numeric_rounded"
    return False, "numeric_mismatch"


def _cr_yes_no(text: str) -> str:
    norm = _cr_normalize(text)
    if any(w in norm for w in _CR_YES_WORDS):
        return "yes"
    return "no" if any(w in norm for w in _CR_NO_WORDS) else norm


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
    pred_num, gold_num = _cr_first_number(prediction), _cr_first_number(reference)
    if pred_num is not None and gold_num is not None:
        ok, kind = _cr_numbers_match(pred_num, gold_num)
        return AnswerCheck(ok, kind, str(pred_num), str(gold_num))

    pred_norm, gold_norm = _cr_normalize(prediction), _cr_normalize(reference)
    if _cr_normalize(gold_norm) in _CR_YES_NO:
        pred_yn, gold_yn = _cr_yes_no(prediction), _cr_yes_no(reference)
        return AnswerCheck(pred_yn == gold_yn, "yes_no", pred_yn, gold_yn)

    pred_letter, gold_letter = _cr_choice(prediction, problem), _cr_choice(reference, problem)
    if pred_letter is not None and gold_letter is not None:
        return AnswerCheck(pred_letter == gold_letter, "choice", pred_letter, gold_letter)

    # exact match; two single words must be equal, anything else may contain the other (the fallback)
    single = len(pred_norm.split()) == len(gold_norm.split()) == 1
    ok = pred_norm == gold_norm if single else pred_norm in gold_norm or gold_norm in pred_norm
    return AnswerCheck(ok, "exact", pred_norm, gold_norm)


# --- strict mode ----------------------------------------------------------------------------------------

NON_ANSWERS = frozenset({"insufficient information", "none", "n/a", "unknown", "null", "nil"})
_YES_TOKENS = frozenset({"yes", "true"})
_NO_TOKENS = frozenset({"no", "false"})

_PREFIX = re.compile(r"(?:the\s+)?(?:final\s+|correct\s+)?answer\b(?:\s+is\b)?\s*[:：]?\s*", re.IGNORECASE)
_WRAPPERS = tuple(re.compile(p, re.DOTALL) for p in (
    r"\$\$(.*)\$\$", r"\$(.*)\$", r"\\\((.*)\\\)", r"\\\[(.*)\\\]", r"\\boxed\s*\{(.*)\}"))
_ARTICLE = re.compile(r"(?:a|an|the)\s+")

# Letter forms (matched in full on the cleaned answer, after an optional "option"/"choice").
_CHOICE_WORD = re.compile(r"(?:option|choice)\b\s*[:#]?\s*", re.IGNORECASE)
# In the order tried: B, (B) .., [B] .., B) .., B (..), B. / B: .. (the last is not a letter in a
# reference with text after it and no options known: "C. elegans").
_LETTER_FORMS = tuple(re.compile(p, re.DOTALL) for p in (
    r"([A-Za-z])", r"\(\s*([A-Za-z])\s*\)\s*(.*)", r"\[\s*([A-Za-z])\s*\]\s*(.*)", r"([A-Za-z])\s*\)\s*(.*)",
    r"([A-Za-z])\s+(\(.*\))", r"([A-Za-z])\s*[.:]\s*(.*)"))
_OTHER_LETTER = re.compile(r"\(\s*[A-Za-z]\s*\)|(?<![A-Za-z])[A-Z](?![A-Za-z])")
_OR_AND = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)
_QUESTION_OPTION = re.compile(r"^[ \t]*\(?([A-Z])[).:][ \t]*(\S[^\n]*)$", re.MULTILINE)


class _LetterForm(NamedTuple):
    letter: str  # upper case
    rest: str  # text after the letter (may be empty)


def _strict_check(pred: str, ref: str, options: list[str], question: str) -> AnswerCheck:
    """Strict rules 1-4 on the cleaned answers (check_answer has refused non-answers already)."""
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
    for _ in range(4):  # surrounding $..$, \(..\), \[..\], \boxed{..}, nested up to four deep
        if (found := next((m for w in _WRAPPERS if (m := w.fullmatch(out))), None)) is None:
            break
        out = found.group(1).strip()
    return out


def _strip_punctuation(text: str) -> str:
    def edge(ch: str) -> bool:
        return ch.isspace() or unicodedata.category(ch).startswith("P")

    start, end = 0, len(text)
    while start < end and edge(text[start]):
        start += 1
    while end > start and edge(text[end - 1]):
        end -= 1
    return text[start:end]


def _norm_text(text: str) -> str:
    """NFKC, case-folded, ASCII quotes, collapsed spaces, outer punctuation and a leading article gone."""
    out = unicodedata.normalize("NFKC", text).casefold().translate(_QUOTES)
    out = _strip_punctuation(_SPACES.sub(" ", out))
    article = _ARTICLE.match(out)
    if article is not None:
        out = _strip_punctuation(out[article.end():])
    return out


def _is_non_answer(cleaned: str) -> bool:
    norm = _norm_text(cleaned)
    return not any(ch.isalnum() for ch in norm) or norm in NON_ANSWERS


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
    for pattern in _LETTER_FORMS:
        found = pattern.fullmatch(body)
        if found is None:
            continue
        rest = found.group(2).strip() if pattern.groups > 1 else ""
        if as_reference and pattern is _LETTER_FORMS[-1] and rest:
            return None
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
    return None if form is None else (form.letter, form.rest or None)


def _matching_option(text: str, options: list[str]) -> int | None:
    """Index of the single option equivalent to ``text``; None for no match or several."""
    hits = [i for i, opt in enumerate(options) if opt.strip() and _values_equal(text, opt).correct]
    return hits[0] if len(hits) == 1 else None


def _check_choice(pred: str, ref_letter: str, ref_text: str | None, options: list[str]) -> AnswerCheck:
    form = _letter_form(pred)
    pred_letter: str | None = None
    if form is not None and (not options or _letter_index(form.letter) < len(options)):
        text = (options[_letter_index(form.letter)] if options
                else ref_text if form.letter == ref_letter else None)
        # text after the letter must agree with that option, or (option unknown) name no other letter
        if form.rest and not (
            _values_equal(form.rest, text).correct if text is not None
            else _OTHER_LETTER.search(form.rest) is None and _OR_AND.search(form.rest) is None
        ):
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
    """Strict rules 2-4 (yes/no, numbers and LaTeX, normalised exact text) on cleaned answers."""
    pred, ref = _clean(pred), _clean(ref)
    pred_norm, ref_norm = _norm_text(pred), _norm_text(ref)
    if ref_norm in _YES_TOKENS or ref_norm in _NO_TOKENS:
        polarity = _YES_TOKENS if ref_norm in _YES_TOKENS else _NO_TOKENS
        shown = ["yes" if n in _YES_TOKENS else "no" if n in _NO_TOKENS else n for n in (pred_norm, ref_norm)]
        return AnswerCheck(pred_norm in polarity, "yes_no", *shown)

    ref_math = _math_value(ref, None)
    if ref_math is not None:
        pred_math = _math_value(pred, ref_math)
        if pred_math is not None:
            plain = _PLAIN_NUMBER.fullmatch(pred_math.shown) and _PLAIN_NUMBER.fullmatch(ref_math.shown)
            kind = "numeric" if plain else "math"
            return AnswerCheck(_math_equal(ref_math, pred_math), kind, pred_math.shown, ref_math.shown)

    return AnswerCheck(pred_norm == ref_norm, "exact", pred_norm, ref_norm)


# --- numbers and LaTeX via math-verify -------------------------------------------------------------

MAX_MATH_CHARS = 160
MAX_EXPONENT_DIGITS = 4

# math-verify's LaTeX normalisation (its defaults: $ signs, \boxed{} (text outside dropped; several: a list),
# \dfrac, \left / \right, trailing units, "and" / "or" as list commas, \frac12 / \sqrt2 / a/b written out).
# equations stays off: deprecated (it warns on every call); math-verify's parser and verify() handle them.
_NORMALIZATION = NormalizationConfig(basic_latex=True, units=True, malformed_operators=True, nits=True, boxed="all",
                                     equations=False)
# Only the whole answer is extracted (boxes are read by the normalisation, not as separate matches).
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=-1, normalization_config=_NORMALIZATION),)
# How an answer is shown and held to its reference's vocabulary: the same normalisation without
# the rewrites that only change how a value is written ("25/3" stays "25/3", "0.5" stays "0.5").
_SHOWN = dataclasses.replace(_NORMALIZATION, malformed_operators=False, nits=False)

_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*\d+)?\s*%?")
_NUMBER_WITH_UNIT = re.compile(r"([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:\s*/\s*\d+)?\s*%?)\s*"
                               r"([^\W\d_](?:[^\W\d_]|[ .'/\-])*?(?:\^\s*\{?\s*[23]\s*\}?|[23²³])?)")
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
_ALLOWED_CHARS = frozenset(string.digits + string.ascii_letters + " +-*/^_()[]{}.,=:;%\\|<>!$~°π√∞×÷≤≥\u2212")
_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+)")
_LETTER_RUN = re.compile(r"[A-Za-z]+")
_BRACED = re.compile(r"\{[^{}]*\}")
# Commands a prediction may always use (plus any its reference uses).
_ALWAYS_ALLOWED_COMMANDS = frozenset("frac sqrt pi cdot times div infty circ".split())
_FUNCTION_NAMES = frozenset(
    "sin cos tan cot sec csc log ln exp arcsin arccos arctan sinh cosh tanh sqrt pi".split())
_SPACED_NUMBERS = re.compile(r"[\d}\)\]]\s+[\d.]")
_NESTED_EXPONENT = re.compile(r"\^\s*\{[^{}]*\^|\^\s*[\d.]*\s*\^|\*\*")
_EXPONENT_DIGITS = re.compile(r"\^\s*\{?\s*[-+]?(\d+)")
_ABBREVIATION = re.compile(r"[A-Za-z]\.")


@dataclass(frozen=True)
class _MathValue:
    text: str  # math-verify's normalised LaTeX
    expr: Basic | MatrixBase

    @property
    def shown(self) -> str:
        """The text, or an integer value's digits (no thousands separators, degree marks, ...)."""
        return str(self.expr) if getattr(self.expr, "is_Integer", False) else self.text

    @property
    def commands(self) -> set[str]:
        return set(_LATEX_COMMAND.findall(self.text))

    @property
    def words(self) -> set[str]:
        return set(_LETTER_RUN.findall(_LATEX_COMMAND.sub(" ", self.text)))


def _math_value(text: str, reference: _MathValue | None) -> _MathValue | None:
    """An answer read as one math value, or None (a prediction is held to the reference's vocabulary)."""
    core = _math_core(text)
    parsed = _parse_math(core) if core is not None else None
    if parsed is None:
        return None
    value = _MathValue(parsed[1], parsed[0])
    if reference is not None and not is_relation(reference.expr) and is_assignment_relation(value.expr):
        value = _MathValue(value.text.rpartition("=")[2].strip(), take_last_relation(value.expr).rhs)
    if _SPACED_NUMBERS.search(value.text) or _NESTED_EXPONENT.search(value.text):
        return None
    if any(len(d) > MAX_EXPONENT_DIGITS for d in _EXPONENT_DIGITS.findall(value.text)):
        return None
    if reference is None:
        return value if all(len(w) == 1 or w in _FUNCTION_NAMES for w in value.words) else None
    allowed = (value.commands <= _ALWAYS_ALLOWED_COMMANDS | reference.commands
               and value.words <= reference.words and ("!" not in value.text or "!" in reference.text)
               and (not is_relation(value.expr) or is_relation(reference.expr))
               and (not isinstance(value.expr, (Set, Tuple)) or isinstance(reference.expr, (Set, Tuple))))
    return value if allowed else None


def _math_core(text: str) -> str | None:
    """The text for math-verify: ``°``, ``1.5e3`` and unit words after a number (it misreads) rewritten."""
    core = text.replace("\\$", "").replace("$", "").strip().removesuffix(".").replace("°", "^{\\circ}")
    if len(core) > MAX_MATH_CHARS or any(ch not in _ALLOWED_CHARS for ch in core):
        return None
    if _ABBREVIATION.search(_LATEX_COMMAND.sub(" ", core)):
        return None
    scientific = _SCIENTIFIC.fullmatch(core)
    if scientific is not None:
        return f"{scientific.group(1)}\\times 10^{{{scientific.group(2)}}}"
    with_unit = _NUMBER_WITH_UNIT.fullmatch(core)
    if with_unit is not None:
        unit = with_unit.group(2).strip()
        words = [w.lower() for w in _UNIT_WORD.findall(unit)]
        if set(words) & _NOT_UNIT_WORDS:
            return None
        if all(len(w) > 1 for w in words) or unit.rstrip(".") in _ONE_LETTER_UNITS:
            return with_unit.group(1).strip()
    return core


def _timeout_s() -> int | None:
    """math-verify's signal-based timeout only works in the main thread."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_math(core: str) -> tuple[Basic | MatrixBase, str] | None:
    """(SymPy value, normalised LaTeX) of ``core`` by math-verify; None if undefined or a letter dropped."""
    try:
        parsed = parse(f"${core}$", extraction_config=_EXTRACTION, fallback_mode="first_match",
                       extraction_mode="first_match", parsing_timeout=_timeout_s(), raise_on_error=True)
    except TimeoutException:
        logger.warning("math-verify timed out parsing %r; treated as not a math answer", core[:80])
        return None
    exprs = [p for p in parsed if isinstance(p, (Basic, MatrixBase))]
    normalized = normalize_latex(core, _NORMALIZATION)
    if not exprs or parsed[-1] != normalized or exprs[0].has(S.NaN, S.ComplexInfinity):
        return None  # not parsed, or parsed from a part of the answer only, or undefined
    bare = _LATEX_COMMAND.sub(" ", core)
    while (flat := _BRACED.sub(" ", bare)) != bare:
        bare = flat
    written = {run for run in _LETTER_RUN.findall(bare) if len(run) == 1} - {"e", "i"}
    if not written <= {ch for symbol in exprs[0].free_symbols for ch in str(symbol)}:
        return None
    return exprs[0], normalize_latex(core, _SHOWN)


def _math_equal(reference: _MathValue, prediction: _MathValue) -> bool:
    try:
        return bool(verify(reference.expr, prediction.expr, timeout_seconds=_timeout_s(), raise_on_error=True))
    except TimeoutException:
        logger.warning("math-verify timed out comparing %r with %r; treated as not equivalent",
                       prediction.shown[:80], reference.shown[:80])
        return False
