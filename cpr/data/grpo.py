"""Records -> the ``datasets.Dataset`` TRL's ``GRPOTrainer`` trains vision-language models on, made by
``Dataset.map`` over the record dataset (the TRL 1.16 format it follows: docs/data.md section 6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpr.data.prompts import PromptTemplates, build_messages
from cpr.data.records import WRITER_BATCH_SIZE, Record, Records, row_record, write_records


def map_records(records: Sequence[Record], function: Any, columns: dict[str, Any], desc: str, **fn_kwargs: Any) -> Any:
    """``Dataset.map`` of ``function`` (record-dataset row -> row of ``columns``, name -> feature) over
    ``records`` (a list is written to a record dataset first): a memory-mapped dataset whose
    ``images`` column is ``List(Image())``, decoded when read and not converted (docs/data.md)."""
    from datasets import Features, Image, List

    data = (records if isinstance(records, Records) else write_records(records)).dataset
    features = Features({name: List(Image()) if name == "images" else f for name, f in columns.items()})
    return data.map(function, fn_kwargs=fn_kwargs, remove_columns=data.column_names, features=features,
                    writer_batch_size=WRITER_BATCH_SIZE, desc=desc)


def to_grpo_dataset(records: Sequence[Record], templates: PromptTemplates, *, mode: str = "train") -> Any:
    """Build the GRPO training (``mode="train"``) or evaluation (``"eval"``) dataset.

    Returns a memory-mapped ``datasets.Dataset`` with columns ``prompt`` (:func:`build_messages`,
    messages stored as ``Json``), ``images`` (a list per row, decoded when read), the reward columns
    ``answer``, ``reference_steps``, ``options``, ``question``, and ``id``, ``difficulty``, ``source``.
    Raises ``ValueError`` for an unknown ``mode``.
    """
    from datasets import Json, List, Value

    templates.for_mode(mode)
    text, texts = Value("string"), List(Value("string"))
    columns = {"prompt": List(Json()), "images": None, "answer": text, "reference_steps": texts, "options": texts,
               "question": text, "id": text, "difficulty": text, "source": text}
    return map_records(records, _grpo_row, columns, "GRPO prompts", templates=templates, mode=mode)


def _grpo_row(row: dict[str, Any], templates: PromptTemplates, mode: str) -> dict[str, Any]:
    prompt = build_messages(row_record(row), templates, mode=mode)  # uses the number of images only
    return {"prompt": prompt, **{k: v for k, v in row.items() if k != "meta"}}
