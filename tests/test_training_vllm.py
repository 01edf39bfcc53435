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
def test_the_run_records_in_config_yaml_the_generation_settings_its_trainer_was_given(tmp_path, monkeypatch, use_vllm):
    """A run gives TRL's trainer ``generation_kwargs`` with the placeholder ban when ``use_vllm``, and its
    ``config.yaml``'s ``training_effective`` is the trainer's arguments (the ban used to be added after
    config.yaml was written). The trainer is stopped at construction (TRL's vLLM engine needs vLLM and a GPU);
    the launch check, which refuses ``use_vllm`` without vLLM installed, is skipped."""
    import yaml
    from conftest import tiny_run_config

    from cpr.training import preflight, trainer
    from cpr.training.build import effective_training_args
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment

    seen = {}

    def stop(*args, **kwargs):
        seen["args"] = kwargs["args"]
        raise _Built

    monkeypatch.setattr(trainer, "CprGRPOTrainer", stop)
    monkeypatch.setattr(preflight, "check_launch", lambda cfg, phases=None: None)
    training = {"per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 1, "use_vllm": use_vllm,
                "generation_kwargs": {"seed": 3}}
    cfg = config_from_dict(tiny_run_config("vllm", tmp_path / "run", heldout=0, training=training, phases=["cpr"],
                                           evaluation={"final": False}))
    with pytest.raises(_Built):
        run_experiment(cfg)
    args = seen["args"]
    assert args.use_vllm is use_vllm
    expected = {"seed": 3, "bad_words": ["<|image_pad|>", "<|video_pad|>"]} if use_vllm else {"seed": 3}
    assert args.generation_kwargs == expected
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))["training_effective"]
    assert recorded["cpr"]["generation_kwargs"] == expected
    assert recorded["cpr"] == yaml.safe_load(yaml.safe_dump(effective_training_args(args)))


def test_the_trainers_grpo_config_is_built_at_its_phase_and_equals_the_recorded_one(tmp_path):
    """Under DeepSpeed a GRPOConfig carries a DeepSpeedPlugin that accelerate refuses once an earlier phase's
    Accelerator exists, unless it was made after it: train_phase takes a new GRPOConfig of the spec's own
    keyword arguments (tests/test_deepspeed.py runs two phases under ZeRO-2/3), equal to what config.yaml records."""
    from conftest import tiny_run_config

    from cpr.training.build import build_phases, effective_training_args
    from cpr.training.config import config_from_dict

    cfg = config_from_dict(tiny_run_config("t", tmp_path, training={"max_steps": 2, "num_generations": 2,
                                                                   "per_device_train_batch_size": 2}))
    spec = list(build_phases(cfg).values())[-1]
    fresh = spec.trainer_args()
    assert fresh is not spec.args and fresh is not spec.trainer_args()
    assert effective_training_args(fresh) == effective_training_args(spec.args)
