"""Load a vision-language model and its processor for GRPO, and build its LoRA configuration.

:func:`load_model_and_processor` loads any model transformers' auto classes know
(``AutoModelForImageTextToText`` + ``AutoProcessor``) from a local folder or a hub id, with the
processor padding on the left (TRL's GRPOTrainer pads prompts on the left) and a pad token, the
image-size limits of :func:`apply_pixel_limits`, and the LoRA targets of
:func:`lora_target_modules`. The paper models' ``config.json`` files ship in ``cpr/models/configs``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError, InputError, ModelNotAvailableError

logger = logging.getLogger("cpr.models")

#: Model families cpr knows how to configure (pixel limits, LoRA targets).
FAMILIES = ("qwen2_5_vl", "internvl")

_LM = r"(?:.*\.)?language_model\.layers\.\d+\.(?:self_attn\.(?:q|k|v|o)_proj|mlp\.(?:gate|up|down)_proj)"
_VISION = {
    "qwen2_5_vl": (r"(?:.*\.)?visual\.blocks\.\d+\.(?:attn\.(?:qkv|proj)|mlp\.(?:gate|up|down)_proj)"
                   r"|(?:.*\.)?visual\.merger\.mlp\.(?:0|2)"),
    "internvl": (r"(?:.*\.)?vision_tower\.encoder\.layer\.\d+\."
                 r"(?:attention\.(?:q_proj|k_proj|v_proj|projection_layer)|mlp\.fc[12])"
                 r"|(?:.*\.)?multi_modal_projector\.linear_[12]"),
}
_PATH_HINT = ("Pass an existing model folder (with config.json, the weights and the processor files) or a hub id "
              "such as 'Qwen/Qwen2.5-VL-3B-Instruct'.")


def hub_hint(name: str, key: str = "the model path") -> str:
    """How to supply a model the hub cannot give here (one sentence, no final period)."""
    return (f"download it where the hub is reachable (hf download {name} --local-dir DIR) and set {key} to DIR, "
            "or point HF_HOME at a cache that holds it")


def _not_available(name: str, what: str, err: BaseException) -> ModelNotAvailableError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"} else ""
    return ModelNotAvailableError(f"{what} {name!r} is not available: it is not a local folder and could not "
                                  f"be fetched from the Hugging Face Hub{offline} ({type(err).__name__}: "
                                  f"{first[:300]}); {hub_hint(name)}")


def resolve_model_path(model_name_or_path: str | Path) -> str:
    """What ``from_pretrained`` should load: an existing folder as is, anything else as a hub id.

    Raises ``ModelNotAvailableError`` for a path-like name (``./x``, ``/x``, ``~/x``, ``a/b/c``) that is
    not an existing folder.
    """
    name = str(model_name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotAvailableError(f"model {name!r} is not available: not an existing model folder. {_PATH_HINT}")
    return name


def detect_family(model_name_or_path: str | Path) -> str:
    """Model family (``model_type``: ``"qwen2_5_vl"``, ``"internvl"``, ...) of a folder or hub id.

    A folder gives its ``config.json``'s ``model_type``; a hub id is matched by name (``Qwen2.5-VL``,
    ``InternVL...-HF``; other InternVL names are the remote-code format ``"internvl_chat"``, which cpr
    does not train), else its config is fetched with ``AutoConfig`` (hub cache or network).
    Raises ``ModelNotAvailableError`` when no config is found, ``InputError`` for a ``config.json``
    without ``model_type``.
    """
    name = str(model_name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelNotAvailableError(f"model folder {name!r} has no config.json. {_PATH_HINT}")
        model_type = json.loads(cfg_file.read_text(encoding="utf-8")).get("model_type")
        if not model_type:
            raise InputError("config.json has no model_type", path=cfg_file, field="model_type")
        return model_type
    lowered = name.lower()
    if re.search(r"qwen2[._]5[-_]vl", lowered):
        return "qwen2_5_vl"
    if "internvl" in lowered:
        return "internvl" if lowered.endswith("-hf") else "internvl_chat"
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name).model_type
    except (OSError, ValueError) as err:
        raise _not_available(name, "model", err) from None


def resolve_dtype(dtype: str, device: str) -> Any:
    """``torch.dtype`` of a dtype name on a device type: ``"auto"`` is bfloat16 on a CUDA GPU that
    supports it (else float16) and float32 on CPU; also bfloat16/bf16, float16/fp16/half,
    float32/fp32/float. Raises ``ConfigError`` (field ``dtype``) for other names."""
    import torch

    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in names:
        raise ConfigError(f"unknown dtype {dtype!r}; expected auto or one of {', '.join(names)}", field="dtype")
    return names[dtype]


def apply_pixel_limits(processor: Any, family: str, min_pixels: int | None, max_pixels: int | None) -> None:
    """Set the image-size limits of a loaded processor in place (``None`` keeps the current value):
    Qwen2.5-VL's pixel range ``image_processor.size`` (transformers 5), InternVL's tile counts
    ``max_patches = max(1, max_pixels // tile_area)``, ``min_patches = max(1, ceil(min_pixels / tile_area))``.
    Raises ``ConfigError`` for non-positive limits, ``min_pixels > max_pixels``, or another family.
    """
    if min_pixels is None and max_pixels is None:
        return
    for field, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"must be a positive integer, got {value!r}", field=field)
    image_processor = processor.image_processor
    size = dict(image_processor.size)
    if family == "qwen2_5_vl":
        size["shortest_edge"] = min_pixels or size["shortest_edge"]
        size["longest_edge"] = max_pixels or size["longest_edge"]
        if size["shortest_edge"] > size["longest_edge"]:
            raise ConfigError(f"min_pixels ({size['shortest_edge']}) is larger than max_pixels ({size['longest_edge']})",
                              field="min_pixels")
        image_processor.size = size
    elif family == "internvl":
        if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
            raise ConfigError(f"min_pixels ({min_pixels}) is larger than max_pixels ({max_pixels})", field="min_pixels")
        tile_area = int(size["height"]) * int(size["width"])
        if max_pixels is not None:
            image_processor.max_patches = max(1, max_pixels // tile_area)
        if min_pixels is not None:
            image_processor.min_patches = min(max(1, math.ceil(min_pixels / tile_area)), image_processor.max_patches)
    else:
        raise ConfigError(
            f"pixel limits are not supported for model family {family!r} (known: {', '.join(FAMILIES)})",
            field="max_pixels" if max_pixels is not None else "min_pixels",
        )


def load_model_and_processor(
    model_name_or_path: str | Path, *, dtype: str = "auto", device: str | None = None,
    gradient_checkpointing: bool | None = None, attn_implementation: str | None = None, min_pixels: int | None = None,
    max_pixels: int | None = None, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Load ``(model, processor)`` (module docstring) from a local folder or a hub id, the model in eval mode.

    ``device`` ``None`` leaves the model on CPU for a trainer to place; the ``dtype`` (:func:`resolve_dtype`)
    and ``gradient_checkpointing`` (non-reentrant) defaults follow whether CUDA is available. The pad token
    is ``<|endoftext|>`` where the vocabulary has it, else eos, mirrored onto the model's configs.
    Raises ``ModelNotAvailableError`` when the model or processor is neither local nor downloadable,
    ``ConfigError`` for a bad dtype or pixel limit or a tokenizer without pad and eos tokens.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    name = str(model_name_or_path)
    path = resolve_model_path(name)
    family = detect_family(path)
    device_type = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, device_type), "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    except OSError as err:
        raise _not_available(name, "model", err) from None
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, padding_side="left")
    except OSError as err:
        raise _not_available(name, "processor of model", err) from None
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise ModelNotAvailableError(
            f"model {name!r} has no multimodal processor (got {type(processor).__name__}); cpr needs a processor "
            "with a tokenizer and an image processor (processor_config.json / preprocessor_config.json).")
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token
    if tokenizer.pad_token is None:
        raise ConfigError("the tokenizer has neither a pad token nor an eos token", field="model")
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    apply_pixel_limits(processor, family, min_pixels, max_pixels)
    if device is not None:
        model.to(device)
    if gradient_checkpointing is None:
        gradient_checkpointing = device_type.startswith("cuda")
    if gradient_checkpointing:
        # transformers 5.24 renamed gradient checkpointing to activation checkpointing (old names warn).
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model, processor


def lora_target_modules(family: str, *, include_vision: bool = False) -> str:
    """PEFT ``target_modules`` regex (PEFT ``re.fullmatch``-es it against full module names): the language
    model's decoder layers' attention and MLP projections, never a vision module of the same name (Qwen2.5-VL
    vision blocks have ``mlp.gate_proj``); ``include_vision=True`` adds the vision tower's linears and the
    projector (the patterns: ``_LM``, ``_VISION``).
    Raises ``ConfigError`` (field ``family``) for a family other than :data:`FAMILIES`.
    """
    if family not in FAMILIES:
        raise ConfigError(f"no LoRA targets for model family {family!r}; known: {', '.join(FAMILIES)}", field="family")
    return f"{_LM}|{_VISION[family]}" if include_vision else _LM


def build_lora_config(family: str, r: int = 16, alpha: int = 32, dropout: float = 0.05, include_vision: bool = False) -> Any:
    """``peft.LoraConfig`` for a model family: rank ``r``, ``lora_alpha`` ``alpha`` (scale ``alpha / r``),
    ``lora_dropout`` ``dropout``, :func:`lora_target_modules`, no bias, task type ``CAUSAL_LM``.
    Raises ``ConfigError`` for an unknown family, ``r < 1`` or dropout outside ``[0, 1)``."""
    from peft import LoraConfig

    if not isinstance(r, int) or r < 1:
        raise ConfigError(f"LoRA rank must be a positive integer, got {r!r}", field="lora.r")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"LoRA dropout must be in [0, 1), got {dropout!r}", field="lora.dropout")
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type="CAUSAL_LM",
                      target_modules=lora_target_modules(family, include_vision=include_vision))


def base_fingerprint(name_or_path: str | Path) -> str | None:
    """The first 16 hex digits of the SHA-256 of a model's ``config.json`` and tokenizer files, plus
    its ``*.safetensors`` when they total at most 64 MiB (small models built from one config differ in
    tokenizer or weights only). Read from a folder, or the Hugging Face cache for a hub id.
    Returns ``None`` when the model's ``config.json`` is not at hand."""
    folder = Path(str(name_or_path)).expanduser()
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(str(name_or_path), "config.json")
        except Exception:  # a name that is no repo id is simply not cached
            cached = None
        if not isinstance(cached, str):
            return None
        folder = Path(cached).parent
    if not (folder / "config.json").is_file():
        return None
    weights = sorted(folder.glob("*.safetensors"))
    small = sum(w.stat().st_size for w in weights) <= 64 * 2**20
    h = hashlib.sha256()
    for f in [folder / n for n in ("config.json", "tokenizer.json", "tokenizer_config.json")] + (weights if small else []):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def check_adapter_base(adapter: str | Path, base: str | Path | None = None, *, allow_mismatch: bool = False,
                       field: str = "adapter", override: str = "--allow-base-mismatch") -> str | None:
    """Refuse to put a LoRA adapter on another base model than the ``base_model_name_or_path`` its
    ``adapter_config.json`` records; every place that loads an adapter calls it. The two are the same when
    their :func:`base_fingerprint` agree or, where either is not at hand, when their names or resolved
    folders are equal or ``base`` is a Hugging Face cache snapshot of the recorded hub id. ``base`` ``None``
    only reads the recorded base; ``allow_mismatch`` warns instead of raising; ``field`` and ``override``
    (the settings that gave the adapter and that set ``allow_mismatch``) are named in the error.

    Returns the recorded base (``None`` when the adapter records none and ``base`` is given).
    Raises ``InputError`` without ``adapter_config.json`` or, ``base`` being ``None``, without a
    recorded base; ``ConfigError`` (field ``field``) when the bases differ, naming both.
    """
    config = Path(adapter) / "adapter_config.json"
    if not config.is_file():
        raise InputError("not a LoRA adapter folder (no adapter_config.json)", path=adapter)
    recorded = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    if base is None and not recorded:
        raise InputError("the adapter records no base model", path=config, field="base_model_name_or_path")
    if base is None or not recorded:
        return recorded
    mine, theirs = base_fingerprint(base), base_fingerprint(recorded)
    if mine is not None and theirs is not None:
        if mine == theirs:
            return recorded
        why = f"config, tokenizer or weights differ: fingerprint {theirs} vs {mine}"
    else:
        given = Path(str(base)).expanduser().resolve()
        if (str(recorded) == str(base) or Path(recorded).expanduser().resolve() == given
                or "models--" + str(recorded).replace("/", "--") in given.parts):
            return recorded
        why = "the names differ and the recorded base is not here to compare"
    message = (f"LoRA adapter {adapter} was trained on base model {recorded!r}, not on {str(base)!r} "
               f"({why}); load it on its own base, or set {override} if both are the same model (e.g. hub "
               "ids that differ only in revision)")
    if not allow_mismatch:
        raise ConfigError(message, field=field)
    logger.warning("%s: %s", override, message)
    return recorded


def check_adapter_weights(adapter: str | Path, *, field: str = "adapter") -> None:
    """Refuse a LoRA adapter whose weights (``adapter_model.safetensors`` in folder ``adapter``) do not load
    (truncated, not safetensors) or hold a non-finite value (NaN, Inf: a corrupt file or a diverged run, which
    would score as if it were a model). A folder without that file (PEFT's older ``.bin``) passes. Raises
    ``InputError`` naming the file, ``field`` (the setting that gave the adapter) and what is wrong: the
    loader's error, or how many values are non-finite and the first tensor holding one."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        return
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise InputError(f"the adapter's weights do not load ({e})", path=path, field=field) from None
    bad = {k: int((~torch.isfinite(v)).sum()) for k, v in tensors.items()
           if v.is_floating_point() and not bool(torch.isfinite(v).all())}
    if bad:
        first = next(iter(bad))
        raise InputError(f"{sum(bad.values())} non-finite weights (NaN or Inf) in {len(bad)} tensors, the first "
                         f"{first}: the file is damaged or its training diverged", path=path, field=field)
