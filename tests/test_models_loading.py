"""Model loading: family detection, offline errors, processor settings, pixel limits, LoRA targets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import tiny_model

from cpr.errors import ConfigError, InputError, ModelNotAvailableError
from cpr.models import (
    apply_pixel_limits,
    build_lora_config,
    detect_family,
    load_model_and_processor,
    lora_target_modules,
    resolve_dtype,
)

LM_MODULES = [
    f"model.language_model.layers.{i}.{m}"
    for i in range(4)
    for m in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
]
VISION_MODULES = {
    "qwen2_5_vl": [
        f"model.visual.blocks.{i}.{m}"
        for i in range(2)
        for m in ("attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    ]
    + ["model.visual.merger.mlp.0", "model.visual.merger.mlp.2"],
    "internvl": [
        f"model.vision_tower.encoder.layer.{i}.{m}"
        for i in range(2)
        for m in (
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.projection_layer",
            "mlp.fc1",
            "mlp.fc2",
        )
    ]
    + ["model.multi_modal_projector.linear_1", "model.multi_modal_projector.linear_2"],
}


def _image_tokens(processor, image, token: str) -> int:
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Q"}]}
    ]
    inputs = processor.apply_chat_template(
        [messages], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    return int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids(token)).sum())


# ---------------------------------------------------------------- family detection


def test_detect_family_from_names():
    assert detect_family("Qwen/Qwen2.5-VL-3B-Instruct") == "qwen2_5_vl"
    assert detect_family("OpenGVLab/InternVL3_5-4B-HF") == "internvl"
    # The remote-code format, which the auto classes cannot load.
    assert detect_family("OpenGVLab/InternVL3_5-4B") == "internvl_chat"


def test_detect_family_from_local_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl"}))
    assert detect_family(tmp_path) == "internvl"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    assert detect_family(str(tmp_path)) == "llava"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": []}))
    with pytest.raises(InputError) as err:
        detect_family(tmp_path)
    assert str(err.value) == f"{tmp_path / 'config.json'} field 'model_type': config.json has no model_type"


def test_detect_family_unknown_hub_name_offline():
    with pytest.raises(ModelNotAvailableError, match=r"model 'nobody-here/not-a-model' is not available"):
        detect_family("nobody-here/not-a-model")


# ---------------------------------------------------------------- offline errors


@pytest.mark.parametrize("name", ["nobody-here/not-a-model", "Qwen/Qwen2.5-VL-3B-Instruct"])
def test_missing_hub_model_raises_one_clear_error(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError) as err:
        load_model_and_processor(name)
    message = str(err.value)
    assert message.startswith(f"model {name!r} is not available: it is not a local folder")
    assert "HF_HUB_OFFLINE is set" in message
    assert f"hf download {name} --local-dir DIR" in message
    assert message.endswith(
        f"; download it where the hub is reachable (hf download {name} --local-dir DIR) and set the model path to DIR, "
        "or point HF_HOME at a cache that holds it"
    )
    # No chained traceback of hub retries.
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_missing_local_folder(tmp_path):
    missing = tmp_path / "no-model-here"
    with pytest.raises(ModelNotAvailableError) as err:
        load_model_and_processor(str(missing))
    assert str(err.value).startswith(
        f"model '{missing}' is not available: not an existing model folder. Pass an existing"
    )


# ---------------------------------------------------------------- dtype


def test_resolve_dtype():
    import torch

    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert resolve_dtype("float16", "cuda") is torch.float16
    with pytest.raises(ConfigError, match=r"^field 'dtype': unknown dtype 'int8'"):
        resolve_dtype("int8", "cpu")


# ---------------------------------------------------------------- loading the tiny models


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_load_tiny_defaults(kind):
    import torch

    folder = tiny_model(kind)
    assert detect_family(folder) == kind
    model, processor = load_model_and_processor(folder, device="cpu")
    assert type(model).__name__ == {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}.get(
        kind, "InternVLForConditionalGeneration"
    )
    assert model.dtype == torch.float32
    assert not model.is_activation_checkpointing  # CPU default: off
    assert processor.tokenizer.padding_side == "left"
    assert processor.tokenizer.pad_token == "<|endoftext|>"
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert model.config.get_text_config().pad_token_id == pad_id
    assert model.generation_config.pad_token_id == pad_id


def test_load_tiny_with_options(tiny_qwen):
    import torch

    model, _ = load_model_and_processor(
        tiny_qwen, dtype="bfloat16", gradient_checkpointing=True, attn_implementation="eager"
    )
    assert model.dtype == torch.bfloat16
    assert model.is_activation_checkpointing
    assert model.config._attn_implementation == "eager"


def test_qwen_pixel_limits(tiny_qwen):
    from PIL import Image

    # Defaults of the tiny processor: 3136..12544 pixels.  280x140 (39200 px) is scaled by
    # sqrt(39200/12544) = 1.768 and floored to multiples of 28: 56x140 -> 4x10 patches -> 10 tokens.
    _, processor = load_model_and_processor(tiny_qwen, device="cpu")
    assert _image_tokens(processor, Image.new("RGB", (280, 140)), "<|image_pad|>") == 10
    # max_pixels 3136: scale sqrt(12.5) = 3.536 -> 28x56 -> 2x4 patches -> 2 tokens.
    _, processor = load_model_and_processor(tiny_qwen, device="cpu", max_pixels=3136)
    assert processor.image_processor.size["longest_edge"] == 3136
    assert _image_tokens(processor, Image.new("RGB", (280, 140)), "<|image_pad|>") == 2
    # min_pixels 12544: a 28x28 image is scaled up by sqrt(12544/784) = 4 -> 112x112 -> 8x8 patches -> 16 tokens.
    _, processor = load_model_and_processor(
        tiny_qwen, device="cpu", min_pixels=12544, max_pixels=12544
    )
    assert _image_tokens(processor, Image.new("RGB", (28, 28)), "<|image_pad|>") == 16


def test_internvl_pixel_limits_set_tile_count(tiny_internvl):
    from PIL import Image

    # Tiles of 56x56 = 3136 px, 4 tokens each.  A 224x56 image (aspect 4): default max 2 tiles
    # -> grid 2x1 + thumbnail = 3 tiles = 12 tokens; max_pixels 4 tiles' worth -> 4x1 + thumbnail = 20 tokens.
    _, processor = load_model_and_processor(tiny_internvl, device="cpu")
    assert _image_tokens(processor, Image.new("RGB", (224, 56)), "<IMG_CONTEXT>") == 12
    _, processor = load_model_and_processor(
        tiny_internvl, device="cpu", max_pixels=4 * 3136
    )
    assert processor.image_processor.max_patches == 4
    assert _image_tokens(processor, Image.new("RGB", (224, 56)), "<IMG_CONTEXT>") == 20
    # A square image is one tile (4 tokens, no thumbnail) while min_patches is 1.  min_pixels of
    # 1.5 tiles -> min_patches 2: among the 2..4-tile grids a square image fits 2x2 exactly
    # -> 4 tiles + thumbnail = 20 tokens.
    assert _image_tokens(processor, Image.new("RGB", (56, 56)), "<IMG_CONTEXT>") == 4
    apply_pixel_limits(processor, "internvl", 4704, None)
    assert processor.image_processor.min_patches == 2
    assert _image_tokens(processor, Image.new("RGB", (56, 56)), "<IMG_CONTEXT>") == 20


def test_pixel_limit_errors(tiny_qwen):
    _, processor = load_model_and_processor(tiny_qwen, device="cpu")
    with pytest.raises(
        ConfigError, match=r"^field 'min_pixels': min_pixels \(5000\) is larger than max_pixels"
    ):
        apply_pixel_limits(processor, "qwen2_5_vl", 5000, 4000)
    with pytest.raises(
        ConfigError, match=r"^field 'min_pixels': min_pixels \(20000\) is larger than max_pixels"
    ):
        apply_pixel_limits(processor, "qwen2_5_vl", 20000, None)  # current max is 12544
    with pytest.raises(ConfigError, match=r"^field 'max_pixels': must be a positive integer, got 0"):
        apply_pixel_limits(processor, "qwen2_5_vl", None, 0)
    with pytest.raises(
        ConfigError, match=r"^field 'max_pixels': pixel limits are not supported for model family"
    ):
        apply_pixel_limits(processor, "llava", None, 1000)


# ---------------------------------------------------------------- LoRA targets


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
@pytest.mark.parametrize("include_vision", [False, True])
def test_lora_targets_match_exactly_the_intended_modules(kind, include_vision):
    import torch
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_model(kind))
    pattern = lora_target_modules(kind, include_vision=include_vision)
    linear_names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    matched = sorted(n for n in linear_names if re.fullmatch(pattern, n))
    expected = sorted(LM_MODULES + (VISION_MODULES[kind] if include_vision else []))
    assert matched == expected
    # PEFT itself wraps exactly these modules.
    peft_model = get_peft_model(
        model, build_lora_config(kind, r=4, alpha=8, dropout=0.0, include_vision=include_vision)
    )
    wrapped = sorted(
        n.removeprefix("base_model.model.") for n, m in peft_model.named_modules() if isinstance(m, LoraLayer)
    )
    assert wrapped == expected


def test_lora_config_fields_and_errors():
    cfg = build_lora_config("qwen2_5_vl", r=8, alpha=16, dropout=0.1)
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.bias) == (8, 16, 0.1, "none")
    assert cfg.target_modules == lora_target_modules("qwen2_5_vl")
    with pytest.raises(ConfigError, match=r"^field 'family': no LoRA targets for model family 'llava'"):
        build_lora_config("llava")
    with pytest.raises(ConfigError, match=r"^field 'lora.r': LoRA rank must be a positive integer, got 0"):
        build_lora_config("internvl", r=0)
    with pytest.raises(
        ConfigError, match=r"^field 'lora.dropout': LoRA dropout must be in \[0, 1\), got 1.0"
    ):
        build_lora_config("internvl", dropout=1.0)


# ---------------------------------------------------------------- generation


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_generate_on_image_and_text(kind, one_thread):
    import torch
    from PIL import Image

    model, processor = load_model_and_processor(tiny_model(kind), device="cpu")
    model.eval()

    def inputs_for(image):
        messages = [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "Area?"}],
            }
        ]
        return processor.apply_chat_template(
            [messages, messages],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            padding=True,
        )

    inputs = inputs_for(Image.new("RGB", (90, 60), (255, 0, 0)))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    prompt_len = inputs["input_ids"].shape[1]
    assert out.shape == (2, prompt_len + 5)
    assert torch.equal(out[:, :prompt_len], inputs["input_ids"])
    assert torch.equal(out[0], out[1])  # same prompt, greedy
    assert isinstance(processor.batch_decode(out[:, prompt_len:], skip_special_tokens=True)[0], str)
    # The image reaches the language model: another image changes the next-token logits.
    other = inputs_for(Image.new("RGB", (90, 60), (0, 0, 255)))
    with torch.no_grad():
        a = model(**inputs).logits[0, -1]
        b = model(**other).logits[0, -1]
    assert not torch.allclose(a, b)


# ---------------------------------------------------------------- adapter base check


def _model_folder(path: Path, vocab: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    (path / "tokenizer.json").write_text(vocab)
    (path / "model.safetensors").write_bytes(b"\x00" * 8)
    return path


def _adapter(path: Path, base: str) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 4}))
    return path


def test_adapter_base_check_compares_fingerprints_then_names(tmp_path, caplog):
    from cpr.models import base_fingerprint, check_adapter_base

    a = _model_folder(tmp_path / "models" / "qwen2_5_vl-aaaa", '{"vocab": ["x"]}')
    b = _model_folder(tmp_path / "models" / "qwen2_5_vl-bbbb", '{"vocab": ["y"]}')  # same config, other vocabulary
    copy = _model_folder(tmp_path / "elsewhere" / "copy-of-a", '{"vocab": ["x"]}')
    adapter = _adapter(tmp_path / "adapter", str(a))
    fa, fb = base_fingerprint(a), base_fingerprint(b)
    assert fa == base_fingerprint(copy) and fa != fb and len(fa) == 16
    assert base_fingerprint(tmp_path / "nothing") is None and base_fingerprint("org/not-cached") is None
    check_adapter_base(adapter, a)
    check_adapter_base(adapter, copy)  # the same model under another path
    with pytest.raises(ConfigError) as e:
        check_adapter_base(adapter, b, field="phase_settings.cpr.init_adapter")
    assert str(e.value) == (
        f"field 'phase_settings.cpr.init_adapter': LoRA adapter {adapter} was trained on base model {str(a)!r}, "
        f"not on {str(b)!r} (config, tokenizer or weights differ: fingerprint {fa} vs {fb}); load it on its own "
        "base, or set --allow-base-mismatch if both are the same model (e.g. hub ids that differ only in revision)"
    )
    with caplog.at_level("WARNING", logger="cpr.models"):
        check_adapter_base(adapter, b, allow_mismatch=True, override="model.allow_base_mismatch")
    assert caplog.messages[-1].startswith(f"model.allow_base_mismatch: LoRA adapter {adapter} was trained on")
    # hub ids that are not in the cache: compared by name
    hub = _adapter(tmp_path / "hub_adapter", "Qwen/Qwen2.5-VL-3B-Instruct")
    check_adapter_base(hub, "Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(ConfigError, match=r"not on 'Qwen/Qwen2.5-VL-7B-Instruct' \(the names differ and the recorded "
                       r"base is not here to compare\)"):
        check_adapter_base(hub, "Qwen/Qwen2.5-VL-7B-Instruct", field="--adapter")
