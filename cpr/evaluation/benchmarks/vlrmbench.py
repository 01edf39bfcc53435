"""VLRMBench (arXiv 2503.07478) step-error tasks: which steps of a solution are wrong?

The model sees the image(s), the question (and options) and the solution's numbered steps, and answers
``{"erroneous_steps": [ints]}`` (prompt: ``cpr/templates/vlrmbench.yaml``, the same in both prompt
modes). The steps shown are those the labels describe: ``meta["reasoning_error_steps"]`` (the solution
with injected errors) when the task has it, else the reference steps. Gold: the 1-based numbers of the
steps whose ``task_gt`` label is 1.

Parsing (:func:`parse_erroneous_steps`, tried in order): (1) JSON, the whole text (one code fence
removed) or the span from the first ``{`` to the last ``}`` (trailing commas removed): key
``erroneous_steps`` holding a list of step numbers (ints, integral floats, strings read by rule 3/4), a
number or a "none" string, or a top-level list of numbers; (2) "none" answers (``none``, ``no errors``,
``all steps are correct``, ``[]``, ``n/a``) give the empty set; (3) ``Step N`` mentions anywhere
(``steps 2 and 4``, ``STEP3``); (4) a bare list of numbers (``2, 4``, ``[2, 4]``, ``2 and 4``);
(5) else unparsable.

Score (a choice, docs/choices.md): :func:`set_f1` of the predicted and gold sets (numbers outside the steps
stay in the predicted set; an unparsable or missing completion scores 0); reported: mean F1 and the percent
``parsed``, overall and per task.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

import yaml

from cpr.data.records import Record, open_image, option_letters
from cpr.errors import ConfigError, InputError
from cpr.evaluation.benchmarks.base import Benchmark, format_counts, grouped
from cpr.scoring import ScoringSettings

__all__ = ["VLRMBENCH", "load_vlrmbench_templates", "parse_erroneous_steps", "score_vlrmbench", "set_f1",
           "step_error_messages"]

_ALLOWED = {"user": {"question", "options", "steps"}, "options": {"options"}, "option_line": {"letter", "text"},
            "step_line": {"number", "text"}}


@dataclass(frozen=True)
class StepErrorTemplates:
    """The VLRMBench prompt strings (placeholders: ``cpr/templates/vlrmbench.yaml``)."""

    system: str
    user: str
    options: str
    option_line: str
    step_line: str
    step_separator: str


def load_vlrmbench_templates(override: Mapping[str, Any] | None = None) -> StepErrorTemplates:
    """The packaged VLRMBench prompt, with the keys of ``override`` replacing the defaults.

    Raises:
        ConfigError: an unknown key, a non-string value or an unknown placeholder
            (field ``vlrmbench_prompts.<key>``).
    """
    text = resources.files("cpr").joinpath("templates", "vlrmbench.yaml").read_text(encoding="utf-8")
    data = {**yaml.safe_load(text), **(override or {})}
    known = {f.name for f in fields(StepErrorTemplates)}
    if set(data) - known:
        raise ConfigError(f"unknown key(s) {sorted(set(data) - known)}; known: {sorted(known)}",
                          field="vlrmbench_prompts")
    for key, value in data.items():
        field = f"vlrmbench_prompts.{key}"
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {type(value).__name__}", field=field)
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as e:
            raise ConfigError(f"invalid format template ({e})", field=field) from None
        if key in _ALLOWED and used - _ALLOWED[key]:
            raise ConfigError(f"unknown placeholder(s) {sorted(used - _ALLOWED[key])}; allowed: "
                              f"{sorted(_ALLOWED[key])}", field=field)
    return StepErrorTemplates(**data)


def _labels(record: Record) -> list[int]:
    labels = record.meta.get("task_gt")
    if not isinstance(labels, list) or not labels:
        raise InputError("missing or not a non-empty list of 0/1 labels", record_id=record.id, field="task_gt")
    for k, v in enumerate(labels):
        if isinstance(v, bool) or v not in (0, 1):
            raise InputError(f"label {k} is {v!r}, expected 0 or 1", record_id=record.id, field="task_gt")
    return [int(v) for v in labels]


def _shown_steps(record: Record) -> list[str]:
    steps = record.meta.get("reasoning_error_steps")
    steps = record.reference_steps if steps is None else steps
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise InputError("steps must be a list of strings", record_id=record.id, field="reasoning_error")
    if len(steps) != len(_labels(record)):
        raise InputError(f"{len(steps)} steps but {len(_labels(record))} task_gt labels", record_id=record.id,
                         field="task_gt")
    return [s.strip() for s in steps]


def _gold(record: Record) -> list[int]:
    return [k + 1 for k, v in enumerate(_labels(record)) if v == 1]


def _task(record: Record) -> str:
    value = record.meta.get("task") or record.meta.get("category")
    return value if isinstance(value, str) and value else "unknown"


def step_error_messages(record: Record, tpl: StepErrorTemplates) -> list[dict[str, Any]]:
    """Conversational prompt (system, then user with the images) asking for the erroneous steps.

    Raises:
        InputError: malformed ``task_gt`` or steps, or a step count other than the labels' (id named).
    """
    steps = tpl.step_separator.join(tpl.step_line.format(number=k, text=text)
                                    for k, text in enumerate(_shown_steps(record), start=1))
    options = ""
    if record.options:
        options = tpl.options.format(options="\n".join(
            letter if text.strip() == letter else tpl.option_line.format(letter=letter, text=text)
            for letter, text in zip(option_letters(len(record.options)), record.options, strict=True)))
    text = tpl.user.format(question=record.question, options=options, steps=steps).strip()
    return [{"role": "system", "content": [{"type": "text", "text": tpl.system}]},
            {"role": "user", "content": [*({"type": "image", "image": open_image(ref)} for ref in record.images),
                                         {"type": "text", "text": text}]}]


_FENCE_RE = re.compile(r"\A```[ \t]*(?:json)?[ \t]*\r?\n?(.*?)```\Z", re.DOTALL | re.IGNORECASE)
_TRAILING_COMMA_RE = re.compile(r'("(?:[^"\\]|\\.)*")|,(?=\s*[\]}])', re.DOTALL)
_NONE_RE = re.compile(
    r"\A\W*(?:none|no errors?|no erroneous steps?|no incorrect steps?|no wrong steps?|n/?a"
    r"|all (?:the )?steps are correct|every step is correct|\[\s*\])[\s.!]*\Z",
    re.IGNORECASE,
)
_STEP_MENTION_RE = re.compile(
    r"\bsteps?\s*#?\s*(\d{1,4}(?:\s*(?:,|;|/|&|\band\b|\bor\b)\s*(?:steps?\s*)?#?\s*\d{1,4})*)", re.IGNORECASE
)
_BARE_LIST_RE = re.compile(r"\A\[?\s*\d{1,4}(?:\s*(?:,|;|\band\b|&|\s)\s*\d{1,4})*\s*\]?\s*\.?\Z", re.IGNORECASE)
_INT_RE = re.compile(r"\d{1,4}")


def _numbers_from_text(text: str) -> frozenset[int] | None:
    body = text.strip()
    if _NONE_RE.match(body):
        return frozenset()
    mentions = _STEP_MENTION_RE.findall(body)
    if mentions:
        return frozenset(int(n) for m in mentions for n in _INT_RE.findall(m))
    if _BARE_LIST_RE.match(body):
        return frozenset(int(n) for n in _INT_RE.findall(body))
    return None


def _numbers_from_value(value: Any) -> frozenset[int] | None:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return _numbers_from_text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        return frozenset({int(value)})
    if isinstance(value, list) and not any(isinstance(v, list) for v in value):
        parts = [_numbers_from_value(v) for v in value]
        return None if None in parts else frozenset().union(*parts)
    return None


def _from_json(text: str) -> frozenset[int] | None:
    """Step numbers of the first JSON object with ``erroneous_steps`` (or JSON list) in the text or its ``{..}``."""
    first, last = text.find("{"), text.rfind("}")
    spans = [text, _TRAILING_COMMA_RE.sub(lambda m: m.group(1) or "", text[first: last + 1])] if 0 <= first < last else [text]
    for span in spans:
        try:
            obj = json.loads(span, strict=False)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and "erroneous_steps" in obj:
            return _numbers_from_value(obj["erroneous_steps"])
        if isinstance(obj, list):
            return _numbers_from_value(obj)
    return None


def parse_erroneous_steps(text: str) -> tuple[frozenset[int] | None, str]:
    """Read the predicted erroneous step numbers from a completion (module docstring rules).

    Returns:
        ``(numbers, format)``: the 1-based step numbers (empty for "no error"), or ``None`` when
        unparsable; ``format`` is ``"json"``, ``"text"`` or ``"none"`` (unparsed).

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    body = text.strip()
    fence = _FENCE_RE.match(body)
    body = fence.group(1).strip() if fence is not None else body
    numbers = _from_json(body)
    if numbers is not None:
        return numbers, "json"
    numbers = _numbers_from_text(body)
    return (numbers, "text") if numbers is not None else (None, "none")


