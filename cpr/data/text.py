"""Turning published solution prose into ordered reference steps: pysbd sentences with LaTeX math spans
kept whole (placeholders while pysbd runs; the rules, a **choice**: docs/data.md section 4).
"""

from __future__ import annotations

import functools
import re

import pysbd

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: never present in real text
_TOKEN_RE = re.compile(_OPEN + r"(\d+)" + _CLOSE + r"(\.)?")
_BEGIN_RE = re.compile(r"\\begin\{([A-Za-z]+\*?)\}")
_ASY_RE = re.compile(r"\[asy\].*?(\[/asy\]|\Z)", re.DOTALL)
# LaTeX commands that start with "\n"; any other "\n" (not after a backslash) is a literal newline escape
_N_COMMANDS = (
    "nabla natural ncong ne nearrow neg neq newline nexists ngeq ngtr ni nleftarrow nleftrightarrow nleq nless nmid "
    "nolimits nonumber noindent not notin nparallel nprec nRightarrow nrightarrow nLeftarrow nsim nsubseteq nsucc "
    "nsupseteq ntriangleleft ntriangleright nu nvdash nwarrow"
).split()
_LITERAL_NEWLINE_RE = re.compile(
    r"(?<!\\)\\n(?!(?:" + "|".join(sorted((c[1:] for c in _N_COMMANDS), key=len, reverse=True)) + r")(?![A-Za-z]))"
)
_SOLUTION_1_RE = re.compile(r"^\s*Solution\s*1\s*[:.]\s*(.*?)(?:\n\s*Solution\s*2\s*[:.].*)?\Z", re.DOTALL)
_IMAGE_PLACEHOLDER_RE = re.compile(r"[ \t]*<image\d*>[ \t]*")
_STEP_PREFIX_RE = re.compile(r"^\s*STEP\s*\d+\s*[:.)]\s*", re.IGNORECASE)
_ONLY_PUNCT_RE = re.compile(r"^[\W_]*$")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"))


@functools.lru_cache(maxsize=1)
def _segmenter() -> pysbd.Segmenter:
    return pysbd.Segmenter(language="en", clean=False)


def _close_of(text: str, start: int) -> int:
    """End (exclusive) of the math span opening at ``start``, or -1 (none opens there, or unclosed)."""
    for opener, closer in _DELIMITERS:
        if text.startswith(opener, start):
            i = text.find(closer, start + len(opener))
            while opener[0] == "$" and i > 0 and text[i - 1] == "\\":  # \$ is a literal dollar
                i = text.find(closer, i + 1)
            return i + len(closer) if i != -1 else -1
    if not (m := _BEGIN_RE.match(text, start)):
        return -1
    begin, end, depth, i = f"\\begin{{{m.group(1)}}}", f"\\end{{{m.group(1)}}}", 0, start
    while i < len(text):  # nested environments of the same name
        if text.startswith(begin, i):
            depth, i = depth + 1, i + len(begin)
        elif text.startswith(end, i):
            depth, i = depth - 1, i + len(end)
            if depth == 0:
                return i
        else:
            i += 1
    return -1


def find_math_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every top-level LaTeX math span, left to right: ``$$...$$``, ``$...$``
    (``\\$`` is a literal dollar), ``\\[...\\]``, ``\\(...\\)`` and ``\\begin{env}...\\end{env}``.
    An unclosed delimiter is left as plain text."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        if text.startswith("\\$", i):
            i += 2
        elif (end := _close_of(text, i)) != -1:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def _ends_sentence(span: str) -> bool:
    """True when the math span's content ends with a period (``$x = 5.$``, ``x &= 90.\\n\\end{align*}``)."""
    for opener, closer in _DELIMITERS:
        if span.startswith(opener) and span.endswith(closer) and len(span) >= len(opener) + len(closer):
            return span[len(opener) : len(span) - len(closer)].rstrip().endswith(".")
    return re.sub(r"\\end\{[A-Za-z]+\*?\}\s*$", "", span).rstrip().endswith(".")


