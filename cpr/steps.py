"""Parse a policy completion into reasoning steps and a final answer.

The policy is trained to answer with a JSON object
``{"reasoning_steps": ["...", "..."], "answer": "..."}`` (docs/method.md section 1). Parsing follows
the CRYSTAL paper's protocol, extended by the project's **choice** of two more formats so
that models prompted in other styles can still be scored. Parsers are tried in this order
and the first one that succeeds names :attr:`ParsedCompletion.format`:

``"json"``
    ``json.loads`` of the whole completion (surrounding whitespace ignored; one enclosing
    Markdown code fence, ```` ```json ```` or a bare ```` ``` ````, is removed first).
``"json_span"``
    the span from the first ``{`` to the last ``}`` with control characters other than
    tab / newline / carriage return deleted and trailing commas before ``]`` or ``}``
    (outside JSON strings) removed, then ``json.loads(..., strict=False)`` (so raw newlines
    and tabs inside strings are kept as text). If that span does not decode, the same repair
    is tried once on the object that starts at the ``{`` in front of the first
    ``"reasoning_steps"`` key, and ``json.JSONDecoder.raw_decode`` is allowed to stop at the
    end of that object (text after it is ignored).
``"tags"``
    ``<think>...</think>`` (optional) followed by ``<answer>...</answer>`` (required); the
    steps are read from the think block (see :func:`split_step_lines`).
``"numbered"``
    lines numbered ``1.`` / ``1)`` or labelled ``Step N:`` (at least one) together with an
    ``Answer:`` / ``Final answer:`` line (the last such line is the answer; only step lines
    before it are steps).
``"none"``
    nothing parsed: no steps and the answer ``"insufficient information"``.

A decoded JSON value counts as parsed only when it is an object holding at least one of
the keys ``"reasoning_steps"`` and ``"answer"`` (a JSON list at top level, or an object with
neither key, is passed on to the next parser). A missing ``"answer"`` (or ``null``) gives
the answer ``"insufficient information"``; a missing ``"reasoning_steps"`` (or ``null``)
gives no steps. Keys are exact (case-sensitive) and may come in any order.

Value conversion: string steps are stripped and empty ones dropped; numbers become
``str(n)``; booleans ``"true"`` / ``"false"``; ``null`` steps are dropped; nested lists and
objects become ``json.dumps(value, ensure_ascii=False)``. ``"reasoning_steps"`` given as a
single string (or number / object) gives one step. The answer is converted the same way
and stripped (an explicitly empty answer string stays ``""``).

:attr:`ParsedCompletion.json_valid` is the format-reward condition of docs/method.md section 4 and
is independent of which parser succeeded: the whitespace-stripped completion, with at most
one enclosing code fence removed, must ``json.loads`` to an object whose
``"reasoning_steps"`` is a list of strings (an empty list is allowed) and whose ``"answer"``
is a string. Note: crystal-metrics' ``format_reward`` additionally repairs broken JSON and
requires at least one non-blank step; this module follows docs/method.md section 4 literally.

Robustness: :func:`parse_completion` never raises for a ``str`` input (deep nesting that
makes the JSON decoder recurse too deeply, integers beyond Python's digit limit, lone
surrogates and NUL bytes are all handled as "did not decode"), and runs in time roughly
linear in the length of the text (no regular expression here can backtrack
catastrophically).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INSUFFICIENT_INFORMATION",
    "ParsedCompletion",
    "completion_text",
    "parse_completion",
    "split_step_lines",
]

INSUFFICIENT_INFORMATION = "insufficient information"

STEPS_KEY = "reasoning_steps"
ANSWER_KEY = "answer"


@dataclass(frozen=True)
class ParsedCompletion:
    """Result of :func:`parse_completion`.

    Attributes:
        steps: reasoning steps, each stripped and non-empty, in completion order.
        answer: stripped answer text; ``"insufficient information"`` when no answer was found.
        format: the parser that succeeded: ``"json" | "json_span" | "tags" | "numbered" | "none"``.
        json_valid: docs/method.md section 4 format-reward condition (see the module docstring).
    """

    steps: tuple[str, ...]
    answer: str
    format: str
    json_valid: bool


# --- regular expressions (all anchored or single-pass; none can backtrack badly) ---------------
# One enclosing code fence: ```json\n ... \n``` (language tag optional, any case).
_FENCE_RE = re.compile(r"\A```[ \t]*(?:json|JSON|Json)?[ \t]*\r?\n?(.*?)```\Z", re.DOTALL)
# Control characters that are never valid raw inside JSON text (tab, LF, CR are kept).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A JSON string literal (kept as is) or a trailing comma before a closing bracket (dropped).
_TRAILING_COMMA_RE = re.compile(r'("(?:[^"\\]|\\.)*")|,(?=[ \t\r\n]*[\]}])', re.DOTALL)
_STEPS_KEY_RE = re.compile(r'"reasoning_steps"')
# Step markers: "1." "1)" "(1)" at the start of a line, or "Step N:" ("Step N." "Step N)"
# "Step N -") anywhere after whitespace; an optional bullet and markdown bold around them.
_STEP_MARK_RE = re.compile(
    r"(?:^[ \t]*(?:[-*•][ \t]*)?(?:\*\*)?\(?\d{1,4}[.)](?:\*\*)?[ \t]+"
    r"|(?:^|(?<=\s))(?:[-*•][ \t]*)?(?:\*\*)?step[ \t]*\d{1,4}[ \t]*(?:\*\*)?[ \t]*[:.)\-–][ \t]*(?:\*\*)?)",
    re.IGNORECASE | re.MULTILINE,
)
_BULLET_RE = re.compile(r"[ \t]*[-*•][ \t]+")
# "Answer:" / "Final answer:" line, markdown emphasis and heading marks allowed around it.
_ANSWER_LINE_RE = re.compile(
    r"[ \t#>*_]*(?:final[ \t]+)?answer[ \t]*(?:\*\*|__)?[ \t]*[:：][ \t]*(?:\*\*|__)?[ \t]*(.*)",
    re.IGNORECASE,
)


def parse_completion(text: str) -> ParsedCompletion:
    """Parse one completion into steps and an answer (paper protocol plus the project's choices).

    Args:
        text: the completion text (use :func:`completion_text` for TRL's conversational form).

    Returns:
        A :class:`ParsedCompletion`; see the module docstring for the order of parsers, the
        value conversions and the ``json_valid`` condition.

    Raises:
        TypeError: if ``text`` is not a ``str`` (never raises for any ``str``).

    Source: docs/method.md section 1 (paper protocol) and section 4 (format reward condition).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_completion expects str, got {type(text).__name__}")

    body = _strip_fence(text.strip())
    whole = _loads(body)
    json_valid = _is_schema_valid(whole)
    if _is_schema_object(whole):
        parsed = _from_object(whole, "json", json_valid)
        if parsed is not None:
            return parsed

    obj = _json_span(text)
    if obj is not None:
        parsed = _from_object(obj, "json_span", json_valid)
        if parsed is not None:
            return parsed

    tagged = _parse_tags(text)
    if tagged is not None:
        steps, answer = tagged
        return ParsedCompletion(steps, answer, "tags", json_valid)

    numbered = _parse_numbered(text)
    if numbered is not None:
        steps, answer = numbered
        return ParsedCompletion(steps, answer, "numbered", json_valid)

    return ParsedCompletion((), INSUFFICIENT_INFORMATION, "none", json_valid)


def completion_text(completion: Any) -> str:
    """Text of one TRL completion.

    Args:
        completion: either a plain ``str`` (standard format) or a conversational list of
            messages ``[{"role": "assistant", "content": str | [{"type": "text", "text": str}, ...]}]``
            (tool messages may be interleaved). The text of the *last* assistant message is
            returned; list content contributes its ``"text"`` parts concatenated in order
            (non-text parts such as images are skipped).

    Returns:
        The completion text.

    Raises:
        TypeError: if ``completion`` is neither ``str`` nor a list/tuple of message dicts, or
            a message / content part has the wrong type (the message names the type).
        ValueError: if a conversational completion holds no assistant message.
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, (list, tuple)):
        raise TypeError(
            "completion must be str or a list of chat messages, got " f"{type(completion).__name__}"
        )
    for message in completion:
        if not isinstance(message, dict):
            raise TypeError(f"chat message must be a dict, got {type(message).__name__}")
    assistant = [m for m in completion if m.get("role") == "assistant"]
    if not assistant:
        roles = [m.get("role") for m in completion]
        raise ValueError(f"conversational completion has no assistant message (roles: {roles})")
    content = assistant[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        pieces = []
        for part in content:
            if not isinstance(part, dict):
                raise TypeError(f"message content part must be a dict, got {type(part).__name__}")
            if part.get("type") == "text":
                piece = part.get("text")
                if not isinstance(piece, str):
                    raise TypeError(f"text content part must hold a str, got {type(piece).__name__}")
                pieces.append(piece)
        return "".join(pieces)
    raise TypeError(f"assistant message content must be str or a list of parts, got {type(content).__name__}")


def split_step_lines(block: str) -> tuple[str, ...]:
    """Split a free-text reasoning block (e.g. a ``<think>`` block) into steps.

    If the block holds step markers (``1.``, ``1)``, ``(1)`` at the start of a line, or
    ``Step N:`` / ``Step N.`` anywhere after whitespace), each marker starts a step that runs
    to the next marker, with line breaks inside a step joined by a space (text before the
    first marker is dropped). Otherwise every non-blank line is a step, with a leading bullet
    (``-``, ``*``, ``•``) removed.

    Args:
        block: the text to split.

    Returns:
        The stripped, non-empty steps.
    """
    marks = list(_STEP_MARK_RE.finditer(block))
    if marks:
        ends = [m.start() for m in marks[1:]] + [len(block)]
        return _clean(" ".join(block[m.end(): e].split()) for m, e in zip(marks, ends, strict=True))
    out = []
    for line in block.splitlines():
        m = _BULLET_RE.match(line)
        out.append(line[m.end():] if m is not None else line)
    return _clean(out)


# --- helpers ------------------------------------------------------------------------------------


def _clean(items: Any) -> tuple[str, ...]:
    return tuple(s for s in (str(x).strip() for x in items) if s)


def _strip_fence(text: str) -> str:
    m = _FENCE_RE.match(text)
    return m.group(1).strip() if m is not None else text


def _loads(text: str, *, strict: bool = True) -> Any:
    """``json.loads`` that reports "did not decode" as ``None`` (never raises).

    ``ValueError`` covers JSONDecodeError and the int-digit limit; RecursionError comes from
    deeply nested brackets. JSON ``null`` at top level also returns ``None`` (not an object).
    """
    if not text:
        return None
    try:
        return json.loads(text, strict=strict)
    except (ValueError, RecursionError):
        return None


def _is_schema_object(value: Any) -> bool:
    return isinstance(value, dict) and (STEPS_KEY in value or ANSWER_KEY in value)


def _is_schema_valid(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    steps = value.get(STEPS_KEY)
    return (
        isinstance(steps, list)
        and all(isinstance(s, str) for s in steps)
        and isinstance(value.get(ANSWER_KEY), str)
    )


def _to_text(value: Any) -> str | None:
    """JSON value -> text (``None`` for JSON null). Never raises for decoded JSON values."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _steps_from(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    return _clean(t for t in (_to_text(v) for v in items) if t is not None)


def _from_object(obj: dict, fmt: str, json_valid: bool) -> ParsedCompletion | None:
    """Steps and answer of a decoded schema object; ``None`` if a nested value is too deep to
    re-serialise (``json.dumps`` recursing past the limit that ``json.loads`` just passed)."""
    try:
        steps = _steps_from(obj.get(STEPS_KEY))
        answer_text = _to_text(obj.get(ANSWER_KEY))
    except RecursionError:
        return None
    answer = INSUFFICIENT_INFORMATION if answer_text is None else answer_text.strip()
    return ParsedCompletion(steps, answer, fmt, json_valid)


def _repair(span: str) -> str:
    span = _CONTROL_RE.sub("", span)
    return _TRAILING_COMMA_RE.sub(lambda m: m.group(1) or "", span)


def _json_span(text: str) -> dict | None:
    first = text.find("{")
    last = text.rfind("}")
    if first == -1 or last <= first:
        return None
    obj = _loads(_repair(text[first: last + 1]), strict=False)
    if _is_schema_object(obj):
        return obj
    key = _STEPS_KEY_RE.search(text, first)
    if key is None:
        return None
    start = text.rfind("{", first, key.start())
    if start == -1:
        return None
    try:
        obj, _end = json.JSONDecoder(strict=False).raw_decode(_repair(text[start: last + 1]))
    except (ValueError, RecursionError):
        return None
    return obj if _is_schema_object(obj) else None


def _between(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[str, int] | None:
    i = text.find(open_tag, start)
    if i == -1:
        return None
    j = text.find(close_tag, i + len(open_tag))
    if j == -1:
        return None
    return text[i + len(open_tag): j], j + len(close_tag)


def _parse_tags(text: str) -> tuple[tuple[str, ...], str] | None:
    think = _between(text, "<think>", "</think>")
    answer = _between(text, "<answer>", "</answer>", think[1] if think is not None else 0)
    if answer is None:
        return None
    steps = split_step_lines(think[0]) if think is not None else ()
    return steps, answer[0].strip()


def _parse_numbered(text: str) -> tuple[tuple[str, ...], str] | None:
    lines = text.splitlines()
    answer_at = None
    for idx, line in enumerate(lines):
        if _ANSWER_LINE_RE.match(line) is not None:
            answer_at = idx
    if answer_at is None:
        return None
    before = lines[:answer_at]
    before_text = "\n".join(before)
    if _STEP_MARK_RE.search(before_text) is None:
        return None
    steps = split_step_lines(before_text)
    m = _ANSWER_LINE_RE.match(lines[answer_at])
    answer = m.group(1).strip() if m is not None else ""
    if answer.endswith(("**", "__")):
        answer = answer[:-2].rstrip()
    if not answer:
        following = [ln.strip() for ln in lines[answer_at + 1:] if ln.strip()]
        answer = following[0] if following else ""
    return steps, answer