def set_f1(predicted: frozenset[int] | set[int], gold: frozenset[int] | set[int]) -> float:
    """F1 of a predicted step set P against the gold set G, ``2|P & G| / (|P| + |G|)``; 1.0 when both are
    empty (the model rightly says no step is wrong)."""
    if not predicted and not gold:
        return 1.0
    return 2.0 * len(set(predicted) & set(gold)) / (len(predicted) + len(gold))


def _summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    n = len(samples)
    return {"n": n, "f1": sum(float(s["f1"]) for s in samples) / n,
            "parsed": 100.0 * sum(s["predicted"] is not None for s in samples) / n}


def score_vlrmbench(records: Sequence[Record], completions: Mapping[str, str],
                    settings: ScoringSettings | None = None) -> dict[str, Any]:
    """Metrics dict of the step-error tasks, overall and per task (``settings`` unused: no encoder).
    Sample rows: ``{"id", "task", "predicted" (sorted list or None), "gold", "f1", "format"}``; a missing
    completion scores 0 with format ``"missing"``.

    Raises:
        InputError: a record with missing or malformed ``task_gt``.
    """
    samples = []
    for record in records:
        gold = _gold(record)
        text = completions.get(record.id)
        predicted, fmt = (None, "missing") if text is None else parse_erroneous_steps(text)
        samples.append({"id": record.id, "task": _task(record),
                        "predicted": sorted(predicted) if predicted is not None else None, "gold": gold,
                        "f1": set_f1(predicted, set(gold)) if predicted is not None else 0.0, "format": fmt})
    return {"benchmark": "vlrmbench", "overall": _summarize(samples),
            "groups": {"task": grouped(records, samples, _task, _summarize)},
            "formats": format_counts(samples), "scoring": {"metric": "step-error set F1 (both empty = 1.0)"},
            "samples": samples}


def _messages(templates: Any, prompt_mode: str) -> Any:
    tpl = load_vlrmbench_templates()
    return lambda record: step_error_messages(record, tpl)


VLRMBENCH = Benchmark(
    name="vlrmbench", default_source="vlrmbench",
    description="VLRMBench step-error tasks: F1 of the predicted erroneous steps, overall and per task",
    columns=(("F1", "f1", 3), ("Parsed %", "parsed", 1)), group_kinds=("task",), messages=_messages,
    references=lambda records: [{"id": r.id, "task": _task(r), "question": r.question, "options": list(r.options),
                                 "steps": _shown_steps(r), "task_gt": _labels(r), "erroneous_steps": _gold(r)}
                                for r in records],
    score=score_vlrmbench, references_format="vlrmbench")
