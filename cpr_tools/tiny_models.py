"""Tiny vision-language models for cpr's tests and offline demos (tooling, not part of the library).

No model hub is reachable where cpr's tests run, so tests and demos use *tiny* versions of the two
model families the paper trains, built from configs with random weights and saved with
``save_pretrained``; cpr loads the folder like any checkpoint. This module is the one place that
knows ``tiny:<kind>`` names (:func:`resolve`) and how a tiny model is built and cached::

    python -m cpr_tools.tiny_models qwen2_5_vl --out DIR [--config X.yaml]  # tokenizer also on X's training texts
    python -m cpr_tools.tiny_models --demo [CONFIG ...]                     # the demo configs' models, where missing

* :func:`build_tiny_qwen2_5_vl`: ``Qwen2_5_VLForConditionalGeneration`` + ``Qwen2_5_VLProcessor``.
* :func:`build_tiny_internvl`: HF-format ``InternVLForConditionalGeneration`` (the format of
  ``OpenGVLab/InternVL3_5-4B-HF``: InternViT + Qwen3) + ``InternVLProcessor``.

Both get a byte-level BPE tokenizer trained in-process (Qwen's normalizer, pre-tokenizer and
decoder), so any text can be encoded. Facts about transformers 5.24 the builders rely on:

* ``Qwen2_5_VLConfig``: token ids belong in ``text_config``; ``rope_parameters["mrope_section"]``
  must sum to ``head_dim / 2`` (:func:`mrope_section`). The image processor's pixel limits are
  ``size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}``; images are resized to
  multiples of 28 px and give ``h * w / 28**2`` image tokens. The video processor needs torchvision.
* ``InternVLProcessor`` reads ``tokenizer.start_image_token`` / ``end_image_token`` /
  ``context_image_token`` / ``video_token`` (and ``*_id``), saved as named special tokens.
  ``image_seq_length`` must equal ``(tile / patch)**2 * downsample_ratio**2`` and the vision
  config's ``image_size`` the image processor's tile ``size``.
* TRL's GRPOTrainer suppresses ``config.image_token_id`` during generation and pads with
  ``tokenizer.pad_token`` (``<|endoftext|>``; eos ``<|im_end|>``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

#: Prefix of model names that resolve to a tiny model (``tiny:qwen2_5_vl``, ``tiny:internvl``).
TINY_PREFIX = "tiny:"
#: The kinds of tiny model :func:`ensure_tiny_model` can build.
TINY_KINDS = ("qwen2_5_vl", "internvl")
#: Bump when a builder changes what it writes: the cache key includes it.
BUILDER_VERSION = 2
#: The demo configs' models (folder relative to the repository -> kind, the config that names the folder
#: and whose training texts the tokenizer also learns); the demo recipes build them where missing.
DEMO_MODELS = {
    "outputs/models/demo": ("qwen2_5_vl", "recipes/configs/demo.yaml"),
    "outputs/models/demo_tabmwp": ("qwen2_5_vl", "recipes/configs/demo_tabmwp.yaml"),
}

#: Scale of the language model's final norm weight. With random tied embeddings (std 0.02) and
#: a norm weight of 1 no logit can exceed about 2.6, so the loss cannot fall below about 5 nats
#: a token whatever a LoRA adapter learns, and sampling stays near uniform: a supervised LoRA
#: warm start could not teach the output format. A weight of 8 lifts that cap (measured:
#: 150 LoRA steps then give valid JSON for all greedy completions of the trained prompts).
OUTPUT_SCALE = 8.0


def _scale_output(model: Any) -> None:
    import torch

    with torch.no_grad():
        model.model.language_model.norm.weight.mul_(OUTPUT_SCALE)


#: Qwen's special tokens (names and strings as in Qwen2.5-VL's tokenizer).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
#: InternVL's image tokens, by the tokenizer attribute names ``InternVLProcessor`` reads.
INTERNVL_IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}

#: Qwen2.5-VL's chat template (as published with ``Qwen/Qwen2.5-VL-3B-Instruct``): a default
#: system turn, ``<|vision_start|><|image_pad|><|vision_end|>`` per image.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: InternVL's HF-format chat template (the one transformers' InternVL conversion script writes):
#: ``<IMG_CONTEXT>`` per image, which the processor expands.
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2's pre-tokenizer split pattern (transformers/models/qwen2/tokenization_qwen2.py).
_QWEN_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_REASONING_WORDS = (
    "First Second Third Next Then Finally So Therefore Thus Hence Since Because We know that "
    "the answer is Step Let us find compute calculate count add subtract multiply divide total "
    "sum difference product quotient each per more less than equal equals greater smaller "
    "largest smallest how many much what which whose when where who table shows row column "
    "value values number numbers price cost dollars cents hours minutes days weeks years "
    "area perimeter length width height radius diameter circle triangle square rectangle "
    "angle degrees side sides parallel perpendicular line lines point points figure image "
    "shown below above left right top bottom color red blue green yellow black white shape "
    "option options choice choose correct incorrect true false yes no not and or of in on to "
    "for with from by is are was were be it this that these those there their its a an as "
    "at if one two three four five six seven eight nine ten half twice times mean median "
    "mode range frequency probability fraction ratio percent rate speed distance time "
    "question solution reasoning conclusion observe notice look read remaining left over "
    "subtracting adding multiplying dividing gives get got becomes result results final"
)


def default_corpus() -> list[str]:
    """The built-in tokenizer training corpus (deterministic, about 39 kB of text, ~810 BPE tokens).

    It covers JSON punctuation (the ``{"steps": [...], "answer": ...}`` completions cpr
    rewards), digits and arithmetic, letters and multiple-choice options, LaTeX fragments
    and the words of typical reasoning steps.  Returns a list of strings.
    """
    words = _REASONING_WORDS.split()
    texts: list[str] = []
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    texts.append(letters + " " + letters.lower() + " 0123456789")
    texts.append("{ } [ ] ( ) , : ; . \" ' ! ? + - * / = < > % $ # & @ ^ _ \\ | ~ `")
    for i in range(0, 400, 3):
        a, b = i % 97 + 1, (i * 7) % 53 + 2
        w1, w2, w3 = words[i % len(words)], words[(i * 3 + 1) % len(words)], words[(i * 5 + 2) % len(words)]
        steps = [
            f"Step 1: The {w1} of the {w2} is {a}.",
            f"Step 2: {w3.capitalize()} {a} + {b} = {a + b}.",
            f"Step 3: So {a + b} - {b % 10} = {a + b - b % 10}, and {a} x {b} = {a * b}.",
        ]
        answer = str(a + b) if i % 2 else letters[i % 5]
        texts.append(json.dumps({"steps": steps, "answer": answer}))
        texts.append(f"Question: What is the {w1} {w2}? Choices: (A) {a} (B) {b} (C) {a + b} (D) {a * b}")
        texts.append(
            f"$\\frac{{{a}}}{{{b}}}$ = {a / b:.2f}, $\\sqrt{{{a}}}$, {a}^\\circ, {a} \\times {b}, {a}%"
        )
    for j in range(0, len(words), 8):
        texts.append(" ".join(words[j : j + 8]).capitalize() + ".")
    return texts


def mrope_section(head_dim: int) -> list[int]:
    """Split ``head_dim / 2`` rotary frequencies into (temporal, height, width) sections.

    Qwen2.5-VL's multimodal RoPE needs ``sum(mrope_section) == head_dim // 2``; the real
    models use ``[16, 24, 24]`` for head_dim 128, i.e. 1/4, 3/8, 3/8 of the frequencies.
    Raises ``ConfigError`` when ``head_dim`` is odd or smaller than 8.
    """
    if head_dim % 2 or head_dim < 8:
        raise ConfigError(f"head_dim must be even and >= 8, got {head_dim}", field="hidden_size")
    half = head_dim // 2
    temporal = max(1, half // 4)
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def train_byte_level_bpe(
    texts: Iterable[str], vocab_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE (Qwen2's normalizer and pre-tokenizer) on ``texts``.

    Args:
        texts: training texts.
        vocab_size: size of the BPE vocabulary (special tokens not included); it is smaller
            when the texts do not contain enough distinct merges.

    Returns:
        ``(vocab, merges)`` for ``Qwen2Tokenizer(vocab=..., merges=...)``.  The 256 byte symbols
        are always in the vocabulary, so every string is encodable.  Deterministic for given
        texts (the ``tokenizers`` BPE trainer breaks count ties by pair order).
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def _build_tokenizer(texts: Iterable[str] | None, vocab_size: int, extra_named: dict[str, str] | None):
    """Qwen2Tokenizer with a BPE trained on ``texts`` and Qwen's special tokens appended."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    extra_named = dict(extra_named or {})
    specials = list(QWEN_SPECIAL_TOKENS) + [t for t in extra_named.values() if t not in QWEN_SPECIAL_TOKENS]
    if vocab_size < 256 + len(specials) + 1:
        raise ConfigError(
            f"vocab_size must be at least {256 + len(specials) + 1} (256 byte symbols + special tokens)",
            field="vocab_size",
        )
    corpus = list(texts) if texts is not None else default_corpus()
    vocab, merges = train_byte_level_bpe(corpus, vocab_size - len(specials))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=32768,
        **extra_named,
    )
    # Order matters for the ids: the special tokens follow the BPE vocabulary, as in Qwen.
    tokenizer.add_special_tokens(
        {"extra_special_tokens": [AddedToken(t, special=True, normalized=False) for t in specials]},
        replace_extra_special_tokens=True,
    )
    return tokenizer


