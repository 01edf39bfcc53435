"""Both GRPO phases end to end on the tiny models (CPU): run_experiment with real data.

The Qwen2.5-VL run trains on the generated colour-grid task with a short supervised warm start and
the real reward functions only: the warm-started model writes the output format often enough that
its groups' rewards vary. The InternVL and resume runs check plumbing on the TabMWP samples, where
a random tiny model earns no format / accuracy / CPR reward (every group would have zero reward
variance and LoRA would not move), so they add a reward with variance (distinct characters of the
completion / 100) next to the real ones. That the real CPR reward moves the policy toward better
steps is tests/test_training_signal.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_model, tiny_run_config
from launch import write_reward_recipe
from safetensors.torch import load_file
from transformers import TrainerCallback

import cpr.rewards as rewards_mod
import cpr.training.experiment as runner
import cpr.training.policy as policy
from cpr.training.config import config_from_dict, load_config
from cpr_tools import tiny_models


class DistinctChars(rewards_mod.RewardFunction):
    name = "distinct_chars"
    high = 10.0

    def score(self, completions, kwargs):
        from cpr.steps import completion_text

        return [len(set(completion_text(c))) / 100 for c in completions]



@pytest.fixture
def with_test_reward(monkeypatch):
    monkeypatch.setitem(rewards_mod.REWARD_FUNCTIONS, "distinct_chars", DistinctChars)


@pytest.fixture
def record_loads(monkeypatch):
    """Keep every model the runner loads, and every adapter it wraps a model with."""
    loaded, wrapped = [], []
    real_load, real_wrap = policy.load_policy, policy.with_adapter

    def load(cfg, path, device=None):
        model, processor = real_load(cfg, path, device=device)
        base = {k: v.detach().clone() for k, v in model.state_dict().items()}
        loaded.append((model, base))
        return model, processor

    def wrap(model, adapter, *args, **kwargs):
        out = real_wrap(model, adapter, *args, **kwargs)
        if adapter is not None:
            lora = {k: v.detach().clone() for k, v in out.state_dict().items() if "lora_" in k}
            wrapped.append((Path(adapter), lora))
        return out

    monkeypatch.setattr(policy, "load_policy", load)
    monkeypatch.setattr(policy, "with_adapter", wrap)
    return loaded, wrapped


def _config(tmp_path: Path, samples_dir: Path, model: str) -> dict:
    train = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16,
             "logging_steps": 1, "save_steps": 2, "beta": 0.04}
    return tiny_run_config(
        "e2e", tmp_path / "run", limit=12,
        model={"name_or_path": model, "dtype": "float32"},
        training=train,
        phases=["answer_only", "cpr"],
        phase_settings={
            "answer_only": {
                "rewards": ["format", "accuracy", "distinct_chars"],
                "training": {"max_steps": 4, "learning_rate": 5e-3},
            },
            "cpr": {
                "rewards": ["format", "cpr", "distinct_chars"],
                "reward_params": {"cpr": {"answer_weight": 0.65, "step_weight": 0.35}},
                "curriculum": {"schedule": "staged", "stage_fractions": [0.5, 0.75]},
                "training": {"max_steps": 4, "learning_rate": 2e-3},
            },
        },
        evaluation={"max_new_tokens": 16, "batch_size": 4},
    )


def _adapter_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


def _check_base_unchanged(loaded):
    for model, base in loaded:
        for k, v in model.state_dict().items():
            key = k.replace("base_model.model.", "").replace(".base_layer", "")
            if "lora_" in k or key not in base:
                continue
            assert torch.equal(v, base[key]), f"base weight {key} changed"


def _synthetic(data: dict) -> dict:
    """The config on the generated task with real rewards only and a short supervised warm start."""
    data["data"] = {"train": [{"source": "synthetic", "split": "train", "options": {"size": 24}}],
                    "validation": [{"source": "synthetic", "split": "validation", "options": {"size": 2}}],
                    "test": [{"source": "synthetic", "split": "test", "options": {"size": 2}}],
                    "prompts": {"system": 'Reply with JSON: {"reasoning_steps": [...], "answer": "<letter>"}'}}
    data["warm_start"] = {"enabled": True, "max_steps": 120, "learning_rate": 3e-3, "per_device_train_batch_size": 8}
    data["training"]["temperature"] = 0.7
    data["training"]["max_completion_length"] = 48
    data["evaluation"]["max_new_tokens"] = 48
    for phase in data["phase_settings"].values():
        phase["rewards"] = [r for r in phase["rewards"] if r != "distinct_chars"]
        phase["training"]["learning_rate"] = 1e-4  # larger steps on real rewards can break the format
    texts = tiny_models.config_texts(config_from_dict(data))  # the tokenizer also learns the task's texts
    data["model"]["name_or_path"] = str(tiny_models.ensure_tiny_model("qwen2_5_vl", texts=texts))
    return data


@pytest.mark.slow
def test_two_phases_qwen(tmp_path, samples_dir, record_loads, one_thread):
    loaded, wrapped = record_loads
    data = _synthetic(_config(tmp_path, samples_dir, tiny_model(data=True)))
    data["evaluation"]["final_splits"] = ["test", "validation"]
    data["evaluation"]["compare"] = ["untrained", "warm_start", "answer_only"]
    cfg = config_from_dict(data)
    summary = runner.run_experiment(cfg)
    out = Path(cfg.output_dir)
    assert summary["status"] == "finished"
    p1, p2 = summary["phases"]
    assert (p1["phase"], p1["steps"], p2["phase"], p2["steps"]) == ("answer_only", 4, "cpr", 4)

    # the real reward functions ran and logged their metrics in both phases
    logs1 = [json.loads(x) for x in (out / "answer_only" / "log.jsonl").read_text().splitlines()]
    logs2 = [json.loads(x) for x in (out / "cpr" / "log.jsonl").read_text().splitlines()]
    assert all("rewards/accuracy/mean" in r for r in logs1 if "reward" in r)
    assert all("rewards/cpr/mean" in r and "steps/match_f1" in r for r in logs2 if "reward" in r)
    scored = [json.loads(x) for x in (out / "cpr" / "scored_completions.jsonl").read_text().splitlines()]
    assert len(scored) == 4 * 8  # every completion scored by cpr is recorded, with its text
    assert all(isinstance(r["completion"], str) and len(r["completion"]) == r["completion_chars"] for r in scored)
    # on log.jsonl's step axis: each logged step's batch is scored at that step
    assert {r["step"] for r in scored} == {r["step"] for r in logs2 if "reward" in r}

    # phase 1: LoRA moved away from the warm start on the real rewards alone
    a1, ws = _adapter_weights(out / "answer_only" / "adapter"), _adapter_weights(out / "warm_start" / "adapter")
    assert set(a1) == set(ws) and any(not torch.equal(a1[k], ws[k]) for k in a1)

    # selection scored every checkpoint and the final adapter; its pick seeds phase 2
    sel = json.loads((out / "answer_only" / "selection.json").read_text())
    assert [s["step"] for s in sel["scores"]] == [2, 4, None]
    picked = Path(sel["picked"])
    assert p2["init_adapter"] == str(picked)
    (ws_path, _), (wrapped_path, lora_at_start) = wrapped  # phase 1 starts from the warm start, phase 2 from the pick
    assert ws_path == out / "warm_start" / "adapter" == Path(p1["init_adapter"])
    assert wrapped_path == picked
    start = _adapter_weights(picked)
    # the phase's adapter folder, which the summary names, holds the pick
    selected = _adapter_weights(out / "answer_only" / "adapter")
    assert p1["adapter"] == str(out / "answer_only" / "adapter") and all(torch.equal(selected[k], start[k]) for k in start)
    for k, v in lora_at_start.items():
        short = k.replace(".default", "")
        assert torch.equal(v, start[short]), k

    # phase 2 moved the adapter away from where it started
    a2 = _adapter_weights(out / "cpr" / "adapter")
    assert set(a2) == set(start)
    assert any(not torch.equal(a2[k], start[k]) for k in a2)

    # base weights never change (every model the runner loaded)
    _check_base_unchanged(loaded)

    # curriculum state saved with phase 2's checkpoints; final evaluation written
    state = json.loads((out / "cpr" / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert state["CurriculumStateCallback"]["attributes"]["curriculum_state"]["position"]["generation_batch"] == 2
    metrics = json.loads((out / "final_eval" / "crystal" / "metrics.json").read_text())
    assert metrics["overall"]["n"] == 2 and metrics["split"] == "test"
    saved = json.loads((out / "summary.json").read_text())
    assert saved["status"] == "finished" and saved["final_eval"]["crystal"] == metrics["overall"]
    # evaluation.final_splits also lists validation: the hand-over adapter scored there too
    val = json.loads((out / "final_eval" / "validation" / "crystal" / "metrics.json").read_text())
    assert (val["overall"]["n"], val["split"], val["adapter"]) == (2, "validation", str(out / "cpr" / "adapter"))
    assert saved["final_eval_validation"]["crystal"] == val["overall"]
    # the closing comparison: each stage scored on the same test items, then the final adapter
    rows = saved["comparison"]
    assert [(r["stage"], r["adapter"]) for r in rows] == [
        ("untrained", None), ("warm_start", str(out / "warm_start" / "adapter")), ("answer_only", str(picked)),
        ("final", str(out / "cpr" / "adapter"))]
    assert rows[0]["accuracy"] == 0.0 and all(r["n"] == 2 for r in rows) and rows[-1] == {**rows[-1], **metrics["overall"]}
    stage = json.loads((out / "final_eval" / "stages" / "warm_start" / "final_eval" / "crystal" / "metrics.json").read_text())
    assert stage["adapter"] == str(out / "warm_start" / "adapter") and rows[1] == {**rows[1], **stage["overall"]}
    assert saved["chance_accuracy"] == pytest.approx(100 / 3)
    assert len(saved["bucket_mix"]["cpr"]) == 3  # the cpr phase scored its completions' steps


@pytest.mark.slow
def test_two_phases_internvl(tmp_path, samples_dir, with_test_reward, record_loads, one_thread):
    loaded, wrapped = record_loads
    data = _config(tmp_path, samples_dir, tiny_model("internvl", data=True))
    for p in data["phase_settings"].values():
        p["training"]["max_steps"] = 2
    cfg = config_from_dict(data)
    summary = runner.run_experiment(cfg)
    out = Path(cfg.output_dir)
    assert [p["steps"] for p in summary["phases"]] == [2, 2]
    a1 = _adapter_weights(out / "answer_only" / "adapter")
    a2 = _adapter_weights(out / "cpr" / "adapter")
    assert any(("lora_B" in k) and v.abs().max() > 0 for k, v in a1.items())
    assert wrapped and wrapped[0][0] == Path(summary["phases"][1]["init_adapter"])
    assert any(not torch.equal(a2[k], _adapter_weights(wrapped[0][0])[k]) for k in a2)
    # LoRA adapts the language model only (default): no vision-tower module carries an adapter
    assert not any("vision_tower" in k or "multi_modal_projector" in k for k in a1)
    _check_base_unchanged(loaded)


@pytest.mark.slow
def test_single_phase_and_resume_skips_finished_phases(tmp_path, samples_dir, with_test_reward, one_thread):
    data = _config(tmp_path, samples_dir, tiny_model(data=True))
    data["phases"] = ["cpr"]
    data["phase_settings"] = {"cpr": data["phase_settings"]["cpr"]}
    data["phase_settings"]["cpr"]["training"]["max_steps"] = 2
    data["evaluation"]["final"] = False
    cfg = config_from_dict(data)
    first = runner.run_experiment(cfg)
    assert [p["phase"] for p in first["phases"]] == ["cpr"] and first["phases"][0]["init_adapter"] is None
    again = runner.run_experiment(config_from_dict(data), resume=True)  # nothing left to train
    assert again["phases"][0]["wall_time_s"] == first["phases"][0]["wall_time_s"]


@pytest.fixture
def trainers(monkeypatch):
    """Every GRPO trainer the runner builds."""
    import cpr.training.trainer as grpo_trainer

    made = []

    class Recording(grpo_trainer.CprGRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(grpo_trainer, "CprGRPOTrainer", Recording)
    return made


class _Threads(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.append(torch.get_num_threads())


@pytest.mark.slow
def test_training_settings_reach_the_trainer_and_config_yaml(tmp_path, samples_dir, with_test_reward, trainers):
    """training.reward_weights (TRL's field) weights every reward function of the phase;
    model.gradient_checkpointing reaches the trainer's args and model; torch_threads is applied; and
    config.yaml's training_effective holds the values the trainer trained with."""
    data = _config(tmp_path, samples_dir, tiny_model(data=True))
    data["phases"] = ["cpr"]
    data["phase_settings"] = {"cpr": {"rewards": ["format", "cpr", "distinct_chars"], "curriculum": {"schedule": "none"},
                                      "training": {"max_steps": 2, "learning_rate": 2e-3}}}
    data["training"].update(reward_weights=[0.5, 2.0, 1.0], scale_rewards="batch")
    data["model"]["gradient_checkpointing"] = True
    data["evaluation"]["final"] = False
    threads, before = _Threads(), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = runner.run_experiment(config_from_dict(data), callbacks=[threads])
    finally:
        torch.set_num_threads(before)
    (trainer,) = trainers
    assert trainer.reward_weights.tolist() == [0.5, 2.0, 1.0] == summary["phases"][0]["reward_weights"]
    assert trainer.args.activation_checkpointing and trainer.model.get_base_model().is_activation_checkpointing
    assert threads.seen == [1, 1]  # torch_threads' default, whatever the process had before

    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["torch_threads"] == 1
    eff = saved["training_effective"]["cpr"]
    used = {
        "beta": trainer.beta, "epsilon": trainer.epsilon_low, "epsilon_high": trainer.epsilon_high,
        "loss_type": trainer.loss_type, "scale_rewards": trainer.scale_rewards,
        "importance_sampling_level": trainer.importance_sampling_level,
        "mask_truncated_completions": trainer.mask_truncated_completions,
        "top_entropy_quantile": trainer.top_entropy_quantile, "num_iterations": trainer.num_iterations,
        "temperature": trainer.temperature, "top_p": trainer.top_p, "num_generations": trainer.num_generations,
        "max_completion_length": trainer.max_completion_length, "reward_weights": trainer.reward_weights.tolist(),
        "multi_objective_aggregation": trainer.multi_objective_aggregation,
        "steps_per_generation": trainer.args.steps_per_generation, "learning_rate": trainer.args.learning_rate,
        "max_grad_norm": trainer.args.max_grad_norm, "activation_checkpointing": True,
    }
    assert {k: eff[k] for k in used} == used
    assert (eff["beta"], eff["scale_rewards"], eff["epsilon_high"], eff["max_completion_length"]) == (0.04, "batch", 0.2, 16)
    # the run's config.yaml loads back as a config (training_effective is derived, and ignored)
    again = load_config(tmp_path / "run" / "config.yaml").to_dict()
    assert {k: v for k, v in again.items() if k != "config_path"} == {
        k: v for k, v in saved.items() if k not in ("training_effective", "config_path")}


@pytest.mark.slow
def test_console_shows_the_bar_and_one_line_a_step_and_run_log_keeps_everything(tmp_path, samples_dir):
    import os
    import re
    import subprocess
    import sys

    data = _config(tmp_path, samples_dir, tiny_model(data=True))
    data["phases"] = ["cpr"]
    data["phase_settings"] = {"cpr": {"rewards": ["format", "cpr", "noisy"], "curriculum": {"schedule": "none"},
                                      "training": {"max_steps": 3, "learning_rate": 2e-3, "save_steps": 10}}}
    data["evaluation"]["final"] = False
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    write_reward_recipe(tmp_path / "wrapper.py", "noisy", 'warnings.warn("noisy reward is deprecated", FutureWarning)\n'
                        "return [len(set(completion_text(c))) / 100 for c in completions]", prelude="import warnings\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, str(tmp_path / "wrapper.py"), "--config", str(tmp_path / "run.yaml")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    bar = re.compile(r"\d+%\|.*\|")  # a tqdm progress bar (training, weight loading)
    lines = [x.strip() for x in re.split(r"[\r\n]", done.stdout) if x.strip() and not bar.search(x)]
    assert not [x for x in lines if "'loss'" in x or "Warning" in x or "noisy reward" in x], lines
    start = next(i for i, x in enumerate(lines) if x.startswith("[cpr] phase cpr: 3 steps"))
    end = next(i for i, x in enumerate(lines) if x.startswith("run e2e finished"))
    during = lines[start + 1:end]
    assert [x.split(":")[0] for x in during] == ["step 1/3", "step 2/3", "step 3/3"], during
    assert all("reward " in x and "loss " in x and "kl " in x for x in during)

    # run.log: every warning and every trainer log record, as log.jsonl has it
    run_log = (tmp_path / "run" / "run.log").read_text()
    assert run_log.count("FutureWarning: noisy reward is deprecated") >= 1
    records = [json.loads(m) for m in re.findall(r"cpr\.trainer_log: step \d+: (\{.*\})", run_log)]
    rows = [json.loads(x) for x in (tmp_path / "run" / "cpr" / "log.jsonl").read_text().splitlines()]
    assert len(records) == len(rows) == 4  # 3 steps and the closing train_runtime record
    assert records == [{k: v for k, v in r.items() if k != "step"} for r in rows]
