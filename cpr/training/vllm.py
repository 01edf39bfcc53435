"""vLLM generation settings in training (``training.use_vllm``; docs/training.md, "vLLM generation"): the image
placeholder tokens banned (TRL issue 3847), other pixel limits than the model's own refused.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from cpr.errors import ConfigError


def placeholder_tokens(model_config: Any, tokenizer: Any) -> list[str]:
    """The model's vision placeholder tokens (``image_token_id``, ``video_token_id`` of its config, as tokens
    of its tokenizer; Qwen2.5-VL: ``<|image_pad|>``, ``<|video_pad|>``; InternVL3.5: ``<IMG_CONTEXT>``)."""
    ids = [getattr(model_config, f, None) for f in ("image_token_id", "video_token_id")]
    return [tokenizer.convert_ids_to_tokens(int(i)) for i in ids if i is not None]


def vllm_generation_kwargs(model_config: Any, tokenizer: Any, generation_kwargs: Mapping[str, Any] | None = None
                           ) -> dict[str, Any]:
    """A copy of ``generation_kwargs`` with :func:`placeholder_tokens` added to its (vLLM) ``bad_words``."""
    kwargs = dict(generation_kwargs or {})
    words = list(kwargs.get("bad_words") or [])
    kwargs["bad_words"] = words + [t for t in placeholder_tokens(model_config, tokenizer) if t not in words]
    return kwargs


def _limits(image_processor: Any, family: str) -> dict[str, Any]:
    if family == "qwen2_5_vl":
        size = image_processor.size
        return {"min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]}
    return {"min_patches": image_processor.min_patches, "max_patches": image_processor.max_patches}


def vllm_image_limits(model_path: str, min_pixels: int | None, max_pixels: int | None,
                      trust_remote_code: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(what vLLM uses, what the trainer uses)``: the image-size limits of the image processor saved with
    ``model_path`` and under :func:`cpr.models.apply_pixel_limits`. Raises ``ModelNotAvailableError``."""
    from transformers import AutoImageProcessor

    from cpr.models import _not_available, apply_pixel_limits, detect_family, resolve_model_path

    path = resolve_model_path(model_path)
    family = detect_family(path)
    try:
        saved = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise _not_available(model_path, "processor of model", err) from None
    limited = copy.deepcopy(saved)
    apply_pixel_limits(SimpleNamespace(image_processor=limited), family, min_pixels, max_pixels)
    return _limits(saved, family), _limits(limited, family)


def check_vllm_pixels(cfg: Any, modes: set[str]) -> None:
    """Refuse ``training.use_vllm`` (``modes``: each phase's ``vllm_mode``) when vLLM would process images with
    other limits than the trainer (TRL 1.16 gives it no ``mm_processor_kwargs``). Raises ``ConfigError`` (one
    line saying what vLLM would use, what the config asks for, and how to give vLLM the same);
    ``ModelNotAvailableError``: see :func:`vllm_image_limits`."""
    import json

    m = cfg.model
    if not modes or (m.min_pixels is None and m.max_pixels is None):
        return
    vllm, trainer = vllm_image_limits(m.name_or_path, m.min_pixels, m.max_pixels, m.trust_remote_code)
    if vllm == trainer:
        return
    said = ", ".join(f"{k} {v}" for k, v in vllm.items())
    wanted = ", ".join(f"{k} {v}" for k, v in trainer.items())
    how = ("point model.name_or_path at a copy of the model whose processor was saved with them "
           "(cpr.models.load_model_and_processor(..., min_pixels=, max_pixels=), then processor.save_pretrained"
           " into the copy)")
    if "server" in modes:
        how += (" and serve that folder (trl vllm-serve --model <copy>; --mm-processor-kwargs "
                f"'{json.dumps(trainer)}' after it is forwarded to vllm serve, but cpr cannot see a server's settings)")
    raise ConfigError(
        f"training.use_vllm: vLLM processes images with the limits saved with {m.name_or_path} ({said}), not the "
        f"trainer's ({wanted}), and TRL passes it no mm_processor_kwargs: a larger image gets another number of "
        f"placeholder tokens in vLLM than in the prompt; {how}, or set training.use_vllm: false",
        field="model.max_pixels" if m.max_pixels is not None else "model.min_pixels",
    )
