"""Splitting published solutions into reference steps (cpr.data.text, MATH-Vision steps)."""

from __future__ import annotations

import json

import pytest

from cpr.data.adapters.mathvision import solution_steps
from cpr.data.text import (
    drop_asy_blocks,
    find_math_spans,
    first_solution,
    remove_image_placeholders,
    split_blank_lines,
    split_sentences,
    strip_step_prefix,
    unescape_literal_newlines,
)


def test_sentences_keep_inline_math_abbreviations_and_decimals():
    text = (
        "The height is the diameter, i.e. $12 \\mathrm{~cm}$; e.g. Mr. Lee measured it. "
        "The median is $7.5$ cm, so $CQ = 5.$ Therefore the answer is 3.14 approx."
    )
    assert split_sentences(text) == [
        "The height is the diameter, i.e. $12 \\mathrm{~cm}$; e.g. Mr. Lee measured it.",
        "The median is $7.5$ cm, so $CQ = 5.$",
        "Therefore the answer is 3.14 approx.",
    ]


def test_periods_inside_math_do_not_split_it():
    # "x. y" inside $...$ looks like a sentence end to a plain splitter.
    text = "We get $a = b. c = d$ here. Next step."
    assert split_sentences(text) == ["We get $a = b. c = d$ here.", "Next step."]


def test_align_block_stays_whole_inside_its_sentence():
    text = (
        "Since the sum is $180^\\circ$, we have \\begin{align*}\nx + y &= 180\\\\\nx &= 90.\n"
        "\\end{align*}Therefore, $x = \\boxed{90}$."
    )
    assert split_sentences(text) == [
        "Since the sum is $180^\\circ$, we have \\begin{align*}\nx + y &= 180\\\\\nx &= 90.\n\\end{align*}",
        "Therefore, $x = \\boxed{90}$.",
    ]


def test_nested_environments_and_display_math_are_one_span():
    text = "A $$ \\begin{aligned} \\begin{array}{l} 1 \\end{array} \\end{aligned} $$ B \\[ x. \\] C"
    spans = [text[s:e] for s, e in find_math_spans(text)]
    assert spans == [
        "$$ \\begin{aligned} \\begin{array}{l} 1 \\end{array} \\end{aligned} $$",
        "\\[ x. \\]",
    ]


def test_escaped_dollar_is_not_math():
    assert find_math_spans("It costs \\$5 and \\$6.") == []


def test_lines_split_but_math_only_and_lowercase_lines_continue():
    text = (
        "We consider the function\n$$\nf(k)=k^2\n$$\nwhere k is odd.\n1 Edge: seven ways.\n2 Edge: ten ways."
    )
    assert split_sentences(text) == [
        "We consider the function $$\nf(k)=k^2\n$$ where k is odd.",
        "1 Edge: seven ways.",
        "2 Edge: ten ways.",
    ]


def test_literal_backslash_n_becomes_newline_but_latex_commands_stay():
    text = "Line one.\\n1 Edge: $a \\neq b$ and $\\nu$.\\n$$\\nf(k)$$"
    assert unescape_literal_newlines(text) == "Line one.\n1 Edge: $a \\neq b$ and $\\nu$.\n$$\nf(k)$$"


def test_asy_blocks_are_dropped():
    text = 'Draw it: [asy]\ndraw(a--b);\nlabel("$A$", a);\n[/asy] Then $AB = 2$.'
    assert split_sentences(drop_asy_blocks(text)) == ["Draw it: Then $AB = 2$."]
    assert drop_asy_blocks("Before. [asy] unclosed code").strip() == "Before."


def test_first_solution_kept():
    text = "Solution 1: First way. Done.\n\nSolution 2: Second way."
    assert first_solution(text) == "First way. Done."
    assert first_solution("No label. Solution 2 is mentioned.") == "No label. Solution 2 is mentioned."


def test_image_placeholders_removed():
    assert remove_image_placeholders("What is x? <image1>") == "What is x?"
    assert (
        remove_image_placeholders("Squares.\n\n<image1>\n\nWhat is the area?")
        == "Squares.\n\nWhat is the area?"
    )


def test_blank_line_split_and_step_prefix():
    assert split_blank_lines("Find the numbers.\n\nA: 1\nB: 2\n\n \nSubtract.") == [
        "Find the numbers.",
        "A: 1\nB: 2",
        "Subtract.",
    ]
    assert strip_step_prefix("STEP12: So the answer is 3.\n\n") == "So the answer is 3."


def test_mathvision_solution_steps_on_a_real_record(samples_dir):
    records = {}
    for line in (samples_dir / "mathvision" / "test_subset.jsonl").read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        records[obj["id"]] = obj
    steps = solution_steps(records["2930"]["solution"])
    assert steps[0] == "Since $\\triangle BDA$ is isosceles, $\\angle BAD = \\angle ABD = x^\\circ$."
    assert steps[2] == "Therefore, $\\angle BAC = (x + y)^\\circ$."  # the [asy] block between is gone
    assert steps[3].startswith("Since the sum of the angles") and steps[3].endswith("\\end{align*}")
    assert steps[4] == "Therefore, $x + y = \\boxed{90}$."
    assert len(steps) == 5
    assert not any(
        "[asy]" in s or "draw(" in s for rec in records.values() for s in solution_steps(rec["solution"])
    )


@pytest.mark.parametrize("text", ["", "   ", "\n\n"])
def test_empty_text_gives_no_sentences(text):
    assert split_sentences(text) == []
