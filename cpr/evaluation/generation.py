"""Batched generation of completions, resumable through a JSON-lines file.

Protocol (CRYSTAL paper evaluation): greedy decoding of at most ``max_new_tokens`` (default 256, the paper's
budget, docs/method.md section 6); :class:`DecodingSettings` ``sampled`` adds seeded sampled completions.
Prompts are rendered as TRL's ``GRPOTrainer`` renders them (the processor's ``apply_chat_template``).
Backends: :class:`TransformersGenerator` and :class:`VLLMGenerator` (vLLM's offline engine, LoRA through
``LoRARequest``; needs a CUDA GPU, so the CPU test suite cannot exercise it).

Resumability (:func:`generate_completions`): each finished batch is appended (fsync'ed), one ``{"id",
"completion", "num_tokens", "finished"}`` line per prompt; a rerun skips the ids there, and a cut line is dropped.
Sharding over processes: :func:`sharded_rounds`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpr.data.prompts import MODES
from cpr.data.records import Record
from cpr.errors import ConfigError, InputError, check_choice

__all__ = ["BACKENDS", "DECODING_MODES", "DecodingSettings", "Generated", "GenerationSettings", "TransformersGenerator", "VLLMGenerator",
           "batch_seed", "generate_completions", "load_model_for_eval", "resolve_model_and_adapter", "vllm_available"]

DEFAULT_MAX_NEW_TOKENS = 256
BACKENDS: tuple[str, ...] = ("auto", "transformers", "vllm")
DECODING_MODES: tuple[str, ...] = ("greedy", "sampled")
Batch = Sequence[list[dict[str, Any]]]


@dataclass(frozen=True)
class DecodingSettings:
    """Evaluation decoding: ``greedy`` (the paper's protocol) or ``sampled``, which also draws ``samples``
    completions per prompt at ``temperature`` with nucleus ``top_p`` (no top-k cut, as TRL's GRPO generation),
    torch's generator seeded per batch from ``seed`` (:func:`batch_seed`). Greedy ignores the sampling fields.
    Raises ``ConfigError`` (the field named) for an unknown mode, a temperature that is not a positive finite
    number, ``top_p`` outside (0, 1], ``samples < 1`` or ``seed < 0``."""

    mode: str = "greedy"
    temperature: float = 1.0
    top_p: float = 1.0
    samples: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice(self.mode, DECODING_MODES, "mode")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"must be a positive number, got {value!r}", field=name)
        if self.top_p > 1:
            raise ConfigError(f"must be in (0, 1], got {self.top_p!r}", field="top_p")
        for name, low in (("samples", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"must be an integer >= {low}, got {value!r}", field=name)

    @property
    def sampled(self) -> bool:
        """True for ``sampled`` decoding."""
        return self.mode == "sampled"


def batch_seed(seed: int, first_id: str) -> int:
    """The torch seed of a sampled batch: the first 8 bytes of SHA-256 of ``"<seed>:<first record id>"``
    (below 2**63), so a batch draws the same samples whether or not a run was resumed before it."""
    digest = hashlib.sha256(f"{seed}:{first_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class GenerationSettings:
    """How completions are generated: the new-token budget, prompts per generation call (also the unit
    of resumability), ``prompt_mode`` ``eval`` (CRYSTAL evaluation prompt) or ``train``, ``backend``
    (``auto``: vLLM when :func:`vllm_available`), a progress bar, and the ``decoding``
    (:class:`DecodingSettings`, default greedy). Raises ``ConfigError`` for a non-positive budget or batch
    size, an unknown mode or backend."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = 8
    prompt_mode: str = "eval"
    backend: str = "auto"
    progress: bool = True
    decoding: DecodingSettings = DecodingSettings()

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        for name, known in (("prompt_mode", MODES), ("backend", BACKENDS)):
            check_choice(getattr(self, name), known, name)
        if not isinstance(self.decoding, DecodingSettings):
            raise ConfigError(f"must be a DecodingSettings, got {type(self.decoding).__name__}", field="decoding")


@dataclass(frozen=True)
class Generated:
    """One completion: its text (special tokens removed, nothing after the first EOS), its token count
    up to and including the first EOS, and whether an EOS ended it (else the budget ran out)."""

    text: str
    num_tokens: int
    finished: bool


class TransformersGenerator:
    """Batched generation with ``model.generate``: greedy (``generator(batch)``) or sampled (:meth:`sample`),
    in eval mode under ``torch.no_grad()`` with ``use_cache=True`` (the model's mode restored).

    Args:
        model: a transformers vision-language model, a ``PeftModel`` around one, or a trainer's unwrapped model.
        processor: its processor (tokenizer padding side ``"left"``, a pad token).
        synced_gpus: ``generate``'s lock-step decoding (ZeRO-3 with several processes, as TRL's generation);
            every process must then call it equally often.
        repetition_penalty: ``generate``'s ``repetition_penalty``; ``None``: the model's ``generation_config``
            decides (a model folder's may set one, e.g. 1.05).

    Raises ``ConfigError`` when the tokenizer does not pad on the left."""

    def __init__(self, model: Any, processor: Any, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *,
                 synced_gpus: bool = False, repetition_penalty: float | None = None) -> None:
        if processor.tokenizer.padding_side != "left":
            raise ConfigError("batched generation needs a left-padding tokenizer (padding_side='left'); load the "
                              "processor with cpr.models.load_model_and_processor", field="processor")
        self.model, self.processor, self.max_new_tokens = model, processor, max_new_tokens
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = processor.tokenizer.eos_token_id if eos is None else eos
        self.eos_ids = set() if eos is None else {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
        self.synced_gpus, self.repetition_penalty, self.calls = synced_gpus, repetition_penalty, 0

    def _inputs(self, batch: Batch) -> Any:
        return self.processor.apply_chat_template(list(batch), add_generation_prompt=True, tokenize=True,
                                                  return_dict=True, return_tensors="pt",
                                                  processor_kwargs={"padding": True})

    def __call__(self, batch: Batch) -> list[Generated]:
        """One greedy completion per conversation of ``batch``, in order."""
        return self._generate(batch, do_sample=False, temperature=None, top_p=None, top_k=None)

    def sample(self, batch: Batch, decoding: DecodingSettings, seed: int) -> list[list[Generated]]:
        """``decoding.samples`` sampled completions per conversation of ``batch`` (``num_return_sequences``),
        in order, drawn with torch's generators seeded with ``seed`` inside ``torch.random.fork_rng``, so
        the caller's random state (e.g. training's) is left as it was."""
        import torch

        k = decoding.samples
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            flat = self._generate(batch, do_sample=True, temperature=float(decoding.temperature),
                                  top_p=float(decoding.top_p), top_k=0, num_return_sequences=k)
        return [flat[i * k: (i + 1) * k] for i in range(len(batch))]

    def _generate(self, batch: Batch, **decoding: Any) -> list[Generated]:
        """``model.generate`` on ``batch`` with the ``decoding`` kwargs; completions in output order."""
        import torch

        if not batch:
            return []
        model = self.model
        inputs = self._inputs(batch).to(device=next(model.parameters()).device, dtype=model.dtype)
        image_token_id = getattr(model.config, "image_token_id", None)
        if self.repetition_penalty is not None:
            decoding = {**decoding, "repetition_penalty": float(self.repetition_penalty)}
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(
                    **inputs, max_new_tokens=self.max_new_tokens, **decoding, use_cache=True,
                    pad_token_id=self.processor.tokenizer.pad_token_id, synced_gpus=self.synced_gpus,
                    suppress_tokens=None if image_token_id is None else [int(image_token_id)])
        finally:
            model.train(was_training)
        self.calls += 1
        results = []
        for row in out[:, inputs["input_ids"].shape[1]:].cpu().tolist():
            end = next((k for k, tok in enumerate(row) if tok in self.eos_ids), None)
            ids = row if end is None else row[: end + 1]
            text = self.processor.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(Generated(text=text, num_tokens=len(ids), finished=end is not None))
        return results


def vllm_available() -> bool:
    """True when the ``vllm`` package is importable and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


class VLLMGenerator:  # pragma: no cover - needs vLLM and a GPU
    """Greedy generation (``temperature=0``; :meth:`sample`: ``n`` sampled completions per prompt, request
    ``i`` of a batch seeded ``seed + i``) with vLLM's offline engine on ``model_path`` (vLLM loads the
    weights), the prompt rendered by ``processor``, an optional LoRA ``adapter`` folder, and vLLM's
    ``limit_mm_per_prompt`` and ``mm_processor_kwargs`` (``min_pixels`` / ``max_pixels``). Raises
    ``ImportError`` when vLLM is not installed."""

    def __init__(self, model_path: str, processor: Any, *, adapter: str | Path | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, max_images_per_prompt: int = 1,
                 mm_processor_kwargs: dict[str, Any] | None = None) -> None:
        from vllm import LLM, SamplingParams

        kwargs: dict[str, Any] = {"model": model_path, "seed": 0,
                                  "limit_mm_per_prompt": {"image": max(1, max_images_per_prompt)}}
        if mm_processor_kwargs:
            kwargs["mm_processor_kwargs"] = mm_processor_kwargs
        self.lora_request = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            rank = int(json.loads((Path(adapter) / "adapter_config.json").read_text(encoding="utf-8")).get("r", 16))
            kwargs.update(enable_lora=True, max_lora_rank=max(rank, 8))
            self.lora_request = LoRARequest("adapter", 1, str(adapter))
        self.llm, self.processor, self.calls = LLM(**kwargs), processor, 0
        self.params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)

    def _requests(self, batch: Batch) -> list[dict[str, Any]]:
        requests = []
        for messages in batch:
            request: dict[str, Any] = {
                "prompt": self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)}
            images = [b["image"] for m in messages if isinstance(m["content"], list) for b in m["content"]
                      if b.get("type") == "image"]
            if images:
                request["multi_modal_data"] = {"image": images}
            requests.append(request)
        return requests

    def _generate(self, batch: Batch, params: Any) -> list[list[Generated]]:
        outputs = self.llm.generate(self._requests(batch), params, lora_request=self.lora_request, use_tqdm=False)
        self.calls += 1
        return [[Generated(c.text, len(c.token_ids), c.finish_reason == "stop") for c in o.outputs] for o in outputs]

    def __call__(self, batch: Batch) -> list[Generated]:
        return [completions[0] for completions in self._generate(batch, self.params)]

    def sample(self, batch: Batch, decoding: DecodingSettings, seed: int) -> list[list[Generated]]:
        from vllm import SamplingParams

        return self._generate(batch, [SamplingParams(n=decoding.samples, temperature=decoding.temperature,
                                                     top_p=decoding.top_p, max_tokens=self.params.max_tokens,
                                                     seed=(seed + i) % 2**63) for i in range(len(batch))])


def resolve_model_and_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """Base model and adapter of ``cpr eval --model M [--adapter A]``: a ``--model`` folder holding only a
    LoRA adapter (``adapter_config.json``, no ``config.json``, e.g. a ``checkpoint-N``) is that adapter
    on its base model (``base_model_name_or_path``). Raises ``InputError`` when ``--adapter`` has no
    ``adapter_config.json``, both flags name adapters, or the adapter config names no base model."""
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise InputError("not a PEFT adapter folder (no adapter_config.json)", path=adapter, field="--adapter")
    path = Path(model).expanduser()
    if not (path.is_dir() and (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()):
        return model, adapter
    if adapter is not None:
        raise InputError("--model is a LoRA adapter folder and --adapter is given too; pass the base model as "
                         "--model", path=path, field="--model")
    base = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise InputError("adapter_config.json names no base model; pass it with --model and this folder with "
                         "--adapter", path=path / "adapter_config.json", field="base_model_name_or_path")
    return str(base), str(path)


def checked_model_path(model: str, adapter: str | None, allow_base_mismatch: bool = False) -> tuple[str, str | None]:
    """``(resolved base model path, adapter)`` (:func:`resolve_model_and_adapter`), the adapter checked
    against the base (:func:`cpr.models.check_adapter_base`, field ``--adapter``) before anything loads.
    Raises ``ConfigError`` for an adapter trained on another base model (unless ``allow_base_mismatch``)."""
    from cpr.models import check_adapter_base, resolve_model_path

    base, adapter = resolve_model_and_adapter(model, adapter)
    path = resolve_model_path(base)
    if adapter is not None:
        check_adapter_base(adapter, path, allow_mismatch=allow_base_mismatch, field="--adapter")
    return path, adapter


def load_model_for_eval(model: str, adapter: str | None = None, *, device: str | None = None,
                        dtype: str = "auto", min_pixels: int | None = None, max_pixels: int | None = None,
                        allow_base_mismatch: bool = False, attn_implementation: str | None = None,
                        trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Load a model (a base or merged checkpoint, or an adapter folder) with an optional LoRA adapter
    (``peft.PeftModel``, not merged) and its processor (image size limits ``min_pixels`` /
    ``max_pixels``), in eval mode, gradient checkpointing off, on ``device`` (default CUDA if available);
    ``attn_implementation`` and ``trust_remote_code`` go to ``from_pretrained``. Raises
    ``ModelNotAvailableError``, ``InputError``, ``ConfigError``: see
    :func:`cpr.models.load_model_and_processor` and :func:`checked_model_path`."""
    import torch

    from cpr.models import load_model_and_processor

    path, adapter = checked_model_path(model, adapter, allow_base_mismatch)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    net, processor = load_model_and_processor(path, dtype=dtype, device=device, gradient_checkpointing=False,
                                              min_pixels=min_pixels, max_pixels=max_pixels,
                                              attn_implementation=attn_implementation,
                                              trust_remote_code=trust_remote_code)
    if adapter is not None:
        from peft import PeftModel

        net = PeftModel.from_pretrained(net, adapter, is_trainable=False).to(device)
    return net.eval(), processor


def generate_completions(generator: Callable[[Batch], list[Generated]], records: Sequence[Record],
                         messages_fn: Callable[[Record], list[dict[str, Any]]], *, batch_size: int = 8,
                         output_path: str | Path | None = None, progress: bool = True,
                         description: str = "generating", shard: Any = None) -> dict[str, str]:
    """Generate a completion for every record, appending each finished batch to ``output_path``.

    Args:
        generator: batch of conversations -> list of :class:`Generated`, in order.
        records: the records (unique ids), in the order batches are formed.
        messages_fn: record -> conversational prompt with its images.
        output_path: JSON-lines file to resume from and append to; ``None`` keeps nothing.
        shard: :func:`cpr.distributed.process_state` when every process of a group calls this alike: each
            generates its share (:func:`sharded_rounds`), the main process writes ``output_path``.

    Returns:
        id -> completion for every record, those read back from the file included (on every process).

    Raises:
        ValueError: duplicate record ids, or a generator returning the wrong number of completions.
        InputError: a malformed completions file (:func:`cpr.scoring.load_predictions`).
        RuntimeError: with ``shard``, generation failed on another process (its error named).
    """
    from cpr.scoring import load_predictions

    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate record id {next(i for i in ids if ids.count(i) > 1)!r}")
    exists = output_path is not None and Path(output_path).is_file()
    done = load_predictions(output_path, skip_truncated_tail=True)[0] if exists else {}
    results = {rid: done[rid] for rid in ids if rid in done}
    todo = [r for r in records if r.id not in done]
    batches = [todo[start: start + batch_size] for start in range(0, len(todo), batch_size)]

    def generate(batch: list[Record]) -> list[dict[str, Any]]:
        outputs = generator([messages_fn(r) for r in batch])
        if len(outputs) != len(batch):
            raise ValueError(f"generator returned {len(outputs)} completions for {len(batch)} prompts")
        return [{"id": r.id, "completion": g.text, "num_tokens": g.num_tokens, "finished": g.finished}
                for r, g in zip(batch, outputs, strict=True)]

    for rows in sharded_rounds(batches, shard, generate, output_path, total=len(ids), initial=len(results),
                               description=description, progress=progress):
        results.update((row["id"], row["completion"]) for row in rows)
    return {rid: results[rid] for rid in ids}


def sharded_rounds(batches: Sequence[Sequence[Record]], shard: Any,
                   rows_of: Callable[[Sequence[Record]], list[dict[str, Any]]], output_path: str | Path | None, *,
                   total: int, initial: int, description: str, progress: bool) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``batches``, round by round: in round ``r`` process ``k`` of ``shard`` (``None``: one
    process) computes ``rows_of(batches[r * N + k])``; a process past the last batch runs a padding batch
    (the first record of ``batches[0]``) and drops its rows, so every process calls ``rows_of`` equally often
    (what ZeRO-3's lock-step generation needs). Each yield is the round's rows of every process, in process
    order (:func:`gather_checked`), on every process, after the main process appended them to ``output_path``
    (``None``: kept nowhere). The main process shows a progress bar of ``total`` records (``initial`` done before).
    Raises what ``rows_of`` raises (on one process), or ``RuntimeError`` naming the process where it failed.
    """
    from tqdm.auto import tqdm

    from cpr.io import append_jsonl_many

    rank, world = (0, 1) if shard is None else (shard.process_index, shard.num_processes)
    main = shard is None or shard.is_main_process
    with tqdm(total=total, initial=initial, desc=description, disable=not (progress and main), unit="sample") as bar:
        for first in range(0, len(batches), world):
            mine = first + rank
            padding = mine >= len(batches)
            rows, error = [], None
            try:
                rows = rows_of(batches[0][:1] if padding else batches[mine])
            except Exception as e:
                if world == 1:
                    raise
                error = e
            rows = [] if padding else rows
            rows = [row for part in gather_checked(rows, error) for row in part] if world > 1 else rows
            if output_path is not None and main:
                append_jsonl_many(output_path, rows)
            yield rows
            bar.update(len({row["id"] for row in rows}))


def gather_checked(value: Any, error: BaseException | None, what: str = "generation", at: str = "") -> list[Any]:
    """Every process's ``value``, in process order, on every process; raises on every process when one failed:
    its own ``error`` where it failed, else ``RuntimeError("<what> failed on process <k><at>: <its error>")``."""
    from accelerate.utils import gather_object

    gathered = gather_object([(value, None if error is None else f"{type(error).__name__}: {error}")])
    if error is not None:
        raise error
    failed = [(k, e) for k, (_, e) in enumerate(gathered) if e is not None]
    if failed:
        k, e = failed[0]
        raise RuntimeError(f"{what} failed on process {k}{at}: {e}")
    return [v for v, _ in gathered]
