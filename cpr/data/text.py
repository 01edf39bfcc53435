"""Turning published solution prose into ordered reference steps.

Sentence splitting uses pysbd (a maintained rule-based sentence boundary detector, which already
keeps "e.g.", "i.e.", "Mr." and decimals such as "3.5" inside a sentence). LaTeX is protected
before pysbd sees the text: every math span (``$...$``, ``$$...$$``, ``\\[...\\]``, ``\\(...\\)``
and ``\\begin{env}...\\end{env}`` blocks, nested environments included) is replaced by an opaque
placeholder and restored afterwards, so a step never ends inside a formula.

**Choice (display blocks):** an ``align*`` / ``aligned`` / ``array`` / ``tabular`` block, or a
display formula, stays whole *inside the sentence that introduces it* ("..., we have
\\begin{align*}...\\end{align*}") and is never split into one step per line: the lines of a
derivation are one reasoning move, and splitting on ``\\\\`` would produce steps such as
"&= 180" that no model would write. When the block's last line ends with a period
("x + y &= 90.\\n\\end{align*}"), the block ends the sentence.
"""

from __future__ import annotations

import functools
import re

import pysbd

_OPEN = "\ue000"  # private-use characters: never present in real text
_CLOSE = "\ue001"
_TOKEN_RE = re.compile(_OPEN + r"(\d+)" + _CLOSE + r"(\.)?")
_BEGIN_RE = re.compile(r"\\begin\{([A-Za-z]+\*?)\}")
_ASY_RE = re.compile(r"\[asy\].*?(\[/asy\]|\Z)", re.DOTALL)
# LaTeX commands that start with "\n"; any other "\n" (not after a backslash) is a newline
# written literally as two characters.
_N_COMMANDS = (
    "nabla natural ncong ne nearrow neg neq newline nexists ngeq ngtr ni nleftarrow nleftrightarrow "
    "nleq nless nmid nolimits nonumber noindent not notin nparallel nprec nRightarrow nrightarrow "
    "nLeftarrow nsim nsubseteq nsucc nsupseteq ntriangleleft ntriangleright nu nvdash nwarrow"
).split()
_LITERAL_NEWLINE_RE = re.compile(
    r"(?<!\\)\\n(?!(?:"
    + "|".join(sorted((c[1:] for c in _N_COMMANDS), key=len, reverse=True))
    + r")(?![A-Za-z]))"
)
_SOLUTION_N_RE = re.compile(r"^\s*Solution\s*1\s*[:.]\s*(.*?)(?:\n\s*Solution\s*2\s*[:.].*)?\Z", re.DOTALL)
_IMAGE_PLACEHOLDER_RE = re.compile(r"[ \t]*<image\d*>[ \t]*")
_STEP_PREFIX_RE = re.compile(r"^\s*STEP\s*\d+\s*[:.)]\s*", re.IGNORECASE)
_ONLY_PUNCT_RE = re.compile(r"^[\W_]*$")


@functools.lru_cache(maxsize=1)
def _segmenter() -> pysbd.Segmenter:
    return pysbd.Segmenter(language="en", clean=False)


def _find_unescaped(text: str, needle: str, start: int) -> int:
    """Index of the next ``needle`` at or after ``start`` not preceded by a backslash, or -1."""
    i = text.find(needle, start)
    while i != -1 and i > 0 and text[i - 1] == "\\":
        i = text.find(needle, i + 1)
    return i


def _match_environment(text: str, start: int, name: str) -> int:
    """End index (exclusive) of ``\\begin{name}`` at ``start`` with nesting, or -1 if unclosed."""
    begin, end = f"\\begin{{{name}}}", f"\\end{{{name}}}"
    depth, i = 0, start
    while i < len(text):
        if text.startswith(begin, i):
            depth += 1
            i += len(begin)
        elif text.startswith(end, i):
            depth -= 1
            i += len(end)
            if depth == 0:
                return i
        else:
            i += 1
    return -1


