"""The record every adapter produces, and the image references it carries.

A :class:`Record` is one question with its image(s), options, gold answer and the ordered
reference reasoning steps the step metrics (Match F1, docs/method.md section 2) compare against.
Images are *references* (a file path, an in-memory PIL image, an encoded ``{"bytes", "path"}``
dict, or a :class:`DatasetImageRef` row of a Hugging Face dataset); :func:`open_image` decodes
one when it is needed, so loading a large dataset does not decode every image.
"""

from __future__ import annotations

import io
import string
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
    """A lazy reference to an image stored in a row of a Hugging Face ``datasets.Dataset``.

    The dataset's image column must have been cast to ``Image(decode=False)`` (so a row gives
    ``{"bytes": ..., "path": ...}``); nothing is read until :meth:`encoded` is called.

    Attributes:
        dataset: the ``datasets.Dataset`` (memory-mapped, so holding it costs no RAM).
        row: 0-based row index.
        column: the image column name.
        position: index inside the cell when the column holds a list of images, else ``None``.
    """

    dataset: Any
    row: int
    column: str
    position: int | None = None

    def encoded(self) -> dict[str, Any]:
        """The image cell as ``{"bytes": bytes | None, "path": str | None}``."""
        cell = self.dataset[self.row][self.column]
        if self.position is not None:
            cell = cell[self.position]
        if isinstance(cell, str):
            return {"bytes": None, "path": cell}
        return dict(cell)

    def describe(self) -> str:
        """Short human-readable location, used in error messages."""
        where = f"row {self.row} column '{self.column}'"
        return where if self.position is None else f"{where}[{self.position}]"


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
    if isinstance(ref, DatasetImageRef):
        ref = ref.encoded()
    if isinstance(ref, dict):
        data = ref.get("bytes")
        if data is not None:
            return Image.open(io.BytesIO(data))
        path = ref.get("path")
        if not path:
            raise TypeError("image dict has neither 'bytes' nor 'path'")
        return Image.open(path)
    if isinstance(ref, (str, Path)):
        return Image.open(ref)
    raise TypeError(f"unsupported image reference of type {type(ref).__name__}")
