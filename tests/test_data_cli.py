"""``cpr data inspect`` through ``cpr.cli.main``."""

from __future__ import annotations

import json
import statistics

from cpr.cli import main


def test_inspect_tabmwp_samples(samples_dir, capsys):
    path = samples_dir / "tabmwp" / "problems_test1k_subset.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    n_steps = [len([p for p in prob["solution"].split("\n\n") if p.strip()]) for prob in raw.values()]
    assert main(["data", "inspect", "--source", "tabmwp", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1] == f"records: {len(raw)}"
    assert lines[2] == "buckets: easy 38, medium 38, hard 38"
    assert lines[3] == (
        f"reference steps: min {min(n_steps)}, mean {statistics.fmean(n_steps):.2f}, max {max(n_steps)}"
    )
    first_pid, first = next(iter(raw.items()))
    assert f"first record: id {first_pid} (easy, 1 image(s))" in out
    assert "[user]\n<image>\nQuestion: " + first["question"] in out
    target = json.loads(out.split("[target]\n", 1)[1].strip())
    assert target == {
        "reasoning_steps": [p.strip() for p in first["solution"].split("\n\n") if p.strip()],
        "answer": first["answer"],
    }


def test_inspect_eval_mode_and_split(samples_dir, capsys):
    rc = main(
        [
            "data",
            "inspect",
            "--source",
            "mathvision",
            "--path",
            str(samples_dir / "mathvision"),
            "--split",
            "test",
            "--mode",
            "eval",
            "--limit",
            "3",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "records: 3" in out and "insufficient information" in out


def test_inspect_invalid_input_exits_2_with_located_message(tmp_path, samples_dir, capsys):
    image = samples_dir / "tabmwp" / "tables" / "5739.png"
    rows = [
        {"id": "a", "image": str(image), "question": "Q?", "answer": "1", "reference_steps": ["s"]},
        {"id": "b", "image": str(image), "question": "Q?", "answer": "1", "reference_steps": []},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["data", "inspect", "--source", "jsonl", "--path", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"cpr data: error: {path}:2 (id b) field 'reference_steps': reference_steps is empty"
    assert len(err.splitlines()) == 1

    assert main(["data", "inspect", "--source", "jsonl", "--path", str(path), "--on-invalid", "skip"]) == 0
    out = capsys.readouterr().out
    assert "records: 1" in out and "skipped 1 invalid: 1 empty reference_steps" in out


def test_inspect_bad_option_and_missing_path(tmp_path, capsys):
    assert (
        main(["data", "inspect", "--source", "scienceqa", "--path", str(tmp_path), "--option", "oops"]) == 2
    )
    assert "field '--option': expected KEY=VALUE, got 'oops'" in capsys.readouterr().err
    assert main(["data", "inspect", "--source", "mathvision", "--path", str(tmp_path / "none.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"cpr data: error: {tmp_path / 'none.jsonl'}: mathvision: path does not exist"
    )


def test_inspect_with_bucket_and_template_files(tmp_path, samples_dir, capsys):
    buckets = tmp_path / "buckets.yaml"
    buckets.write_text(
        "fields:\n  mathvision: {field: level, easy: [1, 2, 3, 4], hard: [5]}\n", encoding="utf-8"
    )
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text('user: "Problem: {question}"\n', encoding="utf-8")
    path = samples_dir / "mathvision" / "test_subset.jsonl"
    rc = main(
        [
            "data",
            "inspect",
            "--source",
            "mathvision",
            "--path",
            str(path),
            "--buckets",
            str(buckets),
            "--templates",
            str(prompts),
            "--no-image-check",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "buckets: easy 80, medium 0, hard 20" in out
    assert "[user]\n<image>\nProblem: In $\\triangle ABC$, what is the value of $x + y$?\n" in out


def test_inspect_option_values_are_yaml_and_synthetic_needs_no_path(capsys):
    from cpr.data.synthetic import generate

    # size=9 is the integer 9 (as --set reads it), not the string '9' the adapter refuses
    argv = ["data", "inspect", "--source", "synthetic", "--split", "test", "--option", "size=9", "--option", "seed=2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    expected = list(generate(9, seed=2, split="test"))
    assert "records: 9" in out.splitlines() and f"first record: id {expected[0].id} " in out
    assert main(["data", "inspect", "--source", "synthetic", "--option", "size=[1"]) == 2
    assert "field '--option': 'size=[1': the value is not valid YAML" in capsys.readouterr().err
    assert main(["data", "inspect", "--source", "mathvision"]) == 2  # a source that reads files needs --path
    assert "field '--path': source 'mathvision' reads a dataset: give its path" in capsys.readouterr().err
