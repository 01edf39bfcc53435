"""``cpr train --check``: validate a run for N processes (``WORLD_SIZE=N``), build the model on the meta
device with its LoRA adapter (only ``config.json`` needed; the paper models' ship in
``cpr/models/configs``) and estimate one GPU's peak memory (docs/training.md, "Check a run before it starts").

Byte counts (``wb`` = bytes of the model dtype): weights ``params x wb`` (/ N under ZeRO-3). LoRA
(fp32 under DDP in every phase: TRL's new adapter and a handed-over one alike,
:func:`cpr.training.policy.with_adapter`): DDP holds fp32 weights, gradients, buckets and two Adam moments
(20 B a parameter); DeepSpeed bf16 an fp32 master, moments and gradient partition (16 B / N) plus bf16
weights and gradients (4 B, / N under ZeRO-3 only) (Rajbhandari et al. 2020, ZeRO, section 3).
Generation (transformers' ``generate``; each of :attr:`PhaseShape.generations` a peak of its own): ZeRO-3
gathers every parameter; the KV cache holds ``2 x layers x kv_heads x head_dim x wb`` a token of every sequence
at full length; the prefill's working set is one decoder layer for all prompts or one vision block for all
images; fp32 logits. Training: what autograd saves for one micro-batch (:func:`saved_activation_bytes`) plus one layer's again while it
is recomputed; TRL 1.16's fused LM head scores tiles of at most 4096 tokens x 32768 vocabulary
entries; ZeRO-3 holds the gathered embedding and two layers. Plus 1 GiB for the CUDA context, NCCL
and the step encoder. Attention is a flash / memory-efficient kernel (no ``tokens x tokens`` matrix).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import unittest.mock
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError, DatasetNotAvailableError, ModelNotAvailableError

#: Hub ids whose config ships with cpr -> folder under ``cpr/models/configs``.
SHIPPED_CONFIGS = {"Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl_3b", "OpenGVLab/InternVL3_5-4B-HF": "internvl3_5_4b"}
LAUNCHERS = ("ddp", "zero2", "zero3")
_LAUNCHER_NAMES = {"ddp": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
GIB = 1024**3
RUNTIME_OVERHEAD = 1 * GIB
#: TRL's fused LM head tile (trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE).
HEAD_TILE = (4096, 32768)


def config_folder(name_or_path: str) -> Path:
    """The folder holding the model's ``config.json``: a local folder, the shipped copy of a paper model,
    or the hub cache (``HF_HUB_OFFLINE`` allowed). Raises ``ModelNotAvailableError`` when none has it."""
    from cpr.models import resolve_model_path

    if name_or_path in SHIPPED_CONFIGS and not Path(name_or_path).is_dir():
        return Path(__file__).resolve().parents[1] / "models" / "configs" / SHIPPED_CONFIGS[name_or_path]
    path = resolve_model_path(name_or_path)
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(path, "config.json")).parent
    except Exception as err:  # noqa: BLE001 - any hub failure means "not available here"
        raise ModelNotAvailableError(
            f"no config.json for model {path!r} (not shipped with cpr: {', '.join(SHIPPED_CONFIGS)}; not a local "
            f"folder; not in the hub cache: {type(err).__name__}). Pass a folder that holds its config.json."
        ) from None


@dataclasses.dataclass
class Architecture:
    """What the estimate needs from a model, read off its meta-device build with the LoRA adapter. Counts are
    parameters; ``lm_lora_in`` / ``lm_lora_rank``: the summed input widths and ranks of the adapted linears of one
    decoder layer (``vision_lora_*`` of one vision block)."""

    family: str
    params: dict[str, int]  # part -> parameters (vision, projector, language)
    trainable: dict[str, int]  # part -> LoRA parameters
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qk_norm: bool
    layer_params: int
    embed_params: int
    vision_layers: int
    vision_hidden: int
    vision_heads: int
    vision_intermediate: int
    vision_gated: bool
    lm_lora_in: int
    lm_lora_rank: int
    vision_lora_in: int
    vision_lora_rank: int
    lora_modules: list[str]

    @property
    def total_params(self) -> int:
        """All parameters, by count."""
        return sum(self.params.values())

    @property
    def lora_params(self) -> int:
        """The LoRA adapter's (trainable) parameters, by count."""
        return sum(self.trainable.values())