def _save_generation_config(model: Any, tokenizer: Any) -> None:
    from transformers import GenerationConfig

    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )


def _save(model: Any, processor: Any, chat_template: str, output_dir: Path) -> Path:
    """Scale the output norm (:data:`OUTPUT_SCALE`), save model and processor; returns ``output_dir``."""
    processor.tokenizer.chat_template = chat_template
    _scale_output(model)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    return output_dir


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch


def _language_model(texts: Iterable[str] | None, vocab_size: int, extra_tokens: Any, hidden_size: int,
                    num_layers: int) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """The tokenizer, the ``text_config`` entries both tiny builders share and the ids of
    :data:`QWEN_SPECIAL_TOKENS`; the shared entries: 4 attention heads (2 key/value
    heads), MLP 2x wide, 4096 positions, Qwen's special tokens as bos / eos / pad.
    Raises ``ConfigError`` when ``hidden_size`` is not a multiple of 4."""
    heads = 4
    if hidden_size % heads:
        raise ConfigError(
            f"hidden_size must be a multiple of {heads}, got {hidden_size}", field="hidden_size"
        )
    tokenizer = _build_tokenizer(texts, vocab_size, extra_tokens)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    return tokenizer, {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }, ids


def build_tiny_qwen2_5_vl(
    output_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 2000,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
) -> Path:
    """Build and save a tiny ``Qwen2_5_VLForConditionalGeneration`` with its processor.

    Args:
        output_dir: folder to write (created; existing files are overwritten).
        texts: tokenizer training texts (default :func:`default_corpus`).
        vocab_size: tokenizer size target (BPE merges + 7 special tokens); the model's
            vocabulary is the tokenizer's actual length.
        hidden_size: language model width; 4 attention heads (2 key/value heads), MLP 2x wide.
        num_layers: language model decoder layers.
        seed: torch seed for the random weights.

    Vision tower: depth 2, width 32, 2 heads, patch 14, spatial merge 2, temporal patch 2
    (the real semantics), window 112 px.  Image processor: min_pixels 28*28*4, max_pixels
    28*28*16, so an image gives 4 to 16 image tokens.  About 0.8 M parameters at the defaults.

    Returns the output folder.  Deterministic for given arguments.
    Raises ``ConfigError`` for sizes the architecture cannot take.
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    output_dir = Path(output_dir)
    tokenizer, text_config, ids = _language_model(texts, vocab_size, None, hidden_size, num_layers)
    head_dim = hidden_size // text_config["num_attention_heads"]

    config = Qwen2_5_VLConfig(
        text_config={
            **text_config,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": mrope_section(head_dim),
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "tokens_per_second": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    _seeded(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    _save_generation_config(model, tokenizer)

    pixels = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 16}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            size=pixels, patch_size=14, merge_size=2, temporal_patch_size=2
        ),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(
            size=pixels, patch_size=14, merge_size=2, temporal_patch_size=2
        ),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )
    return _save(model, processor, QWEN2_5_VL_CHAT_TEMPLATE, output_dir)


def build_tiny_internvl(
    output_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 2000,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
) -> Path:
    """Build and save a tiny HF-format ``InternVLForConditionalGeneration`` with its processor.

    Same architecture family as ``OpenGVLab/InternVL3_5-4B-HF``: an InternViT vision tower,
    pixel-shuffle (downsample ratio 0.5) + MLP projector, a Qwen3 language model.

    Args: as :func:`build_tiny_qwen2_5_vl` (the tokenizer also holds ``<img>``, ``</img>``,
    ``<IMG_CONTEXT>``, ``<video>``).

    Vision tower: 2 layers, width 32, 2 heads, tiles of 56x56 px in 14 px patches, so a tile
    gives ``(56/14)**2 * 0.5**2 = 4`` image tokens (``image_seq_length``).  Image processor:
    ``GotOcr2ImageProcessor`` with tiles of 56 px, 1 to 2 tiles (+1 thumbnail when 2).
    About 0.8 M parameters at the defaults.

    Returns the output folder.  Deterministic for given arguments.
    """
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    tile, patch, downsample = 56, 14, 0.5
    image_seq_length = int((tile // patch) ** 2 * downsample**2)
    output_dir = Path(output_dir)
    tokenizer, text_config, _ = _language_model(texts, vocab_size, INTERNVL_IMAGE_TOKENS, hidden_size, num_layers)

    config = InternVLConfig(
        text_config={
            **text_config,
            "model_type": "qwen3",
            "head_dim": hidden_size // text_config["num_attention_heads"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": True,
        },
        vision_config={
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "image_size": [tile, tile],
            "patch_size": [patch, patch],
            "norm_type": "layer_norm",
            "use_qk_norm": False,
            "attention_bias": True,
            "use_mean_pooling": True,
            "use_absolute_position_embeddings": True,
        },
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=image_seq_length,
        downsample_ratio=downsample,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    config.architectures = ["InternVLForConditionalGeneration"]
    _seeded(seed)
    model = InternVLForConditionalGeneration(config)
    _save_generation_config(model, tokenizer)

    size = {"height": tile, "width": tile}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1, max_patches=2),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=size),
        image_seq_length=image_seq_length,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )
    return _save(model, processor, INTERNVL_CHAT_TEMPLATE, output_dir)


_BUILDERS = {"qwen2_5_vl": build_tiny_qwen2_5_vl, "internvl": build_tiny_internvl}


def default_cache_dir() -> Path:
    """Cache folder of tiny models: ``$CPR_CACHE_DIR/tiny_models`` or ``~/.cache/cpr/tiny_models``."""
    root = os.environ.get("CPR_CACHE_DIR")
    return Path(root) / "tiny_models" if root else Path.home() / ".cache" / "cpr" / "tiny_models"


def parse_tiny_name(name: str) -> str | None:
    """Return the kind of a ``tiny:<kind>`` model name, ``None`` for any other name.

    Raises ``ConfigError`` (field ``model``) for ``tiny:`` names of an unknown kind.
    """
    if not isinstance(name, str) or not name.startswith(TINY_PREFIX):
        return None
    kind = name[len(TINY_PREFIX) :]
    if kind not in TINY_KINDS:
        raise ConfigError(
            f"unknown tiny model {name!r}; expected one of {', '.join(TINY_PREFIX + k for k in TINY_KINDS)}",
            field="model",
        )
    return kind


def resolve(name: str) -> str:
    """The folder of a ``tiny:<kind>`` name (built into the default cache on first use); any other
    name (a folder, a hub id) unchanged. Raises ``ConfigError`` for an unknown tiny kind."""
    kind = parse_tiny_name(name)
    return name if kind is None else str(ensure_tiny_model(kind))


def record_texts(records: Iterable[Any]) -> list[str]:
    """Tokenizer training texts for a model that will see ``records``: :func:`default_corpus` plus
    each record's question and target JSON (``cpr.data.render_target``), sorted and de-duplicated."""
    from cpr.data import render_target

    return default_corpus() + sorted({t for r in records for t in (r.question, render_target(r))})


