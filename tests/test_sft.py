"""Supervised LoRA fine-tuning (cpr.training.sft) on the embedded TabMWP samples.

Unit tests check the dataset TRL's SFTTrainer receives, the settings validation and the config
mapping. The slow tests build tiny models (tokenizer trained on the default corpus plus the
samples' texts) and check, against TRL's own vision-language collator, what ``max_length``
counts; then they train: the loss falls, only LoRA tensors move, and the saved adapter reloads
with PEFT and gives the same logits.

The tiny models are built with their final norm weight scaled by 8 (cpr_tools/tiny_models.py, OUTPUT_SCALE):
with random tied embeddings of std 0.02 and a norm weight of 1 every logit would be at most ~2.6
in size whatever LoRA learns, and the loss could not fall much below 5 nats.
"""

from __future__ import annotations

import json
import logging
import math

import pytest

from cpr.data import build_messages, load_records, load_templates, render_target, user_text
from cpr.errors import ConfigError, InputError
from cpr.training.sft import (
    ADAPTER_DIRNAME,
    SFTSettings,
    build_sft_config,
    check_example_lengths,
    example_lengths,
    run_sft,
    to_sft_dataset,
)


@pytest.fixture(scope="module")
def records(samples_dir):
    return load_records("tabmwp", samples_dir / "tabmwp" / "problems_test1k_subset.json")


@pytest.fixture(scope="module")
def templates():
    return load_templates()



# --------------------------------------------------------------------------------------------
# dataset
# --------------------------------------------------------------------------------------------


def test_to_sft_dataset_holds_grpo_prompt_and_target_json(records, templates):
    chosen = records[:3]
    ds = to_sft_dataset(chosen, templates)
    assert ds.column_names == ["prompt", "completion", "images", "id"]
    assert len(ds) == 3
    for row, record in zip(ds, chosen, strict=True):
        assert row["id"] == record.id
        # The prompt is exactly the GRPO training prompt (system + user with one image placeholder).
        assert row["prompt"] == build_messages(record, templates, mode="train")
        assert row["prompt"][0]["content"][0]["text"] == templates.system
        assert row["prompt"][1]["content"][0] == {"type": "image"}
        assert row["prompt"][1]["content"][1]["text"] == user_text(record, templates, mode="train")
        # One assistant message whose text is the target JSON of docs/method.md section 1.
        assert len(row["completion"]) == 1 and row["completion"][0]["role"] == "assistant"
        text = row["completion"][0]["content"][0]["text"]
        assert text == render_target(record)
        assert json.loads(text) == {"reasoning_steps": record.reference_steps, "answer": record.answer}
        # One decoded image per record, the file the record points at.
        assert len(row["images"]) == 1
        assert row["images"][0].size == record.load_images()[0].size


def test_to_sft_dataset_refuses_record_without_answer(records, templates):
    import dataclasses

    bad = dataclasses.replace(records[1], answer="  ")
    with pytest.raises(InputError) as err:
        to_sft_dataset([records[0], bad], templates)
    assert str(err.value) == f"(id {bad.id}) field 'answer': has no answer, so there is no SFT target"


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------


def test_default_settings_are_valid():
    SFTSettings().validate()
    SFTSettings(max_steps=5, max_length=None, report_to=["tensorboard"], extra={"weight_decay": 0.1}).validate()


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"max_steps": 0}, "max_steps", "must be a positive integer or -1 (use num_train_epochs), got 0"),
        ({"num_train_epochs": 0}, "num_train_epochs", "must be a number > 0, got 0"),
        ({"learning_rate": float("nan")}, "learning_rate", "must be a number > 0, got nan"),
        ({"learning_rate": -1e-5}, "learning_rate", "must be a number > 0, got -1e-05"),
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size", "must be a positive integer, got 0"),
        ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps", "must be a positive integer, got 1.5"),
        ({"max_length": 1}, "max_length", "must be an integer >= 2 or None, got 1"),
        ({"warmup_ratio": 1.0}, "warmup_ratio", "must be in [0, 1), got 1.0"),
        ({"save_strategy": "best"}, "save_strategy", "must be one of no, steps, epoch, got 'best'"),
        ({"report_to": []}, "report_to", "must be a tracker name or a non-empty list of names, got []"),
        ({"completion_only_loss": "yes"}, "completion_only_loss", "expected true or false, got 'yes'"),
        ({"seed": None}, "seed", "must be an integer, got None"),
        (
            {"extra": {"learning_rate": 1.0}},
            "extra.learning_rate",
            "is set by SFTSettings or run_sft itself; set the SFTSettings field instead",
        ),
        (
            {"extra": {"output_dir": "x"}},
            "extra.output_dir",
            "is set by SFTSettings or run_sft itself; set the SFTSettings field instead",
        ),
        ({"extra": {"num_generations": 4}}, "extra.num_generations", "not a trl.SFTConfig field"),
    ],
)
def test_invalid_settings_name_their_key(changes, key, message):
    settings = SFTSettings(**changes)
    with pytest.raises(ConfigError) as err:
        settings.validate(prefix="warm_start")
    assert str(err.value) == f"field 'warm_start.{key}': {message}"


