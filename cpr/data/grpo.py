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

The dataset is made by ``Dataset.map`` over the record dataset (:class:`cpr.data.records.Records`)
and written to a memory-mapped Arrow file. ``images`` is a ``datasets`` ``List(Image())``
feature: file images are stored as paths, embedded ones as their encoded bytes, and each is
decoded only when its row is read, i.e. per batch (``datasets`` returns PIL images). Images
are not converted to RGB at decode (``Image(mode=None)``): the model's image processor does
that, compositing transparent PNGs on white, where a plain ``convert("RGB")`` would turn them
black. Each message is stored as a ``Json`` value so image blocks keep no spurious ``"text": None`` key (Arrow
structs would add one; see ``trl.trainer.utils.remove_none_values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpr.data.prompts import PromptTemplates, build_messages, check_mode
from cpr.data.records import WRITER_BATCH_SIZE, Record, Records, row_record, write_records


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
        records: validated records (:func:`cpr.data.load_records`); a list of :class:`Record`
            is written to a record dataset first.
        templates: prompt templates; ``mode`` picks the training or the evaluation prompt.
        mode: ``"train"`` or ``"eval"``.

    Returns:
        A memory-mapped ``datasets.Dataset`` with columns ``prompt`` (system + user messages, one
        ``{"type": "image"}`` placeholder per image), ``images`` (list of images, decoded to PIL
        when a row is read), and the reward columns ``answer``, ``reference_steps``,
        ``options``, ``question``, plus ``id``, ``difficulty``, ``source``.

    Raises:
        ValueError: unknown ``mode``.
    """
    check_mode(mode)
    data = (records if isinstance(records, Records) else write_records(records)).dataset
    return data.map(
        _grpo_row,
        fn_kwargs={"templates": templates, "mode": mode},
        remove_columns=data.column_names,
        features=grpo_features(),
        writer_batch_size=WRITER_BATCH_SIZE,
        desc="GRPO prompts",
    )


def _grpo_row(row: dict[str, Any], templates: PromptTemplates, mode: str) -> dict[str, Any]:
    prompt = build_messages(row_record(row), templates, mode=mode)  # uses the number of images only
    return {"prompt": prompt, **{k: v for k, v in row.items() if k != "meta"}}
