"""Records -> the ``datasets.Dataset`` TRL's ``GRPOTrainer`` trains vision-language models on.

What TRL 1.16 expects (``trl/trainer/grpo_trainer.py``, ``trl/data_utils.py``):

- a conversational ``prompt`` column (``is_conversational``: a list of ``{"role", "content"}``
  messages); a chat template must *not* have been applied already;
- an ``images`` column holding a list of images per row (``example.get("images")``; the older
  single-image ``image`` column is the alternative). TRL passes each row's list to
  ``prepare_multimodal_messages(prompt, images=...)``, which fills the ``{"type": "image"}``
  placeholders in order and raises when their number differs from the number of images. A
  batch whose rows all have ``[]`` is treated as text-only.
- every other column is handed to the reward functions as a keyword argument of per-row lists
  (``GRPOConfig.remove_unused_columns`` defaults to ``False``, which keeps them).

Here ``images`` is a ``datasets`` ``List(Image())`` feature: file images are stored as paths
and decoded only when a row is read (``datasets`` returns PIL images). Images are not converted
to RGB at decode (``Image(mode=None)``): the model's image processor does that, compositing
transparent PNGs on white, where a plain ``convert("RGB")`` would turn them black. Each message
is stored as a ``Json`` value so image blocks keep no spurious ``"text": None`` key (Arrow
structs would add one; see ``trl.trainer.utils.remove_none_values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpr.data.prompts import PromptTemplates, build_messages, check_mode
from cpr.data.records import Record, image_ref_to_encodable

GRPO_COLUMNS: tuple[str, ...] = (
    "prompt",
    "images",
    "answer",
    "reference_steps",
    "options",
    "question",
    "id",
    "difficulty",
    "source",
)


def grpo_features() -> Any:
    """The ``datasets.Features`` of :func:`to_grpo_dataset`'s output."""
    from datasets import Features, Image, Json, List, Value

    return Features(
        {
            "prompt": List(Json()),
            "images": List(Image()),
            "answer": Value("string"),
            "reference_steps": List(Value("string")),
            "options": List(Value("string")),
            "question": Value("string"),
            "id": Value("string"),
            "difficulty": Value("string"),
            "source": Value("string"),
        }
    )


def to_grpo_dataset(records: Sequence[Record], templates: PromptTemplates, *, mode: str = "train") -> Any:
    """Build the GRPO training (or evaluation) dataset.

    Args:
        records: validated records (:func:`cpr.data.load_records`).
        templates: prompt templates; ``mode`` picks the training or the evaluation prompt.
        mode: ``"train"`` or ``"eval"``.

    Returns:
        A ``datasets.Dataset`` with columns ``prompt`` (system + user messages, one
        ``{"type": "image"}`` placeholder per image), ``images`` (list of images, decoded to PIL
        lazily), and the reward columns ``answer``, ``reference_steps``, ``options``,
        ``question``, plus ``id``, ``difficulty``, ``source``.

    Raises:
        ValueError: unknown ``mode``.
    """
    from datasets import Dataset

    check_mode(mode)
    columns: dict[str, list[Any]] = {name: [] for name in GRPO_COLUMNS}
    for r in records:
        columns["prompt"].append(build_messages(r, templates, mode=mode))
        columns["images"].append([image_ref_to_encodable(ref) for ref in r.images])
        columns["answer"].append(r.answer)
        columns["reference_steps"].append(list(r.reference_steps))
        columns["options"].append(list(r.options))
        columns["question"].append(r.question)
        columns["id"].append(r.id)
        columns["difficulty"].append(r.difficulty)
        columns["source"].append(r.source)
    return Dataset.from_dict(columns, features=grpo_features())