def test_unknown_scheduler_is_refused():
    with pytest.raises(ConfigError, match=r"field 'sft\.lr_scheduler_type': unknown scheduler 'step'; known: linear"):
        SFTSettings(lr_scheduler_type="step").validate()


def test_build_sft_config_maps_settings(tmp_path):
    import torch

    settings = SFTSettings(
        max_steps=7,
        learning_rate=3e-4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        max_length=256,
        lr_scheduler_type="cosine",
        warmup_ratio=0.1,
        logging_steps=2,
        seed=5,
        extra={"weight_decay": 0.25},
    )
    settings.validate()
    model = torch.nn.Linear(2, 2)  # only its dtype is read
    cfg = build_sft_config(settings, tmp_path / "run", model)
    assert cfg.output_dir == str(tmp_path / "run")
    assert (cfg.max_steps, cfg.learning_rate, cfg.per_device_train_batch_size) == (7, 3e-4, 2)
    assert (cfg.gradient_accumulation_steps, cfg.max_length, cfg.logging_steps, cfg.seed) == (3, 256, 2, 5)
    assert cfg.lr_scheduler_type == "cosine"
    assert cfg.completion_only_loss is True
    assert cfg.report_to == []  # transformers' reading of "none"
    assert cfg.weight_decay == 0.25
    # transformers 5: a warmup_steps below 1 is a ratio of the training steps (ceil(0.1 * 7) = 1 step).
    assert cfg.warmup_steps == 0.1 and cfg.get_warmup_steps(7) == math.ceil(0.1 * 7)
    if not torch.cuda.is_available():
        assert cfg.use_cpu is True
        assert (cfg.bf16, cfg.fp16, cfg.activation_checkpointing) == (False, False, False)


# --------------------------------------------------------------------------------------------
# tiny models
# --------------------------------------------------------------------------------------------


def _tokenizer_texts(records, templates) -> list[str]:
    from cpr_tools.tiny_models import default_corpus

    return (
        default_corpus()
        + [templates.system]
        + [user_text(r, templates) for r in records]
        + [render_target(r) for r in records]
    )


@pytest.fixture(scope="module")
def tiny_paths(records, templates):
    """Tiny model folders, built on first use (tokenizer trained on the corpus + sample texts)."""
    from cpr_tools.tiny_models import ensure_tiny_model

    texts = _tokenizer_texts(records, templates)
    built: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in built:
            built[kind] = str(ensure_tiny_model(kind, texts=texts))
        return built[kind]

    return get


def _load(path: str, norm_scale: float = 1.0):
    import torch

    from cpr.models import load_model_and_processor

    model, processor = load_model_and_processor(path, device="cpu")
    if norm_scale != 1.0:
        with torch.no_grad():
            model.model.language_model.norm.weight.mul_(norm_scale)
    return model, processor


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_example_lengths_match_trl_collator(kind, tiny_paths, records, templates, one_thread):
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    _, processor = _load(tiny_paths(kind))
    ds = to_sft_dataset(records[:3], templates)
    lengths = example_lengths(ds, processor)
    full = DataCollatorForVisionLanguageModeling(processor=processor, max_length=None, completion_only_loss=True)
    for i, (n_prompt, n_image, n_completion) in enumerate(lengths):
        batch = full([dict(ds[i])])
        assert int(batch["attention_mask"].sum()) == n_prompt + n_completion
        assert int((batch["labels"] != -100).sum()) == n_completion  # completion-only loss
        assert int((batch["input_ids"] == processor.image_token_id).sum()) == n_image > 0
        if kind == "qwen2_5_vl":  # one token per 2x2 merged patches of the image grid
            assert n_image == int(batch["image_grid_thw"].prod()) // 4
        # The completion is the target JSON followed by the chat template's end of turn.
        labelled = batch["input_ids"][batch["labels"] != -100]
        decoded = processor.tokenizer.decode(labelled)
        assert decoded.startswith(render_target(records[i])) and decoded.rstrip().endswith("<|im_end|>")

    # max_length counts image tokens and truncation keeps the start: 5 tokens more than the prompt
    # keep the whole prompt (images included) and the first 5 completion tokens.
    n_prompt, n_image, _ = lengths[0]
    cut = DataCollatorForVisionLanguageModeling(processor=processor, max_length=n_prompt + 5, completion_only_loss=True)
    batch = cut([dict(ds[0])])
    assert batch["input_ids"].shape[1] == n_prompt + 5
    assert int((batch["labels"] != -100).sum()) == 5
    assert int((batch["input_ids"] == processor.image_token_id).sum()) == n_image


