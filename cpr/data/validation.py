"""Checks every record passes at load time (not at training step 900): each problem is a
:class:`RecordError` naming the file, the line or record id and the field, with a ``reason`` (the
constants below) used to count skipped records."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, UnidentifiedImageError

from cpr.data.records import DIFFICULTIES, DatasetImageRef, ImageRef, Record, open_image, option_letters
from cpr.errors import InputError

MISSING_FIELD, BAD_VALUE, MALFORMED_JSON, DUPLICATE_ID = "missing field", "bad value", "malformed JSON", "duplicate id"
MISSING_IMAGE, UNREADABLE_IMAGE = "missing image", "unreadable image"
EMPTY_STEPS, MISSING_ANSWER, ANSWER_NOT_OPTION = "empty reference_steps", "missing answer", "answer not an option letter"


class RecordError(InputError):
    """An invalid record: :class:`InputError` (``path``, ``line``, ``record_id``, ``field``) plus
    ``reason``, one of the module's reason constants."""

    def __init__(self, message: str, *, reason: str, **where: object) -> None:
        self.reason = reason
        super().__init__(message, **where)


def _where(ref: ImageRef) -> str:
    if isinstance(ref, DatasetImageRef):
        return f"row {ref.row} image {ref.position}"
    if isinstance(ref, dict):
        return str(ref.get("path") or "<embedded image bytes>")
    return str(ref) if isinstance(ref, (str, Path)) else "<in-memory image>"


def check_image(ref: ImageRef) -> None:
    """Open and verify one image: PIL's ``verify()`` reads the whole file (PNG chunk CRCs); a JPEG is also
    decoded at its smallest DCT scale (``Image.draft``), which reads the whole entropy-coded stream, so a
    truncated JPEG fails. Raises ``FileNotFoundError`` when the path does not exist, ``ValueError`` for not a
    readable image, zero size, or a mode that does not convert to RGB."""
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
            raise ValueError(f"cannot read image {_where(ref)}: {e}") from e
    if size[0] <= 0 or size[1] <= 0:
        raise ValueError(f"image {_where(ref)} has size {size[0]}x{size[1]}")
    try:
        Image.new(mode, (1, 1)).convert("RGB")
    except (ValueError, OSError) as e:
        raise ValueError(f"image {_where(ref)} has mode {mode!r}, not convertible to RGB") from e


def validate_record(record: Record, *, path: str | Path | None, line: int | None = None,
                    allow_empty_answer: bool = False, validate_images: bool = True) -> None:
    """Raise :class:`RecordError` for the first problem of ``record`` (from file ``path``, 1-based
    ``line`` for JSON lines): an empty question, no or empty reference steps, a missing answer
    (unless ``allow_empty_answer``), a multiple-choice answer that is not an option letter, an unknown
    difficulty, or (``validate_images``) an image :func:`check_image` refuses."""

    def fail(message: str, reason: str, field: str) -> RecordError:
        return RecordError(message, reason=reason, field=field, path=path, line=line, record_id=record.id)

    if not record.question.strip():
        raise fail("question is empty", MISSING_FIELD, "question")
    if not record.reference_steps:
        raise fail("reference_steps is empty", EMPTY_STEPS, "reference_steps")
    for i, step in enumerate(record.reference_steps):
        if not isinstance(step, str) or not step.strip():
            raise fail(f"reference step {i} is empty or not a string", EMPTY_STEPS, "reference_steps")
    if not isinstance(record.answer, str):
        raise fail(f"answer must be a string, got {type(record.answer).__name__}", BAD_VALUE, "answer")
    if not record.answer.strip():
        if not allow_empty_answer:
            raise fail("answer is missing or empty", MISSING_ANSWER, "answer")
    elif record.options and record.answer not in (letters := option_letters(len(record.options))):
        message = f"multiple-choice answer {record.answer!r} is not one of the option letters {', '.join(letters)}"
        raise fail(message, ANSWER_NOT_OPTION, "answer")
    if record.difficulty is not None and record.difficulty not in DIFFICULTIES:
        raise fail(f"difficulty {record.difficulty!r} is not one of {', '.join(DIFFICULTIES)}", BAD_VALUE, "difficulty")
    for i, ref in enumerate(record.images if validate_images else []):
        field = "image" if len(record.images) == 1 else f"images[{i}]"
        try:
            check_image(ref)
        except FileNotFoundError as e:
            raise fail(str(e), MISSING_IMAGE, field) from None
        except ValueError as e:
            raise fail(str(e), UNREADABLE_IMAGE, field) from e