def _part(name: str) -> str:
    if "visual.merger" in name or "multi_modal_projector" in name:
        return "projector"
    return "vision" if ("visual." in name or "vision_tower" in name) else "language"


def load_architecture(folder: Path, lora_config: Any, *, include_vision: bool) -> tuple[Architecture, Any]:
    """Build the model of ``folder/config.json`` on the meta device, wrap it with ``lora_config``
    (PEFT) and read off an :class:`Architecture`. Returns ``(architecture, transformers config)``.
    Raises ``ConfigError`` (field ``lora.target_modules``) when no module matches the LoRA targets,
    or a vision / projector module does while ``include_vision`` is false."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):  # not accelerate.init_empty_weights: its re-registered parameters untie the LM head
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
        try:
            with warnings.catch_warnings():  # transformers' deprecation notes about PEFT's calls: not the user's
                warnings.simplefilter("ignore", FutureWarning)
                peft_model = get_peft_model(model, lora_config)
        except ValueError as e:
            raise ConfigError(f"no module matches the LoRA targets ({e})", field="lora.target_modules") from None
    adapted = sorted({n.rsplit(".lora_", 1)[0].removeprefix("base_model.model.") for n, _ in peft_model.named_parameters()
                      if ".lora_" in n})
    vision = [n for n in adapted if _part(n) != "language"]
    if vision and not include_vision:
        raise ConfigError(f"{len(vision)} vision / projector modules are LoRA targets (e.g. {vision[0]}) but "
                          "lora.include_vision is false", field="lora.target_modules")
    params = {"vision": 0, "projector": 0, "language": 0}
    trainable = dict.fromkeys(params, 0)
    for n, p in peft_model.named_parameters():
        (trainable if ".lora_" in n else params)[_part(n)] += p.numel()
    text, lm, vcfg = config.get_text_config(), model.model.language_model, config.vision_config
    layer = lm.layers[0]
    blocks = model.model.visual.blocks if hasattr(model.model, "visual") else model.model.vision_tower.encoder.layer

    def lora_sums(prefix: str) -> tuple[int, int]:  # one layer's adapted linears: summed input widths, ranks
        mods = [m for n, m in peft_model.named_modules() if prefix in n and "default" in getattr(m, "lora_A", {})]
        return sum(m.in_features for m in mods), sum(m.r["default"] for m in mods)

    lm_in, lm_r = lora_sums("language_model.layers.0.")
    v_in, v_r = lora_sums("visual.blocks.0." if hasattr(model.model, "visual") else "vision_tower.encoder.layer.0.")
    arch = Architecture(
        family=config.model_type, params=params, trainable=trainable, layers=text.num_hidden_layers,
        hidden=text.hidden_size, heads=text.num_attention_heads, kv_heads=text.num_key_value_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        intermediate=text.intermediate_size, vocab=text.vocab_size, qk_norm=hasattr(layer.self_attn, "q_norm"),
        layer_params=sum(p.numel() for p in layer.parameters()), embed_params=lm.embed_tokens.weight.numel(),
        vision_layers=len(blocks), vision_hidden=vcfg.hidden_size,
        vision_heads=getattr(vcfg, "num_heads", None) or vcfg.num_attention_heads,
        vision_intermediate=vcfg.intermediate_size, vision_gated=hasattr(blocks[0].mlp, "gate_proj"),
        lm_lora_in=lm_in, lm_lora_rank=lm_r, vision_lora_in=v_in, vision_lora_rank=v_r, lora_modules=adapted)
    return arch, config


@dataclasses.dataclass
class PhaseShape:
    """The sizes of one phase on one GPU. Tokens are per sequence."""

    name: str
    train_batch: int  # per_device_train_batch_size
    gen_batch: int  # sequences generated at once on one GPU
    text_tokens: int
    image_tokens: int  # per image (one image a prompt)
    patches: int  # vision-encoder positions per image
    completion_tokens: int
    checkpointing: bool
    #: the greedy baseline's and the eval hook's generations, as in :attr:`generations`
    extra_generations: tuple[tuple[str, int, int], ...] = ()

    @property
    def generations(self) -> list[tuple[str, int, int]]:
        """Every generation of the phase on one GPU: ``(what, sequences at once, completion tokens)``, TRL's
        training rounds first."""
        return [("training rounds", self.gen_batch, self.completion_tokens), *self.extra_generations]

    @property
    def prompt_tokens(self) -> int:
        """Tokens of one prompt: text and image."""
        return self.text_tokens + self.image_tokens

    @property
    def seq_tokens(self) -> int:
        """Tokens of one sequence: prompt and completion."""
        return self.prompt_tokens + self.completion_tokens


def saved_activation_bytes(arch: Architecture, *, batch: int, tokens: int, scored_tokens: int, images: int, patches: int,
                           image_tokens: int, checkpointing: bool, include_vision: bool, dropout: bool, wb: int,
                           device: str = "cuda") -> dict[str, int]:
    """Bytes autograd keeps for backward after a training forward of ``batch`` sequences of ``tokens``
    tokens (``scored_tokens`` completion tokens each) and ``images`` images: ``language``, ``vision``,
    ``head``; ``layer`` is one decoder layer's (recomputed under gradient checkpointing),
    ``vision_block`` one vision block's with its fp32 gradients.

    Per token and decoder layer (transformers 5.24 Qwen2 / Qwen3, PEFT LoRA): each RMSNorm's fp32 input
    and inverse RMS (``4 h + 4``, twice; Qwen3 also on q and k), attention's q, k, v, output and
    log-sum-exp (``wb (2 q + 2 kv) + 4 heads``), the MLP's gate, SiLU and up outputs (``3 i wb``), each
    adapted linear's LoRA input, dropout mask and rank-r intermediate. Gradient checkpointing keeps each
    layer's input (``h wb``) and (``enable_input_require_grads``) the frozen vision tower's block inputs.
    Checked against ``torch.autograd.graph.saved_tensors_hooks`` on tiny models (tests); an fp32 model
    without LoRA dropout shares one input among q / k / v and gate / up (up to 26 % over).
    """
    h, q, kv, i = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.intermediate
    # bytes a saved LoRA input / output element: PEFT runs LoRA in the adapter's dtype (fp32; DeepSpeed's bf16
    # engine casts it to bf16; under DDP with bf16 autocast saves the input in bf16); a dropout-mask element:
    # CUDA's fused dropout saves a bool mask, the CPU kernel one of the input's dtype
    lora_b = 4 if (wb == 4 or device == "cpu") else 2
    mask_b = lora_b if device == "cpu" else 1
    per_in = lora_b + (mask_b if dropout else 0)
    layer = 2 * (4 * h + 4) + wb * (2 * q + 2 * kv) + 4 * arch.heads + 3 * i * wb
    layer += arch.lm_lora_in * per_in + arch.lm_lora_rank * lora_b
    if arch.qk_norm:
        layer += 4 * (q + kv) + 4 * (arch.heads + arch.kv_heads)
    n = batch * tokens
    language = n * arch.layers * (h * wb if checkpointing else layer)
    head = n * (4 * h + 4) + batch * scored_tokens * (h * wb + 16)
    hv, iv, vh = arch.vision_hidden, arch.vision_intermediate, arch.vision_heads
    norm = (4 * hv + 4) if arch.vision_gated else (hv * wb + 8)  # RMSNorm (Qwen) or LayerNorm (InternViT)
    full_block = 2 * norm + 4 * hv * wb + 4 * vh + (3 if arch.vision_gated else 1) * iv * wb
    vision = 0
    if include_vision or checkpointing:
        block = hv * wb if checkpointing else full_block + arch.vision_lora_in * per_in + arch.vision_lora_rank * lora_b
        merged = images * image_tokens
        if arch.vision_gated:  # Qwen2.5-VL merger: RMSNorm on patches, GELU on merged tokens
            proj = images * patches * (4 * hv + 4) + merged * 4 * hv * wb
        else:  # InternVL projector: LayerNorm and GELU on pixel-shuffled tokens
            proj = merged * (4 * hv * wb + 8 + h * wb)
        vision = images * patches * arch.vision_layers * block + proj
    return {"language": language, "vision": vision, "head": head, "layer": n * layer,
            "vision_block": images * patches * (full_block + 8 * hv)}


def generation_rows(arch: Architecture, *, sequences: int, prompt_tokens: int, completion_tokens: int, patches: int,
                    wb: int, gathered: bool) -> dict[str, int]:
    """The ``gen:`` rows (bytes, module docstring) of one ``generate`` call of ``sequences`` prompts, one image of
    ``patches`` vision positions each (``gathered``: ZeRO-3's gathered weights)."""
    h, i, kv, q = arch.hidden, arch.intermediate, arch.kv_heads * arch.head_dim, arch.heads * arch.head_dim
    g = sequences
    rows = {"gen: gathered weights": arch.total_params * wb if gathered else 0,
            "gen: KV cache": 2 * arch.layers * kv * wb * g * (prompt_tokens + completion_tokens)}
    hv, iv, mlp_v = arch.vision_hidden, arch.vision_intermediate, 3 if arch.vision_gated else 2
    # no-grad prefill: the residual stream and one block's larger half (attention: fp32 norm, q k v out, a LoRA
    # input in fp32; MLP: gate, up, product and the down projection's fp32 LoRA input); the vision tower runs
    # first, one block at a time over every image, and leaves its output for the language model
    lm = wb * 2 * h + max(8 * h + wb * (2 * q + 2 * kv), wb * 3 * i + 4 * i)
    vision = wb * 3 * hv + max(wb * 5 * hv + 4 * hv, wb * mlp_v * iv)
    rows["gen: activations"] = g * max(prompt_tokens * lm, patches * vision)
    rows["gen: logits"] = 3 * g * arch.vocab * 4
    return rows


def estimate_memory(arch: Architecture, shape: PhaseShape, *, launcher: str, processes: int, wb: int = 2,
                    include_vision: bool = False, dropout: bool = True) -> dict[str, int]:
    """Peak bytes on one GPU for one phase under ``launcher`` (``ddp``, ``zero2``, ``zero3``), by
    component (module docstring). ``generation: <what>`` is the peak of each of :attr:`PhaseShape.generations`,
    ``generation`` the largest of them (its ``gen:`` rows are shown), ``training`` the training step's.
    Raises ``ValueError`` for an unknown launcher."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; expected one of {LAUNCHERS}")
    n, z3, h, p = processes, launcher == "zero3", arch.hidden, arch.lora_params
    rows = {"weights (shard)": arch.total_params * wb // (n if z3 else 1)}
    rows["LoRA weights, grads, Adam"] = 20 * p if launcher == "ddp" else 16 * p // n + 4 * p // (n if z3 else 1)
    common = rows["weights (shard)"] + rows["LoRA weights, grads, Adam"] + RUNTIME_OVERHEAD
    peaks = {what: generation_rows(arch, sequences=g, prompt_tokens=shape.prompt_tokens, completion_tokens=c,
                                   patches=shape.patches, wb=wb, gathered=z3) for what, g, c in shape.generations}
    largest = max(peaks, key=lambda what: sum(peaks[what].values()))
    rows.update(peaks[largest])
    rows["train: gathered layers"] = (arch.embed_params + 2 * arch.layer_params) * wb if z3 else 0
    saved = saved_activation_bytes(
        arch, batch=shape.train_batch, tokens=shape.seq_tokens, scored_tokens=shape.completion_tokens,
        images=shape.train_batch, patches=shape.patches, image_tokens=shape.image_tokens,
        checkpointing=shape.checkpointing, include_vision=include_vision, dropout=dropout, wb=wb)
    # backward: one decoder layer's (or, when its tower is differentiated, one vision block's) tensors again
    # while it is recomputed, and the gradients flowing through it (fp32 at most)
    block = saved["vision_block"] if (shape.checkpointing or include_vision) else 0
    backward = max(saved["layer"] + shape.train_batch * shape.seq_tokens * 2 * h * 4, block)
    rows["train: activations"] = saved["language"] + saved["vision"] + saved["head"] + backward
    scored = shape.train_batch * shape.completion_tokens
    rows["train: logits"] = 2 * min(scored, HEAD_TILE[0]) * min(arch.vocab, HEAD_TILE[1]) * wb + scored * h * 4
    rows["runtime (CUDA context, NCCL, encoder)"] = RUNTIME_OVERHEAD
    for what, gen in peaks.items():
        rows[f"generation: {what}"] = common + sum(gen.values())
    rows["generation"] = common + sum(peaks[largest].values())
    rows["training"] = common + sum(v for k, v in rows.items() if k.startswith("train:"))
    return rows


def estimate_evaluation_memory(arch: Architecture, *, sequences: int, prompt_tokens: int, completion_tokens: int,
                               patches: int, wb: int = 2) -> dict[str, int]:
    """Peak bytes on one GPU of the final evaluation and checkpoint selection (the whole model, one fp32 adapter,
    ``sequences`` at once); ``generation`` is the total."""
    rows = {"weights (whole model)": arch.total_params * wb, "LoRA weights": 4 * arch.lora_params}
    gen = generation_rows(arch, sequences=sequences, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          patches=patches, wb=wb, gathered=False)
    rows.update((k, v) for k, v in gen.items() if k != "gen: gathered weights")
    rows["runtime (CUDA context, NCCL, encoder)"] = RUNTIME_OVERHEAD
    rows["generation"] = sum(rows.values())
    return rows


def evaluation_sequences(cfg: Any) -> tuple[int, str]:
    """Sequences one evaluation ``generate`` call decodes at once (sampled: ``batch_size x samples``), described."""
    ev = cfg.evaluation
    if ev.decoding.mode == "sampled":
        return ev.batch_size * ev.decoding.samples, f"{ev.batch_size} x {ev.decoding.samples} sampled"
    return ev.batch_size, "greedy"


def greedy_baseline_sequences(gen_batch: int, num_generations: int, processes: int) -> int:
    """Greedy completions one process decodes at once for ``baseline: greedy``: one per group among its
    ``gen_batch`` rows of a generation round; with several processes a group may be split between two (one more)."""
    groups = -(-gen_batch // num_generations)
    split = processes > 1 and gen_batch % num_generations != 0
    return min(gen_batch, groups + (1 if split else 0))


def launcher_from_accelerate_config(path: str | Path) -> tuple[str, int | None]:
    """``(launcher, num_processes or None)`` of an accelerate config file. Raises ``ConfigError`` for a missing file
    or a DeepSpeed stage other than 2 or 3."""
    from cpr.training.config import read_yaml

    try:
        data = read_yaml(path) or {}
    except FileNotFoundError:
        raise ConfigError("no such file", path=path, field="--accelerate-config") from None
    kind = str(data.get("distributed_type", "NO")).upper()
    launcher = "ddp"
    if kind == "DEEPSPEED":
        stage = (data.get("deepspeed_config") or {}).get("zero_stage")
        if stage not in (2, 3):
            raise ConfigError(f"zero_stage {stage!r}: the estimate knows ZeRO-2 and ZeRO-3", path=path, field="deepspeed_config.zero_stage")
        launcher = f"zero{stage}"
    n = data.get("num_processes")
    return launcher, int(n) if isinstance(n, int) else None


def _image_sizes(arch: Architecture, config: Any, folder: Path, cfg: Any) -> tuple[int, int, str, str | None]:
    """(image tokens, vision positions, description, warning) of one image at the run's limits."""
    pp: dict[str, Any] = {}  # the image processor's settings: preprocessor_config.json, or inside processor_config.json
    for name in ("processor_config.json", "preprocessor_config.json"):
        if (folder / name).is_file():
            data = json.loads((folder / name).read_text(encoding="utf-8"))
            pp.update(data.get("image_processor", data))
    if arch.family == "qwen2_5_vl":
        v = config.vision_config
        unit = (v.patch_size * v.spatial_merge_size) ** 2
        limit = cfg.model.max_pixels or pp.get("max_pixels") or (pp.get("size") or {}).get("longest_edge")
        if not limit:
            raise ConfigError("no pixel limit: set model.max_pixels", field="model.max_pixels")
        tokens = int(limit) // unit
        warn = None if cfg.model.max_pixels else f"no model.max_pixels set: the processor allows {limit} pixels ({tokens} image tokens) an image"
        return tokens, tokens * v.spatial_merge_size**2, f"max_pixels {limit} -> up to {tokens} image tokens an image", warn
    if arch.family == "internvl":
        tile = config.vision_config.image_size[0]
        per_tile = config.image_seq_length
        limit = cfg.model.max_pixels
        most = max(1, limit // tile**2) if limit else int(pp.get("max_patches", 12))
        tiles = most + 1 if most > 1 else 1  # a thumbnail tile when an image is cut into several
        warn = None if limit else f"no tile limit set (model.max_pixels): up to {tiles} tiles an image ({most} + thumbnail)"
        patches = tiles * ((tile // config.vision_config.patch_size[0]) ** 2 + 1)
        return tiles * per_tile + 2, patches, f"up to {tiles} tiles x {per_tile} tokens + <img> </img> = {tiles * per_tile + 2} image tokens an image", warn
    raise ConfigError(f"no image-size rule for model family {arch.family!r}", field="model.name_or_path")


def _phase_shapes(cfg: Any, phases: Mapping[str, Any], processes: int, image: tuple[int, int],
                  text_tokens: int) -> list[PhaseShape]:
    """Each phase's shapes from its trainer's settings, greedy baseline's and eval hook's generations."""
    shapes = []
    for name, spec in phases.items():
        b = spec.setting("per_device_train_batch_size")
        spg = spec.setting("steps_per_generation") or spec.setting("gradient_accumulation_steps")
        gen_batch = spec.setting("generation_batch_size")
        gen = gen_batch // processes if gen_batch else b * spg
        completion = spec.setting("max_completion_length")
        extra = []
        if getattr(spec.phase, "baseline", "group") == "greedy":
            groups = greedy_baseline_sequences(gen, spec.setting("num_generations"), processes)
            extra.append(("greedy baseline", groups, completion))
        if cfg.evaluation.eval_steps:
            sequences, how = evaluation_sequences(cfg)
            extra.append(("eval hook" + (", sampled" if how != "greedy" else ""), sequences,
                          cfg.evaluation.max_new_tokens))
        ckpt = cfg.model.gradient_checkpointing is not False  # None: on, as on a GPU
        shapes.append(PhaseShape(name, b, gen, text_tokens, image[0], image[1], completion, ckpt, tuple(extra)))
    return shapes


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:,.1f} M"


def _load_data(cfg: Any) -> tuple[Any, list[str]]:
    """The run's data splits and the check's data line (none without the hub, as ``--skip-data``)."""
    from cpr.training.splits import load_run_data

    try:
        splits = load_run_data(cfg)[0]
    except DatasetNotAvailableError as e:
        if not e.offline:
            raise DatasetNotAvailableError(f"{e.message}; or check the rest without the data: --check --skip-data",
                                           path=e.path, offline=False) from e
        return None, [f"data: not loaded: the Hugging Face hub cannot be reached from this machine ({e.path}); "
                      "checked without the data, as --skip-data does (the run loads it)"]
    return splits, ["data: " + ", ".join(f"{k} {v}" for k, v in splits.counts().items()) + " records, loaded and validated"]


def run_check(args: argparse.Namespace) -> int:
    """``cpr train --check`` (docs/training.md): print the validation, the parameter table and the memory tables.
    Returns 0, or 1 when ``--gpu-memory`` is given and no shown launcher fits in it. Raises ``ConfigError`` (an invalid config for N processes, bad LoRA targets or option, a source refusing
    its options), ``InputError`` (an invalid record: missing image, bad field) and ``ModelNotAvailableError``
    (no ``config.json`` for the model)."""
    from cpr.models import resolve_dtype
    from cpr.training import policy
    from cpr.training.build import build_phases
    from cpr.training.config import config_from_args
    from cpr.training.curriculum import empty_buckets_message

    launchers, n = list(LAUNCHERS), args.num_processes
    if n is not None and n < 1:
        raise ConfigError(f"must be >= 1, got {n}", field="--num-processes")
    if args.accelerate_config:
        launcher, n_file = launcher_from_accelerate_config(args.accelerate_config)
        launchers, n = [launcher], n or n_file
    n = n or 1
    with unittest.mock.patch.dict(os.environ, {"WORLD_SIZE": str(n)}):  # validated as on n processes
        cfg = config_from_args(args)
    data_lines, splits = ["data: not loaded (--skip-data)"], None
    if not args.skip_data:  # as the run loads it, so that a data error the run would hit is one here
        splits, data_lines = _load_data(cfg)
    folder = config_folder(cfg.model.name_or_path)
    phases = build_phases(cfg, str(folder))  # their GRPOConfigs are not built: no process state, no processor
    if splits is not None:
        for name, spec in phases.items():
            if empty := empty_buckets_message(spec.curriculum, splits.train.column("difficulty"), name):
                data_lines.append(f"warning: {empty}")
    arch, config = load_architecture(folder, policy.lora_config(cfg, str(folder)), include_vision=cfg.lora.include_vision)
    wb = 2 if cfg.model.dtype == "auto" else resolve_dtype(cfg.model.dtype, "cuda").itemsize  # auto: bf16 on GPUs
    image = _image_sizes(arch, config, folder, cfg)
    shapes = _phase_shapes(cfg, phases, n, image, args.prompt_tokens)
    print(f"config {args.config}: valid for {n} process{'es' if n > 1 else ''}; phases {', '.join(cfg.phases)}")
    print("\n".join(data_lines))
    print(f"model {cfg.model.name_or_path}: {arch.family}, config from {folder}, {'bf16' if wb == 2 else 'fp32'} weights")
    lm = [m for m in arch.lora_modules if _part(m) == "language"]
    kinds = sorted({m.rsplit(".", 1)[-1] for m in arch.lora_modules})
    print(f"LoRA r {cfg.lora.r}, alpha {cfg.lora.alpha}: {len(arch.lora_modules)} modules ({', '.join(kinds)}); "
          f"{len(lm)} in the language model, {len(arch.lora_modules) - len(lm)} in vision / projector")
    print(f"\n{'parameters':<12}{'total':>14}{'trainable':>14}")
    for part in ("vision", "projector", "language"):
        print(f"  {part:<10}{_fmt_params(arch.params[part]):>14}{_fmt_params(arch.trainable[part]):>14}")
    share = 100 * arch.lora_params / arch.total_params
    print(f"  {'all':<10}{_fmt_params(arch.total_params):>14}{_fmt_params(arch.lora_params):>14} ({share:.2f} %)")
    print(f"\nimages: {image[2]} ({image[1]} vision positions); prompt = {args.prompt_tokens} text tokens "
          f"(--prompt-tokens) + one image")
    if image[3]:
        print(f"warning: {image[3]}")
    if any(spec.setting("use_vllm") for spec in phases.values()):
        print("note: training.use_vllm: TRL's training rounds generate in vLLM, which reserves "
              "vllm_gpu_memory_utilization of each GPU (colocate mode); the 'gen:' rows below are for transformers' "
              "generate, which the greedy baseline and the eval hook use either way")
    fits = dict.fromkeys(launchers, True)
    for shape in shapes:
        others = "".join(f"; {what}: {g} at once, {c} new tokens" for what, g, c in shape.extra_generations)
        print(f"\nphase {shape.name}: {shape.gen_batch} sequences generated at once, {shape.train_batch} a micro-batch, "
              f"{shape.seq_tokens} tokens each ({shape.prompt_tokens} prompt + {shape.completion_tokens} completion); "
              f"gradient checkpointing {'on' if shape.checkpointing else 'off'}{others}")
        tables = {lc: estimate_memory(arch, shape, launcher=lc, processes=n, wb=wb, include_vision=cfg.lora.include_vision,
                                      dropout=cfg.lora.dropout > 0) for lc in launchers}
        table = tables[launchers[0]]
        if shape.extra_generations:
            largest = max(shape.generations, key=lambda gen: table[f"generation: {gen[0]}"])[0]
            print(f"  (gen: rows of the largest generation, {largest})")
        print(f"  {'per-GPU memory (GiB), ' + str(n) + ' processes':<40}" + "".join(f"{_LAUNCHER_NAMES[lc]:>9}" for lc in launchers))
        rows = [(row, row) for row in table
                if row not in ("generation", "training") and not row.startswith("generation: ")]
        rows += [(f"peak in generation: {what}", f"generation: {what}") for what, _, _ in shape.generations]
        for label, row in [*rows, ("peak in training", "training")]:
            print(f"  {label:<40}" + "".join(f"{tables[lc][row] / GIB:>9.2f}" for lc in launchers))
        if args.gpu_memory is not None:
            fits = {lc: fits[lc] and max(tables[lc]["generation"], tables[lc]["training"]) / GIB <= args.gpu_memory
                    for lc in launchers}
    if cfg.evaluation.final or cfg.evaluation.eval_steps:
        sequences, how = evaluation_sequences(cfg)
        final = estimate_evaluation_memory(arch, sequences=sequences, prompt_tokens=shapes[0].prompt_tokens,
                                           completion_tokens=cfg.evaluation.max_new_tokens, patches=image[1], wb=wb)
        print(f"\nfinal evaluation and checkpoint selection ({how}): {sequences} sequences generated at once, "
              f"{cfg.evaluation.max_new_tokens} new tokens; every launcher")
        for row, value in final.items():
            print(f"  {'peak in generation' if row == 'generation' else row:<40}{value / GIB:>9.2f}")
        if args.gpu_memory is not None and final["generation"] / GIB > args.gpu_memory:
            fits = dict.fromkeys(launchers, False)
    if args.gpu_memory is None:
        return 0
    ok = [_LAUNCHER_NAMES[lc] for lc, f in fits.items() if f]
    names = ", ".join(ok or [_LAUNCHER_NAMES[lc] for lc in launchers])
    print(f"\n{'fits' if ok else 'does not fit'} in {args.gpu_memory:g} GiB a GPU with {names}")
    return 0 if ok else 1


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """``--check`` and its options (``cpr train`` and the recipe)."""
    g = parser.add_argument_group("--check (no GPU, no weights: validate the run and estimate its per-GPU memory)")
    g.add_argument("--check", action="store_true", help="validate the config for N processes, build the model on the "
                   "meta device, check the LoRA targets, print parameters and a per-GPU memory estimate; train nothing")
    g.add_argument("--num-processes", type=int, default=None, help="processes (GPUs) of the launch (default: the "
                   "accelerate config's, else 1)")
    g.add_argument("--gpu-memory", type=float, default=None, metavar="GIB", help="exit 1 when the estimate exceeds this")
    g.add_argument("--accelerate-config", default=None, help="the launch's accelerate config: its DDP / ZeRO-2 / ZeRO-3 "
                   "column only (default: all three)")
    g.add_argument("--skip-data", action="store_true", help="do not load the datasets (by default they are loaded "
                   "and validated as the run does: every record, image and source option)")
    g.add_argument("--prompt-tokens", type=int, default=256, help="text tokens of a prompt besides the image (default 256)")

