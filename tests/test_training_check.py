"""``cpr train --check``: validation for N processes, meta-device build, LoRA targets, parameter counts,
the memory estimate, and its activation part against tensors measured on the tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import tiny_model

from cpr.cli import main
from cpr.errors import ConfigError
from cpr.training.check import (
    GIB,
    PhaseShape,
    config_folder,
    estimate_evaluation_memory,
    estimate_memory,
    greedy_baseline_sequences,
    launcher_from_accelerate_config,
    load_architecture,
    saved_activation_bytes,
)

REPO = Path(__file__).resolve().parents[1]
QWEN_YAML = str(REPO / "recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml")
INTERNVL_YAML = str(REPO / "recipes/configs/internvl3_5_4b_cpr_curriculum.yaml")
DEMO_YAML = str(REPO / "recipes/configs/demo.yaml")


def _paper_arch(name: str, r: int = 64):
    from cpr.models import build_lora_config

    folder = config_folder(name)
    family = "qwen2_5_vl" if "Qwen" in name else "internvl"
    return load_architecture(folder, build_lora_config(family, r=r, alpha=2 * r), include_vision=False)[0]


def test_paper_model_parameters_match_the_published_architecture():
    # Qwen2.5-VL-3B, from its published layer sizes: decoder layer = q (2048x2048 + bias) + k, v (2048x256 + bias)
    # + o (2048x2048) + MLP 3 x 2048 x 11008 + 2 norms; tied 151936 x 2048 embedding; vision: patch embed
    # 3x2x14x14x1280, 32 blocks of 19,702,200, merger RMSNorm 1280 + MLP 5120x5120+5120 + 5120x2048+2048.
    layer = (2048 * 2048 + 2048) + 2 * (2048 * 256 + 256) + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048
    assert layer == 77_076_992
    qwen = _paper_arch("Qwen/Qwen2.5-VL-3B-Instruct")
    assert qwen.params["language"] == 36 * layer + 151936 * 2048 + 2048
    assert qwen.params["vision"] == 3 * 2 * 14 * 14 * 1280 + 32 * 19_702_200
    assert qwen.params["projector"] == 1280 + 5120 * 5120 + 5120 + 5120 * 2048 + 2048
    assert qwen.total_params == 3_754_622_976  # the published 3.75 B
    # LoRA r 64 on q, k, v, o, gate, up, down: r x (in + out) each
    lora = 64 * ((2048 + 2048) + 2 * (2048 + 256) + (2048 + 2048) + 3 * (2048 + 11008))
    assert qwen.trainable == {"vision": 0, "projector": 0, "language": 36 * lora}
    assert qwen.lm_lora_in == 5 * 2048 + 2048 + 11008 and qwen.lm_lora_rank == 7 * 64

    # InternVL3.5-4B: Qwen3-4B decoder (q 2560x4096, k, v 2560x1024, o 4096x2560, q/k norms of 128, MLP 3 x 2560
    # x 9728) and an untied 151936 x 2560 LM head, which the published total of 4.73 B needs.
    layer = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128
    internvl = _paper_arch("OpenGVLab/InternVL3_5-4B-HF")
    assert internvl.params["language"] == 36 * layer + 2 * 151936 * 2560 + 2560
    assert internvl.total_params == 4_732_489_216
    assert internvl.qk_norm and not qwen.qk_norm and qwen.vision_gated and not internvl.vision_gated


def test_memory_estimate_components_for_the_qwen_paper_run():
    arch = _paper_arch("Qwen/Qwen2.5-VL-3B-Instruct")
    # phase cpr: 5 a micro-batch, 2 steps a generation; 256 text + 768 image tokens + 256 completion tokens
    shape = PhaseShape("cpr", 5, 10, 256, 768, 3072, 256, True)
    z3 = estimate_memory(arch, shape, launcher="zero3", processes=4)
    ddp = estimate_memory(arch, shape, launcher="ddp", processes=4)
    assert z3["weights (shard)"] == 3_754_622_976 * 2 // 4
    assert ddp["weights (shard)"] == 3_754_622_976 * 2
    assert z3["gen: gathered weights"] == 3_754_622_976 * 2 and ddp["gen: gathered weights"] == 0
    # K and V, 36 layers x 2 KV heads x 128 x 2 bytes, for 10 sequences of 1280 tokens
    assert z3["gen: KV cache"] == 2 * 36 * 256 * 2 * 10 * 1280
    assert ddp["LoRA weights, grads, Adam"] == 20 * arch.lora_params
    assert z3["LoRA weights, grads, Adam"] == 16 * arch.lora_params // 4 + 4 * arch.lora_params // 4
    # gradient checkpointing keeps each decoder layer's bf16 input: 36 x 5 x 1280 tokens x 2048 x 2 bytes (+ the rest)
    assert z3["train: activations"] > 36 * 5 * 1280 * 2048 * 2
    assert z3["training"] < ddp["training"] and 4 * GIB < z3["training"] < 20 * GIB


def test_every_generation_of_a_phase_is_a_peak_of_its_own():
    """Issue 33: the greedy baseline's and the eval hook's generations are counted besides TRL's rounds; the
    ``gen:`` rows are the largest one's; the final evaluation holds the whole model and one fp32 adapter."""
    arch = _paper_arch("Qwen/Qwen2.5-VL-3B-Instruct")
    shape = PhaseShape("cpr", 5, 10, 256, 768, 3072, 256, True,
                       (("greedy baseline", 2, 256), ("eval hook, sampled", 64, 128)))
    z3 = estimate_memory(arch, shape, launcher="zero3", processes=4)
    kv = 2 * 36 * 256 * 2  # bytes of K and V a token
    assert z3["gen: KV cache"] == kv * 64 * (1024 + 128)  # the eval hook's 16 x 4 sampled rows, the largest
    rounds, greedy, hook = (z3[f"generation: {w}"] for w in ("training rounds", "greedy baseline", "eval hook, sampled"))
    assert z3["generation"] == hook == max(rounds, greedy, hook)
    # the same model and optimizer state; each generation's KV cache, prefill and logits scale with its sequences
    lm_prefill = 2 * 2 * 2048 + max(8 * 2048 + 2 * (2 * 2048 + 2 * 256), 2 * 3 * 11008 + 4 * 11008)
    per_sequence = max(1024 * lm_prefill, 3072 * (2 * 3 * 1280 + max(2 * 5 * 1280 + 4 * 1280, 2 * 3 * 3420)))
    assert rounds - greedy == kv * 8 * 1280 + 8 * per_sequence + 3 * 8 * arch.vocab * 4
    alone = estimate_memory(arch, PhaseShape("cpr", 5, 10, 256, 768, 3072, 256, True), launcher="zero3", processes=4)
    assert alone["generation"] == rounds and alone["training"] == z3["training"]
    final = estimate_evaluation_memory(arch, sequences=16, prompt_tokens=1024, completion_tokens=256, patches=3072)
    assert final["weights (whole model)"] == 3_754_622_976 * 2 and final["LoRA weights"] == 4 * arch.lora_params
    assert final["generation"] == (3_754_622_976 * 2 + 4 * arch.lora_params + kv * 16 * 1280 + 16 * per_sequence
                                   + 3 * 16 * arch.vocab * 4 + GIB)


