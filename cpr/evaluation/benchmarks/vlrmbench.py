"""VLRMBench (arXiv 2503.07478) step-error tasks: which steps of a solution are wrong?

Records come from the ``vlrmbench`` adapter. The model is shown the image(s), the question (and
its options) and the solution's numbered steps, and asked for ``{"erroneous_steps": [ints]}``
(prompt: ``cpr/templates/vlrmbench.yaml``; the same prompt in both prompt modes). The steps
shown are those the labels describe: ``meta["reasoning_error_steps"]`` (the solution with the
injected errors, VLRMBench's ``reasoning_error`` field) when the task has it, else the record's
reference steps (``step_list``). Gold: the 1-based numbers of the steps whose ``task_gt`` label
is 1.

Parsing a completion (:func:`parse_erroneous_steps`, tolerant, tried in order):

1. JSON: the whole text (one enclosing code fence removed), else the span from the first ``{``
   to the last ``}`` (trailing commas removed): an object with key ``erroneous_steps`` whose
   value is a list of step numbers (ints, integral floats, or strings read by rule 3/4), a
   single number, or a "none" string; a top-level JSON list of step numbers is read the same way.
2. "None" answers: ``none``, ``no errors``, ``no erroneous steps``, ``all steps are correct``,
   ``[]``, ``n/a`` (case-insensitive, trailing punctuation allowed) give the empty set.
3. ``Step N`` mentions anywhere in the text (``Step 2, Step 4``, ``steps 2 and 4``, ``STEP3``):
   every number of each mention.
4. A bare list of numbers, the whole text: ``2, 4``, ``[2, 4]``, ``2 and 4``, ``2 4``.
5. Anything else is unparsable (``None``).

Per-sample score (**choice**, documented): F1 of the predicted set P against the gold set G,
``2|P & G| / (|P| + |G|)`` (= 2PR/(P+R)); **both empty gives 1.0** (the model correctly says no
step is wrong), exactly one empty gives 0.0. Predicted numbers outside ``1..n_steps`` stay in P
(false positives). An unparsable or missing completion scores 0.0. Reported: mean F1 and the
share of parsable completions (``parsed``, percent), overall and per task (``category``),
where the overall F1 is the mean over all samples.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from cpr.data.prompts import PromptTemplates
from cpr.data.records import Record, open_image, option_letters
from cpr.errors import ConfigError, InputError
from cpr.evaluation.benchmarks.base import Benchmark, ScoringSettings, format_counts, grouped
from cpr.evaluation.generation import MessagesFn

__all__ = [
    "VLRMBENCH",
    "VLRMBENCH_COLUMNS",
    "StepErrorTemplates",
    "gold_erroneous_steps",
    "load_vlrmbench_templates",
    "parse_erroneous_steps",
    "score_vlrmbench",
    "set_f1",
    "shown_steps",
    "step_error_messages",
    "summarize_step_errors",
    "task_of",
]

VLRMBENCH_COLUMNS = (("F1", "f1", 3), ("Parsed %", "parsed", 1))
"""Report columns: mean step-error F1 in [0, 1], parsable completions in percent."""

_ALLOWED = {
    "user": {"question", "options", "steps"},
    "options": {"options"},
    "option_line": {"letter", "text"},
    "step_line": {"number", "text"},
}


@dataclass(frozen=True)
class StepErrorTemplates:
    """The VLRMBench prompt strings (see ``cpr/templates/vlrmbench.yaml`` for placeholders)."""

    system: str
    user: str
    options: str
    option_line: str
    step_line: str
    step_separator: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            key = f"vlrmbench_prompts.{f.name}"
            if not isinstance(value, str):
                raise ConfigError(f"expected a string, got {type(value).__name__}", field=key)
            allowed = _ALLOWED.get(f.name)
            if allowed is None:
                continue
            try:
                used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
            except ValueError as e:
                raise ConfigError(f"invalid format template ({e})", field=key) from None
            if used - allowed:
                raise ConfigError(
                    f"unknown placeholder(s) {sorted(used - allowed)}; allowed: {sorted(allowed)}", field=key
                )


@lru_cache(maxsize=1)
def _packaged() -> dict[str, str]:
    text = resources.files("cpr").joinpath("templates", "vlrmbench.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def load_vlrmbench_templates(override: Mapping[str, Any] | None = None) -> StepErrorTemplates:
    """The packaged VLRMBench prompt, with keys of ``override`` replacing the defaults.

    Raises:
        ConfigError: an unknown key, a non-string value or an unknown placeholder.
    """
    data = dict(_packaged())
    known = {f.name for f in fields(StepErrorTemplates)}
    unknown = set(override or {}) - known
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}", field="vlrmbench_prompts")
    data.update(override or {})
    return StepErrorTemplates(**{k: data[k] for k in known})


# --------------------------------------------------------------------------- records


def shown_steps(record: Record) -> list[str]:
    """The steps the model is asked to check (see the module docstring).

    Raises:
        InputError: the steps are not strings, or their number differs from ``task_gt``'s.
    """
    steps = record.meta.get("reasoning_error_steps")
    if steps is None:
        steps = record.reference_steps
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise InputError("steps must be a list of strings", record_id=record.id, field="reasoning_error")
    labels = _labels(record)
    if len(steps) != len(labels):
        raise InputError(
            f"{len(steps)} steps but {len(labels)} task_gt labels", record_id=record.id, field="task_gt"
        )
    return [s.strip() for s in steps]


def _labels(record: Record) -> list[int]:
    labels = record.meta.get("task_gt")
    if not isinstance(labels, list) or not labels:
        raise InputError("missing or not a non-empty list of 0/1 labels", record_id=record.id, field="task_gt")
    for k, v in enumerate(labels):
        if isinstance(v, bool) or v not in (0, 1):
            raise InputError(f"label {k} is {v!r}, expected 0 or 1", record_id=record.id, field="task_gt")
    return [int(v) for v in labels]


def gold_erroneous_steps(record: Record) -> frozenset[int]:
    """1-based numbers of the steps labelled 1 in ``meta["task_gt"]``.

    Raises:
        InputError: ``task_gt`` missing, empty or holding values other than 0 / 1.
    """
    return frozenset(k + 1 for k, v in enumerate(_labels(record)) if v == 1)


def task_of(record: Record) -> str:
    """The VLRMBench task (``meta["task"]`` / ``meta["category"]``), ``"unknown"`` when absent."""
    value = record.meta.get("task") or record.meta.get("category")
    return value if isinstance(value, str) and value else "unknown"


def _options_block(record: Record, tpl: StepErrorTemplates) -> str:
    if not record.options:
        return ""
    lines = []
    for letter, text in zip(option_letters(len(record.options)), record.options, strict=True):
        lines.append(letter if text.strip() == letter else tpl.option_line.format(letter=letter, text=text))
    return tpl.options.format(options="\n".join(lines))


def step_error_messages(record: Record, tpl: StepErrorTemplates) -> list[dict[str, Any]]:
    """Conversational prompt (system + user with the images) asking for the erroneous steps."""
    steps = tpl.step_separator.join(
        tpl.step_line.format(number=k, text=text) for k, text in enumerate(shown_steps(record), start=1)
    )
    text = tpl.user.format(question=record.question, options=_options_block(record, tpl), steps=steps).strip()
    images = [{"type": "image", "image": open_image(ref)} for ref in record.images]
    return [
        {"role": "system", "content": [{"type": "text", "text": tpl.system}]},
        {"role": "user", "content": [*images, {"type": "text", "text": text}]},
    ]


def _messages_factory(templates: PromptTemplates | None, prompt_mode: str) -> MessagesFn:
    tpl = load_vlrmbench_templates()

    def build(record: Record) -> list[dict[str, Any]]:
        return step_error_messages(record, tpl)

    return build


# --------------------------------------------------------------------------- parsing

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
KEY = "erroneous_steps"


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
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return frozenset({value})
    if isinstance(value, float):
        return frozenset({int(value)}) if value.is_integer() else None
    if isinstance(value, str):
        return _numbers_from_text(value)
    if isinstance(value, list):
        out: set[int] = set()
        for item in value:
            if isinstance(item, list):
                return None
            got = _numbers_from_value(item)
            if got is None:
                return None
            out |= got
        return frozenset(out)
    return None


def _loads(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except (ValueError, RecursionError):
        return None


def _from_json(text: str) -> tuple[bool, frozenset[int] | None]:
    """``(decoded, numbers)``: whether a JSON object / list with step numbers was found."""
    candidates = [_loads(text)]
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        span = _TRAILING_COMMA_RE.sub(lambda m: m.group(1) or "", text[first: last + 1])
        candidates.append(_loads(span))
    for obj in candidates:
        if isinstance(obj, dict) and KEY in obj:
            return True, _numbers_from_value(obj[KEY])
        if isinstance(obj, list):
            return True, _numbers_from_value(obj)
    return False, None


def parse_erroneous_steps(text: str) -> tuple[frozenset[int] | None, str]:
    """Read the predicted erroneous step numbers from a completion (module docstring rules).

    Args:
        text: the completion.

    Returns:
        ``(numbers, format)``: the set of 1-based step numbers (empty for "no error"), or
        ``None`` when unparsable; ``format`` is ``"json"``, ``"text"`` or ``"none"`` (unparsed).

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    body = text.strip()
    fence = _FENCE_RE.match(body)
    if fence is not None:
        body = fence.group(1).strip()
    decoded, numbers = _from_json(body)
    if decoded and numbers is not None:
        return numbers, "json"
    numbers = _numbers_from_text(body)
    if numbers is not None:
        return numbers, "text"
    return None, "none"


