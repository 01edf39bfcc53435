"""Load a vision-language model and its processor, and build its LoRA configuration.

One entry point, :func:`load_model_and_processor`, loads any model transformers' auto
classes know (``AutoModelForImageTextToText`` + ``AutoProcessor``) from a local folder, a hub
id or a ``tiny:<kind>`` name (a tiny model built locally, see :mod:`cpr.models.tiny`), and
prepares it for TRL's ``GRPOTrainer``:

* dtype ``"auto"``: bfloat16 on a GPU that supports it (float16 otherwise), float32 on CPU;
  gradient checkpointing on by default on GPU only (non-reentrant).
* processor padding side ``"left"`` (GRPOTrainer pads prompts on the left and generates
  after them) and a pad token (``<|endoftext|>`` for the Qwen tokenizers, else the eos token),
  mirrored onto ``model.config.get_text_config().pad_token_id`` and the generation config.
* image pixel limits: Qwen2.5-VL's image processor resizes each image so that its pixel
  count lies in ``[min_pixels, max_pixels]`` (``image_processor.size = {"shortest_edge":
  min_pixels, "longest_edge": max_pixels}`` in transformers 5; the ``min_pixels`` /
  ``max_pixels`` call arguments are deprecated there).  InternVL has no pixel range: it cuts
  each image into square tiles of the image processor's ``size`` (448 px for InternVL3.5) and
  emits ``image_seq_length`` tokens per tile; its equivalent is the tile count, so
  ``max_pixels`` sets ``max_patches = max(1, max_pixels // tile_area)`` and ``min_pixels``
  sets ``min_patches = max(1, ceil(min_pixels / tile_area))`` (an image cut into more than one
  tile also gets a thumbnail tile).  Other families: pixel limits raise ``ConfigError``.

LoRA: :func:`lora_target_modules` returns a regular expression (PEFT ``re.fullmatch``-es a
string ``target_modules`` against each module's full name).  Plain names such as
``["q_proj", "gate_proj"]`` would also adapt the vision tower: Qwen2.5-VL's vision blocks have
``mlp.gate_proj/up_proj/down_proj`` and InternVL's have ``attention.q_proj/k_proj/v_proj``.
Module names (transformers 5.24, both the real and the tiny models):

* Qwen2.5-VL: ``model.language_model.layers.N.self_attn.{q,k,v,o}_proj``,
  ``model.language_model.layers.N.mlp.{gate,up,down}_proj``; vision
  ``model.visual.blocks.N.attn.{qkv,proj}``, ``model.visual.blocks.N.mlp.{gate,up,down}_proj``,
  projector ``model.visual.merger.mlp.{0,2}``.
* InternVL (HF format): the same language-model names; vision
  ``model.vision_tower.encoder.layer.N.attention.{q_proj,k_proj,v_proj,projection_layer}``,
  ``model.vision_tower.encoder.layer.N.mlp.{fc1,fc2}``, projector
  ``model.multi_modal_projector.linear_{1,2}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpr.errors import ConfigError, InputError, ModelNotAvailableError
from cpr.models.tiny import TINY_PREFIX, ensure_tiny_model, parse_tiny_name

if TYPE_CHECKING:  # pragma: no cover
    import peft
    from transformers import PreTrainedModel, ProcessorMixin

__all__ = [
    "FAMILIES",
    "detect_family",
    "resolve_model_path",
    "resolve_dtype",
    "apply_pixel_limits",
    "load_model_and_processor",
    "lora_target_modules",
    "build_lora_config",
    "base_fingerprint",
    "check_adapter_base",
]

logger = logging.getLogger("cpr.models")

#: Model families cpr knows how to configure (pixel limits, LoRA targets).
FAMILIES = ("qwen2_5_vl", "internvl")

_NAME_PATTERNS = (("qwen2.5-vl", "qwen2_5_vl"), ("qwen2_5_vl", "qwen2_5_vl"), ("qwen2_5-vl", "qwen2_5_vl"))

_LM = r"(?:.*\.)?language_model\.layers\.\d+\.(?:self_attn\.(?:q|k|v|o)_proj|mlp\.(?:gate|up|down)_proj)"
_VISION = {
    "qwen2_5_vl": (
        r"(?:.*\.)?visual\.blocks\.\d+\.(?:attn\.(?:qkv|proj)|mlp\.(?:gate|up|down)_proj)"
        r"|(?:.*\.)?visual\.merger\.mlp\.(?:0|2)"
    ),
    "internvl": (
        r"(?:.*\.)?vision_tower\.encoder\.layer\.\d+\.(?:attention\.(?:q_proj|k_proj|v_proj|projection_layer)"
        r"|mlp\.fc[12])|(?:.*\.)?multi_modal_projector\.linear_[12]"
    ),
}


def _hub_hint(name: str) -> str:
    return (
        f"Download it where the Hugging Face Hub is reachable (`hf download {name} --local-dir DIR`) and pass "
        "DIR as the model path, or point HF_HOME at a cache that holds it; offline tests and the demo use "
        f"'{TINY_PREFIX}qwen2_5_vl' or '{TINY_PREFIX}internvl'."
    )


_PATH_HINT = (
    "Pass an existing model folder (with config.json, the weights and the processor files), a hub id such as "
    f"'Qwen/Qwen2.5-VL-3B-Instruct', or '{TINY_PREFIX}qwen2_5_vl' / '{TINY_PREFIX}internvl' for a tiny local model."
)


def _not_available(name: str, what: str, err: BaseException | None = None) -> ModelNotAvailableError:
    reason = ""
    if err is not None:
        text = str(err).strip()
        first = text.splitlines()[0] if text else type(err).__name__
        reason = f" ({type(err).__name__}: {first[:300]})"
    offline = (
        " (HF_HUB_OFFLINE is set)"
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
        else ""
    )
    return ModelNotAvailableError(
        f"{what} {name!r} is not available: it is not a local folder and could not be fetched from the "
        f"Hugging Face Hub{offline}{reason}. {_hub_hint(name)}"
    )


def resolve_model_path(model_name_or_path: str | Path, *, cache_dir: str | Path | None = None) -> str:
    """Return what ``from_pretrained`` should load for ``model_name_or_path``.

    ``tiny:<kind>`` names are built (once) into ``cache_dir`` (default
    ``$CPR_CACHE_DIR/tiny_models`` or ``~/.cache/cpr/tiny_models``) and their folder returned;
    an existing folder is returned as is; anything else is taken as a hub id.
    Raises ``ModelNotAvailableError`` for a path-like name (``./x``, ``/x``, ``a/b/c``) that does
    not exist, ``ConfigError`` for an unknown ``tiny:`` kind.
    """
    name = str(model_name_or_path)
    kind = parse_tiny_name(name)
    if kind is not None:
        return str(ensure_tiny_model(kind, cache_dir))
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotAvailableError(
            f"model {name!r} is not available: not an existing model folder. {_PATH_HINT}"
        )
    return name


def detect_family(model_name_or_path: str | Path) -> str:
    """Model family of a model: its config's ``model_type`` (``"qwen2_5_vl"``, ``"internvl"``, ...).

    ``"internvl_chat"`` is the original remote-code InternVL format, which cpr does not train
    (use the ``-HF`` checkpoints, model_type ``internvl``).

    Order: a ``tiny:<kind>`` name gives its kind; a local folder gives its ``config.json``
    ``model_type``; a hub id is matched by name (``Qwen2.5-VL`` -> qwen2_5_vl, ``InternVL`` ->
    internvl); else the config is fetched with ``AutoConfig`` (hub cache or network).
    Raises ``ModelNotAvailableError`` when none of these finds a config, ``InputError`` for a
    local ``config.json`` without ``model_type``.
    """
    name = str(model_name_or_path)
    kind = parse_tiny_name(name)
    if kind is not None:
        return kind
    path = Path(name).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelNotAvailableError(f"model folder {name!r} has no config.json. {_PATH_HINT}")
        with open(cfg_file, encoding="utf-8") as fh:
            model_type = json.load(fh).get("model_type")
        if not model_type:
            raise InputError("config.json has no model_type", path=cfg_file, field="model_type")
        return model_type
    lowered = name.lower()
    for pattern, family in _NAME_PATTERNS:
        if pattern in lowered:
            return family
    if "internvl" in lowered:
        # OpenGVLab publishes the transformers-native format under "-hf" names; the others are
        # the remote-code format (model_type internvl_chat), which AutoModelForImageTextToText cannot load.
        return "internvl" if lowered.endswith("-hf") else "internvl_chat"
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise _not_available(name, "model", err) from None
    return config.model_type


def resolve_dtype(dtype: str, device: str) -> Any:
    """``torch.dtype`` for a dtype name on a device type.

    ``"auto"``: bfloat16 on CUDA when supported, float16 on other CUDA GPUs, float32 on CPU.
    Accepted names: auto, bfloat16/bf16, float16/fp16/half, float32/fp32/float.
    Raises ``ConfigError`` (field ``dtype``) for other names.
    """
    import torch

    names = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
    }
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in names:
        raise ConfigError(
            f"unknown dtype {dtype!r}; expected auto or one of {', '.join(names)}", field="dtype"
        )
    return names[dtype]


def apply_pixel_limits(processor: Any, family: str, min_pixels: int | None, max_pixels: int | None) -> None:
    """Set the image-size limits of a loaded processor in place (see the module docstring).

    Qwen2.5-VL: ``image_processor.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}``
    (a ``None`` keeps the current value).  InternVL: ``max_patches`` / ``min_patches`` from the
    tile area.  Raises ``ConfigError`` for non-positive limits, ``min_pixels > max_pixels``, or
    a family without a known pixel setting.
    """
    if min_pixels is None and max_pixels is None:
        return
    for field, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"must be a positive integer, got {value!r}", field=field)
    if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
        raise ConfigError(
            f"min_pixels ({min_pixels}) is larger than max_pixels ({max_pixels})", field="min_pixels"
        )
    image_processor = processor.image_processor
    size = dict(image_processor.size)
    if family == "qwen2_5_vl":
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        if size["shortest_edge"] > size["longest_edge"]:
            raise ConfigError(
                f"min_pixels ({size['shortest_edge']}) is larger than max_pixels ({size['longest_edge']})",
                field="min_pixels",
            )
        image_processor.size = size
    elif family == "internvl":
        tile_area = int(size["height"]) * int(size["width"])
        if max_pixels is not None:
            image_processor.max_patches = max(1, max_pixels // tile_area)
        if min_pixels is not None:
            image_processor.min_patches = min(
                max(1, math.ceil(min_pixels / tile_area)), image_processor.max_patches
            )
    else:
        raise ConfigError(
            f"pixel limits are not supported for model family {family!r} (known: {', '.join(FAMILIES)})",
            field="max_pixels" if max_pixels is not None else "min_pixels",
        )


def _set_pad_token(processor: Any, model: Any) -> None:
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in vocab else tokenizer.eos_token
    if tokenizer.pad_token is None:
        raise ConfigError("the tokenizer has neither a pad token nor an eos token", field="model")
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def load_model_and_processor(
    model_name_or_path: str | Path,
    *,
    dtype: str = "auto",
    device: str | None = None,
    gradient_checkpointing: bool | None = None,
    attn_implementation: str | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | Path | None = None,
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Load a vision-language model and its processor for GRPO training or evaluation.

    Args:
        model_name_or_path: a local folder, a hub id (``Qwen/Qwen2.5-VL-3B-Instruct``,
            ``OpenGVLab/InternVL3_5-4B-HF``) or ``tiny:qwen2_5_vl`` / ``tiny:internvl``.
        dtype: ``"auto"`` (bf16 on GPU, fp32 on CPU) or a dtype name (see :func:`resolve_dtype`).
        device: where to put the model (``"cpu"``, ``"cuda"``, ``"cuda:1"``); ``None`` leaves it
            where ``from_pretrained`` put it (CPU), for a trainer / accelerate to place it,
            and takes the dtype and checkpointing defaults from whether CUDA is available.
        gradient_checkpointing: ``None``: on for CUDA, off for CPU.  Enabled non-reentrant.
        attn_implementation: passed to ``from_pretrained`` (``"sdpa"``, ``"flash_attention_2"``,
            ``"eager"``); ``None`` keeps transformers' default.
        min_pixels, max_pixels: image size limits (see :func:`apply_pixel_limits`).
        trust_remote_code: passed to ``from_pretrained``.
        cache_dir: cache root of tiny models.

    Returns:
        ``(model, processor)``: the model in eval mode as ``from_pretrained`` leaves it (trainers
        switch it to train mode), the processor with ``tokenizer.padding_side == "left"`` and a
        pad token.

    Raises:
        ModelNotAvailableError: the model or processor is neither local nor downloadable; the
            message names it and how to supply a local path.
        ConfigError: a bad dtype, pixel limit or tiny model kind.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    name = str(model_name_or_path)
    path = resolve_model_path(name, cache_dir=cache_dir)
    family = detect_family(path)
    device_type = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = resolve_dtype(dtype, device_type)
    if gradient_checkpointing is None:
        gradient_checkpointing = device_type.startswith("cuda")

    model_kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        model_kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForImageTextToText.from_pretrained(path, **model_kwargs)
    except OSError as err:
        raise _not_available(name, "model", err) from None
    try:
        processor = AutoProcessor.from_pretrained(
            path, trust_remote_code=trust_remote_code, padding_side="left"
        )
    except OSError as err:
        raise _not_available(name, "processor of model", err) from None
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise ModelNotAvailableError(
            f"model {name!r} has no multimodal processor (got {type(processor).__name__}); cpr needs a processor "
            "with a tokenizer and an image processor (processor_config.json / preprocessor_config.json)."
        )

    processor.tokenizer.padding_side = "left"
    _set_pad_token(processor, model)
    apply_pixel_limits(processor, family, min_pixels, max_pixels)

    if device is not None:
        model.to(device)
    if gradient_checkpointing:
        # transformers 5.24 renamed gradient checkpointing to activation checkpointing (old names warn).
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model, processor


def lora_target_modules(family: str, *, include_vision: bool = False) -> str:
    """PEFT ``target_modules`` regex for a model family.

    Default: the language model's decoder layers only (``self_attn.{q,k,v,o}_proj`` and
    ``mlp.{gate,up,down}_proj``), never a vision-tower module of the same name.
    ``include_vision=True`` adds the vision tower's attention and MLP linears and the
    vision-language projector.  Module names: see the module docstring.
    Raises ``ConfigError`` (field ``family``) for a family other than :data:`FAMILIES`.
    """
    if family not in FAMILIES:
        raise ConfigError(
            f"no LoRA targets for model family {family!r}; known: {', '.join(FAMILIES)}", field="family"
        )
    return f"{_LM}|{_VISION[family]}" if include_vision else _LM


def build_lora_config(
    family: str,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    include_vision: bool = False,
) -> peft.LoraConfig:
    """``peft.LoraConfig`` for a model family (task type ``CAUSAL_LM``, no bias training).

    Args:
        family: ``"qwen2_5_vl"`` or ``"internvl"`` (see :func:`detect_family`).
        r: LoRA rank.  alpha: LoRA scaling numerator (``lora_alpha``; scale ``alpha / r``).
        dropout: dropout on the LoRA input.  include_vision: also adapt the vision tower.
    Raises ``ConfigError`` for an unknown family, ``r < 1`` or dropout outside ``[0, 1)``.
    """
    from peft import LoraConfig

    if not isinstance(r, int) or r < 1:
        raise ConfigError(f"LoRA rank must be a positive integer, got {r!r}", field="lora.r")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"LoRA dropout must be in [0, 1), got {dropout!r}", field="lora.dropout")
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=lora_target_modules(family, include_vision=include_vision),
        bias="none",
        task_type="CAUSAL_LM",
    )


#: Files whose bytes identify a model folder (:func:`base_fingerprint`); weights count when small.
_FINGERPRINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
_SMALL_WEIGHTS = 64 * 2**20


def base_fingerprint(name_or_path: str | Path) -> str | None:
    """What identifies a base model's content: the first 16 hex digits of the SHA-256 of its
    ``config.json`` and tokenizer files, plus its ``*.safetensors`` when they total at most 64 MiB
    (tiny models built from configs: two of them differ in their tokenizer or weights, not their
    config). Read from a local folder, or from the Hugging Face cache for a hub id.

    Returns:
        The fingerprint, or ``None`` when the model's ``config.json`` is not at hand.
    """
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
    small = sum(w.stat().st_size for w in weights) <= _SMALL_WEIGHTS
    h = hashlib.sha256()
    for f in [folder / n for n in _FINGERPRINT_FILES] + (weights if small else []):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def check_adapter_base(
    adapter: str | Path, base: str | Path | None = None, *, allow_mismatch: bool = False, field: str = "adapter",
    override: str = "--allow-base-mismatch",
) -> str | None:
    """Refuse to put a LoRA adapter on a base model other than the one it was trained on (it then
    gives garbage: wrong vocabulary, no reward). Every place that loads an adapter onto a base calls it.

    The adapter's base is ``base_model_name_or_path`` of its ``adapter_config.json`` (PEFT records
    the path or hub id the base was loaded from). The two are the same when their
    :func:`base_fingerprint` agree, or, where either fingerprint is not at hand (a hub id not in the
    cache, a folder of another machine), when their names are equal, the folders resolve to the same
    path, or ``base`` is a Hugging Face cache snapshot of the recorded hub id
    (``.../models--Org--Name/snapshots/...``).

    Args:
        adapter: the adapter folder.
        base: the path or hub id the base model is loaded from (``model.name_or_path``); ``None``:
            only read the recorded base.
        allow_mismatch: log a warning instead of raising (e.g. hub ids that differ only in revision).
        field: the setting that gave the adapter, named in the error.
        override: the flag or config key that sets ``allow_mismatch``, named in the error.

    Returns:
        The recorded base (``None`` when the adapter records none and ``base`` is given).

    Raises:
        InputError: ``adapter`` has no ``adapter_config.json``; or ``base`` is ``None`` and the adapter
            records no base.
        ConfigError: the bases differ (one line naming both), naming ``field``.
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
        if (
            str(recorded) == str(base)
            or Path(recorded).expanduser().resolve() == given
            or "models--" + str(recorded).replace("/", "--") in given.parts
        ):
            return recorded
        why = "the names differ and the recorded base is not here to compare"
    message = (
        f"LoRA adapter {adapter} was trained on base model {recorded!r}, not on {str(base)!r} ({why}); load "
        f"it on its own base, or set {override} if both are the same model (e.g. hub ids that differ only in revision)"
    )
    if not allow_mismatch:
        raise ConfigError(message, field=field)
    logger.warning("%s: %s", override, message)
    return recorded
