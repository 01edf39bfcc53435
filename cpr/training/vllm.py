"""vLLM generation settings in training (``training.use_vllm``).

TRL's transformers generation suppresses the image placeholder token (``suppress_tokens``); its vLLM path
does not (TRL issue 3847), and a placeholder sampled inside a completion breaks the next forward pass's
image features. TRL passes ``GRPOConfig.generation_kwargs`` to vLLM's ``SamplingParams``, so the
placeholders go into its ``bad_words`` there (banned outright).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def placeholder_tokens(model_config: Any, tokenizer: Any) -> list[str]:
    """The model's vision placeholder tokens (``image_token_id``, ``video_token_id`` of its config, as tokens
    of its tokenizer; Qwen2.5-VL: ``<|image_pad|>``, ``<|video_pad|>``; InternVL3.5: ``<IMG_CONTEXT>``)."""
    ids = [getattr(model_config, f, None) for f in ("image_token_id", "video_token_id")]
    return [tokenizer.convert_ids_to_tokens(int(i)) for i in ids if i is not None]


def vllm_generation_kwargs(model_config: Any, tokenizer: Any, generation_kwargs: Mapping[str, Any] | None = None
                           ) -> dict[str, Any]:
    """A copy of ``generation_kwargs`` whose ``bad_words`` (vLLM ``SamplingParams``) lists its own words, then
    the :func:`placeholder_tokens` not among them. Also usable for vLLM outside TRL."""
    kwargs = dict(generation_kwargs or {})
    words = list(kwargs.get("bad_words") or [])
    kwargs["bad_words"] = words + [t for t in placeholder_tokens(model_config, tokenizer) if t not in words]
    return kwargs
