"""Invalid records: located errors (file, line / id, field) and skip counts (cpr.data.validation)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from PIL import Image

from cpr.data import Record, load_records, load_records_with_report, validate_record
from cpr.data.validation import RecordError, check_image
from cpr.errors import InputError


@pytest.fixture()
def image_dir(tmp_path, samples_dir) -> Path:
    """A folder with a good PNG, a good JPEG, a truncated JPEG and a text file named .png."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    shutil.copy(samples_dir / "tabmwp" / "tables" / "5739.png", folder / "good.png")
    jpg = samples_dir / "mathvision" / "images" / "2930.jpg"
    shutil.copy(jpg, folder / "good.jpg")
    data = jpg.read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (folder / "not_an_image.png").write_text("hello", encoding="utf-8")
    return folder


def _good(rid: str, **changes) -> dict:
    rec = {
        "id": rid,
        "image": "imgs/good.png",
        "question": "What is the median?",
        "options": ["5", "7"],
        "answer": "B",
        "reference_steps": ["Sort the numbers.", "Take the middle one."],
    }
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not None}


def _write(tmp_path: Path, rows: list[dict], name: str = "records.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


CASES = [
    # (changes to a good record, field, reason, message tail)
    ({"image": "imgs/missing.png"}, "image", "missing image", "image file not found: {dir}/missing.png"),
    (
        {"image": "imgs/not_an_image.png"},
        "image",
        "unreadable image",
        "cannot read image {dir}/not_an_image.png: cannot identify image file '{dir}/not_an_image.png'",
    ),
    (
        {"image": "imgs/truncated.jpg"},
        "image",
        "unreadable image",
        "cannot read image {dir}/truncated.jpg: image file is truncated",
    ),
    ({"image": None}, "image", "missing image", "the record has no image"),
    ({"reference_steps": []}, "reference_steps", "empty reference_steps", "reference_steps is empty"),
    (
        {"reference_steps": ["ok", "  "]},
        "reference_steps",
        "empty reference_steps",
        "reference step 1 is empty or not a string",
    ),
    ({"answer": None}, "answer", "missing answer", "answer is missing or empty"),
    ({"answer": "  "}, "answer", "missing answer", "answer is missing or empty"),
    (
        {"answer": "C"},
        "answer",
        "answer not an option letter",
        "multiple-choice answer 'C' is not one of the option letters A, B",
    ),
    (
        {"answer": "7"},
        "answer",
        "answer not an option letter",
        "multiple-choice answer '7' is not one of the option letters A, B",
    ),
    (
        {"difficulty": "extreme"},
        "difficulty",
        "bad value",
        "difficulty 'extreme' is not one of easy, medium, hard",
    ),
]


@pytest.mark.parametrize(("changes", "field", "reason", "tail"), CASES)
def test_invalid_record_error_names_file_line_id_field(tmp_path, image_dir, changes, field, reason, tail):
    path = _write(tmp_path, [_good("ok1"), _good("bad", **changes)])
    with pytest.raises(RecordError) as e:
        load_records("jsonl", path)
    message = str(e.value)
    expected_tail = tail.format(dir=image_dir)
    assert message.startswith(f"{path}:2 (id bad) field '{field}': ")
    assert message.split(": ", 1)[1].startswith(expected_tail), message
    assert e.value.reason == reason
    assert (e.value.path, e.value.line, e.value.record_id, e.value.field) == (str(path), 2, "bad", field)
    assert isinstance(e.value, InputError)


def test_duplicate_id(tmp_path, image_dir):
    path = _write(tmp_path, [_good("a"), _good("b"), _good("a")])
    with pytest.raises(RecordError) as e:
        load_records("jsonl", path)
    assert str(e.value) == f"{path}:3 (id a) field 'id': duplicate id (first seen at line 1)"
    assert e.value.reason == "duplicate id"


def test_second_image_is_named_by_index(tmp_path, image_dir):
    path = _write(tmp_path, [_good("m", image=None, images=["imgs/good.jpg", "imgs/gone.png"])])
    with pytest.raises(RecordError) as e:
        load_records("jsonl", path)
    assert str(e.value) == f"{path}:1 (id m) field 'images[1]': image file not found: {image_dir}/gone.png"


def test_skip_counts_per_reason_and_logs(tmp_path, image_dir, caplog):
    rows = [_good("ok1")]
    for i, (changes, _, _, _) in enumerate(CASES):
        rows.append(_good(f"bad{i}", **changes))
    rows += [_good("ok2"), _good("ok1")]  # the last one is a duplicate
    path = _write(tmp_path, rows)
    with caplog.at_level(logging.WARNING, logger="cpr.data"):
        records, report = load_records_with_report("jsonl", path, on_invalid="skip")
    assert [r.id for r in records] == ["ok1", "ok2"]
    expected: dict[str, int] = {}
    for _, _, reason, _ in CASES:
        expected[reason] = expected.get(reason, 0) + 1
    expected["duplicate id"] = 1
    assert dict(report.skipped) == expected
    assert report.rows == len(rows) and report.loaded == 2
    assert sum(report.skipped.values()) == len(rows) - 2 == 12
    log = caplog.text
    assert "skipped 12 invalid: " + ", ".join(f"{n} {r}" for r, n in sorted(expected.items())) in log
    assert "2 missing image, 2 unreadable image" in log and "1 duplicate id" in log
    assert "first missing image: " + f"{path}:2 (id bad0) field 'image'" in log
    # the same file with the default on_invalid raises at the first bad record
    with pytest.raises(RecordError, match=r":2 \(id bad0\) field 'image'"):
        load_records("jsonl", path)


def test_on_invalid_must_be_error_or_skip(tmp_path, image_dir):
    path = _write(tmp_path, [_good("a")])
    with pytest.raises(ValueError, match=r"on_invalid must be one of \('error', 'skip'\), got 'ignore'"):
        load_records("jsonl", path, on_invalid="ignore")


def test_validate_images_false_does_not_open_files(tmp_path, image_dir):
    path = _write(tmp_path, [_good("a", image="imgs/not_an_image.png")])
    assert [r.id for r in load_records("jsonl", path, validate_images=False)] == ["a"]


def test_in_memory_images_checked_for_size_and_mode():
    rec = Record(
        id="r", images=[Image.new("RGB", (0, 0))], question="Q", options=[], answer="1", reference_steps=["s"]
    )
    with pytest.raises(RecordError) as e:
        validate_record(rec, path="mem")
    assert str(e.value) == "mem (id r) field 'image': image <in-memory image> has size 0x0"
    rec.images = [Image.new("La", (2, 2))]
    with pytest.raises(RecordError, match="has mode 'La', not convertible to RGB"):
        validate_record(rec, path="mem")
    rec.images = [Image.new("P", (2, 2)), Image.new("I;16", (3, 1))]
    validate_record(rec, path="mem")  # both convert to RGB


def test_check_image_accepts_real_files(image_dir):
    check_image(image_dir / "good.png")
    check_image(str(image_dir / "good.jpg"))
    check_image({"bytes": (image_dir / "good.png").read_bytes(), "path": None})


def test_tabmwp_answer_not_among_choices_names_pid(tmp_path, samples_dir):
    folder = tmp_path / "tabmwp"
    folder.mkdir()
    raw = json.loads((samples_dir / "tabmwp" / "problems_test1k_subset.json").read_text(encoding="utf-8"))
    pid = "3671"
    subset = {pid: {**raw[pid], "answer": "4:00 P.M."}, "23441": raw["23441"]}
    (folder / "problems_test.json").write_text(json.dumps(subset), encoding="utf-8")
    (folder / "tables").mkdir()
    for p in subset:
        shutil.copy(samples_dir / "tabmwp" / "tables" / f"{p}.png", folder / "tables" / f"{p}.png")
    with pytest.raises(RecordError) as e:
        load_records("tabmwp", folder)
    assert str(e.value).startswith(
        f"{folder / 'problems_test.json'} (id {pid}) field 'answer': answer '4:00 P.M.'"
    )
    records, report = load_records_with_report("tabmwp", folder, on_invalid="skip")
    assert [r.id for r in records] == ["23441"] and dict(report.skipped) == {"answer not an option letter": 1}


def test_difficulty_field_outside_table_is_invalid(tmp_path, samples_dir):
    folder = tmp_path / "tabmwp"
    shutil.copytree(samples_dir / "tabmwp", folder)
    path = folder / "problems_test1k_subset.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["23441"]["grade"] = 9
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(RecordError) as e:
        load_records("tabmwp", path, validate_images=False)
    assert str(e.value).startswith(
        f"{path} (id 23441) field 'grade': value 9 is in no bucket of the 'tabmwp' table"
    )
    records, report = load_records_with_report("tabmwp", path, on_invalid="skip", validate_images=False)
    assert len(records) == 113 and dict(report.skipped) == {"bad value": 1}


def test_malformed_json_line(tmp_path, image_dir):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_good("a")) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{path}:2: malformed JSON"):
        load_records("jsonl", path)