@pytest.mark.slow
def test_prompt_longer_than_max_length_is_an_error(tiny_paths, records, templates, tmp_path, caplog, one_thread):
    from cpr.models import build_lora_config

    model, processor = _load(tiny_paths("qwen2_5_vl"))
    chosen = records[:4]
    lengths = example_lengths(to_sft_dataset(chosen, templates), processor)
    shortest = min(p for p, _, _ in lengths)  # every prompt is at least this long
    p0, n0, _ = lengths[0]
    with pytest.raises(ConfigError) as err:
        run_sft(
            model,
            processor,
            chosen,
            templates,
            SFTSettings(max_steps=1, max_length=shortest),
            tmp_path,
            peft_config=build_lora_config("qwen2_5_vl"),
        )
    assert str(err.value) == (
        f"field 'sft.max_length': 4 of 4 prompts do not leave room for a completion token within "
        f"max_length={shortest}: the first, record {chosen[0].id!r}, takes {p0} tokens ({n0} of them "
        "image tokens), so truncation would cut its image tokens or its whole completion. Raise max_length or "
        "lower the image size (max_pixels)"
    )
    assert not (tmp_path / ADAPTER_DIRNAME).exists()

    # Prompts that fit but completions that do not: a warning with the count and the worst record.
    limit = max(p for p, _, _ in lengths) + 3
    over = [(i, p + c - limit) for i, (p, _, c) in enumerate(lengths) if p + c > limit]
    worst = max(over, key=lambda x: x[1])
    with caplog.at_level(logging.WARNING, logger="cpr.training.sft"):
        check_example_lengths(to_sft_dataset(chosen, templates), processor, limit)
    assert caplog.messages == [
        f"{len(over)} of 4 SFT examples exceed max_length={limit} and lose the end of their completion (the "
        f"closing brace and end-of-turn token); the worst, record {chosen[worst[0]].id!r}, loses {worst[1]} tokens"
    ]


@pytest.mark.slow
def test_run_sft_needs_a_lora_adapter(tiny_paths, records, templates, tmp_path, one_thread):
    from peft import PeftModel, get_peft_model

    from cpr.models import build_lora_config

    model, processor = _load(tiny_paths("qwen2_5_vl"))
    with pytest.raises(ConfigError) as err:
        run_sft(model, processor, records[:2], templates, SFTSettings(max_steps=1), tmp_path)
    assert str(err.value) == (
        "field 'lora': run_sft trains a LoRA adapter: pass peft_config (cpr.models.build_lora_config) or a PeftModel"
    )
    peft_model = get_peft_model(model, build_lora_config("qwen2_5_vl", r=4, alpha=8))
    with pytest.raises(ConfigError, match="the model is already a PeftModel: pass peft_config=None"):
        run_sft(
            peft_model, processor, records[:2], templates, SFTSettings(max_steps=1), tmp_path,
            peft_config=build_lora_config("qwen2_5_vl"),
        )
    adapter = tmp_path / "untrained"
    peft_model.save_pretrained(adapter)
    base, _ = _load(tiny_paths("qwen2_5_vl"))
    frozen = PeftModel.from_pretrained(base, adapter)  # is_trainable defaults to False
    with pytest.raises(ConfigError, match=r"is_trainable=True"):
        run_sft(frozen, processor, records[:2], templates, SFTSettings(max_steps=1), tmp_path)
    with pytest.raises(InputError, match="no training records for SFT"):
        run_sft(peft_model, processor, [], templates, SFTSettings(max_steps=1), tmp_path)


def _recorder():
    """A TrainerCallback that keeps the logged losses and the LoRA tensors as training starts."""
    import torch
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.losses: list[float] = []
            self.lora_at_start: dict = {}  # name -> (the parameter, a copy of its value at the start)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.lora_at_start = {
                n: (p, p.detach().clone()) for n, p in model.named_parameters() if "lora_" in n
            }

        def unchanged(self) -> list[str]:
            return [n for n, (p, start) in self.lora_at_start.items() if torch.equal(start, p.detach())]

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    return Recorder()


