"""Data layer: adapters for published dataset layouts, validated records, prompts, buckets.

Typical use::

    from cpr.data import load_records, load_templates, to_grpo_dataset
    records = load_records("mathvision", "data/samples/mathvision/test_subset.jsonl")
    dataset = to_grpo_dataset(records, load_templates())
"""

from cpr.data.adapters import ADAPTERS, Adapter, RawRow, SkipRow, get_adapter, register_adapter
from cpr.data.buckets import BucketConfig, StepThresholds, assign_bucket
from cpr.data.grpo import to_grpo_dataset
from cpr.data.loader import LoadReport, load_records, load_records_with_report
from cpr.data.prompts import (
    PromptTemplates,
    build_messages,
    load_templates,
    messages_as_text,
    render_target,
    user_text,
)
from cpr.data.records import DIFFICULTIES, DatasetImageRef, Record, Records, open_image
from cpr.data.validation import RecordError, validate_record

__all__ = ["ADAPTERS", "DIFFICULTIES", "Adapter", "BucketConfig", "DatasetImageRef", "LoadReport", "PromptTemplates",
           "RawRow", "Record", "RecordError", "Records", "SkipRow", "StepThresholds", "assign_bucket", "build_messages",
           "get_adapter", "load_records", "load_records_with_report", "load_templates", "messages_as_text", "open_image",
           "register_adapter", "render_target", "to_grpo_dataset", "user_text", "validate_record"]
