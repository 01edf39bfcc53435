"""Loaded records live in a memory-mapped record dataset; the GRPO dataset is made from it by map."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from cpr.data import (
    DatasetImageRef,
    RecordError,
    Records,
    load_records,
    load_records_with_report,
    load_templates,
    to_grpo_dataset,
)


def _saved_crystal(tmp_path, images: list[bytes]):
    """CRYSTAL's published layout: a ``save_to_disk`` dataset with each image's PNG bytes embedded."""
    import datasets

    features = datasets.Features(
        {
            "image": datasets.Image(),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "reference_steps": datasets.List(datasets.Value("string")),
        }
    )
    rows = [
        {
            "image": {"bytes": b, "path": f"{i}.png"},
            "question": f"Q{i}?",
            "answer": str(i),
            "reference_steps": ["s"],
        }
        for i, b in enumerate(images)
    ]
    path = tmp_path / "crystal"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows, features=features)}).save_to_disk(
        str(path)
    )
    return path


def _png(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def test_embedded_images_stay_in_memory_mapped_files(tmp_path):
    pngs = [_png((3, 2)), _png((5, 4))]
    records = load_records("crystal", _saved_crystal(tmp_path, pngs))
    assert records.dataset.cache_files  # an Arrow file on disk, not an in-memory table
    ref = records[1].images[0]
    assert isinstance(ref, DatasetImageRef) and ref.encoded() == {"bytes": pngs[1], "path": "1.png"}
    assert records[1].load_images()[0].size == (5, 4)
    ds = to_grpo_dataset(records, load_templates())
    assert ds.cache_files  # written by Dataset.map, memory-mapped
    assert ds.data.column("images").to_pylist() == [
        [{"bytes": b, "path": f"{i}.png"}] for i, b in enumerate(pngs)
    ]
    assert [row["images"][0].size for row in ds] == [(3, 2), (5, 4)]  # decoded when a row is read
    assert ds[1]["prompt"][1]["content"][0] == {"type": "image"} and ds[1]["answer"] == "1"


def test_bad_embedded_image_names_dataset_row_and_field(tmp_path):
    path = _saved_crystal(tmp_path, [_png((3, 2)), b"not a png", _png((2, 2))])
    with pytest.raises(RecordError) as e:
        load_records("crystal", path)
    assert str(e.value).startswith(f"{path}[test] (id test-1) field 'image': cannot read image 1.png: ")
    records, report = load_records_with_report("crystal", path, on_invalid="skip")
    assert [r.id for r in records] == ["test-0", "test-2"]
    assert report.skipped == {"unreadable image": 1} and report.rows == 3
    assert [im.size for r in records for im in r.load_images()] == [(3, 2), (2, 2)]


def test_records_is_a_lazy_sequence(samples_dir):
    records = load_records("mathvision", samples_dir / "mathvision", validate_images=False)
    ids = [r.id for r in records]
    assert len(records) == len(ids) == 100 and records[-1].id == ids[-1]
    assert records[5].images == [samples_dir / "mathvision" / "images" / f"{ids[5]}.jpg"]
    assert isinstance(records[2:8:3], Records) and [r.id for r in records[2:8:3]] == [ids[2], ids[5]]
    assert [r.id for r in records.select([7, 0])] == [ids[7], ids[0]]
    assert records.column("id") == ids
    both = Records.concatenate([records[:2], records[10:11]])
    assert [r.id for r in both] == [ids[0], ids[1], ids[10]]
    assert records[3].meta["level"] == records.dataset[3]["meta"]["level"]
    with pytest.raises(IndexError):
        records[100]
