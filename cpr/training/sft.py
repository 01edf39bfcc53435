"""Supervised LoRA fine-tuning on the records' target JSON, with TRL's ``SFTTrainer``.

Two uses:

* the **warm start** of the offline demo: a random tiny model earns no reward, so a short
  supervised LoRA pass on the samples' target JSON comes before GRPO, and GRPO's groups then
  hold completions of different reward;
* the M3CoT paper's **fine-tuning baseline** (arXiv 2405.16473: batch size from {2, 4, 8},
  learning rate in [1e-6, 8e-5], max length 512), run by ``recipes/sft_lora.py``.

The prompt is the GRPO training prompt (:func:`cpr.data.build_messages` with ``mode="train"``:
system message + user message with one ``{"type": "image"}`` placeholder per image) and the
completion is :func:`cpr.data.render_target` (``{"reasoning_steps": [...], "answer": ...}``,
docs/method.md section 1) as one assistant message.

What TRL 1.16's ``SFTTrainer`` does with such a dataset (``trl/trainer/sft_trainer.py``):

* a row with an ``images`` column makes it a *vision dataset*: dataset preparation is skipped
  (``dataset_kwargs`` has no effect; images are processed in the collator), and the collator is
  ``DataCollatorForVisionLanguageModeling``. Packing and padding-free training are refused.
* conversational ``prompt`` / ``completion`` columns select its prompt-completion path: TRL's
  ``prepare_multimodal_messages`` fills the image placeholders from ``images``;
  ``apply_chat_template`` renders the prompt with the generation prompt and takes the
  completion as the rest of the rendered conversation, so the completion ends with the chat
  template's end-of-turn token (``<|im_end|>``) and the model learns to stop. Prompts are
  processed with the images (image tokens expanded), left-padded, concatenated with the
  right-padded completions and flushed left.
* ``completion_only_loss=True`` sets the labels of prompt tokens (image tokens included) to
  -100: the loss is the mean negative log-likelihood of the completion tokens (TRL's fused LM
  head, ``loss_type="nll"``).
* ``max_length`` counts **all** tokens, the expanded image tokens included, and truncation
  keeps the start (``truncation_mode="keep_start"``; ``keep_end`` is refused for vision data).
  So the prompt is never cut while it fits: a too-long example loses the end of its
  completion. A prompt longer than ``max_length`` would lose image tokens (the model then
  fails with "Image features and image tokens do not match") or leave no completion token;
  :func:`run_sft` therefore measures every example first (:func:`example_lengths`) and raises
  a :class:`~cpr.errors.ConfigError` naming the record, and logs how many completions will be
  truncated. With Qwen2.5-VL's default ``max_pixels`` (602,112 px, up to 768 image tokens an
  image) a 512-token limit needs a smaller ``max_pixels``.
* ``remove_unused_columns`` may stay ``True``: TRL keeps ``prompt``, ``completion`` and
  ``images`` for vision datasets (``_set_signature_columns_if_needed``).

Tiny models (``tools/tiny_models.py``) as built have random tied embeddings of std 0.02 and a final
RMSNorm of weight 1, so no logit exceeds about 2.6 whatever LoRA does to the decoder layers:
the loss cannot fall below about 5 nats a token and samples at temperature 1 stay near uniform.
A warm start works once the frozen final-norm weight is larger (x8): see
``benchmarks/warm_start_probe.py`` for the recipe and the measured rates.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpr.data.prompts import PromptTemplates, build_messages, render_target
from cpr.data.records import WRITER_BATCH_SIZE, Record, Records, row_record, write_records
from cpr.errors import ConfigError, InputError

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import peft
    from transformers import PreTrainedModel, ProcessorMixin, TrainerCallback

__all__ = [
    "ADAPTER_DIRNAME",
    "SFT_COLUMNS",
    "SFTSettings",
    "build_sft_config",
    "check_example_lengths",
    "example_lengths",
    "run_sft",
    "sft_features",
    "to_sft_dataset",
]

logger = logging.getLogger(__name__)

#: Folder under ``output_dir`` that receives the trained LoRA adapter.
ADAPTER_DIRNAME = "adapter"
#: Columns of :func:`to_sft_dataset`'s output.
SFT_COLUMNS: tuple[str, ...] = ("prompt", "completion", "images", "id")
_SAVE_STRATEGIES = ("no", "steps", "epoch")


def _help(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class SFTSettings:
    """Settings of a supervised LoRA run (a subset of ``trl.SFTConfig``, with cpr's defaults).

    Fields map onto ``trl.SFTConfig`` of the same name, except ``warmup_ratio`` (transformers 5
    reads a ``warmup_steps`` below 1 as a ratio) and ``gradient_checkpointing`` (transformers
    5.24's ``activation_checkpointing``). ``extra`` passes any other ``SFTConfig`` field.
    Call :meth:`validate` before use (:func:`run_sft` does).
    """

    max_steps: int = _help("Optimizer steps; -1 trains num_train_epochs epochs instead.", -1)
    num_train_epochs: float = _help("Epochs over the records when max_steps is -1.", 1.0)
    learning_rate: float = _help(
        "Peak AdamW learning rate (M3CoT baseline: 1e-6 to 8e-5; tiny-model warm start: 5e-3).", 2e-5
    )
    per_device_train_batch_size: int = _help("Examples per device per micro-batch (M3CoT: 2, 4 or 8).", 4)
    gradient_accumulation_steps: int = _help("Micro-batches accumulated per optimizer step.", 1)
    max_length: int | None = _help(
        "Maximum tokens per example, image tokens included; longer completions are cut at the end. "
        "None: no truncation. M3CoT baseline: 512.",
        512,
    )
    lr_scheduler_type: str = _help("transformers scheduler name (linear, cosine, constant, ...).", "linear")
    warmup_ratio: float = _help("Share of the optimizer steps spent warming the learning rate up, in [0, 1).", 0.0)
    logging_steps: int = _help("Log the loss every this many optimizer steps.", 10)
    save_strategy: str = _help(
        "Intermediate checkpoints: no, steps (every save_steps) or epoch; the final adapter is always saved.", "no"
    )
    save_steps: int = _help("Checkpoint interval in optimizer steps when save_strategy is steps.", 500)
    seed: int = _help("Seed of the LoRA initialisation, the data order and dropout.", 42)
    report_to: str | list[str] = _help("Trackers (none, tensorboard, wandb, or a list).", "none")
    completion_only_loss: bool = _help(
        "True: the loss covers the assistant's JSON completion only; False: the whole sequence (prompt text and "
        "image placeholder tokens too).",
        True,
    )
    gradient_checkpointing: bool | None = _help(
        "Activation checkpointing; None: on when CUDA is available, off on CPU.", None
    )
    check_lengths: bool = _help(
        "Measure every example with the processor before training (one pass over the images): a prompt "
        "longer than max_length is an error, truncated completions are logged.",
        True,
    )
    extra: dict[str, Any] = _help(
        "Other trl.SFTConfig fields, passed as given (e.g. {'weight_decay': 0.0, 'use_cpu': True}).", factory=dict
    )

    def validate(self, prefix: str = "sft") -> None:
        """Check every value; raise :class:`~cpr.errors.ConfigError` with ``field=f"{prefix}.<key>"``.

        ``extra`` may not name a field of this class (set it directly) nor ``output_dir``
        (an argument of :func:`run_sft`), and must name ``trl.SFTConfig`` fields.
        """

        def fail(key: str, message: str) -> None:
            raise ConfigError(message, field=f"{prefix}.{key}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.max_steps) or (self.max_steps < 1 and self.max_steps != -1):
            fail("max_steps", f"must be a positive integer or -1 (use num_train_epochs), got {self.max_steps!r}")
        if not is_number(self.num_train_epochs) or self.num_train_epochs <= 0:
            fail("num_train_epochs", f"must be a number > 0, got {self.num_train_epochs!r}")
        if not is_number(self.learning_rate) or self.learning_rate <= 0:
            fail("learning_rate", f"must be a number > 0, got {self.learning_rate!r}")
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "save_steps"):
            value = getattr(self, key)
            if not is_int(value) or value < 1:
                fail(key, f"must be a positive integer, got {value!r}")
        if self.max_length is not None and (not is_int(self.max_length) or self.max_length < 2):
            fail("max_length", f"must be an integer >= 2 or None, got {self.max_length!r}")
        from transformers.trainer_utils import SchedulerType

        schedulers = [s.value for s in SchedulerType]
        if self.lr_scheduler_type not in schedulers:
            fail("lr_scheduler_type", f"unknown scheduler {self.lr_scheduler_type!r}; known: {', '.join(schedulers)}")
        if not is_number(self.warmup_ratio) or not 0.0 <= self.warmup_ratio < 1.0:
            fail("warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio!r}")
        if self.save_strategy not in _SAVE_STRATEGIES:
            fail("save_strategy", f"must be one of {', '.join(_SAVE_STRATEGIES)}, got {self.save_strategy!r}")
        if not is_int(self.seed):
            fail("seed", f"must be an integer, got {self.seed!r}")
        report = [self.report_to] if isinstance(self.report_to, str) else self.report_to
        if not isinstance(report, list) or not report or not all(isinstance(r, str) and r for r in report):
            fail("report_to", f"must be a tracker name or a non-empty list of names, got {self.report_to!r}")
        for key in ("completion_only_loss", "check_lengths"):
            if not isinstance(getattr(self, key), bool):
                fail(key, f"expected true or false, got {getattr(self, key)!r}")
        if self.gradient_checkpointing is not None and not isinstance(self.gradient_checkpointing, bool):
            fail("gradient_checkpointing", f"expected true, false or None, got {self.gradient_checkpointing!r}")
        if not isinstance(self.extra, dict):
            fail("extra", f"expected a mapping of trl.SFTConfig fields, got {type(self.extra).__name__}")
        from trl import SFTConfig

        own = {f.name for f in dataclasses.fields(self)}
        known = {f.name for f in dataclasses.fields(SFTConfig)}
        for key in self.extra:
            if key in own or key in ("output_dir", "warmup_steps", "activation_checkpointing"):
                fail(f"extra.{key}", "is set by SFTSettings or run_sft itself; set the SFTSettings field instead")
            if key not in known:
                fail(f"extra.{key}", "not a trl.SFTConfig field")


def sft_features() -> Any:
    """The ``datasets.Features`` of :func:`to_sft_dataset`'s output."""
    from datasets import Features, Image, Json, List, Value

    return Features(
        {
            "prompt": List(Json()),
            "completion": List(Json()),
            "images": List(Image()),
            "id": Value("string"),
        }
    )


def to_sft_dataset(records: Sequence[Record], templates: PromptTemplates) -> datasets.Dataset:
    """Records -> TRL's conversational prompt-completion dataset for vision-language SFT.

    Args:
        records: validated records (:func:`cpr.data.load_records`), each with an answer.
        templates: prompt templates; the training prompt (``mode="train"``) is used, as in GRPO.

    Returns:
        A memory-mapped ``datasets.Dataset`` (made by ``Dataset.map``) with columns ``prompt``
        (system + user messages, one ``{"type": "image"}`` placeholder per image, as
        :func:`cpr.data.to_grpo_dataset`),
        ``completion`` (``[{"role": "assistant", "content": [{"type": "text", "text":
        render_target(record)}]}]``), ``images`` (the record's images, decoded lazily) and ``id``.
        Messages are stored as ``Json`` values so image blocks carry no spurious ``"text": None``.

    Raises:
        InputError: a record without an answer (``field="answer"``, its id in the message):
            there would be no target to learn.
    """
    data = records if isinstance(records, Records) else write_records(records)
    for rid, answer in zip(data.column("id"), data.column("answer"), strict=True):
        if not answer.strip():
            raise InputError("has no answer, so there is no SFT target", record_id=rid, field="answer")
    return data.dataset.map(
        _sft_row,
        fn_kwargs={"templates": templates},
        remove_columns=data.dataset.column_names,
        features=sft_features(),
        writer_batch_size=WRITER_BATCH_SIZE,
        desc="SFT examples",
    )


def _sft_row(row: dict[str, Any], templates: PromptTemplates) -> dict[str, Any]:
    record = row_record(row)
    completion = [{"role": "assistant", "content": [{"type": "text", "text": render_target(record)}]}]
    prompt = build_messages(record, templates, mode="train")
    return {"prompt": prompt, "completion": completion, "images": row["images"], "id": record.id}


def example_lengths(dataset: datasets.Dataset, processor: ProcessorMixin) -> list[tuple[int, int, int]]:
    """Token counts of each example as TRL's vision-language collator builds it.

    Uses TRL's own ``prepare_multimodal_messages`` and ``apply_chat_template``, then the
    processor on the prompt with its images (image tokens expanded) and on the completion,
    without special tokens, like ``DataCollatorForVisionLanguageModeling``.

    Args:
        dataset: the output of :func:`to_sft_dataset`.
        processor: the model's processor.

    Returns:
        One ``(prompt_tokens, image_tokens, completion_tokens)`` per row; ``image_tokens`` counts
        the processor's ``image_token_id`` inside the prompt (0 when the processor has none).
    """
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    image_token_id = getattr(processor, "image_token_id", None)
    lengths = []
    for row in dataset:
        images = row["images"] or []
        example = {
            "prompt": prepare_multimodal_messages(row["prompt"], images=images),
            "completion": prepare_multimodal_messages(row["completion"]),
        }
        text = apply_chat_template(example, processor)
        prompt_ids = processor(images=[images] if images else None, text=[text["prompt"]], add_special_tokens=False)[
            "input_ids"
        ][0]
        completion_ids = processor(text=[text["completion"]], add_special_tokens=False)["input_ids"][0]
        n_image = sum(1 for t in prompt_ids if t == image_token_id) if image_token_id is not None else 0
        lengths.append((len(prompt_ids), n_image, len(completion_ids)))
    return lengths


def check_example_lengths(
    dataset: datasets.Dataset, processor: ProcessorMixin, max_length: int, *, prefix: str = "sft"
) -> list[tuple[int, int, int]]:
    """Check that every example of :func:`to_sft_dataset`'s output fits ``max_length``.

    Returns :func:`example_lengths`. Logs a warning (logger ``cpr.training.sft``) with the count
    of examples whose prompt + completion exceed ``max_length`` (TRL keeps the start, so they
    lose the end of their completion).

    Raises:
        ConfigError: ``field=f"{prefix}.max_length"``, when a prompt alone takes ``max_length``
            tokens or more (image tokens included): truncation would cut its image tokens or leave
            no completion token. The message names the first such record and its token counts.
    """
    lengths = example_lengths(dataset, processor)
    ids = dataset["id"]
    too_long = [(i, p, n) for i, (p, n, _) in enumerate(lengths) if p >= max_length]
    if too_long:
        i, p, n = too_long[0]
        raise ConfigError(
            f"{len(too_long)} of {len(lengths)} prompts do not leave room for a completion token within "
            f"max_length={max_length}: the first, record {ids[i]!r}, takes {p} tokens ({n} of them image tokens), "
            f"so truncation would cut its image tokens or its whole completion. Raise max_length or lower the "
            f"image size (max_pixels)",
            field=f"{prefix}.max_length",
        )
    cut = [(i, p + c - max_length) for i, (p, _, c) in enumerate(lengths) if p + c > max_length]
    if cut:
        worst = max(cut, key=lambda x: x[1])
        logger.warning(
            "%d of %d SFT examples exceed max_length=%d and lose the end of their completion (the closing "
            "brace and end-of-turn token); the worst, record %r, loses %d tokens",
            len(cut),
            len(lengths),
            max_length,
            ids[worst[0]],
            worst[1],
        )
    return lengths


def _is_peft_model(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def build_sft_config(settings: SFTSettings, output_dir: str | Path, model: Any) -> Any:
    """The ``trl.SFTConfig`` :func:`run_sft` trains with (``settings`` must be valid).

    Beyond the fields of the same name: ``warmup_steps = warmup_ratio`` (transformers 5 reads a
    value below 1 as a ratio); ``activation_checkpointing`` from ``gradient_checkpointing``
    (None: on with CUDA); without CUDA ``use_cpu=True`` and no mixed precision, with CUDA
    ``bf16`` / ``fp16`` when the model's dtype is bfloat16 / float16. ``settings.extra`` is
    applied last, so it can override these (e.g. ``{"use_cpu": True}`` on a GPU machine).
    """
    import torch
    from trl import SFTConfig

    cuda = torch.cuda.is_available()
    dtype = getattr(model, "dtype", torch.float32)
    checkpointing = cuda if settings.gradient_checkpointing is None else settings.gradient_checkpointing
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": settings.max_steps,
        "num_train_epochs": settings.num_train_epochs,
        "learning_rate": settings.learning_rate,
        "per_device_train_batch_size": settings.per_device_train_batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "max_length": settings.max_length,
        "lr_scheduler_type": settings.lr_scheduler_type,
        "warmup_steps": settings.warmup_ratio,  # < 1: a ratio of the training steps (transformers 5)
        "logging_steps": settings.logging_steps,
        "save_strategy": settings.save_strategy,
        "save_steps": settings.save_steps,
        "seed": settings.seed,
        "report_to": settings.report_to,
        "completion_only_loss": settings.completion_only_loss,
        "activation_checkpointing": checkpointing,
        # Mixed precision follows the model's dtype on a GPU; CPU training runs in the model's dtype (fp32).
        "use_cpu": not cuda,
        "bf16": cuda and dtype == torch.bfloat16,
        "fp16": cuda and dtype == torch.float16,
    }
    kwargs.update(settings.extra)
    return SFTConfig(**kwargs)


def run_sft(
    model: PreTrainedModel,
    processor: ProcessorMixin,
    records: Sequence[Record],
    templates: PromptTemplates,
    settings: SFTSettings,
    output_dir: str | Path,
    *,
    peft_config: peft.PeftConfig | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> Path:
    """Train a LoRA adapter on the records' target JSON with ``trl.SFTTrainer``; save it.

    Args:
        model: a vision-language model (e.g. from :func:`cpr.models.load_model_and_processor`)
            with ``peft_config``, or a ``peft.PeftModel`` with a trainable adapter and no
            ``peft_config``. With ``peft_config``, PEFT injects the LoRA layers into ``model`` in
            place, so after the call ``model`` computes with the trained adapter.
        processor: the model's processor (``processing_class``); its pad token is used.
        records: training records (each with an answer).
        templates: prompt templates (the GRPO training prompt).
        settings: training settings; validated first (``ConfigError`` fields ``sft.<key>``).
        output_dir: run folder: intermediate checkpoints (``checkpoint-N``, when
            ``settings.save_strategy`` is not ``"no"``), ``trainer_state.json`` (the log
            history: loss, ``mean_token_accuracy``, learning rate per logging step) and the
            adapter folder.
        peft_config: LoRA configuration (:func:`cpr.models.build_lora_config`).
        callbacks: extra ``transformers.TrainerCallback`` objects.

    Returns:
        ``output_dir / "adapter"``: the LoRA adapter only (``adapter_config.json``,
        ``adapter_model.safetensors``) plus the processor files; load it with
        ``peft.PeftModel.from_pretrained(base_model, path)``. The trained model is left in
        eval mode.

    Raises:
        ConfigError: invalid settings; neither ``peft_config`` nor a ``PeftModel`` (this trains
            adapters only); a ``PeftModel`` together with a ``peft_config``, or one without
            trainable parameters; a prompt longer than ``settings.max_length``.
        InputError: no records, or a record without an answer.
    """
    from trl import SFTTrainer

    from cpr.training.logs import quiet_console

    settings.validate()
    if not records:
        raise InputError("no training records for SFT")
    is_peft = _is_peft_model(model)
    if peft_config is None and not is_peft:
        raise ConfigError(
            "run_sft trains a LoRA adapter: pass peft_config (cpr.models.build_lora_config) or a PeftModel",
            field="lora",
        )
    if peft_config is not None and is_peft:
        raise ConfigError(
            "the model is already a PeftModel: pass peft_config=None to keep training its adapter", field="lora"
        )
    if is_peft and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            "the PeftModel has no trainable parameters; load it with "
            "PeftModel.from_pretrained(..., is_trainable=True)",
            field="lora",
        )

    output_dir = Path(output_dir)
    dataset = to_sft_dataset(records, templates)
    if settings.check_lengths and settings.max_length is not None:
        check_example_lengths(dataset, processor, settings.max_length)
    trainer = SFTTrainer(
        model=model,
        args=build_sft_config(settings, output_dir, model),
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=list(callbacks) or None,
    )
    quiet_console(trainer)
    trainer.train()
    adapter_dir = output_dir / ADAPTER_DIRNAME
    trainer.save_model(str(adapter_dir))
    if trainer.is_world_process_zero():
        trainer.state.save_to_json(str(output_dir / "trainer_state.json"))
    trainer.model.eval()
    return adapter_dir