def test_greedy_baseline_decodes_one_sequence_per_group_of_a_process():
    assert greedy_baseline_sequences(10, 5, 4) == 2  # each process holds two whole groups
    assert greedy_baseline_sequences(8, 2, 1) == 4
    assert greedy_baseline_sequences(6, 4, 2) == 3  # rows 0-5 / 6-11 of groups of 4: a group split in two
    assert greedy_baseline_sequences(2, 4, 1) == 1


@pytest.mark.parametrize(
    "kind,dtype,checkpointing,include_vision",
    [
        ("qwen2_5_vl", "float32", False, False),
        ("qwen2_5_vl", "bfloat16", False, False),
        ("qwen2_5_vl", "bfloat16", True, False),
        ("qwen2_5_vl", "bfloat16", False, True),
        ("internvl", "float32", False, False),
        ("internvl", "bfloat16", False, False),
        ("internvl", "bfloat16", True, False),
        ("internvl", "bfloat16", False, True),
    ],
)
def test_activation_estimate_matches_saved_tensors_measured_on_tiny_models(kind, dtype, checkpointing, include_vision):
    """The estimate's saved activations against what autograd keeps after a training forward of the tiny model
    with TRL's fused LM head (bytes of every saved tensor, by storage, parameters and buffers excluded)."""
    import torch
    from peft import get_peft_model
    from PIL import Image
    from trl.trainer.utils import add_fused_lm_head

    from cpr.models import build_lora_config, load_model_and_processor

    model, proc = load_model_and_processor(tiny_model(kind), device="cpu", dtype=dtype, gradient_checkpointing=checkpointing)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    lora = build_lora_config(kind, r=8, alpha=16, dropout=0.05, include_vision=include_vision)
    model = get_peft_model(model, lora)
    model.train()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many squares are there?"}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "Step 1: 4 + 5 = 9. " * 6
    batch = 2
    inputs = proc(text=[text] * batch, images=[[Image.new("RGB", (112, 112), (10, 200, 30))]] * batch, return_tensors="pt")
    inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    tokens = inputs["input_ids"].shape[1]
    labels = inputs["input_ids"].clone()
    labels[:, : tokens // 2] = -100
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            saved.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs, labels=labels, fused_lm_head=True)
    measured = sum(saved.values())

    arch, config = load_architecture(Path(tiny_model(kind)), lora, include_vision=include_vision)
    image_tokens = int((inputs["input_ids"][0] == config.image_token_id).sum())
    patches = inputs["pixel_values"].shape[0] // batch
    if kind == "internvl":  # tiles of 56 px in 14 px patches, plus the class token
        patches *= (56 // 14) ** 2 + 1
    est = saved_activation_bytes(
        arch, batch=batch, tokens=tokens, scored_tokens=tokens - 1,  # on CPU TRL's head scores every position
        images=batch, patches=patches, image_tokens=image_tokens, checkpointing=checkpointing,
        include_vision=include_vision, dropout=True, wb=4 if dtype == "float32" else 2, device="cpu",
    )
    estimate = est["language"] + est["vision"] + est["head"]
    assert measured > 100_000
    assert estimate == pytest.approx(measured, rel=0.1), (estimate, measured)


def _check(capsys, *argv):
    if DEMO_YAML in argv:  # the demo's model folder is built by the recipe: a tiny model of the same family
        argv = (*argv, "--set", f"model.name_or_path={tiny_model()}")
    code = main(["train", "--check", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_prints_parameters_and_memory_tables_for_the_paper_configs(capsys):
    code, out, err = _check(capsys, "--config", QWEN_YAML, "--num-processes", "4", "--skip-data")  # a hub dataset
    assert code == 0, err
    assert "valid for 4 processes" in out
    assert "252 in the language model, 0 in vision / projector" in out
    assert "3,754.6 M" in out and "119.7 M" in out
    assert "max_pixels 602112 -> up to 768 image tokens" in out
    for row in ("weights (shard)", "LoRA weights, grads, Adam", "gen: gathered weights", "train: activations",
                "train: logits", "peak in generation: training rounds", "peak in generation: eval hook",
                "peak in training"):
        assert out.count(row) == 2, row  # one table a phase
    # the eval hook's 16 sequences (evaluation.batch_size) are more than a training round's 8 or 10
    assert "eval hook: 16 at once, 256 new tokens" in out and "(gen: rows of the largest generation, eval hook)" in out
    assert "final evaluation and checkpoint selection (greedy): 16 sequences generated at once, 256 new tokens" in out
    assert "DDP   ZeRO-2   ZeRO-3" in out

    code, out, err = _check(capsys, "--config", INTERNVL_YAML, "--num-processes", "4", "--skip-data")
    assert code == 0, err
    assert "4,732.5 M" in out
    assert "warning: no tile limit set (model.max_pixels): up to 13 tiles an image" in out
    assert "13 tiles x 256 tokens + <img> </img> = 3330 image tokens" in out


def test_the_readme_check_commands_run_without_the_hub(capsys):
    """The README's two --check commands as written, on a machine without the hub (HF_HUB_OFFLINE, as in every
    test): the CRYSTAL hub dataset is left out with one line saying so, the model shapes come from the shipped
    configs, exit code 0."""
    code, out, err = _check(capsys, "--config", QWEN_YAML, "--num-processes", "4")
    assert code == 0, err
    data = [ln for ln in out.splitlines() if ln.startswith("data:")]
    assert data == ["data: not loaded: the Hugging Face hub cannot be reached from this machine (waybarrios/CRYSTAL); "
                    "checked without the data, as --skip-data does (the run loads it)"]
    assert "3,754.6 M" in out
    code, out, err = _check(capsys, "--config", INTERNVL_YAML, "--accelerate-config",
                            str(REPO / "accelerate_configs/deepspeed_zero3.yaml"), "--num-processes", "4",
                            "--gpu-memory", "80")
    assert code == 0, err
    assert "data: not loaded: the Hugging Face hub cannot be reached" in out and "fits in 80 GiB a GPU with ZeRO-3" in out


def test_check_names_skip_data_for_a_hub_dataset_it_cannot_load(capsys, monkeypatch):
    """A gated (or missing) hub dataset is an error the run would hit too: one line naming the dataset, how to
    give a local copy, and --skip-data."""
    import datasets

    def gated(name, **_):
        raise datasets.exceptions.DatasetNotFoundError(f"Dataset '{name}' is a gated dataset on the Hub.")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    code, out, err = _check(capsys, "--config", QWEN_YAML, "--num-processes", "4")
    assert code == 2 and "valid" not in out
    assert err.startswith("cpr train: error: waybarrios/CRYSTAL: crystal: cannot load the Hugging Face dataset "
                          "'waybarrios/CRYSTAL' (DatasetNotFoundError: Dataset 'waybarrios/CRYSTAL' is a gated dataset")
    assert err.rstrip().endswith("; or check the rest without the data: --check --skip-data") and err.count("\n") == 1


def test_check_exit_code_follows_the_gpu_memory(capsys):
    args = ["--config", QWEN_YAML, "--num-processes", "4", "--skip-data", "--accelerate-config",
            str(REPO / "accelerate_configs/deepspeed_zero3.yaml")]
    code, out, _ = _check(capsys, *args, "--gpu-memory", "80")
    assert code == 0 and "fits in 80 GiB a GPU with ZeRO-3" in out
    assert "DDP" not in out.split("phase cpr")[1]  # the launch's column only
    code, out, _ = _check(capsys, *args, "--gpu-memory", "4")
    assert code == 1 and "does not fit in 4 GiB a GPU with ZeRO-3" in out


def test_check_validates_the_config_for_the_number_of_processes(capsys):
    over = ["--set", "phase_settings.answer_only.training.per_device_train_batch_size=2",
            "--set", "phase_settings.answer_only.training.num_generations=4",
            "--set", "training.gradient_accumulation_steps=1"]
    code, _, err = _check(capsys, "--config", DEMO_YAML, *over, "--num-processes", "1")
    assert code == 2
    assert "(2 per device x 1 processes x 1 steps per generation = 2) is not divisible by num_generations (4)" in err
    code, out, err = _check(capsys, "--config", DEMO_YAML, *over, "--num-processes", "2")
    assert code == 0, err
    assert "valid for 2 processes" in out


def test_check_refuses_vision_targets_without_include_vision_and_unknown_targets(capsys):
    code, _, err = _check(capsys, "--config", DEMO_YAML, "--set", "lora.target_modules=.*attn.qkv")
    assert code == 2
    assert "field 'lora.target_modules': 2 vision / projector modules are LoRA targets (e.g. model.visual.blocks.0.attn.qkv)" in err
    assert "lora.include_vision is false" in err
    code, out, _ = _check(capsys, "--config", DEMO_YAML, "--set", "lora.target_modules=.*attn.qkv",
                          "--set", "lora.include_vision=true")
    assert code == 0 and "0 in the language model, 2 in vision / projector" in out
    code, _, err = _check(capsys, "--config", DEMO_YAML, "--set", "lora.target_modules=[no_such_proj]")
    assert code == 2 and "field 'lora.target_modules': no module matches the LoRA targets" in err


def _demo_with_data(tmp_path: Path, train: list) -> Path:
    """demo.yaml on the tiny model with ``train`` as its training data."""
    data = yaml.safe_load(Path(DEMO_YAML).read_text())
    data["model"]["name_or_path"] = tiny_model()
    data["data"]["train"] = train
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_check_loads_the_data_as_the_run_does(tmp_path, capsys):
    """A data error the run would hit in its first seconds is one for --check too, with the run's message."""
    code, out, err = _check(capsys, "--config", DEMO_YAML)
    assert code == 0, err
    assert "data: train 600, validation 45, test 90 records, loaded and validated" in out

    unknown = _demo_with_data(tmp_path, [{"source": "synthetic", "split": "train", "options": {"size": 60, "colours": 4}}])
    code, out, err = _check(capsys, "--config", str(unknown))
    assert code == 2 and "valid" not in out
    line = err.strip()
    assert line == f"cpr train: error: {unknown} field 'data.train[0].options.colours': unknown option for source 'synthetic' (allowed: size, seed)"
    assert "\n" not in line

    from PIL import Image

    Image.new("RGB", (28, 28), "red").save(tmp_path / "red.png")
    rows = [{"id": f"r{i}", "image": image, "question": "Which colour?", "options": ["red", "blue"], "answer": "A",
             "reference_steps": ["The image is red."]} for i, image in enumerate(["red.png", "missing.png"])]
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    missing = _demo_with_data(tmp_path, [{"source": "jsonl", "path": str(records)}])
    code, out, err = _check(capsys, "--config", str(missing))
    assert code == 2 and "valid" not in out
    assert err.startswith(f"cpr train: error: {records}:2 (id r1) field 'image'") and "missing.png" in err

    code, out, err = _check(capsys, "--config", str(missing), "--skip-data")  # only the model and memory
    assert code == 0 and "data: not loaded (--skip-data)" in out


def test_check_warns_of_an_empty_curriculum_bucket(capsys):
    """demo_tabmwp.yaml's TabMWP samples are all grades 3-4: every record easy, so its staged phase never
    trains on medium or hard."""
    code, out, err = _check(capsys, "--config", str(REPO / "recipes/configs/demo_tabmwp.yaml"),
                            "--set", f"model.name_or_path={tiny_model(data=True)}")
    assert code == 0, err
    assert "data: train 16, validation 4, test 8 records, loaded and validated" in out
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning: phase")]
    assert warnings == ["warning: phase cpr: curriculum buckets 'medium', 'hard' have no training records (easy 16, "
                        "medium 0, hard 0); the staged schedule trains on the other buckets only (check data.buckets "
                        "or the data's difficulty)"]


def test_the_run_names_the_file_and_key_of_an_unknown_source_option(tmp_path, capsys):
    unknown = _demo_with_data(tmp_path, [{"source": "synthetic", "split": "train", "options": {"size": 60, "colours": 4}}])
    assert main(["train", "--config", str(unknown), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"cpr train: error: {unknown} field 'data.train[0].options.colours': unknown option for source 'synthetic' (allowed: size, seed)"


def test_launcher_from_the_shipped_accelerate_configs(tmp_path):
    configs = REPO / "accelerate_configs"
    assert launcher_from_accelerate_config(configs / "deepspeed_zero3.yaml") == ("zero3", 8)
    assert launcher_from_accelerate_config(configs / "deepspeed_zero2.yaml") == ("zero2", 8)
    assert launcher_from_accelerate_config(configs / "multi_gpu.yaml") == ("ddp", 8)
    bad = tmp_path / "z1.yaml"
    bad.write_text("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 1}\n")
    with pytest.raises(ConfigError, match="zero_stage 1: the estimate knows ZeRO-2 and ZeRO-3"):
        launcher_from_accelerate_config(bad)


def test_check_options_without_check_are_refused(capsys):
    assert main(["train", "--config", DEMO_YAML, "--num-processes", "4"]) == 2
    assert "field '--num-processes': --num-processes belongs to --check" in capsys.readouterr().err


def test_config_folder_of_an_unknown_hub_model_names_the_remedy():
    from cpr.errors import ModelNotAvailableError

    assert config_folder("Qwen/Qwen2.5-VL-3B-Instruct") == REPO / "cpr/models/configs/qwen2_5_vl_3b"
    with pytest.raises(ModelNotAvailableError, match="no config.json for model 'Org/Unknown-VL'.*Pass a folder that holds"):
        config_folder("Org/Unknown-VL")
