"""Batched greedy generation of completions, resumable through a JSON-lines file.

Protocol (CRYSTAL paper evaluation): greedy decoding (``do_sample=False``), at most
``max_new_tokens`` new tokens (default 256, the paper's completion budget), prompts built
with the project's templates (:mod:`cpr.data.prompts`): ``prompt_mode="eval"`` uses the
CRYSTAL evaluation prompt (``cpr eval``'s default), ``"train"`` the training system prompt
(what the training hook uses, so a policy is evaluated in the format it is trained on).

Backends:

``transformers`` (:class:`TransformersGenerator`)
    ``model.generate`` on batches of ``batch_size`` prompts, left-padded (the processor of
    :func:`cpr.models.load_model_and_processor` pads on the left). Each prompt is rendered as
    TRL 1.16's GRPOTrainer renders it (``trl/trainer/grpo_trainer.py``, ``_tokenize_prompts``):
    conversational messages whose image blocks carry the PIL image, the processor's chat template
    with ``add_generation_prompt=True``, then ``processor(text=..., images=..., padding=True,
    return_tensors="pt")`` with one image list per prompt. As in TRL, the image token is
    suppressed during generation (a generated image placeholder has no image features).
    Generation runs under ``torch.no_grad()`` with ``use_cache=True`` passed to ``generate`` (a
    training config may have turned the KV cache off for gradient checkpointing; nothing is
    changed on the model), in eval mode (dropout off), and the model's train / eval mode is
    restored afterwards. Works on a plain model, a PEFT ``PeftModel`` (LoRA adapter) or a merged
    checkpoint, and on a model inside a trainer (the training hook, :mod:`cpr.evaluation.callback`).
    Generation is never collective (``synced_gpus=False``): under DeepSpeed ZeRO-3 transformers
    would otherwise make every rank step in lock-step (an ``all_reduce`` per token), while cpr
    generates on the main process only, with the full parameters gathered, so it would hang.
``vllm`` (:class:`VLLMGenerator`)
    vLLM's offline engine with ``temperature=0`` (greedy), LoRA adapters through
    ``LoRARequest``. Used by ``cpr eval`` when ``--backend auto`` finds vLLM importable and a
    CUDA GPU present (:func:`vllm_available`), for models given by path or hub id. This code
    path is kept but cannot be exercised by the test suite (no vLLM, no GPU there).

Resumability (:func:`generate_completions`): each finished batch is appended to the output
file (``cpr.io.append_jsonl``, fsync'ed), one line ``{"id", "completion", "num_tokens",
"finished"}`` per prompt, so a crash loses at most the batch in flight. On restart the ids
already in the file are skipped; a truncated last line (a write cut by a kill) is removed
before appending.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cpr.data.prompts import MODES, PromptTemplates, build_messages
from cpr.data.records import Record
from cpr.errors import ConfigError, InputError
from cpr.io import append_jsonl, atomic_write_text, read_jsonl

logger = logging.getLogger("cpr.evaluation")

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_NEW_TOKENS",
    "Generated",
    "GenerationSettings",
    "Generator",
    "MessagesFn",
    "TransformersGenerator",
    "VLLMGenerator",
    "generate_completions",
    "images_of",
    "load_model_for_eval",
    "read_completions",
    "repair_truncated_tail",
    "resolve_model_and_adapter",
    "standard_messages",
    "vllm_available",
]

DEFAULT_MAX_NEW_TOKENS = 256
"""Completion budget of the paper's scripts (docs/method.md section 6: max completion 256 tokens)."""

BACKENDS: tuple[str, ...] = ("auto", "transformers", "vllm")


