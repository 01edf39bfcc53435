"""Parse a policy completion into reasoning steps and a final answer (docs/method.md section 1).

Parsers, in order; the first that succeeds names :attr:`ParsedCompletion.format`: ``"json"`` (the whole
completion, one Markdown code fence removed), ``"json_span"`` (first ``{`` to last ``}``, control characters
and trailing commas removed; failing that, the object at the first ``"reasoning_steps"`` key), ``"tags"``
(``<think>..</think>`` optional, ``<answer>..</answer>``; **choice**), ``"numbered"`` (``1.`` / ``Step N:``
lines and an ``Answer:`` line; **choice**), ``"none"`` (no steps, answer ``"insufficient information"``). A
JSON value counts only if it is an object with ``"reasoning_steps"`` or ``"answer"``; non-string values become
text (numbers ``str(n)``, ``null`` steps dropped, lists and objects ``json.dumps``). Never raises for a
``str``, and no regular expression here can backtrack catastrophically.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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
        json_valid: the format-reward condition (docs/method.md section 4), whichever parser succeeded:
            the stripped completion, one code fence removed, ``json.loads`` to an object whose
            ``"reasoning_steps"`` is a list of strings (may be empty) and whose ``"answer"`` is a string.
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
# Step markers: "1." "1)" "(1)" at the start of a line, or "Step N:" ("Step N." "Step N)"
# "Step N -") anywhere after whitespace; an optional bullet and markdown bold around them.
_STEP_MARK_RE = re.compile(
    r"(?:^[ \t]*(?:[-*•][ \t]*)?(?:\*\*)?\(?\d{1,4}[.)](?:\*\*)?[ \t]+"
    r"|(?:^|(?<=\s))(?:[-*•][ \t]*)?(?:\*\*)?step[ \t]*\d{1,4}[ \t]*(?:\*\*)?[ \t]*[:.)\-–][ \t]*(?:\*\*)?)",
    re.IGNORECASE | re.MULTILINE)
_BULLET_RE = re.compile(r"[ \t]*[-*•][ \t]+")
# "Answer:" / "Final answer:" line, markdown emphasis and heading marks allowed around it.
_ANSWER_LINE_RE = re.compile(r"[ \t#>*_]*(?:final[ \t]+)?answer[ \t]*(?:\*\*|__)?[ \t]*[:：][ \t]*"
                             r"(?:\*\*|__)?[ \t]*(.*)", re.IGNORECASE)


def parse_completion(text: str) -> ParsedCompletion:
    """Parse one completion text (module docstring; :func:`completion_text` for TRL's conversational
    form) into a :class:`ParsedCompletion`. Raises ``TypeError`` if ``text`` is not a ``str``."""
    if not isinstance(text, str):
        raise TypeError(f"parse_completion expects str, got {type(text).__name__}")

    fence = _FENCE_RE.match(stripped := text.strip())
    whole = _loads(fence.group(1).strip() if fence is not None else stripped)
    json_valid = _is_schema_valid(whole)
    if _is_schema_object(whole) and (parsed := _from_object(whole, "json", json_valid)):
        return parsed
    if (obj := _json_span(text)) is not None and (parsed := _from_object(obj, "json_span", json_valid)):
        return parsed
    for fmt, parser in (("tags", _parse_tags), ("numbered", _parse_numbered)):
        if (found := parser(text)) is not None:
            return ParsedCompletion(*found, fmt, json_valid)
    return ParsedCompletion((), INSUFFICIENT_INFORMATION, "none", json_valid)


def completion_text(completion: Any) -> str:
    """Text of one TRL completion: a ``str``, or the *last* assistant message of a conversational
    list ``[{"role": "assistant", "content": str | [{"type": "text", "text": str}, ...]}]`` (its text
    parts concatenated, other parts skipped).

    Raises:
        TypeError: not a ``str`` or a list of message dicts, or a part of the wrong type (named).
        ValueError: a conversational completion without an assistant message.
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, (list, tuple)):
        raise TypeError(f"completion must be str or a list of chat messages, got {type(completion).__name__}")
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
    """The stripped, non-empty steps of a free-text block (e.g. ``<think>``): with step markers (``1.``,
    ``1)``, ``(1)`` starting a line, ``Step N:`` / ``Step N.`` after whitespace) each runs to the next,
    line breaks joined by a space (text before the first is dropped); else every non-blank line, a
    leading bullet (``-``, ``*``, ``•``) removed."""
    marks = list(_STEP_MARK_RE.finditer(block))
    if marks:
        ends = [m.start() for m in marks[1:]] + [len(block)]
        return _clean(" ".join(block[m.end(): e].split()) for m, e in zip(marks, ends, strict=True))
    out = []
    for line in block.splitlines():
        m = _BULLET_RE.match(line)
        out.append(line[m.end():] if m is not None else line)
    return _clean(out)


