"""Data layer: adapters for published dataset layouts, validated records, prompts, buckets.

Typical use::

    from cpr.data import load_records, load_templates, to_grpo_dataset
    records = load_records("mathvision", "data/samples/mathvision/test_subset.jsonl")
    dataset = to_grpo_dataset(records, load_templates())
"""

from cpr.data.adapters import ADAPTERS, Adapter, RawRow, SkipRow, get_adapter, register_adapter
from cpr.data.buckets import BucketConfig, FieldBuckets, StepThresholds, assign_bucket
from cpr.data.grpo import grpo_features, to_grpo_dataset
from cpr.data.loader import LoadReport, load_records, load_records_with_report
from cpr.data.prompts import (
    PromptTemplates,
    build_messages,
    format_options,
    load_templates,
    messages_as_text,
    render_target,
    user_text,
)
from cpr.data.records import DIFFICULTIES, DatasetImageRef, Record, Records, open_image, write_records
from cpr.data.text import split_sentences
from cpr.data.validation import RecordError, check_image, validate_record

__all__ = [
    "ADAPTERS",
    "DIFFICULTIES",
    "Adapter",
    "BucketConfig",
    "DatasetImageRef",
    "FieldBuckets",
    "LoadReport",
    "PromptTemplates",
    "RawRow",
    "Record",
    "RecordError",
    "Records",
    "SkipRow",
    "StepThresholds",
    "assign_bucket",
    "build_messages",
    "check_image",
    "format_options",
    "get_adapter",
    "grpo_features",
    "load_records",
    "load_records_with_report",
    "load_templates",
    "open_image",
    "messages_as_text",
    "register_adapter",
    "render_target",
    "split_sentences",
    "to_grpo_dataset",
    "user_text",
    "validate_record",
    "write_records",
]