@dataclass(frozen=True)
class GenerationSettings:
    """How completions are generated.

    Attributes:
        max_new_tokens: new-token budget per completion (default 256).
        batch_size: prompts per ``generate`` call (transformers) or per vLLM request chunk;
            also the unit of resumability (a batch is written when it finishes).
        prompt_mode: ``"eval"`` (CRYSTAL evaluation prompt) or ``"train"`` (training prompt).
        backend: ``"auto"`` (vLLM when :func:`vllm_available` and the model is given by name
            or path, else transformers), ``"transformers"`` or ``"vllm"``.
        progress: show a tqdm progress bar.

    Raises:
        ConfigError: a non-positive budget or batch size, an unknown mode or backend.
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = 8
    prompt_mode: str = "eval"
    backend: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if self.prompt_mode not in MODES:
            raise ConfigError(f"must be one of {', '.join(MODES)}, got {self.prompt_mode!r}", field="prompt_mode")
        if self.backend not in BACKENDS:
            raise ConfigError(f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}", field="backend")


@dataclass(frozen=True)
class Generated:
    """One generated completion.

    Attributes:
        text: the decoded completion (special tokens removed, nothing after the first EOS).
        num_tokens: completion tokens up to and including the first EOS token.
        finished: ``True`` when an EOS token ended it, ``False`` when the budget ran out.
    """

    text: str
    num_tokens: int
    finished: bool


class Generator(Protocol):
    """Anything that turns a batch of conversational prompts into completions, in order."""

    def __call__(self, batch: Sequence[list[dict[str, Any]]]) -> list[Generated]: ...


MessagesFn = Callable[[Record], list[dict[str, Any]]]
"""Builds the conversational prompt of a record, image blocks holding PIL images."""


def standard_messages(templates: PromptTemplates, prompt_mode: str) -> MessagesFn:
    """The CRYSTAL-format prompt builder: :func:`cpr.data.prompts.build_messages` with images."""

    def build(record: Record) -> list[dict[str, Any]]:
        return build_messages(record, templates, mode=prompt_mode, include_images=True)

    return build


def images_of(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The ``"image"`` payloads of a conversation's image blocks, in order (as TRL collects them).

    Raises:
        ValueError: an image block without an ``"image"`` payload (a bare placeholder).
    """
    images = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") == "image":
                if block.get("image") is None:
                    raise ValueError("an image block has no 'image' payload; build messages with include_images=True")
                images.append(block["image"])
    return images


# --------------------------------------------------------------------------- transformers