def _batch(processor, records, templates):
    messages = [build_messages(r, templates, mode="train", include_images=True) for r in records]
    return processor.apply_chat_template(
        messages,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True},
    )


@pytest.mark.slow
def test_sft_lora_learns_and_adapter_reloads(tiny_paths, records, templates, tmp_path, one_thread):
    import torch
    from peft import PeftModel

    from cpr.models import build_lora_config

    path = tiny_paths("qwen2_5_vl")
    model, processor = _load(path)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    chosen = records[:4]
    recorder = _recorder()
    settings = SFTSettings(
        max_steps=20, learning_rate=5e-3, per_device_train_batch_size=4, lr_scheduler_type="linear",
        warmup_ratio=0.1, logging_steps=1, seed=0,
    )
    adapter = run_sft(
        model, processor, chosen, templates, settings, tmp_path / "run",
        peft_config=build_lora_config("qwen2_5_vl", r=16, alpha=32, dropout=0.0), callbacks=[recorder],
    )

    # The loss on the 4 targets falls far: from about ln(vocab) to under a third of it.
    losses = recorder.losses
    assert len(losses) == 20
    assert losses[0] > 0.8 * math.log(len(processor.tokenizer))
    assert losses[-1] < losses[0] / 3, losses

    # Every LoRA tensor moved (lora_B starts at zero), no base weight did.
    assert len(recorder.lora_at_start) == 4 * 7 * 2  # 4 layers x 7 linears x (lora_A, lora_B)
    assert recorder.unchanged() == []
    assert all(torch.count_nonzero(p) > 0 for n, (p, _) in recorder.lora_at_start.items() if "lora_B" in n)
    after = dict(model.named_parameters())
    base_names = {n.replace(".base_layer.", "."): n for n in after if "lora_" not in n}
    assert set(base_names) == set(base_before)
    assert [n for n, orig in base_names.items() if not torch.equal(base_before[n], after[orig].detach())] == []

    # The adapter folder holds the adapter only (plus processor files), and the trainer state.
    files = {p.name for p in adapter.iterdir()}
    assert adapter == tmp_path / "run" / ADAPTER_DIRNAME
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert "model.safetensors" not in files
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (16, 32)
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert [h["loss"] for h in state["log_history"] if "loss" in h] == pytest.approx(losses)

    # Reloaded onto a fresh copy of the same base, the adapter gives the trained model's logits.
    batch = _batch(processor, chosen[:2], templates)
    assert not model.training
    with torch.no_grad():
        trained_logits = model(**batch).logits
    fresh, _ = _load(path)
    reloaded = PeftModel.from_pretrained(fresh, adapter).eval()
    with torch.no_grad():
        reloaded_logits = reloaded(**batch).logits
    torch.testing.assert_close(reloaded_logits, trained_logits, rtol=0, atol=1e-5)
    with reloaded.disable_adapter(), torch.no_grad():
        base_logits = reloaded(**batch).logits
    assert (base_logits - trained_logits).abs().max() > 1.0  # the adapter matters

    # A reloaded trainable PeftModel continues training (the warm start -> later phases path).
    resumed = PeftModel.from_pretrained(_load(path)[0], adapter, is_trainable=True)
    recorder2 = _recorder()
    again = run_sft(
        resumed, processor, chosen, templates, SFTSettings(max_steps=1, learning_rate=5e-3, logging_steps=1),
        tmp_path / "run2", callbacks=[recorder2],
    )
    assert recorder2.lora_at_start and recorder2.unchanged() == []
    assert recorder2.losses[0] < losses[0] / 3  # it starts where the first run ended, not from scratch
    assert (again / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_sft_lora_runs_on_tiny_internvl(tiny_paths, records, templates, tmp_path, one_thread):
    import torch

    from cpr.models import build_lora_config

    model, processor = _load(tiny_paths("internvl"))
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    recorder = _recorder()
    adapter = run_sft(
        model, processor, records[:4], templates,
        SFTSettings(max_steps=3, learning_rate=5e-3, per_device_train_batch_size=2, logging_steps=1),
        tmp_path / "run",
        peft_config=build_lora_config("internvl", r=8, alpha=16, dropout=0.0), callbacks=[recorder],
    )
    assert len(recorder.losses) == 3 and all(math.isfinite(x) for x in recorder.losses)
    assert len(recorder.lora_at_start) == 4 * 7 * 2 and recorder.unchanged() == []
    after = dict(model.named_parameters())
    base_names = {n.replace(".base_layer.", "."): n for n in after if "lora_" not in n}
    assert [n for n, orig in base_names.items() if not torch.equal(base_before[n], after[orig].detach())] == []
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