def _clean(items: Any) -> tuple[str, ...]:
    return tuple(s for s in (str(x).strip() for x in items) if s)


def _loads(text: str, *, strict: bool = True) -> Any:
    """``json.loads``, ``None`` when it did not decode (ValueError, RecursionError)."""
    if not text:
        return None
    try:
        return json.loads(text, strict=strict)
    except (ValueError, RecursionError):
        return None


def _is_schema_object(value: Any) -> bool:
    return isinstance(value, dict) and (STEPS_KEY in value or ANSWER_KEY in value)


def _is_schema_valid(value: Any) -> bool:
    steps = value.get(STEPS_KEY) if isinstance(value, dict) else None
    return (isinstance(steps, list) and all(isinstance(s, str) for s in steps)
            and isinstance(value.get(ANSWER_KEY), str))


def _to_text(value: Any) -> str | None:
    """JSON value -> text (``None`` for JSON null). Never raises for decoded JSON values."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False)  # true / false, lists, objects


def _steps_from(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    return _clean(t for t in (_to_text(v) for v in items) if t is not None)


def _from_object(obj: dict, fmt: str, json_valid: bool) -> ParsedCompletion | None:
    # None if a nested value is too deep for json.dumps (past the limit json.loads just passed)
    try:
        steps = _steps_from(obj.get(STEPS_KEY))
        answer_text = _to_text(obj.get(ANSWER_KEY))
    except RecursionError:
        return None
    answer = INSUFFICIENT_INFORMATION if answer_text is None else answer_text.strip()
    return ParsedCompletion(steps, answer, fmt, json_valid)


def _repair(span: str) -> str:
    return _TRAILING_COMMA_RE.sub(lambda m: m.group(1) or "", _CONTROL_RE.sub("", span))


def _json_span(text: str) -> dict | None:
    first, last = text.find("{"), text.rfind("}")
    if first == -1 or last <= first:
        return None
    obj = _loads(_repair(text[first: last + 1]), strict=False)
    if _is_schema_object(obj):
        return obj
    key = text.find(f'"{STEPS_KEY}"', first)
    start = text.rfind("{", first, key) if key != -1 else -1
    if start == -1:
        return None
    try:
        obj, _end = json.JSONDecoder(strict=False).raw_decode(_repair(text[start: last + 1]))
    except (ValueError, RecursionError):
        return None
    return obj if _is_schema_object(obj) else None


def _between(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[str, int] | None:
    i = text.find(open_tag, start)
    j = text.find(close_tag, i + len(open_tag)) if i != -1 else -1
    return (text[i + len(open_tag): j], j + len(close_tag)) if j != -1 else None


def _parse_tags(text: str) -> tuple[tuple[str, ...], str] | None:
    think = _between(text, "<think>", "</think>")
    answer = _between(text, "<answer>", "</answer>", think[1] if think is not None else 0)
    if answer is None:
        return None
    steps = split_step_lines(think[0]) if think is not None else ()
    return steps, answer[0].strip()


def _parse_numbered(text: str) -> tuple[tuple[str, ...], str] | None:
    lines = text.splitlines()
    answer_at = max((i for i, line in enumerate(lines) if _ANSWER_LINE_RE.match(line)), default=None)
    if answer_at is None or _STEP_MARK_RE.search(before := "\n".join(lines[:answer_at])) is None:
        return None
    steps = split_step_lines(before)
    answer = _ANSWER_LINE_RE.match(lines[answer_at]).group(1).strip()
    if answer.endswith(("**", "__")):
        answer = answer[:-2].rstrip()
    if not answer:
        following = [ln.strip() for ln in lines[answer_at + 1:] if ln.strip()]
        answer = following[0] if following else ""
    return steps, answer

