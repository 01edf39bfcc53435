"""Supervised LoRA fine-tuning with TRL's ``SFTTrainer``: the GRPO training prompt, the target JSON
(:func:`cpr.data.render_target`) as the completion. Used by the warm start before GRPO and the M3CoT
paper's fine-tuning baseline (arXiv 2405.16473, ``recipes/sft_lora.py``); how TRL 1.16 treats the
dataset, and why prompts longer than ``max_length`` are refused: docs/data.md."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpr.data.grpo import map_records
from cpr.data.prompts import PromptTemplates, build_messages, render_target
from cpr.data.records import Record, Records, row_record, write_records
from cpr.errors import ConfigError, InputError

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import peft
    from transformers import PreTrainedModel, ProcessorMixin, TrainerCallback

logger = logging.getLogger(__name__)

#: Folder under ``output_dir`` that receives the trained LoRA adapter.
ADAPTER_DIRNAME = "adapter"
#: Fields passed to ``trl.SFTConfig`` under the same name.
_SAME_NAME = ("max_steps", "num_train_epochs", "learning_rate", "per_device_train_batch_size",
              "gradient_accumulation_steps", "max_length", "lr_scheduler_type", "logging_steps", "save_strategy",
              "save_steps", "seed", "report_to", "completion_only_loss")


@dataclass
class SFTSettings:
    """Settings of a supervised LoRA run: ``trl.SFTConfig`` fields of the same name with cpr's defaults, plus
    ``warmup_ratio`` (``SFTConfig.warmup_steps``: transformers 5 reads a value below 1 as a ratio),
    ``gradient_checkpointing`` (``SFTConfig.activation_checkpointing``; ``None``: on with CUDA), ``check_lengths``
    (:func:`check_example_lengths` first) and ``extra`` (other ``SFTConfig`` fields). ``max_length`` counts image
    tokens too (``None``: no truncation). The M3CoT baseline: batch sizes 2-8, learning rates 1e-6 to 8e-5.
    """

    max_steps: int = -1
    num_train_epochs: float = 1.0
    learning_rate: float = 2e-5
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_length: int | None = 512
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.0
    logging_steps: int = 10
    save_strategy: str = "no"
    save_steps: int = 500
    seed: int = 42
    report_to: str | list[str] = "none"
    completion_only_loss: bool = True
    gradient_checkpointing: bool | None = None
    check_lengths: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self, prefix: str = "sft") -> None:
        """Check every value (``extra``: other ``trl.SFTConfig`` fields than those run_sft sets); ``ConfigError``
        with ``field=f"{prefix}.<key>"`` otherwise."""
        from transformers.trainer_utils import SchedulerType
        from trl import SFTConfig

        def check(key: str, ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message, field=f"{prefix}.{key}")

        s = self
        check("max_steps", _is_int(s.max_steps) and (s.max_steps >= 1 or s.max_steps == -1),
              f"must be a positive integer or -1 (use num_train_epochs), got {s.max_steps!r}")
        for key in ("num_train_epochs", "learning_rate"):
            check(key, _is_number(getattr(s, key)) and getattr(s, key) > 0, f"must be a number > 0, got {getattr(s, key)!r}")
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "save_steps"):
            value = getattr(s, key)
            check(key, _is_int(value) and value >= 1, f"must be a positive integer, got {value!r}")
        check("max_length", s.max_length is None or _is_int(s.max_length) and s.max_length >= 2,
              f"must be an integer >= 2 or None, got {s.max_length!r}")
        schedulers = [t.value for t in SchedulerType]
        check("lr_scheduler_type", s.lr_scheduler_type in schedulers,
              f"unknown scheduler {s.lr_scheduler_type!r}; known: {', '.join(schedulers)}")
        check("warmup_ratio", _is_number(s.warmup_ratio) and 0.0 <= s.warmup_ratio < 1.0,
              f"must be in [0, 1), got {s.warmup_ratio!r}")
        check("save_strategy", s.save_strategy in ("no", "steps", "epoch"),
              f"must be one of no, steps, epoch, got {s.save_strategy!r}")
        check("seed", _is_int(s.seed), f"must be an integer, got {s.seed!r}")
        report = [s.report_to] if isinstance(s.report_to, str) else s.report_to
        check("report_to", isinstance(report, list) and bool(report) and all(isinstance(r, str) and r for r in report),
              f"must be a tracker name or a non-empty list of names, got {s.report_to!r}")
        for key in ("completion_only_loss", "check_lengths"):
            check(key, isinstance(getattr(s, key), bool), f"expected true or false, got {getattr(s, key)!r}")
        check("gradient_checkpointing", s.gradient_checkpointing is None or isinstance(s.gradient_checkpointing, bool),
              f"expected true, false or None, got {s.gradient_checkpointing!r}")
        check("extra", isinstance(s.extra, dict), f"expected a mapping of trl.SFTConfig fields, got {type(s.extra).__name__}")
        own = {f.name for f in dataclasses.fields(self)} | {"output_dir", "warmup_steps", "activation_checkpointing"}
        known = {f.name for f in dataclasses.fields(SFTConfig)}
        for key in s.extra:
            check(f"extra.{key}", key not in own, "is set by SFTSettings or run_sft itself; set the SFTSettings field instead")
            check(f"extra.{key}", key in known, "not a trl.SFTConfig field")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def to_sft_dataset(records: Sequence[Record], templates: PromptTemplates) -> datasets.Dataset:
    """Records -> TRL's conversational prompt-completion dataset (``prompt``, ``completion``, ``images``, ``id``).
    Raises ``InputError`` (``field="answer"``, the id named) for a record without an answer."""
    from datasets import Json, List, Value

    data = records if isinstance(records, Records) else write_records(records)
    for rid, answer in zip(data.column("id"), data.column("answer"), strict=True):
        if not answer.strip():
            raise InputError("has no answer, so there is no SFT target", record_id=rid, field="answer")
    columns = {"prompt": List(Json()), "completion": List(Json()), "images": None, "id": Value("string")}
    return map_records(data, _sft_row, columns, "SFT examples", templates=templates)


def _sft_row(row: dict[str, Any], templates: PromptTemplates) -> dict[str, Any]:
    record = row_record(row)
    completion = [{"role": "assistant", "content": [{"type": "text", "text": render_target(record)}]}]
    return {"prompt": build_messages(record, templates), "completion": completion, "images": row["images"],
            "id": record.id}


def example_lengths(dataset: datasets.Dataset, processor: ProcessorMixin) -> list[tuple[int, int, int]]:
    """``(prompt_tokens, image_tokens, completion_tokens)`` of each row of :func:`to_sft_dataset`'s output, as
    TRL's ``DataCollatorForVisionLanguageModeling`` builds it (image tokens expanded, no special tokens)."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    image_token_id = getattr(processor, "image_token_id", None)
    lengths = []
    for row in dataset:
        images = row["images"] or []
        text = apply_chat_template({"prompt": prepare_multimodal_messages(row["prompt"], images=images),
                                    "completion": prepare_multimodal_messages(row["completion"])}, processor)
        prompt = processor(images=[images] if images else None, text=[text["prompt"]], add_special_tokens=False)
        prompt_ids = prompt["input_ids"][0]
        completion_ids = processor(text=[text["completion"]], add_special_tokens=False)["input_ids"][0]
        n_image = sum(1 for t in prompt_ids if t == image_token_id) if image_token_id is not None else 0
        lengths.append((len(prompt_ids), n_image, len(completion_ids)))
    return lengths


