"""Checks every record passes before it reaches a trainer or an evaluator.

A record is invalid when an image is missing or unreadable, ``reference_steps`` is empty, the
answer is missing (except for sources that have none, e.g. VLRMBench), a multiple-choice answer
is not one of the options' letters, or its id repeats an earlier one. Each problem is a
:class:`RecordError` (an :class:`cpr.errors.InputError`) naming the file, the line or record id,
and the field, plus a short ``reason`` used to count skipped records.

Images are checked once at load time (a bad image fails at load time, not at training
step 900): the file is opened with PIL and ``verify()``-ed (PNG chunk CRCs, the whole file),
JPEGs are additionally decoded at their smallest DCT scale (``Image.draft``; cheap, and it
reads the whole entropy-coded stream, so a truncated JPEG fails here), the size must be
positive, and the mode must convert to RGB.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, UnidentifiedImageError

from cpr.data.records import DIFFICULTIES, ImageRef, Record, describe_image_ref, open_image, option_letters
from cpr.errors import InputError

# Reasons (keys of the skip counts).
MISSING_FIELD = "missing field"
BAD_VALUE = "bad value"
MISSING_IMAGE = "missing image"
UNREADABLE_IMAGE = "unreadable image"
EMPTY_STEPS = "empty reference_steps"
MISSING_ANSWER = "missing answer"
ANSWER_NOT_OPTION = "answer not an option letter"
DUPLICATE_ID = "duplicate id"
MALFORMED_JSON = "malformed JSON"

ON_INVALID_CHOICES: tuple[str, ...] = ("error", "skip")


class RecordError(InputError):
    """An invalid record. Same message format as :class:`InputError`, plus ``reason``.

    Args:
        message: what is wrong.
        reason: one of the module's reason constants (used for skip counts).
        path, line, record_id, field: where (see :class:`InputError`).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        path: str | Path | None = None,
        line: int | None = None,
        record_id: str | None = None,
        field: str | None = None,
    ) -> None:
        self.reason = reason
        super().__init__(message, path=path, line=line, record_id=record_id, field=field)


def check_on_invalid(on_invalid: str) -> str:
    """Return ``on_invalid`` if it is ``"error"`` or ``"skip"``; else raise ``ValueError``."""
    if on_invalid not in ON_INVALID_CHOICES:
        raise ValueError(f"on_invalid must be one of {ON_INVALID_CHOICES}, got {on_invalid!r}")
    return on_invalid


def check_image(ref: ImageRef) -> None:
    """Open and verify one image; raise ``FileNotFoundError`` or ``ValueError`` (with the cause).

    ``FileNotFoundError`` means the path does not exist; ``ValueError`` means the bytes are not
    a readable image, its size is zero, or its mode cannot be converted to RGB.
    """
    if isinstance(ref, (str, Path)) and not Path(ref).is_file():
        raise FileNotFoundError(f"image file not found: {ref}")
    if isinstance(ref, Image.Image):  # already in memory: nothing to read, never close it
        mode, size = ref.mode, ref.size
    else:
        try:
            with open_image(ref) as im:
                fmt, mode, size = im.format, im.mode, im.size
                im.verify()
            if fmt == "JPEG":
                with open_image(ref) as im:
                    im.draft("RGB", (1, 1))
                    im.load()
        except FileNotFoundError:
            raise
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise ValueError(f"cannot read image {describe_image_ref(ref)}: {e}") from e
    if size[0] <= 0 or size[1] <= 0:
        raise ValueError(f"image {describe_image_ref(ref)} has size {size[0]}x{size[1]}")
    try:
        Image.new(mode, (1, 1)).convert("RGB")
    except (ValueError, OSError) as e:
        raise ValueError(f"image {describe_image_ref(ref)} has mode {mode!r}, not convertible to RGB") from e


def validate_record(
    record: Record,
    *,
    path: str | Path | None,
    line: int | None = None,
    allow_empty_answer: bool = False,
    validate_images: bool = True,
) -> None:
    """Raise :class:`RecordError` for the first problem found in ``record``; return if valid.

    Args:
        record: the converted record.
        path: the file (or dataset) it came from, for the message.
        line: its 1-based line in ``path`` when the file is JSON lines.
        allow_empty_answer: accept ``answer == ""`` (sources without an answer field).
        validate_images: open and verify every image (see :func:`check_image`).
    """
    where = {"path": path, "line": line, "record_id": record.id}
    if not record.question.strip():
        raise RecordError("question is empty", reason=MISSING_FIELD, field="question", **where)
    if not record.reference_steps:
        raise RecordError("reference_steps is empty", reason=EMPTY_STEPS, field="reference_steps", **where)
    for i, step in enumerate(record.reference_steps):
        if not isinstance(step, str) or not step.strip():
            raise RecordError(
                f"reference step {i} is empty or not a string",
                reason=EMPTY_STEPS,
                field="reference_steps",
                **where,
            )
    if not isinstance(record.answer, str):
        raise RecordError(
            f"answer must be a string, got {type(record.answer).__name__}",
            reason=BAD_VALUE,
            field="answer",
            **where,
        )
    if not record.answer.strip():
        if not allow_empty_answer:
            raise RecordError("answer is missing or empty", reason=MISSING_ANSWER, field="answer", **where)
    elif record.options:
        letters = option_letters(len(record.options))
        if record.answer not in letters:
            raise RecordError(
                f"multiple-choice answer {record.answer!r} is not one of the option letters "
                f"{', '.join(letters)}",
                reason=ANSWER_NOT_OPTION,
                field="answer",
                **where,
            )
    if record.difficulty is not None and record.difficulty not in DIFFICULTIES:
        raise RecordError(
            f"difficulty {record.difficulty!r} is not one of {', '.join(DIFFICULTIES)}",
            reason=BAD_VALUE,
            field="difficulty",
            **where,
        )
    if validate_images:
        for i, ref in enumerate(record.images):
            field = "image" if len(record.images) == 1 else f"images[{i}]"
            try:
                check_image(ref)
            except FileNotFoundError as e:
                raise RecordError(str(e), reason=MISSING_IMAGE, field=field, **where) from None
            except ValueError as e:
                raise RecordError(str(e), reason=UNREADABLE_IMAGE, field=field, **where) from e