def test_malformed_json_lines_name_the_real_column_and_are_skipped_on_request(tmp_path, image_dir):
    good = json.dumps(_good("a"))
    cut = json.dumps(_good("b"))[:-1]  # a line cut short: the error is one past its last character
    lines = [good, '{"id": "c", "question": "q",, "answer": "1"}', cut, "[1, 2]", json.dumps(_good("d"))]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_records("jsonl", path)
    assert str(e.value) == f"{path}:2: malformed JSON (Expecting property name enclosed in double quotes at column 29)"
    path.write_text("\n".join([good, cut, good.replace('"a"', '"e"')]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{path}:2: malformed JSON \(Expecting ',' delimiter at column {len(cut) + 1}\)$"):
        load_records("jsonl", path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records, report = load_records_with_report("jsonl", path, on_invalid="skip")
    assert [r.id for r in records] == ["a", "d"]
    assert (report.rows, dict(report.skipped)) == (5, {"malformed JSON": 2, "bad value": 1})
    assert report.first_errors["bad value"] == f"{path}:4: expected a JSON object, got list"


def test_limit_counts_valid_records(tmp_path, image_dir):
    path = _write(tmp_path, [_good("a"), _good("b", answer=None), _good("c"), _good("d")])
    records = load_records("jsonl", path, on_invalid="skip", limit=2)
    assert [r.id for r in records] == ["a", "c"]


def test_a_line_that_is_not_utf8_names_file_line_and_byte(tmp_path, image_dir):
    good = json.dumps(_good("a"))
    bad = json.dumps(_good("b")).replace('"b"', '"b\\u00e9"').encode().replace(b"\\u00e9", b"\xff")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(good.encode() + b"\n" + bad + b"\n" + json.dumps(_good("c")).encode() + b"\n")
    column = bad.index(b"\xff") + 1
    with pytest.raises(InputError) as e:
        load_records("jsonl", path)
    assert str(e.value) == f"{path}:2: malformed JSON (not UTF-8 text: byte 0xff at column {column})"
    records, report = load_records_with_report("jsonl", path, on_invalid="skip")
    assert [r.id for r in records] == ["a", "c"] and dict(report.skipped) == {"malformed JSON": 1}