def check_example_lengths(dataset: datasets.Dataset, processor: ProcessorMixin, max_length: int, *,
                          prefix: str = "sft") -> list[tuple[int, int, int]]:
    """:func:`example_lengths`, with a warning counting the examples that will lose the end of their completion.
    Raises ``ConfigError`` (``<prefix>.max_length``, naming the first) for a prompt of ``max_length`` or more."""
    lengths = example_lengths(dataset, processor)
    ids = dataset["id"]
    if too_long := [(i, p, n) for i, (p, n, _) in enumerate(lengths) if p >= max_length]:
        i, p, n = too_long[0]
        raise ConfigError(
            f"{len(too_long)} of {len(lengths)} prompts do not leave room for a completion token within "
            f"max_length={max_length}: the first, record {ids[i]!r}, takes {p} tokens ({n} of them image tokens), "
            f"so truncation would cut its image tokens or its whole completion. Raise max_length or lower the "
            f"image size (max_pixels)",
            field=f"{prefix}.max_length",
        )
    if cut := [(i, p + c - max_length) for i, (p, _, c) in enumerate(lengths) if p + c > max_length]:
        worst = max(cut, key=lambda x: x[1])
        logger.warning(
            "%d of %d SFT examples exceed max_length=%d and lose the end of their completion (the closing "
            "brace and end-of-turn token); the worst, record %r, loses %d tokens",
            len(cut), len(lengths), max_length, ids[worst[0]], worst[1],
        )
    return lengths