def find_math_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every top-level LaTeX math span, left to right.

    Recognises ``$$...$$``, ``$...$`` (``\\$`` is a literal dollar), ``\\[...\\]``, ``\\(...\\)``
    and ``\\begin{env}...\\end{env}``. An unclosed delimiter is left as plain text.
    """
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("\\$", i):
            i += 2
            continue
        end = -1
        if text.startswith("$$", i):
            close = _find_unescaped(text, "$$", i + 2)
            end = close + 2 if close != -1 else -1
        elif text[i] == "$":
            close = _find_unescaped(text, "$", i + 1)
            end = close + 1 if close != -1 else -1
        elif text.startswith("\\[", i):
            close = text.find("\\]", i + 2)
            end = close + 2 if close != -1 else -1
        elif text.startswith("\\(", i):
            close = text.find("\\)", i + 2)
            end = close + 2 if close != -1 else -1
        elif text.startswith("\\begin{", i):
            m = _BEGIN_RE.match(text, i)
            if m:
                end = _match_environment(text, i, m.group(1))
        if end != -1:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def _ends_sentence(span: str) -> bool:
    """True when the math span's content ends with a period (e.g. ``$x = 5.$``)."""
    inner = span
    for opener, closer in (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if inner.startswith(opener) and inner.endswith(closer) and len(inner) >= len(opener) + len(closer):
            inner = inner[len(opener) : len(inner) - len(closer)]
            break
    else:
        m = re.search(r"\\end\{[A-Za-z]+\*?\}\s*$", inner)
        if m:
            inner = inner[: m.start()]
    return inner.rstrip().endswith(".")


def _protect(text: str) -> tuple[str, list[str], list[bool]]:
    spans = find_math_spans(text)
    out: list[str] = []
    originals: list[str] = []
    period_added: list[bool] = []
    last = 0
    for k, (start, end) in enumerate(spans):
        span = text[start:end]
        out.append(text[last:start])
        out.append(f"{_OPEN}{k}{_CLOSE}")
        originals.append(span)
        ends = _ends_sentence(span)
        period_added.append(ends)
        if ends:
            out.append(".")
            if end < len(text) and not text[end].isspace():
                out.append(" ")
        last = end
    out.append(text[last:])
    return "".join(out), originals, period_added


def _restore(segment: str, originals: list[str], period_added: list[bool]) -> str:
    def sub(m: re.Match[str]) -> str:
        k = int(m.group(1))
        tail = "" if period_added[k] else (m.group(2) or "")
        return originals[k] + tail

    return _TOKEN_RE.sub(sub, segment)


def _merge_lines(lines: list[str]) -> list[str]:
    """Join continuation lines: a line that is only math, or that starts with a lowercase letter,
    continues the previous line (a display formula between "we have" and "where ...")."""
    merged: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        math_only = not _TOKEN_RE.sub("", stripped).strip(" .,;:")
        prev_math_only = bool(merged) and not _TOKEN_RE.sub("", merged[-1]).strip(" .,;:")
        if merged and (math_only or prev_math_only and stripped[0].islower() or stripped[0].islower()):
            merged[-1] = f"{merged[-1]} {stripped}"
        else:
            merged.append(stripped)
    return merged


def split_sentences(text: str, *, split_lines: bool = True) -> list[str]:
    """Split prose into sentences with LaTeX math kept intact.

    Args:
        text: the prose.
        split_lines: also break at newlines outside math, except that a line made only of math,
            or one starting with a lowercase letter, continues the line before it. Newlines
            inside a math span never break it.

    Returns:
        Stripped, non-empty sentences in order (runs of spaces outside math collapsed);
        segments made only of punctuation are dropped.
    """
    protected, originals, period_added = _protect(text)
    protected = re.sub(r"[ \t]{2,}", " ", protected)
    chunks = _merge_lines(protected.split("\n")) if split_lines else [protected.replace("\n", " ")]
    sentences: list[str] = []
    for chunk in chunks:
        if not chunk.strip():
            continue
        for seg in _segmenter().segment(chunk):
            restored = _restore(seg, originals, period_added).strip()
            if restored and not _ONLY_PUNCT_RE.match(restored):
                sentences.append(restored)
    return sentences


def first_solution(text: str) -> str:
    """Keep only "Solution 1" of a text that starts "Solution 1: ... Solution 2: ...".

    **Choice:** alternative solutions are different reasoning paths; concatenating them would
    ask the policy for both. Text without a leading "Solution 1" label is returned unchanged.
    """
    m = _SOLUTION_N_RE.match(text)
    return m.group(1) if m else text


def unescape_literal_newlines(text: str) -> str:
    """Turn literal two-character ``\\n`` sequences into newlines.

    Some MATH-Vision solutions contain a JSON-escaped ``\\n`` as text (eight of the 100 sample
    records). A backslash followed by ``n`` and a lowercase letter is a LaTeX command
    (``\\neq``, ``\\nu``) and is kept.
    """
    return _LITERAL_NEWLINE_RE.sub("\n", text)


def drop_asy_blocks(text: str) -> str:
    """Remove ``[asy]...[/asy]`` Asymptote drawing code (an unclosed block runs to the end)."""
    return _ASY_RE.sub(" ", text)


def remove_image_placeholders(text: str) -> str:
    """Remove ``<image>``/``<image1>``-style placeholders and tidy the whitespace they leave."""
    out = _IMAGE_PLACEHOLDER_RE.sub(" ", text)
    out = re.sub(r"[ \t]{2,}", " ", out)
    out = re.sub(r"[ \t]+\n", "\n", out)
    out = re.sub(r"\n[ \t]+", "\n", out)
    out = re.sub(r"\n{3,}", "\n\n", out)
    return out.strip()


def strip_step_prefix(step: str) -> str:
    """Remove a leading ``STEPn:`` label (VLRMBench) and surrounding whitespace."""
    return _STEP_PREFIX_RE.sub("", step, count=1).strip()


def split_blank_lines(text: str) -> list[str]:
    """Split at blank lines (``\\n\\n``, TabMWP's step separator); strip, drop empty parts."""
    return [part.strip() for part in re.split(r"\n[ \t]*\n", text) if part.strip()]
