"""The record every adapter produces, the image references it carries, and record datasets.

A :class:`Record` is one question with its image(s), options, gold answer and the ordered
reference reasoning steps the step metrics (Match F1, docs/method.md section 2) compare against.
Images are *references* (a file path, an in-memory PIL image, an encoded ``{"bytes", "path"}``
dict, or a :class:`DatasetImageRef` row of a Hugging Face dataset); :func:`open_image` decodes
one when it is needed.

Loaded records are kept in a memory-mapped Arrow file (:func:`write_records`), one row per
record with its images embedded or as paths, and read back one at a time through
:class:`Records`: a loaded dataset holds no image bytes and no per-record Python objects.
"""

from __future__ import annotations

import io
import string
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
"""Bucket names, easiest first (docs/method.md section 6)."""

OPTION_LETTERS: str = string.ascii_uppercase
"""Options are lettered A, B, C, ... in order (at most 26 options)."""


@dataclass(frozen=True)
class DatasetImageRef:
    """A lazy reference to an image embedded in a record dataset (:class:`Records`): nothing is
    read until :meth:`encoded` is called.

    Attributes:
        dataset: the ``datasets.Dataset`` of :func:`record_features` (memory-mapped).
        row: 0-based row index.
        position: index in the row's ``images``.
    """

    dataset: Any
    row: int
    position: int

    def encoded(self) -> dict[str, Any]:
        """The image as ``{"bytes": bytes | None, "path": str | None}``."""
        return dict(self.dataset[self.row]["images"][self.position])

    def describe(self) -> str:
        """Short human-readable location, used in error messages."""
        return f"row {self.row} image {self.position}"


ImageRef = str | Path | Image.Image | dict | DatasetImageRef
"""What ``Record.images`` holds: path, PIL image, encoded dict or dataset row reference."""


@dataclass
class Record:
    """One validated example, independent of the dataset it came from.

    Attributes:
        id: unique id within a loaded dataset (the source's own id where it has one).
        images: image references (see :data:`ImageRef`), in the order the question uses them;
            empty only for text-only questions (ScienceQA with ``text_only="keep"``).
        question: question text with dataset-specific image placeholders (``<image1>``) removed.
        options: option texts, lettered A, B, ... in order; empty for free-form questions.
        answer: gold answer; for multiple choice the option letter. Empty only for sources whose
            adapter allows it (VLRMBench step-error tasks, which have no answer field).
        reference_steps: ordered reference reasoning steps (non-empty).
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"`` once assigned (:mod:`cpr.data.buckets`).
        source: the adapter name (``"mathvision"``, ``"tabmwp"``, ...), or the ``source`` field
            of a generic JSON-lines record.
        meta: the source's own fields worth keeping (level, grade, unit, domain, topic, task_gt,
            ...). ``meta["context"]`` (a hint or context paragraph) is rendered in the prompt.
    """

    id: str
    images: list[ImageRef]
    question: str
    options: list[str]
    answer: str
    reference_steps: list[str]
    difficulty: str | None = None
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_multiple_choice(self) -> bool:
        """True when the record has options (its answer is then a letter)."""
        return bool(self.options)

    @property
    def context(self) -> str:
        """The context / hint text rendered before the question (``""`` when none)."""
        value = self.meta.get("context")
        return value if isinstance(value, str) else ""

    def option_letters(self) -> list[str]:
        """Letters of the options, ``["A", "B", ...]``."""
        return option_letters(len(self.options))

    def load_images(self, mode: str | None = "RGB") -> list[Image.Image]:
        """Decode every image (converted to ``mode`` unless ``None``).

        Raises ``OSError`` / ``PIL.UnidentifiedImageError`` for unreadable files; records
        returned by :func:`cpr.data.load_records` with ``validate_images=True`` were checked.
        """
        images = [open_image(ref) for ref in self.images]
        if mode is None:
            return images
        return [im if im.mode == mode else im.convert(mode) for im in images]


def option_letters(n: int) -> list[str]:
    """The first ``n`` option letters. Raises ``ValueError`` for more than 26 options."""
    if n > len(OPTION_LETTERS):
        raise ValueError(f"at most {len(OPTION_LETTERS)} options can be lettered, got {n}")
    return list(OPTION_LETTERS[:n])


def letter_for_index(index: int, n_options: int) -> str:
    """Letter of the 0-based option ``index``; ``ValueError`` if out of range."""
    if not 0 <= index < n_options:
        raise ValueError(f"option index {index} is out of range for {n_options} options")
    return OPTION_LETTERS[index]


def image_ref_to_encodable(ref: ImageRef) -> str | dict | Image.Image:
    """Convert a reference to a value ``datasets.Image().encode_example`` accepts.

    Paths stay paths (the dataset then stores only the path and decodes lazily); dataset
    row references become their ``{"bytes", "path"}`` dict.
    """
    if isinstance(ref, DatasetImageRef):
        return ref.encoded()
    if isinstance(ref, Path):
        return str(ref)
    return ref