def build_sft_config(settings: SFTSettings, output_dir: str | Path, model: Any) -> Any:
    """The ``trl.SFTConfig`` :func:`run_sft` trains with (precision: :func:`sft_precision`)."""
    import torch
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        **{k: getattr(settings, k) for k in _SAME_NAME},
        warmup_steps=settings.warmup_ratio,  # < 1: a ratio of the training steps (transformers 5)
        activation_checkpointing=torch.cuda.is_available() if settings.gradient_checkpointing is None else settings.gradient_checkpointing,
        **sft_precision(getattr(model, "dtype", torch.float32), settings.extra),
    )


def sft_precision(dtype: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """``use_cpu`` / ``bf16`` / ``fp16`` of the supervised pass: CPU without CUDA; on CUDA, mixed precision
    following the model's ``torch.dtype``; then ``extra`` (``warm_start.extra``) over them."""
    import torch

    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": cuda and dtype == torch.bfloat16, "fp16": cuda and dtype == torch.float16,
            **extra}


@functools.cache
def _sft_trainer_class() -> type:
    """``trl.SFTTrainer`` whose model card names the base model, built on first use (TRL imported lazily)."""
    from trl import SFTTrainer

    from cpr.trl_internals import name_base_model

    class NamedBaseSFTTrainer(SFTTrainer):
        def create_model_card(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
            super().create_model_card(*args, **kwargs)
            name_base_model(self)

    return NamedBaseSFTTrainer


def run_sft(
    model: PreTrainedModel, processor: ProcessorMixin, records: Sequence[Record], templates: PromptTemplates,
    settings: SFTSettings, output_dir: str | Path, *, peft_config: peft.PeftConfig | None = None,
    callbacks: Sequence[TrainerCallback] = (), prefix: str = "sft", resume_from_checkpoint: str | Path | None = None,
) -> Path:
    """Train a LoRA adapter on ``records`` with ``trl.SFTTrainer`` (``model`` with ``peft_config``, or a
    ``peft.PeftModel`` with a trainable adapter) and return ``output_dir / "adapter"`` (model left in eval mode).
    Raises ``ConfigError`` for invalid settings (fields ``<prefix>.<key>``); neither ``peft_config`` nor a
    ``PeftModel``, both, or a ``PeftModel`` without trainable parameters; a prompt longer than
    ``settings.max_length``. Raises ``InputError`` for no records, or a record without an answer."""
    from peft import PeftModel

    from cpr.training.checkpoints import CompleteMarkerCallback, restore_trained, training_done
    from cpr.training.logs import quiet_console

    settings.validate(prefix)
    if not records:
        raise InputError("no training records for SFT")
    is_peft = isinstance(model, PeftModel)
    if peft_config is None and not is_peft:
        raise ConfigError("run_sft trains a LoRA adapter: pass peft_config (cpr.models.build_lora_config) or a "
                          "PeftModel", field="lora")
    if peft_config is not None and is_peft:
        raise ConfigError("the model is already a PeftModel: pass peft_config=None to keep training its adapter",
                          field="lora")
    if is_peft and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("the PeftModel has no trainable parameters; load it with PeftModel.from_pretrained(..., "
                          "is_trainable=True)", field="lora")
    output_dir = Path(output_dir)
    dataset = to_sft_dataset(records, templates)
    if settings.check_lengths and settings.max_length is not None:
        check_example_lengths(dataset, processor, settings.max_length, prefix=prefix)
    trainer = _sft_trainer_class()(
        model=model, args=build_sft_config(settings, output_dir, model), train_dataset=dataset,
        processing_class=processor, peft_config=peft_config, callbacks=[*callbacks, CompleteMarkerCallback()])
    quiet_console(trainer)
    if resume_from_checkpoint is not None and training_done(resume_from_checkpoint):
        restore_trained(trainer, resume_from_checkpoint)  # killed after its last checkpoint: nothing left to train
    else:
        trainer.train(resume_from_checkpoint=str(resume_from_checkpoint) if resume_from_checkpoint else None)
    adapter_dir = output_dir / ADAPTER_DIRNAME
    trainer.save_model(str(adapter_dir))
    if trainer.is_world_process_zero():
        trainer.state.save_to_json(str(output_dir / "trainer_state.json"))
    trainer.model.eval()
    return adapter_dir