def config_texts(config: Any) -> list[str]:
    """:func:`record_texts` of the training split of an experiment config (a file, or a loaded
    ``ExperimentConfig``): the records its warm start and GRPO phases train on, not the held-out ones."""
    from cpr.training.config import load_config
    from cpr.training.splits import load_splits

    cfg = load_config(config) if isinstance(config, (str, Path)) else config
    return record_texts(load_splits(cfg.data).train)


def _cache_key(kind: str, params: dict[str, Any]) -> str:
    import tokenizers
    import transformers

    payload = dict(params)
    texts = payload.pop("texts", None)
    h = hashlib.sha256()
    h.update(json.dumps(payload, sort_keys=True).encode())
    h.update(f"|v{BUILDER_VERSION}|tf{transformers.__version__}|tok{tokenizers.__version__}|".encode())
    if texts is None:
        h.update(b"default-corpus")
    else:
        for t in texts:
            h.update(len(t).to_bytes(8, "little"))
            h.update(t.encode("utf-8"))
    return f"{kind}-{h.hexdigest()[:16]}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic rename alone protects the folder
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _main_process_first() -> contextlib.AbstractContextManager:
    """Under an initialised ``torch.distributed`` group, rank 0 runs the block first while the others
    wait: transformers saves a model on rank 0 only. Elsewhere a no-op."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from accelerate import PartialState

        return PartialState().main_process_first()
    return contextlib.nullcontext()


def build_at(folder: str | Path, kind: str, **params: Any) -> Path:
    """Build a tiny model of ``kind`` into ``folder`` unless it already holds one (``config.json``).

    The model is built in a temporary folder next to it and renamed into place (atomic), under a file
    lock, so concurrent processes neither corrupt nor rebuild it. ``params``: the builder's arguments.

    Raises ``ConfigError`` for an unknown kind; ``RuntimeError`` when the build wrote no files (a
    process other than rank 0 of a ``torch.distributed`` group: build on the main process first).
    """
    if kind not in _BUILDERS:
        raise ConfigError(
            f"unknown tiny model kind {kind!r}; expected one of {', '.join(TINY_KINDS)}", field="kind"
        )
    target = Path(folder)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if (target / "config.json").is_file():  # built by another process while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        try:
            _BUILDERS[kind](tmp, **params)
            if not (tmp / "config.json").is_file():  # transformers writes a model on rank 0 only
                raise RuntimeError(
                    f"building {target.name} wrote no config.json: under torch.distributed only rank 0 saves a "
                    "model, so build tiny models on the main process first"
                )
            if target.exists():  # a half-written folder from an older, unlocked writer
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def ensure_tiny_model(
    kind: str,
    cache_dir: str | Path | None = None,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 2000,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
) -> Path:
    """Return the folder of a tiny model of ``kind`` in the cache, building it on first use.

    The folder is ``<cache_dir>/<kind>-<hash>``, the hash covering the builder arguments (texts
    included), :data:`BUILDER_VERSION` and the transformers / tokenizers versions; it is built by
    :func:`build_at`, by the main process first under ``torch.distributed``.

    Args:
        kind: ``"qwen2_5_vl"`` or ``"internvl"``.
        cache_dir: cache root (default :func:`default_cache_dir`).
        texts: tokenizer training texts (default :func:`default_corpus`; see :func:`record_texts`).
        vocab_size, hidden_size, num_layers, seed: passed to the builder.

    Raises ``ConfigError`` for an unknown kind, ``OSError`` from the file system.
    """
    params = {"texts": list(texts) if texts is not None else None, "vocab_size": vocab_size,
              "hidden_size": hidden_size, "num_layers": num_layers, "seed": seed}
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    with _main_process_first():
        return build_at(root / _cache_key(kind, params), kind, **params)


def build_demo_models(*configs: str | Path, root: str | Path = REPO) -> list[Path]:
    """Build the :data:`DEMO_MODELS` of the demo ``configs`` (all of them when none is given) under
    ``root`` where missing. Returns their folders."""
    wanted = {Path(c).resolve() for c in configs}
    folders = []
    for rel, (kind, config) in DEMO_MODELS.items():
        folder = Path(root) / rel
        if wanted and (Path(root) / config).resolve() not in wanted:
            continue
        if not (folder / "config.json").is_file():
            print(f"building the tiny {kind} model of {config} into {folder}", file=sys.stderr)
            build_at(folder, kind, texts=config_texts(Path(root) / config))
        folders.append(folder)
    return folders


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (``--help``); returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", nargs="?", choices=TINY_KINDS, help="the model family to build")
    parser.add_argument("--out", help="the folder to write (kept when it already holds a model)")
    parser.add_argument("--config", help="an experiment config: the tokenizer also learns its training texts")
    parser.add_argument("--demo", nargs="*", metavar="CONFIG",
                        help="build the models of these demo configs (default: all) where missing")
    args = parser.parse_args(argv)
    if args.demo is not None:
        for folder in build_demo_models(*args.demo):
            print(folder)
        return 0
    if not (args.kind and args.out):
        parser.error("give KIND and --out DIR, or --demo")
    texts = config_texts(args.config) if args.config else None
    print(build_at(args.out, args.kind, texts=texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
