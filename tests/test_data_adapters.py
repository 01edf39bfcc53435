"""Adapters read each source's published layout unchanged (cpr.data.adapters)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpr.data import load_records, load_records_with_report
from cpr.data.adapters import ADAPTERS, get_adapter
from cpr.data.adapters.base import answer_to_letter, strip_option_labels
from cpr.data.records import DatasetImageRef, open_image
from cpr.errors import ConfigError, InputError

FIXTURES = Path(__file__).parent / "fixtures"


def test_registry_names():
    assert sorted(ADAPTERS) == ["crystal", "jsonl", "m3cot", "mathvision", "scienceqa", "synthetic", "tabmwp", "vlrmbench"]
    with pytest.raises(ConfigError, match="unknown source 'nope'"):
        get_adapter("nope")
    with pytest.raises(ConfigError, match=r"field 'options.colour': unknown option for source 'mathvision'") as e:
        get_adapter("mathvision", colour="red")
    assert e.value.field == "options.colour"


# --------------------------------------------------------------------------- MATH-Vision


def test_mathvision_samples(samples_dir):
    path = samples_dir / "mathvision" / "test_subset.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = load_records("mathvision", path)
    assert [r.id for r in records] == [str(o["id"]) for o in raw]
    by_id = {r.id: r for r in records}
    for obj in raw:
        rec = by_id[str(obj["id"])]
        assert rec.images == [path.parent / obj["image"]]
        assert "<image" not in rec.question
        assert rec.options == obj["options"]
        assert rec.answer == obj["answer"]
        assert rec.meta["level"] == obj["level"] and rec.meta["subject"] == obj["subject"]
        assert rec.reference_steps and all(s.strip() for s in rec.reference_steps)
        assert rec.source == "mathvision"
    mc = [r for r in records if r.options]
    assert len(mc) == sum(1 for o in raw if o["options"]) == 32
    assert all(r.answer in "ABCDE"[: len(r.options)] for r in mc)
    first = by_id["2930"]
    assert first.question == "In $\\triangle ABC$, what is the value of $x + y$?"
    assert open_image(first.images[0]).size == (2520, 1409)


def test_mathvision_folder_and_split(samples_dir):
    folder = samples_dir / "mathvision"
    assert len(load_records("mathvision", folder, validate_images=False)) == 100
    assert len(load_records("mathvision", folder, split="test", validate_images=False)) == 100  # test_subset
    with pytest.raises(InputError, match=r"none of \['testmini.jsonl', 'data/testmini.jsonl'"):
        load_records("mathvision", folder, split="testmini", validate_images=False)
    with pytest.raises(InputError) as e:
        load_records("mathvision", folder / "test_subset.jsonl", split="test")
    assert "field 'split'" in str(e.value) and "test_subset.jsonl" in str(e.value)


def test_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as e:
        load_records("mathvision", tmp_path / "nope.jsonl")
    assert str(e.value) == f"{tmp_path / 'nope.jsonl'}: mathvision: path does not exist"


# --------------------------------------------------------------------------- TabMWP


def test_tabmwp_samples(samples_dir):
    path = samples_dir / "tabmwp" / "problems_test1k_subset.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    records = load_records("tabmwp", path)
    assert [r.id for r in records] == list(raw)
    n_mc = 0
    for rec in records:
        obj = raw[rec.id]
        assert rec.images == [path.parent / "tables" / f"{rec.id}.png"]
        assert rec.reference_steps == [p.strip() for p in obj["solution"].split("\n\n") if p.strip()]
        assert rec.meta["grade"] == obj["grade"] and rec.meta["unit"] == obj["unit"]
        assert rec.meta["answer_text"] == obj["answer"]
        if obj["choices"]:
            n_mc += 1
            assert rec.options == obj["choices"]
            assert rec.answer == "ABCDEFGH"[obj["choices"].index(obj["answer"])]
        else:
            assert rec.options == [] and rec.answer == obj["answer"]
    assert n_mc == 19
    yes_no = [r for r in records if r.options == ["yes", "no"]]
    assert yes_no and all(r.answer == ("A" if r.meta["answer_text"] == "yes" else "B") for r in yes_no)


def test_tabmwp_split_filter_and_folder(samples_dir):
    folder = samples_dir / "tabmwp"
    assert len(load_records("tabmwp", folder, split="test", validate_images=False)) == 114
    assert list(load_records("tabmwp", folder, split="train", validate_images=False)) == []


# --------------------------------------------------------------------------- ScienceQA


def test_scienceqa_samples(samples_dir):
    root = samples_dir / "scienceqa"
    raw = json.loads((root / "data/scienceqa/problems_subset.json").read_text(encoding="utf-8"))
    records = load_records("scienceqa", root)
    assert {r.id for r in records} == set(raw) == {"11", "23"}
    for rec in records:
        obj = raw[rec.id]
        assert rec.options == obj["choices"]
        assert rec.answer == "ABCDE"[obj["answer"]]
        assert rec.images == [root / "data/scienceqa/images" / obj["split"] / rec.id / obj["image"]]
        assert rec.meta["grade"] == obj["grade"]
        lines = [ln for ln in obj["solution"].split("\n") if ln.strip()]
        assert len(rec.reference_steps) >= len(lines)
        assert "".join(rec.reference_steps).replace(" ", "") == "".join(lines).replace(" ", "")
    r23 = next(r for r in records if r.id == "23")
    assert r23.context == raw["23"]["hint"]
    assert r23.answer == "B" and r23.options[1] == "mushroom"
    assert next(r for r in records if r.id == "11").context == ""


def _scienceqa_copy(samples_dir, tmp_path, mutate):
    src = samples_dir / "scienceqa" / "data" / "scienceqa"
    dst = tmp_path / "scienceqa"
    shutil.copytree(src, dst)
    problems = json.loads((dst / "problems_subset.json").read_text(encoding="utf-8"))
    mutate(problems)
    (dst / "problems_subset.json").write_text(json.dumps(problems), encoding="utf-8")
    return dst / "problems_subset.json"


def test_scienceqa_text_only_questions(samples_dir, tmp_path, caplog):
    def add_text_only(problems):
        problems["99"] = {**problems["11"], "image": None, "question": "Which word is a noun?"}

    path = _scienceqa_copy(samples_dir, tmp_path, add_text_only)
    with caplog.at_level("INFO", logger="cpr.data"):
        records, report = load_records_with_report("scienceqa", path)
    assert [r.id for r in records] == ["11", "23"]
    assert report.filtered == {"text-only question (no image)": 1}
    assert "left out 1: 1 text-only question (no image)" in caplog.text
    kept = load_records("scienceqa", path, options={"text_only": "keep"})
    assert [r.id for r in kept] == ["11", "23", "99"] and kept[2].images == []
    with pytest.raises(ConfigError, match="text_only must be 'skip' or 'keep'"):
        load_records("scienceqa", path, options={"text_only": "maybe"})


def test_scienceqa_answer_index_out_of_range(samples_dir, tmp_path):
    def bad(problems):
        problems["23"]["answer"] = 5

    path = _scienceqa_copy(samples_dir, tmp_path, bad)
    with pytest.raises(InputError) as e:
        load_records("scienceqa", path)
    assert str(e.value) == f"{path} (id 23) field 'answer': option index 5 is out of range for 2 options"


# --------------------------------------------------------------------------- VLRMBench


def test_vlrmbench_samples(samples_dir):
    path = samples_dir / "vlrmbench" / "benchmark_data" / "location_error_subset.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = load_records("vlrmbench", path)
    assert [r.id for r in records] == [o["id"] for o in raw]
    for rec, obj in zip(records, raw, strict=True):
        assert rec.answer == ""
        assert rec.images == [samples_dir / "vlrmbench/meta_data/Image" / p for p in obj["image"]]
        assert len(rec.reference_steps) == len(obj["step_list"]) == len(obj["task_gt"])
        for step, original in zip(rec.reference_steps, obj["step_list"], strict=True):
            assert not step.startswith("STEP")
            assert original.strip().endswith(step)
        assert rec.meta["task"] == rec.meta["category"] == obj["category"] == "location_error"
        assert rec.meta["task_gt"] == obj["task_gt"]
        assert len(rec.meta["reasoning_error_steps"]) == len(obj["task_gt"])
        assert "<image1>" not in rec.question and not rec.question.rstrip().endswith("]")
    assert records[0].options == []
    assert records[2].options == ["A", "B", "C", "D", "E"]
    assert records[4].options[0] == "$2 \\mathrm{~m}$"
    # the injected error sits in a step labelled 1
    err_index = raw[0]["task_gt"].index(1)
    assert records[0].meta["reasoning_error_steps"][err_index] != records[0].reference_steps[err_index]


def test_vlrmbench_answer_empty_is_allowed_only_there(tmp_path, samples_dir):
    image = samples_dir / "tabmwp" / "tables" / "5739.png"
    line = {"id": "x", "image": str(image), "question": "Q?", "answer": "", "reference_steps": ["a"]}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="answer is missing or empty"):
        load_records("jsonl", path)


# --------------------------------------------------------------------------- CRYSTAL


def test_crystal_gallery(samples_dir):
    folder = samples_dir / "crystal_gallery"
    raw = [json.loads(line) for line in (folder / "gallery.jsonl").read_text(encoding="utf-8").splitlines()]
    for path in (folder, folder / "gallery.jsonl"):
        records = load_records("crystal", path)
        assert [r.id for r in records] == [o["id"] for o in raw]
        for rec, obj in zip(records, raw, strict=True):
            assert rec.reference_steps == obj["reference_steps"]
            assert rec.answer == obj["answer"]  # no options: kept as published
            assert rec.images == [folder / obj["image"]]
            assert rec.meta["source"] == obj["source"]
            assert rec.meta["steps_omitted_for_display"] == obj["steps_omitted_for_display"]
            assert rec.source == "crystal"


def _crystal_rows(samples_dir):
    folder = samples_dir / "crystal_gallery"
    rows = [json.loads(line) for line in (folder / "gallery.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["image"] = str(folder / r["image"])
    return rows


def test_crystal_saved_dataset_with_choices(samples_dir, tmp_path):
    import datasets

    rows = _crystal_rows(samples_dir)[:3]
    for r in rows:
        del r["id"]  # the hub dataset has no id column
    rows[0]["choices"] = ["(A) left", "(B) right", "(C) straight"]
    rows[0]["answer"] = "A"
    rows[1]["choices"] = ["40°", "60°", "80°"]
    rows[1]["answer"] = "B (60°)"
    rows[2]["choices"] = []
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "reference_steps": datasets.List(datasets.Value("string")),
            "choices": datasets.List(datasets.Value("string")),
            "source": datasets.Value("string"),
            "reference_step_count_full": datasets.Value("int64"),
            "steps_omitted_for_display": datasets.Value("int64"),
        }
    )
    ds = datasets.Dataset.from_list(rows, features=features)
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "crystal"))
    records = load_records("crystal", tmp_path / "crystal")
    assert [r.id for r in records] == ["test-0", "test-1", "test-2"]
    assert records[0].options == ["left", "right", "straight"] and records[0].answer == "A"
    assert records[1].options == ["40°", "60°", "80°"] and records[1].answer == "B"
    assert records[1].meta["answer_raw"] == "B (60°)"
    assert records[2].options == [] and records[2].answer == rows[2]["answer"]
    assert isinstance(records[0].images[0], DatasetImageRef)
    assert open_image(records[0].images[0]).size == open_image(rows[0]["image"]).size
    assert records[0].reference_steps == rows[0]["reference_steps"]
    with pytest.raises(InputError, match=r"no split 'train' \(available: \['test'\]\)"):
        load_records("crystal", tmp_path / "crystal", split="train")


def test_crystal_parquet(samples_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _crystal_rows(samples_dir)[:2]
    table = pa.table(
        {
            "image": [{"bytes": Path(r["image"]).read_bytes(), "path": Path(r["image"]).name} for r in rows],
            "question": [r["question"] for r in rows],
            "answer": [r["answer"] for r in rows],
            "reference_steps": [json.dumps(r["reference_steps"]) for r in rows],
            "source": [r["source"] for r in rows],
        }
    )
    pq.write_table(table, tmp_path / "test.parquet")
    records = load_records("crystal", tmp_path / "test.parquet")
    assert [r.id for r in records] == ["row-0", "row-1"]
    assert records[1].reference_steps == rows[1]["reference_steps"]
    assert open_image(records[0].images[0]).size == open_image(rows[0]["image"]).size


def test_crystal_hub_name_offline_error():
    with pytest.raises(InputError) as e:
        load_records("crystal", "waybarrios/CRYSTAL", split="test")
    message = str(e.value)
    assert message.startswith(
        "waybarrios/CRYSTAL: crystal: cannot load the Hugging Face dataset 'waybarrios/CRYSTAL'"
    )
    assert "save_to_disk('DIR')" in message and "pass DIR as the path" in message
    assert message.endswith("(a parquet or JSON-lines export of the same columns also works)")
    with pytest.raises(InputError) as e:
        load_records("m3cot", "LightChen2333/M3CoT")
    assert str(e.value).startswith("LightChen2333/M3CoT: m3cot: cannot load the Hugging Face dataset")
    assert str(e.value).endswith("pass DIR as the path (a JSON-lines export of the same columns also works)")


def test_answer_letter_mapping_helpers():
    options = ["Yes", "No", "Maybe"]
    assert [
        answer_to_letter(a, options) for a in ["B", "(B)", "B)", "B.", "C: maybe", "B (no)", "no", "D", "x"]
    ] == [
        "B",
        "B",
        "B",
        "B",
        "C",
        "B",
        "B",
        None,
        None,
    ]
    assert strip_option_labels(["A) x", "B) y"]) == ["x", "y"]
    assert strip_option_labels(["A) x", "C) y"]) == ["A) x", "C) y"]


# --------------------------------------------------------------------------- M3CoT


def test_m3cot_jsonl_fixture():
    path = FIXTURES / "m3cot" / "test.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    records = load_records("m3cot", path)
    assert [r.id for r in records] == [o["id"] for o in raw]
    assert {r.meta["domain"] for r in records} == {"science", "commonsense", "mathematics"}
    for rec, obj in zip(records, raw, strict=True):
        assert rec.options == obj["choices"] and rec.answer == obj["answer"]
        assert rec.context == obj["context"]
        assert rec.images == [path.parent / obj["image"]]
        assert rec.meta["topic"] == obj["topic"]
    assert records[0].reference_steps == [
        "The table lists the temperature at noon for each day.",
        "Thursday, Sunday and Monday were 7 degrees Celsius.",
        "Saturday was 5 degrees Celsius.",
        "Friday was 10 degrees Celsius, the highest value.",
        "So Friday was the warmest day.",
    ]
    assert [r.id for r in load_records("m3cot", path, split="validation")] == ["natural-science-536"]
    assert len(load_records("m3cot", path.parent, split="test")) == 3


def test_m3cot_saved_dataset(tmp_path):
    import datasets

    path = FIXTURES / "m3cot" / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["image"] = str(path.parent / r["image"])
    features = datasets.Features(
        {
            **{k: datasets.Value("string") for k in rows[0] if k not in ("choices", "image")},
            "choices": datasets.List(datasets.Value("string")),
            "image": datasets.Image(),
        }
    )
    dd = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_list([r for r in rows if r["split"] == split], features=features)
            for split in ("test", "validation")
        }
    )
    dd.save_to_disk(str(tmp_path / "m3cot"))
    records = load_records("m3cot", tmp_path / "m3cot", split="test")
    assert [r.id for r in records] == [r["id"] for r in rows if r["split"] == "test"]
    assert {r.meta["domain"] for r in records} == {"science", "commonsense", "mathematics"}
    assert all(isinstance(r.images[0], DatasetImageRef) for r in records)
    assert records[2].load_images()[0].size == open_image(rows[2]["image"]).size
    with pytest.raises(InputError, match=r"has splits \['test', 'validation'\]; choose one"):
        load_records("m3cot", tmp_path / "m3cot")


# --------------------------------------------------------------------------- generic JSON lines


def test_generic_jsonl_relative_images_and_difficulty(tmp_path, samples_dir):
    shutil.copy(samples_dir / "tabmwp" / "tables" / "5739.png", tmp_path / "t.png")
    lines = [
        {
            "id": "a",
            "image": "t.png",
            "question": "Median?",
            "answer": "7",
            "reference_steps": ["Sort.", "Pick."],
            "context": "Five days.",
            "difficulty": "hard",
            "topic": "stats",
        },
        {
            "id": "b",
            "images": ["t.png", "t.png"],
            "question": "Which?",
            "options": ["x", "y"],
            "answer": "B",
            "reference_steps": ["One."],
            "source": "tabmwp",
            "meta": {"grade": 7},
        },
    ]
    path = tmp_path / "recs.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    a, b = load_records("jsonl", path)
    assert a.images == [tmp_path / "t.png"] and a.difficulty == "hard" and a.context == "Five days."
    assert a.meta["topic"] == "stats" and a.source == "jsonl"
    assert b.images == [tmp_path / "t.png"] * 2 and b.source == "tabmwp"
    assert b.difficulty == "hard"  # grade 7 under the default TabMWP table