def _protect(text: str) -> tuple[str, list[str], list[bool]]:
    """``text`` with each math span replaced by a token (plus ". " when the span ends a sentence)."""
    out, originals, ends, last = [], [], [], 0
    for k, (start, end) in enumerate(find_math_spans(text)):
        span = text[start:end]
        originals.append(span)
        ends.append(_ends_sentence(span))
        period = ("." + (" " if end < len(text) and not text[end].isspace() else "")) if ends[-1] else ""
        out += [text[last:start], f"{_OPEN}{k}{_CLOSE}", period]
        last = end
    return "".join([*out, text[last:]]), originals, ends


def _merge_lines(lines: list[str]) -> list[str]:
    """Join a line made only of math, or starting with a lowercase letter, to the previous line."""
    merged: list[str] = []
    for line in map(str.strip, lines):
        if not line:
            continue
        math_only = not _TOKEN_RE.sub("", line).strip(" .,;:")
        if merged and (math_only or line[0].islower()):
            merged[-1] = f"{merged[-1]} {line}"
        else:
            merged.append(line)
    return merged


def split_sentences(text: str, *, split_lines: bool = True) -> list[str]:
    """Split prose into sentences with LaTeX math kept intact: stripped, non-empty sentences in order (runs of
    spaces outside math collapsed; segments made only of punctuation dropped). ``split_lines`` also breaks at
    newlines outside math, except that a line made only of math, or one starting with a lowercase letter,
    continues the line before it."""
    protected, originals, ends = _protect(text)
    protected = re.sub(r"[ \t]{2,}", " ", protected)
    chunks = _merge_lines(protected.split("\n")) if split_lines else [protected.replace("\n", " ")]

    def restore(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return originals[k] + ("" if ends[k] else m.group(2) or "")

    sentences = [_TOKEN_RE.sub(restore, seg).strip() for chunk in chunks if chunk.strip()
                 for seg in _segmenter().segment(chunk)]
    return [s for s in sentences if s and not _ONLY_PUNCT_RE.match(s)]


def solution_steps(solution: str) -> list[str]:
    """MATH-Vision ``solution`` prose -> reference steps: literal ``\\n`` escapes become newlines,
    ``[asy]`` drawing code is dropped, only "Solution 1" is kept, then :func:`split_sentences`."""
    return split_sentences(first_solution(drop_asy_blocks(unescape_literal_newlines(solution)).strip()))


def first_solution(text: str) -> str:
    """Keep only "Solution 1" of a text starting "Solution 1: ... Solution 2: ..." (a **choice**: the
    alternatives are other reasoning paths); other text is returned unchanged."""
    return m.group(1) if (m := _SOLUTION_1_RE.match(text)) else text


def unescape_literal_newlines(text: str) -> str:
    """Turn literal two-character ``\\n`` sequences (JSON escapes left in some MATH-Vision solutions)
    into newlines; LaTeX commands starting with ``\\n`` (``\\neq``, ``\\nu``) are kept."""
    return _LITERAL_NEWLINE_RE.sub("\n", text)


def drop_asy_blocks(text: str) -> str:
    """Remove ``[asy]...[/asy]`` Asymptote drawing code (an unclosed block runs to the end)."""
    return _ASY_RE.sub(" ", text)


def remove_image_placeholders(text: str) -> str:
    """Remove ``<image>`` / ``<image1>`` placeholders and tidy the whitespace they leave."""
    out = re.sub(r"[ \t]{2,}", " ", _IMAGE_PLACEHOLDER_RE.sub(" ", text))
    out = re.sub(r"\n[ \t]+", "\n", re.sub(r"[ \t]+\n", "\n", out))
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def strip_step_prefix(step: str) -> str:
    """Remove a leading ``STEPn:`` label (VLRMBench) and surrounding whitespace."""
    return _STEP_PREFIX_RE.sub("", step, count=1).strip()


def split_blank_lines(text: str) -> list[str]:
    """Split at blank lines (TabMWP's step separator); strip, drop empty parts."""
    return [part.strip() for part in re.split(r"\n[ \t]*\n", text) if part.strip()]