def describe_image_ref(ref: ImageRef) -> str:
    """Where an image comes from, for messages (path, dataset row, or ``<in-memory image>``)."""
    if isinstance(ref, (str, Path)):
        return str(ref)
    if isinstance(ref, DatasetImageRef):
        return ref.describe()
    if isinstance(ref, dict):
        return str(ref.get("path") or "<embedded image bytes>")
    return "<in-memory image>"


def open_image(ref: ImageRef) -> Image.Image:
    """Open an image reference with PIL (lazy: pixel data is decoded on first access).

    Raises:
        FileNotFoundError: a path that does not exist.
        PIL.UnidentifiedImageError / OSError: bytes that are not an image.
        TypeError: an unsupported reference type.
    """
    if isinstance(ref, Image.Image):
        return ref
    value = image_ref_to_encodable(ref)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return Image.open(io.BytesIO(value["bytes"]))
        if not value.get("path"):
            raise TypeError("image dict has neither 'bytes' nor 'path'")
        value = value["path"]
    if isinstance(value, str):
        return Image.open(value)
    raise TypeError(f"unsupported image reference of type {type(ref).__name__}")


# ---------------------------------------------------------------------------------------------
# Record datasets

WRITER_BATCH_SIZE = 32
"""Rows per Arrow record batch written: bounds the image bytes held in memory while writing."""


def record_features() -> Any:
    """The ``datasets.Features`` of a record dataset: one column per :class:`Record` field;
    ``images`` holds ``{"bytes", "path"}`` (not decoded), ``meta`` a JSON object."""
    from datasets import Features, Image, Json, List, Value

    strings = List(Value("string"))
    return Features(
        {
            "id": Value("string"),
            "images": List(Image(decode=False)),
            "question": Value("string"),
            "options": strings,
            "answer": Value("string"),
            "reference_steps": strings,
            "difficulty": Value("string"),
            "source": Value("string"),
            "meta": Json(),
        }
    )


def write_records(records: Iterable[Record]) -> Records:
    """Write records, as they come, to a memory-mapped Arrow file and return them as :class:`Records`.

    Images are stored as their paths (files) or encoded bytes (embedded, in-memory or dataset
    images); at most :data:`WRITER_BATCH_SIZE` records are held in memory at a time. The file
    lives in ``datasets``' temporary cache folder (deleted when the process exits). An error
    raised while ``records`` is iterated propagates unchanged.
    """
    from datasets import Dataset
    from datasets.arrow_writer import ArrowWriter
    from datasets.fingerprint import get_temporary_cache_files_directory

    features = record_features()
    path = str(Path(get_temporary_cache_files_directory()) / f"records-{uuid.uuid4().hex}.arrow")
    with ArrowWriter(features=features, path=path, writer_batch_size=WRITER_BATCH_SIZE) as writer:
        for r in records:
            row = {name: getattr(r, name) for name in features}
            row["images"] = [image_ref_to_encodable(ref) for ref in r.images]
            writer.write(features.encode_example(row))
        writer.finalize()
    return Records(Dataset.from_file(path))


class Records(Sequence[Record]):
    """Records stored one per row in a ``datasets.Dataset`` of :func:`record_features`.

    A sequence of :class:`Record`: each is built when read, with file images as paths and
    embedded images as :class:`DatasetImageRef` (nothing is decoded). Slicing and
    :meth:`select` return :class:`Records` over the same memory-mapped rows.

    Attributes:
        dataset: the rows (memory-mapped; possibly a selection of another dataset's rows).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | slice) -> Record | Records:
        rows = range(len(self))[index]  # IndexError when out of range
        if isinstance(rows, range):
            return self.select(rows)
        return self._record(self.dataset[rows], rows)

    def __iter__(self) -> Iterator[Record]:
        for i, row in enumerate(self.dataset):
            yield self._record(row, i)

    def select(self, indices: Iterable[int]) -> Records:
        """The records at ``indices`` (0-based, in that order)."""
        return Records(self.dataset.select(list(indices)))

    def column(self, name: str) -> list[Any]:
        """One field of every record (e.g. ``"id"``, ``"difficulty"``), without reading images."""
        return list(self.dataset[name])

    @staticmethod
    def concatenate(parts: Sequence[Records]) -> Records:
        """The records of ``parts``, one after the other."""
        from datasets import concatenate_datasets

        if len(parts) == 1:
            return parts[0]
        return Records(concatenate_datasets([p.dataset for p in parts])) if parts else write_records([])

    def _record(self, row: dict[str, Any], index: int) -> Record:
        record = row_record(row)
        record.images = [
            Path(cell["path"]) if cell["bytes"] is None else DatasetImageRef(self.dataset, index, k)
            for k, cell in enumerate(row["images"])
        ]
        return record


def row_record(row: dict[str, Any]) -> Record:
    """The :class:`Record` of one record-dataset row, its images left as the row's encoded
    ``{"bytes", "path"}`` dicts (for ``Dataset.map`` functions that pass them on)."""
    return Record(**{**row, "meta": row["meta"] or {}})
