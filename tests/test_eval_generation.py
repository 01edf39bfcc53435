"""Generation: greedy batches on the tiny model, resumable completions files, LoRA adapters."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cpr.data import load_records, load_templates
from cpr.errors import ConfigError, InputError
from cpr.evaluation.benchmarks.crystal import standard_messages
from cpr.evaluation.generation import (
    Generated,
    GenerationSettings,
    TransformersGenerator,
    generate_completions,
    load_model_for_eval,
    resolve_model_and_adapter,
)
from cpr.scoring import load_predictions


@pytest.fixture(scope="module")
def tiny():
    model, processor = load_model_for_eval("tiny:qwen2_5_vl", device="cpu")
    return model, processor


@pytest.fixture(scope="module")
def records(samples_dir):
    return load_records("mathvision", samples_dir / "mathvision" / "test_subset.jsonl", limit=5)


class Crash(RuntimeError):
    pass


@pytest.mark.slow
def test_interrupted_eval_resumes_without_regenerating(tiny, records, tmp_path, monkeypatch, one_thread):
    model, processor = tiny
    messages = standard_messages(load_templates(), "eval")
    calls: list[list[int]] = []
    real_generate = model.generate

    def counting_generate(*args, crash_after=None, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        if crash_after is not None and len(calls) > crash_after:
            raise Crash("killed mid-run")
        return real_generate(*args, **kwargs)

    out = tmp_path / "completions.jsonl"
    # Run 1 dies in its second generate call: the first batch of two is on disk.
    monkeypatch.setattr(model, "generate", lambda *a, **k: counting_generate(*a, crash_after=1, **k))
    with pytest.raises(Crash):
        generate_completions(
            TransformersGenerator(model, processor, 8), records, messages, batch_size=2, output_path=out,
            progress=False,
        )
    assert calls == [2, 2]
    first_lines = out.read_text().splitlines()
    assert [json.loads(line)["id"] for line in first_lines] == [r.id for r in records[:2]]
    with open(out, "a", encoding="utf-8") as f:  # a write cut by the kill
        f.write('{"id": "' + records[2].id + '", "compl')

    # Run 2 skips the two finished samples: batches of the three others only.
    calls.clear()
    monkeypatch.setattr(model, "generate", lambda *a, **k: counting_generate(*a, **k))
    resumed = generate_completions(
        TransformersGenerator(model, processor, 8), records, messages, batch_size=2, output_path=out, progress=False
    )
    assert calls == [2, 1]
    assert list(resumed) == [r.id for r in records]
    lines = out.read_text().splitlines()
    assert lines[:2] == first_lines and len(lines) == 5
    rows = [json.loads(line) for line in lines]
    assert [r["id"] for r in rows] == [r.id for r in records]
    assert all(set(r) == {"id", "completion", "num_tokens", "finished"} for r in rows)
    assert all(0 < r["num_tokens"] <= 8 for r in rows)

    # A third run generates nothing; an uninterrupted run gives the same completions (greedy).
    calls.clear()
    again = generate_completions(
        TransformersGenerator(model, processor, 8), records, messages, batch_size=2, output_path=out, progress=False
    )
    assert calls == [] and again == resumed
    fresh = generate_completions(
        TransformersGenerator(model, processor, 8), records, messages, batch_size=2, progress=False
    )
    assert fresh == resumed and calls == [2, 2, 1]


@pytest.mark.slow
def test_generator_uses_eval_mode_and_restores_train_mode(tiny, records, monkeypatch, one_thread):
    model, processor = tiny
    seen = {}
    real_generate = model.generate

    def spy(*args, **kwargs):
        seen["training"] = model.training
        seen["kwargs"] = {k: kwargs.get(k) for k in ("do_sample", "use_cache", "max_new_tokens", "synced_gpus")}
        seen["padding_left"] = bool((kwargs["attention_mask"][:, -1] == 1).all())
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    model.train()
    try:
        out = TransformersGenerator(model, processor, 4)([standard_messages(load_templates(), "train")(r)
                                                           for r in records[:2]])
    finally:
        model.eval()
    assert seen == {
        "training": False,
        # synced_gpus off: transformers would turn it on under ZeRO-3, and the main process generates alone
        "kwargs": {"do_sample": False, "use_cache": True, "max_new_tokens": 4, "synced_gpus": False},
        "padding_left": True,
    }
    assert len(out) == 2 and all(isinstance(g, Generated) for g in out)
    assert model.training is False  # restored by the finally above; the generator put it back to train
    model.train()
    TransformersGenerator(model, processor, 2)([standard_messages(load_templates(), "eval")(records[0])])
    assert model.training is True
    model.eval()


def test_generator_needs_left_padding():
    processor = SimpleNamespace(tokenizer=SimpleNamespace(padding_side="right"))
    with pytest.raises(ConfigError, match="field 'processor': batched generation needs a left-padding"):
        TransformersGenerator(object(), processor)


@pytest.mark.slow
def test_lora_adapter_loads_for_eval(tiny, records, tmp_path, one_thread):
    import torch
    from peft import PeftModel, get_peft_model

    from cpr.models import build_lora_config, resolve_model_path

    base, processor = load_model_for_eval("tiny:qwen2_5_vl", device="cpu")
    peft_model = get_peft_model(base, build_lora_config("qwen2_5_vl", r=4, alpha=8, dropout=0.0))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a trained-looking adapter (B = 0 would equal the base model)
    adapter_dir = tmp_path / "checkpoint-7"
    peft_model.save_pretrained(adapter_dir)
    peft_model.eval()

    messages = [standard_messages(load_templates(), "eval")(r) for r in records[:2]]
    expected = TransformersGenerator(peft_model, processor, 6)(messages)
    loaded, _ = load_model_for_eval("tiny:qwen2_5_vl", str(adapter_dir), device="cpu")
    assert isinstance(loaded, PeftModel) and not loaded.training
    assert TransformersGenerator(loaded, processor, 6)(messages) == expected
    inputs = TransformersGenerator(loaded, processor, 6)._inputs(messages)
    with torch.no_grad():
        plain = tiny[0](**inputs).logits
        adapted = loaded(**inputs).logits
    assert not torch.allclose(plain, adapted)

    # An adapter folder given as --model is read as that adapter on its base model.
    base_path = resolve_model_path("tiny:qwen2_5_vl")
    assert resolve_model_and_adapter(str(adapter_dir), None) == (base_path, str(adapter_dir))
    with pytest.raises(InputError, match="field '--adapter': not a PEFT adapter folder"):
        resolve_model_and_adapter("tiny:qwen2_5_vl", str(tmp_path))


def test_completions_file_errors(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "completion": "x"}\n{"id": "a", "completion": "y"}\n')
    with pytest.raises(InputError, match=rf"{path}:2 \(id a\) field 'id': duplicate id"):
        load_predictions(path, skip_truncated_tail=True)
    path.write_text('{"id": "a", "completion": 3}\n')
    with pytest.raises(InputError, match=rf"{path}:1 \(id a\) field 'completion': must be a string, got int"):
        load_predictions(path, skip_truncated_tail=True)
    path.write_text('{"id": "a", "completion": "x"}\n{"id": "b", "comp')
    assert list(load_predictions(path, skip_truncated_tail=True)[0]) == ["a"]
    path.write_text('{"id": "a", "completion": "x"}\nnot json\n{"id": "b", "completion": "y"}\n')
    with pytest.raises(InputError, match=rf"{path}:2: malformed JSON"):
        load_predictions(path, skip_truncated_tail=True)


def test_generate_completions_checks_generator_output(records):
    def short(batch):
        return [Generated("x", 1, True)]

    with pytest.raises(ValueError, match="generator returned 1 completions for 2 prompts"):
        generate_completions(short, records[:2], lambda r: [], batch_size=2, progress=False)
    with pytest.raises(ValueError, match="duplicate record id"):
        generate_completions(short, [records[0], records[0]], lambda r: [], progress=False)


def test_generation_settings_are_checked():
    assert GenerationSettings().max_new_tokens == 256 and GenerationSettings().prompt_mode == "eval"
    with pytest.raises(ConfigError, match="field 'max_new_tokens': must be a positive integer, got 0"):
        GenerationSettings(max_new_tokens=0)
    with pytest.raises(ConfigError, match=r"field 'prompt_mode': must be one of train, eval, got 'chat'"):
        GenerationSettings(prompt_mode="chat")
    with pytest.raises(ConfigError, match=r"field 'backend': must be one of auto, transformers, vllm"):
        GenerationSettings(backend="tgi")
