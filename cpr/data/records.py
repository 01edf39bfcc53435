"""The record every adapter produces, its image references, and the memory-mapped record dataset:
loaded records live one per row in an Arrow file that ``datasets`` memory-maps and are read back one
at a time (:class:`Records`), so a loaded dataset holds no image bytes (docs/data.md)."""

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
OPTION_LETTERS = string.ascii_uppercase
WRITER_BATCH_SIZE = 32
"""Rows per Arrow batch written (:func:`write_records`, ``Dataset.map``): bounds the image bytes held."""


@dataclass(frozen=True)
class DatasetImageRef:
    """Image ``position`` of row ``row`` of a record dataset (``datasets.Dataset``); nothing is read
    until :meth:`encoded` is called."""

    dataset: Any
    row: int
    position: int

    def encoded(self) -> dict[str, Any]:
        """The image as ``{"bytes": bytes | None, "path": str | None}``."""
        return dict(self.dataset[self.row]["images"][self.position])


ImageRef = str | Path | Image.Image | dict | DatasetImageRef
"""An entry of ``Record.images``: a path, a PIL image, an encoded ``{"bytes", "path"}`` dict."""


@dataclass
class Record:
    """One validated example, independent of the dataset it came from.

    ``images`` are references in the order the question uses them (empty only for text-only
    questions); ``question`` has the dataset's image placeholders removed; ``options`` are lettered
    A, B, ... in order (empty when free-form); ``answer`` is the option letter for multiple choice
    (``""`` only for sources without an answer field, VLRMBench); ``reference_steps`` are ordered
    and non-empty; ``difficulty`` is ``"easy"``, ``"medium"`` or ``"hard"`` once bucketed;
    ``source`` is the adapter name (or a generic JSON line's ``source``); ``meta`` keeps the
    source's own fields, ``meta["context"]`` being rendered in the prompt.
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
    def context(self) -> str:
        """The context / hint text rendered before the question (``""`` when none)."""
        value = self.meta.get("context")
        return value if isinstance(value, str) else ""

    def load_images(self, mode: str | None = "RGB") -> list[Image.Image]:
        """Decode every image, converted to ``mode`` unless ``None``. Raises ``OSError`` for
        unreadable images (records loaded with ``validate_images=True`` were checked)."""
        images = [open_image(ref) for ref in self.images]
        return [im if mode is None or im.mode == mode else im.convert(mode) for im in images]


def option_letters(n: int) -> list[str]:
    """The first ``n`` option letters; ``ValueError`` for more than 26."""
    if n > len(OPTION_LETTERS):
        raise ValueError(f"at most {len(OPTION_LETTERS)} options can be lettered, got {n}")
    return list(OPTION_LETTERS[:n])


def open_image(ref: ImageRef) -> Image.Image:
    """Open an image reference with PIL (pixels are decoded on first access).

    Raises ``FileNotFoundError`` (missing path), ``PIL.UnidentifiedImageError`` / ``OSError`` (not
    an image) or ``TypeError`` (an unsupported reference).
    """
    if isinstance(ref, Image.Image):
        return ref
    if isinstance(ref, DatasetImageRef):
        ref = ref.encoded()
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return Image.open(io.BytesIO(ref["bytes"]))
        if not ref.get("path"):
            raise TypeError("image dict has neither 'bytes' nor 'path'")
        ref = ref["path"]
    if isinstance(ref, (str, Path)):
        return Image.open(ref)
    raise TypeError(f"unsupported image reference of type {type(ref).__name__}")


def write_records(records: Iterable[Record]) -> Records:
    """Write records, as they come, to an Arrow file in ``datasets``' temporary cache folder (deleted
    at exit) and return them memory-mapped as :class:`Records` (docs/data.md section 1). An error raised
    while iterating ``records`` propagates unchanged."""
    from datasets import Dataset, Features, Json, List, Value
    from datasets import Image as ImageFeature
    from datasets.arrow_writer import ArrowWriter
    from datasets.fingerprint import get_temporary_cache_files_directory

    text, texts = Value("string"), List(Value("string"))
    features = Features({"id": text, "images": List(ImageFeature(decode=False)), "question": text,
                         "options": texts, "answer": text, "reference_steps": texts, "difficulty": text,
                         "source": text, "meta": Json()})
    path = str(Path(get_temporary_cache_files_directory()) / f"records-{uuid.uuid4().hex}.arrow")
    with ArrowWriter(features=features, path=path, writer_batch_size=WRITER_BATCH_SIZE) as writer:
        for r in records:
            images = [ref.encoded() if isinstance(ref, DatasetImageRef) else str(ref) if isinstance(ref, Path) else ref
                      for ref in r.images]
            writer.write(features.encode_example({**vars(r), "images": images}))
        writer.finalize()
    return Records(Dataset.from_file(path))


class Records(Sequence[Record]):
    """Records stored one per row in ``dataset`` (a memory-mapped ``datasets.Dataset`` of
    :func:`write_records`). Each :class:`Record` is built when read, file images as paths and
    embedded ones as :class:`DatasetImageRef`; slices and :meth:`select` share the rows."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | slice) -> Any:
        rows = range(len(self))[index]  # IndexError when out of range
        return self.select(rows) if isinstance(rows, range) else self._record(self.dataset[rows], rows)

    def __iter__(self) -> Iterator[Record]:
        for i, row in enumerate(self.dataset):
            yield self._record(row, i)

    def __add__(self, other: Records) -> Records:
        return Records.concatenate([self, other])

    def select(self, indices: Iterable[int]) -> Records:
        """The records at ``indices`` (0-based, in that order)."""
        return Records(self.dataset.select(list(indices)))

    def column(self, name: str) -> list[Any]:
        """One field of every record (e.g. ``"id"``), without reading images."""
        return list(self.dataset[name])

    @staticmethod
    def concatenate(parts: Sequence[Records]) -> Records:
        """The records of ``parts`` (at least one), one after the other."""
        from datasets import concatenate_datasets

        return parts[0] if len(parts) == 1 else Records(concatenate_datasets([p.dataset for p in parts]))

    def _record(self, row: dict[str, Any], index: int) -> Record:
        record = row_record(row)
        record.images = [Path(c["path"]) if c["bytes"] is None else DatasetImageRef(self.dataset, index, k)
                         for k, c in enumerate(row["images"])]
        return record


def row_record(row: dict[str, Any]) -> Record:
    """The :class:`Record` of one record-dataset row, images left as the row's encoded dicts."""
    return Record(**{**row, "meta": row["meta"] or {}})
