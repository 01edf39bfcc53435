"""Tests for cpr.steps: completion parsing and the format-reward condition (docs/method.md sections 1, 4)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpr.steps import INSUFFICIENT_INFORMATION, ParsedCompletion, completion_text, parse_completion

II = INSUFFICIENT_INFORMATION

# (id, completion text, expected steps, expected answer, expected format, expected json_valid)
CASES = [
    (
        "canonical",
        '{"reasoning_steps": ["The tallest bar is B.", "B is 40."], "answer": "B"}',
        ("The tallest bar is B.", "B is 40."), "B", "json", True,
    ),
    ("keys_other_order", '{"answer": "7", "reasoning_steps": ["a", "b"]}', ("a", "b"), "7", "json", True),
    (
        "nested_braces_in_strings",
        '{"reasoning_steps": ["S = {x | x > 0}", "}{ odd"], "answer": "{1, 2}"}',
        ("S = {x | x > 0}", "}{ odd"), "{1, 2}", "json", True,
    ),
    (
        "surrounding_whitespace",
        '\n   {"reasoning_steps": ["a"], "answer": "A"}  \n\n',
        ("a",), "A", "json", True,
    ),
    (
        "json_code_fence",
        '```json\n{"reasoning_steps": ["a"], "answer": "A"}\n```',
        ("a",), "A", "json", True,
    ),
    (
        "bare_code_fence",
        '```\n{"reasoning_steps": ["a"], "answer": "A"}\n```',
        ("a",), "A", "json", True,
    ),
    (
        "fence_inside_prose",
        'Here it is:\n```json\n{"reasoning_steps": ["a"], "answer": "A"}\n```\nHope that helps.',
        ("a",), "A", "json_span", False,
    ),
    (
        "trailing_commas",
        '{"reasoning_steps": ["a", "b",], "answer": "C",}',
        ("a", "b"), "C", "json_span", False,
    ),
    (
        "trailing_comma_inside_string_kept",
        '{"reasoning_steps": ["x, ]", "y"], "answer": "z",}',
        ("x, ]", "y"), "z", "json_span", False,
    ),
    (
        "prose_around_object",
        'Sure! {"reasoning_steps": ["a"], "answer": "5"} Hope it helps.',
        ("a",), "5", "json_span", False,
    ),
    (
        "stray_brace_after_object",
        '{"reasoning_steps": ["a"], "answer": "5"} :-}',
        ("a",), "5", "json_span", False,
    ),
    (
        "brace_in_preamble",
        'Let f{x} be given. {"reasoning_steps": ["a"], "answer": "5"}',
        ("a",), "5", "json_span", False,
    ),
    (
        "control_char_removed",
        '{"reasoning_steps": ["a\x07b"], "answer": "c"}',
        ("ab",), "c", "json_span", False,
    ),
    (
        "raw_newline_inside_string",
        '{"reasoning_steps": ["line one\nline two"], "answer": "x"}',
        ("line one\nline two",), "x", "json_span", False,
    ),
    (
        "unicode_text",
        '{"reasoning_steps": ["角度是 60°", "émoji 😀"], "answer": "60°"}',
        ("角度是 60°", "émoji 😀"), "60°", "json", True,
    ),
    (
        "unicode_escapes",
        '{"reasoning_steps": ["\\u00e9t\\u00e9"], "answer": "\\u03c0"}',
        ("été",), "π", "json", True,
    ),
    ("empty_string", "", (), II, "none", False),
    ("whitespace_only", "  \n\t ", (), II, "none", False),
    (
        "top_level_list_with_object",
        '[{"reasoning_steps": ["a"], "answer": "x"}]',
        ("a",), "x", "json_span", False,
    ),
    ("top_level_list_of_strings", '["a", "b"]', (), II, "none", False),
    ("steps_single_string", '{"reasoning_steps": "one step", "answer": "B"}', ("one step",), "B", "json", False),
    ("numbers_as_steps", '{"reasoning_steps": [1, 2.5, -3], "answer": 42}', ("1", "2.5", "-3"), "42", "json", False),
    (
        "nested_values_as_steps",
        '{"reasoning_steps": [{"op": "add"}, [1, 2]], "answer": {"value": 5}}',
        ('{"op": "add"}', "[1, 2]"), '{"value": 5}', "json", False,
    ),
    (
        "blank_null_and_bool_steps",
        '{"reasoning_steps": ["a", "", "  ", null, true], "answer": false}',
        ("a", "true"), "false", "json", False,
    ),
    ("empty_step_list_is_valid", '{"reasoning_steps": [], "answer": "B"}', (), "B", "json", True),
    ("answer_missing", '{"reasoning_steps": ["a"]}', ("a",), II, "json", False),
    ("steps_missing", '{"answer": "7"}', (), "7", "json", False),
    ("neither_key", '{"steps": ["a"], "final": "b"}', (), II, "none", False),
    ("answer_null", '{"reasoning_steps": ["a"], "answer": null}', ("a",), II, "json", False),
    ("answer_padded", '{"reasoning_steps": [" a "], "answer": "  B  "}', ("a",), "B", "json", True),
    ("answer_empty_string", '{"reasoning_steps": ["a"], "answer": ""}', ("a",), "", "json", True),
    ("nan_step", '{"reasoning_steps": [NaN], "answer": "x"}', ("nan",), "x", "json", False),
    ("duplicate_key_last_wins", '{"answer": "A", "reasoning_steps": ["a"], "answer": "B"}', ("a",), "B", "json", True),
    ("deep_brackets", "[" * 100_000, (), II, "none", False),
    (
        "deep_brackets_inside_object",
        '{"reasoning_steps": [' + "[" * 5000 + "]" * 5000 + '], "answer": "x"}',
        (), II, "none", False,
    ),
    ("int_beyond_digit_limit", '{"reasoning_steps": [' + "9" * 5000 + '], "answer": "x"}', (), II, "none", False),
    (
        "lone_surrogates_and_nul",
        '\ud800{"reasoning_steps": ["a\x00b"], "answer": "\udfff"}',
        ("ab",), "\udfff", "json_span", False,
    ),
    (
        "tags_numbered_think",
        "<think>\n1. Look at the bars.\n2. Count them.\n</think>\n<answer>3</answer>",
        ("Look at the bars.", "Count them."), "3", "tags", False,
    ),
    (
        "tags_inline_step_markers",
        "<think>Step 1: find x. Step 2: add 2.</think><answer> 5 </answer>",
        ("find x.", "add 2."), "5", "tags", False,
    ),
    (
        "tags_plain_lines_and_bullets",
        "<think>First line\n- second line\n\n* third</think><answer>B</answer>",
        ("First line", "second line", "third"), "B", "tags", False,
    ),
    ("tags_answer_only", "<answer>B</answer>", (), "B", "tags", False),
    (
        "numbered_lines",
        "1. The table lists 4 rows.\n2) Two rows exceed 40.\nAnswer: 2",
        ("The table lists 4 rows.", "Two rows exceed 40."), "2", "numbered", False,
    ),
    (
        "step_lines_continuation_final_answer",
        "Step 1: Read the chart.\nIt has 3 bars.\nStep 2: The tallest is B.\n**Final Answer:** B",
        ("Read the chart. It has 3 bars.", "The tallest is B."), "B", "numbered", False,
    ),
    (
        "answer_on_next_line",
        "1. Add 2 and 3.\nFinal answer:\n\n  5 apples",
        ("Add 2 and 3.",), "5 apples", "numbered", False,
    ),
    ("answer_line_without_steps", "Answer: B", (), II, "none", False),
    ("numbered_without_answer", "1. a\n2. b", (), II, "none", False),
    ("think_without_answer_tag", "<think>1. a</think> so B", (), II, "none", False),
]


@pytest.mark.parametrize(
    ("text", "steps", "answer", "fmt", "valid"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_parse_completion_cases(text: str, steps: tuple, answer: str, fmt: str, valid: bool) -> None:
    assert parse_completion(text) == ParsedCompletion(steps, answer, fmt, valid)


def test_case_count() -> None:
    assert len(CASES) >= 30


GARBAGE_PATTERNS = [
    '{"a": [1, 2\x00\ud800<think> Step',
    '} { ] [ , : " \\ \n',
    '"' + "a" * 97,
    "1. x\n",
    "```",
]


@pytest.mark.parametrize("pattern", GARBAGE_PATTERNS)
def test_100_kb_garbage_is_fast_and_unparsed(pattern: str) -> None:
    text = (pattern * (100_000 // len(pattern) + 1))[:100_000]
    start = time.perf_counter()
    parsed = parse_completion(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    assert parsed.format == "none"
    assert parsed.answer == II
    assert parsed.steps == ()
    assert parsed.json_valid is False


def test_large_valid_completion_is_fast() -> None:
    steps = [f"step {i} {{x}}" for i in range(5000)]
    text = "noise { " + json.dumps({"reasoning_steps": steps, "answer": "B"}, indent=1) + ",}"
    start = time.perf_counter()
    parsed = parse_completion(text)
    assert time.perf_counter() - start < 1.0
    assert parsed.format == "json_span"
    assert parsed.steps == tuple(steps)
    assert parsed.answer == "B"


def test_parse_completion_rejects_non_str() -> None:
    with pytest.raises(TypeError, match="parse_completion expects str, got int"):
        parse_completion(123)  # type: ignore[arg-type]


# --- completion_text ------------------------------------------------------------------------------


def test_completion_text_plain_string() -> None:
    assert completion_text('{"answer": "B"}') == '{"answer": "B"}'


def test_completion_text_conversational_str_content() -> None:
    assert completion_text([{"role": "assistant", "content": "hello"}]) == "hello"


def test_completion_text_content_parts() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}],
    }
    assert completion_text([message]) == "ab"


def test_completion_text_takes_last_assistant_message() -> None:
    messages = [
        {"role": "assistant", "content": "first"},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "last"},
    ]
    assert completion_text(messages) == "last"


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        (42, "got int"),
        (None, "got NoneType"),
        ({"role": "assistant", "content": "x"}, "got dict"),
        (["text"], "chat message must be a dict, got str"),
        ([{"role": "assistant", "content": None}], "content must be str or a list of parts, got NoneType"),
        ([{"role": "assistant", "content": ["x"]}], "content part must be a dict, got str"),
        ([{"role": "assistant", "content": [{"type": "text", "text": 3}]}], "must hold a str, got int"),
    ],
)
def test_completion_text_type_errors(completion: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        completion_text(completion)


def test_completion_text_without_assistant_message() -> None:
    with pytest.raises(ValueError, match=r"no assistant message \(roles: \['user'\]\)"):
        completion_text([{"role": "user", "content": "q"}])


# --- properties -----------------------------------------------------------------------------------

_PARSER_ALPHABET = st.sampled_from(
    list('{}[]",:\\ \n\t.)0123456789abc') + ["<think>", "</think>", "<answer>", "</answer>", "Step 1:",
                                            "Answer:", '"reasoning_steps"', '"answer"', "```json", "\x00", "\ud800"]
)
_ANY_TEXT = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(exclude_categories=())),  # includes lone surrogates
    st.lists(_PARSER_ALPHABET, max_size=60).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(_ANY_TEXT)
def test_parse_never_raises_and_returns_str_fields(text: str) -> None:
    parsed = parse_completion(text)
    assert isinstance(parsed, ParsedCompletion)
    assert isinstance(parsed.answer, str)
    assert isinstance(parsed.format, str)
    assert parsed.format in {"json", "json_span", "tags", "numbered", "none"}
    assert isinstance(parsed.json_valid, bool)
    assert isinstance(parsed.steps, tuple)
    assert all(isinstance(s, str) and s and s == s.strip() for s in parsed.steps)


_STRIPPED = st.text().filter(lambda s: s == s.strip())


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(_STRIPPED.filter(bool), max_size=8),
    answer=_STRIPPED,
    ensure_ascii=st.booleans(),
    answer_first=st.booleans(),
)
def test_json_round_trip(steps: list[str], answer: str, ensure_ascii: bool, answer_first: bool) -> None:
    obj = {"answer": answer, "reasoning_steps": steps} if answer_first else {"reasoning_steps": steps, "answer": answer}
    parsed = parse_completion(json.dumps(obj, ensure_ascii=ensure_ascii))
    assert parsed == ParsedCompletion(tuple(steps), answer, "json", True)