def _eos_ids(model: Any, processor: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = processor.tokenizer.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class TransformersGenerator:
    """Greedy batched generation with ``model.generate`` (see the module docstring).

    Args:
        model: a transformers vision-language model, a ``PeftModel`` around one, or the
            unwrapped model of a trainer.
        processor: its processor (tokenizer padding side ``"left"``, a pad token).
        max_new_tokens: new-token budget.

    Attributes:
        calls: number of ``generate`` calls made (one per batch).
    """

    def __init__(self, model: Any, processor: Any, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> None:
        if processor.tokenizer.padding_side != "left":
            raise ConfigError(
                "batched generation needs a left-padding tokenizer (padding_side='left'); "
                "load the processor with cpr.models.load_model_and_processor",
                field="processor",
            )
        self.model = model
        self.processor = processor
        self.max_new_tokens = max_new_tokens
        self.eos_ids = _eos_ids(model, processor)
        self.calls = 0

    def _inputs(self, batch: Sequence[list[dict[str, Any]]]) -> Any:
        texts = [
            self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            for messages in batch
        ]
        images = [images_of(messages) for messages in batch]
        kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
        if any(images):
            kwargs["images"] = images
        return self.processor(**kwargs)

    def __call__(self, batch: Sequence[list[dict[str, Any]]]) -> list[Generated]:
        """Generate one completion per conversation of ``batch`` (greedy)."""
        import torch

        if not batch:
            return []
        model = self.model
        param = next(model.parameters())
        inputs = self._inputs(batch).to(device=param.device, dtype=model.dtype)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": False,
            "temperature": None,
            "top_p": None,
            "top_k": None,
            "use_cache": True,
            "pad_token_id": self.processor.tokenizer.pad_token_id,
            "synced_gpus": False,  # never collective (module docstring)
        }
        image_token_id = getattr(model.config, "image_token_id", None)
        if image_token_id is not None:
            gen_kwargs["suppress_tokens"] = [int(image_token_id)]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(**inputs, **gen_kwargs)
        finally:
            if was_training:
                model.train()
        self.calls += 1
        completion_ids = out[:, inputs["input_ids"].shape[1]:].cpu()
        results = []
        for row in completion_ids.tolist():
            end = next((k for k, tok in enumerate(row) if tok in self.eos_ids), None)
            ids = row if end is None else row[: end + 1]
            text = self.processor.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(Generated(text=text, num_tokens=len(ids), finished=end is not None))
        return results


# --------------------------------------------------------------------------- vLLM


def vllm_available() -> bool:
    """True when the ``vllm`` package is importable and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


class VLLMGenerator:  # pragma: no cover - needs vLLM and a GPU
    """Greedy generation with vLLM's offline engine (not exercised by the CPU test suite).

    Args:
        model_path: model folder or hub id (vLLM loads the weights itself).
        processor: the model's processor (renders the chat template, as for transformers).
        adapter: optional LoRA adapter folder (served with ``LoRARequest``; its rank is read
            from ``adapter_config.json``).
        max_new_tokens: new-token budget.
        max_images_per_prompt: vLLM's ``limit_mm_per_prompt["image"]``.
        seed: engine seed (greedy decoding does not depend on it).
        mm_processor_kwargs: vLLM's processor arguments (``min_pixels`` / ``max_pixels`` for Qwen2.5-VL).

    Raises:
        ImportError: vLLM is not installed.
    """

    def __init__(
        self,
        model_path: str,
        processor: Any,
        *,
        adapter: str | Path | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_images_per_prompt: int = 1,
        seed: int = 0,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from vllm import LLM, SamplingParams

        kwargs: dict[str, Any] = {
            "model": model_path,
            "seed": seed,
            "limit_mm_per_prompt": {"image": max(1, max_images_per_prompt)},
        }
        if mm_processor_kwargs:
            kwargs["mm_processor_kwargs"] = mm_processor_kwargs
        self.lora_request = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            with open(Path(adapter) / "adapter_config.json", encoding="utf-8") as f:
                rank = int(json.load(f).get("r", 16))
            kwargs.update(enable_lora=True, max_lora_rank=max(rank, 8))
            self.lora_request = LoRARequest("adapter", 1, str(adapter))
        self.llm = LLM(**kwargs)
        self.params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        self.processor = processor
        self.calls = 0

    def __call__(self, batch: Sequence[list[dict[str, Any]]]) -> list[Generated]:
        requests = []
        for messages in batch:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            request: dict[str, Any] = {"prompt": text}
            images = images_of(messages)
            if images:
                request["multi_modal_data"] = {"image": images}
            requests.append(request)
        outputs = self.llm.generate(requests, self.params, lora_request=self.lora_request, use_tqdm=False)
        self.calls += 1
        return [
            Generated(
                text=o.outputs[0].text,
                num_tokens=len(o.outputs[0].token_ids),
                finished=o.outputs[0].finish_reason == "stop",
            )
            for o in outputs
        ]


# --------------------------------------------------------------------------- loading


def resolve_model_and_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """Base model and adapter for ``cpr eval --model M [--adapter A]``.

    A ``--model`` folder holding only a LoRA adapter (``adapter_config.json`` and no
    ``config.json``, e.g. a trainer's ``checkpoint-N``) is read as that adapter on its base
    model (``base_model_name_or_path`` of ``adapter_config.json``).

    Raises:
        InputError: ``--adapter`` is not a folder with ``adapter_config.json``, both ``--model``
            and ``--adapter`` name adapters, or an adapter config has no base model.
    """
    if adapter is not None:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise InputError("not a PEFT adapter folder (no adapter_config.json)", path=adapter, field="--adapter")
    path = Path(model).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        if adapter is not None:
            raise InputError(
                "--model is a LoRA adapter folder and --adapter is given too; pass the base model as --model",
                path=path,
                field="--model",
            )
        with open(path / "adapter_config.json", encoding="utf-8") as f:
            base = json.load(f).get("base_model_name_or_path")
        if not base:
            raise InputError(
                "adapter_config.json names no base model; pass it with --model and this folder with --adapter",
                path=path / "adapter_config.json",
                field="base_model_name_or_path",
            )
        return str(base), str(path)
    return model, adapter


def load_model_for_eval(
    model: str,
    adapter: str | None = None,
    *,
    device: str | None = None,
    dtype: str = "auto",
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    allow_base_mismatch: bool = False,
) -> tuple[Any, Any]:
    """Load a model (plus an optional LoRA adapter) and its processor for generation.

    Args:
        model: a base model or merged checkpoint (folder or hub id), or an
            adapter folder (see :func:`resolve_model_and_adapter`).
        adapter: a LoRA adapter folder, loaded with ``peft.PeftModel.from_pretrained`` (not
            merged, so the evaluated weights are exactly the trained ones).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; ``None``: CUDA if available, else CPU.
        dtype: see :func:`cpr.models.resolve_dtype`.
        min_pixels, max_pixels: the processor's image size limits (:func:`cpr.models.apply_pixel_limits`).
        allow_base_mismatch: put the adapter on ``model`` even if it was trained on another base
            (:func:`cpr.models.check_adapter_base` then only warns).

    Returns:
        ``(model, processor)`` in eval mode, gradient checkpointing off.

    Raises:
        ModelNotAvailableError / InputError: see :func:`cpr.models.load_model_and_processor`
            and :func:`resolve_model_and_adapter`.
        ConfigError: the adapter was trained on another base model (field ``--adapter``).
    """
    import torch

    from cpr.models import check_adapter_base, load_model_and_processor, resolve_model_path

    base, adapter = resolve_model_and_adapter(model, adapter)
    path = resolve_model_path(base)
    if adapter is not None:  # before the base loads
        check_adapter_base(adapter, path, allow_mismatch=allow_base_mismatch, field="--adapter")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    net, processor = load_model_and_processor(
        path, dtype=dtype, device=device, gradient_checkpointing=False, min_pixels=min_pixels, max_pixels=max_pixels
    )
    if adapter is not None:
        from peft import PeftModel

        net = PeftModel.from_pretrained(net, adapter, is_trainable=False)
        net.to(device)
    net.eval()
    return net, processor


# --------------------------------------------------------------------------- resumable loop


def repair_truncated_tail(path: str | Path) -> bool:
    """Drop a last line without a trailing newline (what a killed writer leaves). Atomic.

    Returns:
        ``True`` when the file was rewritten.
    """
    p = Path(path)
    data = p.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    keep = data[: data.rfind(b"\n") + 1]
    atomic_write_text(p, keep.decode("utf-8"))
    logger.warning("%s: dropped a truncated last line (%d bytes)", p, len(data) - len(keep))
    return True


def read_completions(path: str | Path) -> dict[str, dict[str, Any]]:
    """Rows of a completions file by id, tolerating a truncated last line.

    Raises:
        InputError: a line that is not an object with a string ``id`` and ``completion``, or a
            duplicate id (file and line named).
    """
    rows: dict[str, dict[str, Any]] = {}
    for line, obj in read_jsonl(path, skip_truncated_tail=True):
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
        rid, text = obj.get("id"), obj.get("completion")
        if not isinstance(rid, str):
            raise InputError("missing or not a string", path=path, line=line, field="id")
        if not isinstance(text, str):
            raise InputError("missing or not a string", path=path, line=line, record_id=rid, field="completion")
        if rid in rows:
            raise InputError("duplicate id", path=path, line=line, record_id=rid, field="id")
        rows[rid] = obj
    return rows


def _chunks(items: Sequence[Record], size: int) -> Iterator[Sequence[Record]]:
    for start in range(0, len(items), size):
        yield items[start: start + size]


def generate_completions(
    generator: Generator,
    records: Sequence[Record],
    messages_fn: MessagesFn,
    *,
    batch_size: int = 8,
    output_path: str | Path | None = None,
    progress: bool = True,
    description: str = "generating",
) -> dict[str, str]:
    """Generate a completion for every record, appending each finished batch to ``output_path``.

    Args:
        generator: a :class:`TransformersGenerator`, :class:`VLLMGenerator` or any callable
            batch -> list of :class:`Generated`.
        records: the records (unique ids), in the order batches are formed.
        messages_fn: record -> conversational prompt with images (see :func:`standard_messages`).
        batch_size: prompts per generator call.
        output_path: JSON-lines file to resume from and append to; ``None`` keeps nothing.
        progress: show a tqdm bar (counts records, starting at those already done).
        description: the bar's label.

    Returns:
        id -> completion text for every record (those read back from the file included).

    Raises:
        ValueError: duplicate record ids, or a generator returning the wrong number of results.
        InputError: a malformed completions file (see :func:`read_completions`).
    """
    from tqdm.auto import tqdm

    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"duplicate record id {dup!r}")
    done: dict[str, str] = {}
    if output_path is not None and Path(output_path).is_file():
        repair_truncated_tail(output_path)
        done = {rid: row["completion"] for rid, row in read_completions(output_path).items()}
    todo = [r for r in records if r.id not in done]
    results = {rid: done[rid] for rid in ids if rid in done}
    if results:
        logger.info("resuming: %d of %d completions already in %s", len(results), len(ids), output_path)
    bar = tqdm(total=len(ids), initial=len(results), desc=description, disable=not progress, unit="sample")
    try:
        for batch in _chunks(todo, batch_size):
            outputs = generator([messages_fn(r) for r in batch])
            if len(outputs) != len(batch):
                raise ValueError(f"generator returned {len(outputs)} completions for {len(batch)} prompts")
            for record, gen in zip(batch, outputs, strict=True):
                results[record.id] = gen.text
                if output_path is not None:
                    append_jsonl(
                        output_path,
                        {
                            "id": record.id,
                            "completion": gen.text,
                            "num_tokens": gen.num_tokens,
                            "finished": gen.finished,
                        },
                    )
            bar.update(len(batch))
    finally:
        bar.close()
    return {rid: results[rid] for rid in ids}
