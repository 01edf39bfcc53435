"""Model layer: load vision-language models and processors, LoRA configs, tiny local models.

See :mod:`cpr.models.loading` (``load_model_and_processor``, ``detect_family``,
``lora_target_modules``, ``build_lora_config``) and :mod:`cpr.models.tiny` (tiny Qwen2.5-VL and
InternVL models built offline, ``tiny:<kind>`` names).
"""

from cpr.models.loading import (
    FAMILIES,
    apply_pixel_limits,
    base_fingerprint,
    build_lora_config,
    check_adapter_base,
    detect_family,
    load_model_and_processor,
    lora_target_modules,
    resolve_dtype,
    resolve_model_path,
)
from cpr.models.tiny import (
    TINY_KINDS,
    TINY_PREFIX,
    build_tiny_internvl,
    build_tiny_qwen2_5_vl,
    default_cache_dir,
    ensure_tiny_model,
    parse_tiny_name,
)

__all__ = [
    "FAMILIES",
    "TINY_KINDS",
    "TINY_PREFIX",
    "apply_pixel_limits",
    "base_fingerprint",
    "build_lora_config",
    "build_tiny_internvl",
    "build_tiny_qwen2_5_vl",
    "check_adapter_base",
    "default_cache_dir",
    "detect_family",
    "ensure_tiny_model",
    "load_model_and_processor",
    "lora_target_modules",
    "parse_tiny_name",
    "resolve_dtype",
    "resolve_model_path",
]
