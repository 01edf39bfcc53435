"""Generation settings for vLLM in training (``training.use_vllm``, TRL's colocate or server mode).

TRL's transformers generation path suppresses the image placeholder token
(``suppress_tokens=[config.image_token_id]``, ``trl.GRPOTrainer.__init__``); its vLLM path does not
(TRL issue 3847): a placeholder sampled inside a completion (``<|image_pad|>``) is counted as an
image position by the next forward pass, whose image features then no longer match. TRL passes
``GRPOConfig.generation_kwargs`` to vLLM's ``SamplingParams`` in both modes, so
:func:`vllm_generation_kwargs` adds the placeholders to vLLM's ``bad_words`` (banned outright,
logit -inf) there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["placeholder_tokens", "vllm_generation_kwargs"]

#: Model config fields holding the ids of tokens that the processor expands into vision features.
PLACEHOLDER_FIELDS = ("image_token_id", "video_token_id")


def placeholder_tokens(model_config: Any, tokenizer: Any) -> list[str]:
    """The vision placeholder tokens of a model, as strings of its tokenizer.

    Args:
        model_config: the model's ``PretrainedConfig`` (a ``PeftModel``'s ``config`` works): the
            ids of :data:`PLACEHOLDER_FIELDS` that are set (Qwen2.5-VL: ``<|image_pad|>``,
            ``<|video_pad|>``; InternVL3.5-HF: ``<IMG_CONTEXT>``).
        tokenizer: the model's tokenizer.

    Returns:
        The tokens, in :data:`PLACEHOLDER_FIELDS` order (empty for a text-only model).
    """
    ids = [getattr(model_config, f, None) for f in PLACEHOLDER_FIELDS]
    return [tokenizer.convert_ids_to_tokens(int(i)) for i in ids if i is not None]


def vllm_generation_kwargs(
    model_config: Any, tokenizer: Any, generation_kwargs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``GRPOConfig.generation_kwargs`` for vLLM generation: ``generation_kwargs`` (the config's
    own, kept) with the model's :func:`placeholder_tokens` added to ``bad_words`` (vLLM
    ``SamplingParams``: each word's tokens can never be generated; a placeholder is one token).

    Also usable for vLLM outside TRL: ``SamplingParams(**vllm_generation_kwargs(config, tok), ...)``.

    Returns:
        A new dict; ``bad_words`` lists the given words first, then the placeholders not among them.
    """
    kwargs = dict(generation_kwargs or {})
    words = list(kwargs.get("bad_words") or [])
    kwargs["bad_words"] = words + [t for t in placeholder_tokens(model_config, tokenizer) if t not in words]
    return kwargs