def set_f1(predicted: frozenset[int] | set[int], gold: frozenset[int] | set[int]) -> float:
    """F1 of a predicted step set against the gold set; 1.0 when both are empty (module docstring)."""
    if not predicted and not gold:
        return 1.0
    overlap = len(set(predicted) & set(gold))
    return 2.0 * overlap / (len(predicted) + len(gold))


# --------------------------------------------------------------------------- scoring


def summarize_step_errors(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"n", "f1" (mean), "parsed" (percent of parsable completions)}``.

    Raises:
        ValueError: no samples.
    """
    n = len(samples)
    if n == 0:
        raise ValueError("cannot summarize zero samples")
    return {
        "n": n,
        "f1": sum(float(s["f1"]) for s in samples) / n,
        "parsed": 100.0 * sum(s["predicted"] is not None for s in samples) / n,
    }


def score_vlrmbench(
    records: Sequence[Record], completions: Mapping[str, str], settings: ScoringSettings | None = None
) -> dict[str, Any]:
    """Metrics dict of the VLRMBench step-error tasks: overall and per task.

    Args:
        records: ``vlrmbench`` records.
        completions: id -> completion (a missing one scores 0.0 with format ``"missing"``).
        settings: unused (no encoder, no answer); accepted for the registry's signature.

    Returns:
        See :mod:`cpr.evaluation.benchmarks.base`; sample rows are ``{"id", "task",
        "predicted" (sorted list or None), "gold" (sorted list), "f1", "format"}``.

    Raises:
        InputError: a record with missing or malformed ``task_gt``.
    """
    samples = []
    for record in records:
        gold = gold_erroneous_steps(record)
        text = completions.get(record.id)
        if text is None:
            predicted, fmt = None, "missing"
        else:
            predicted, fmt = parse_erroneous_steps(text)
        samples.append(
            {
                "id": record.id,
                "task": task_of(record),
                "predicted": sorted(predicted) if predicted is not None else None,
                "gold": sorted(gold),
                "f1": set_f1(predicted, gold) if predicted is not None else 0.0,
                "format": fmt,
            }
        )
    return {
        "benchmark": "vlrmbench",
        "overall": summarize_step_errors(samples),
        "groups": {"task": grouped(records, samples, task_of, summarize_step_errors)},
        "formats": format_counts(samples),
        "scoring": {"metric": "step-error set F1 (both empty = 1.0)"},
        "samples": samples,
    }


def _reference(record: Record) -> dict[str, Any]:
    return {
        "id": record.id,
        "task": task_of(record),
        "question": record.question,
        "options": list(record.options),
        "steps": shown_steps(record),
        "task_gt": _labels(record),
        "erroneous_steps": sorted(gold_erroneous_steps(record)),
    }


VLRMBENCH = Benchmark(
    name="vlrmbench",
    default_source="vlrmbench",
    description="VLRMBench step-error tasks: F1 of the predicted erroneous steps, overall and per task",
    columns=VLRMBENCH_COLUMNS,
    group_kinds=("task",),
    messages=_messages_factory,
    references=lambda records: [_reference(r) for r in records],
    score=lambda records, completions, settings: score_vlrmbench(records, completions, settings),
    uses_encoder=False,
    references_format="vlrmbench",
)
