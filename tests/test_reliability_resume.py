"""Exact resume: a run killed with SIGKILL mid-interval and resumed with ``--resume`` ends with the
uninterrupted run's adapter weights, prompt order and logs; incomplete and diverged checkpoints
are never resumed from.

The SIGKILL tests run the recipe in subprocesses with one torch thread (OMP_NUM_THREADS=1): two
runs at once (the uninterrupted one and the one to kill), then the resume. A registered
``length`` reward (completion length) gives every group a reward spread, so the adapter really
moves; ``cpr`` writes ``scored_completions.jsonl`` (prompt ids and rewards per step).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import tiny_run_config
from launch import write_length_reward_recipe, write_reward_recipe

from cpr.training.checkpoints import (
    COMPLETE_MARKER,
    DIVERGED_MARKER,
    GENERATION_BUFFER_FILE,
    checkpoint_problem,
    checkpoint_status,
    has_curriculum_state,
    last_checkpoint,
    prepare_resume,
    training_done,
)
from cpr.training.logs import rollback_logs
from cpr.training.warm_start import WARM_START_DONE, warm_start_finished

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------
# unit: which checkpoint a resume continues from, and what it cleans up
# --------------------------------------------------------------------------------------


def _ckpt(phase: Path, step: int, *, complete: bool = True, diverged: bool = False, state: str | None = "{}") -> Path:
    folder = phase / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if state is not None:
        (folder / "trainer_state.json").write_text(state)
    if complete:
        (folder / COMPLETE_MARKER).write_text("{}")
    if diverged:
        (folder / DIVERGED_MARKER).write_text("{}")
    return folder


def test_last_checkpoint_skips_incomplete_and_diverged(tmp_path):
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    _ckpt(tmp_path, 6, diverged=True)
    _ckpt(tmp_path, 8, complete=False)  # killed while saving: trainer_state.json written, no marker yet
    assert [checkpoint_status(tmp_path / f"checkpoint-{s}") for s in (2, 4, 6, 8)] == [
        "complete", "complete", "diverged", "incomplete"
    ]
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    assert last_checkpoint(tmp_path / "missing") is None


def test_checkpoints_without_markers_are_judged_by_trainer_state(tmp_path):
    """Runs saved before the marker existed: complete when trainer_state.json parses."""
    _ckpt(tmp_path, 1, complete=False)
    _ckpt(tmp_path, 2, complete=False, state='{"global_step": ')  # truncated by a kill
    _ckpt(tmp_path, 3, complete=False, state=None)
    assert [checkpoint_status(tmp_path / f"checkpoint-{s}") for s in (1, 2, 3)] == [
        "complete", "incomplete", "incomplete"
    ]
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-1"


def _jsonl(path: Path, rows: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_rollback_logs_cuts_each_file_at_the_checkpoint(tmp_path):
    _jsonl(tmp_path / "log.jsonl", [{"step": s, "loss": s / 10} for s in (1, 2, 3)] + [{"note": "no step"}])
    _jsonl(tmp_path / "scored_completions.jsonl", [{"step": s, "id": str(s)} for s in (1, 1, 2, 3)],
           tail='{"step": 3, "id')  # the killed writer's last line
    _jsonl(tmp_path / "scored_completions.rank1.jsonl", [{"step": s} for s in (1, 2, 3)])
    _jsonl(tmp_path / "eval_history.jsonl", [{"step": 2, "benchmark": "crystal"}, {"step": 3, "benchmark": "crystal"}])
    out = rollback_logs(tmp_path, 2)
    assert out == {
        "log.jsonl": (3, 1),
        "eval_history.jsonl": (1, 1),
        "scored_completions.jsonl": (3, 1),
        "scored_completions.rank1.jsonl": (2, 1),
    }
    read = lambda name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    assert [r.get("step") for r in read("log.jsonl")] == [1, 2, None]
    # a scored row carries the optimizer step its batch trains, as log.jsonl does: steps 1 and 2 stay
    assert [r["id"] for r in read("scored_completions.jsonl")] == ["1", "1", "2"]
    assert rollback_logs(tmp_path, 0)["log.jsonl"] == (1, 2)  # restart from scratch: only step-less rows stay


def test_prepare_resume_moves_later_checkpoints_aside(tmp_path, caplog):
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4, diverged=True)
    _ckpt(tmp_path, 6, complete=False)
    _jsonl(tmp_path / "log.jsonl", [{"step": s} for s in range(1, 6)])
    state = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    assert prepare_resume(tmp_path, True, state) == tmp_path / "checkpoint-2"
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert [n.rsplit("-", 1)[0] for n in names] == ["abandoned-checkpoint-4", "abandoned-checkpoint-6", "checkpoint"]
    assert names[-1] == "checkpoint-2"
    assert [json.loads(x)["step"] for x in (tmp_path / "log.jsonl").read_text().splitlines()] == [1, 2]
    assert prepare_resume(tmp_path, False, state) is None


def test_checkpoints_from_before_the_none_sampler_are_recognised(tmp_path):
    """schedule 'none' phases used TRL's RepeatSampler before; their checkpoints hold no sampler state,
    and the runner resumes them with that sampler instead of refusing."""
    new = _ckpt(tmp_path, 2, state=json.dumps({"stateful_callbacks": {"CurriculumStateCallback": {}, "TrainerControl": {}}}))
    old = _ckpt(tmp_path, 4, state=json.dumps({"stateful_callbacks": {"TrainerControl": {}}}))
    assert has_curriculum_state(new) and not has_curriculum_state(old)
    assert not has_curriculum_state(_ckpt(tmp_path, 6, state="{"))


def test_a_warm_start_adapter_is_reused_only_when_whole(tmp_path):
    import torch
    from safetensors.torch import save_file

    adapter, done = tmp_path / "adapter", tmp_path / WARM_START_DONE
    assert not warm_start_finished(adapter, done)
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(adapter / "adapter_model.safetensors"))
    assert warm_start_finished(adapter, done)  # a run from before the marker: the weights read
    data = (adapter / "adapter_model.safetensors").read_bytes()
    (adapter / "adapter_model.safetensors").write_bytes(data[:-100])  # killed while saving
    assert not warm_start_finished(adapter, done)
    done.write_text("{}")
    assert warm_start_finished(adapter, done)  # the marker is written only after the save returned


# --------------------------------------------------------------------------------------
# SIGKILL and resume, through the recipe
# --------------------------------------------------------------------------------------

#: A ``length`` reward that is 0 for every completion of about half the prompts (by id): their groups have
#: zero variance, which dynamic sampling replaces.
HALF_FLAT_LENGTH = ("return [0.0 if sum(map(ord, str(i))) % 2 else min(len(completion_text(c)), 100) / 100\n"
                    "        for c, i in zip(completions, kwargs['id'])]")


def _write_config(tmp_path: Path, *, schedule: str, limit: int, steps: int, training: dict | None = None,
                  phase: dict | None = None) -> Path:
    cfg = tiny_run_config(
        "resume", tmp_path / "unused", seed=5, lora_r=8, limit=limit, heldout=0,
        training={
            "per_device_train_batch_size": 8,  # 2 prompts x 4 generations a step
            "num_generations": 4,
            "max_completion_length": 16,
            "temperature": 1.0,
            "beta": 0.04,
            "logging_steps": 1,
            "disable_tqdm": True,
        },
        phases=["cpr"],
        phase_settings={"cpr": {
            "rewards": ["format", "cpr", "length"],
            "curriculum": {"schedule": schedule, **(phase or {}).get("curriculum", {})},
            "training": {"max_steps": steps, "learning_rate": 1.0e-2, "save_steps": 2, **(training or {})},
            **{k: v for k, v in (phase or {}).items() if k != "curriculum"},
        }},
        evaluation={"final": False},
    )
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if phase and "dynamic_sampling" in phase:
        write_reward_recipe(tmp_path / "wrapper.py", "length", HALF_FLAT_LENGTH)
    else:
        write_length_reward_recipe(tmp_path / "wrapper.py")
    return path


def _start(tmp_path: Path, config: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "wrapper.py"), "--config", str(config), "--output-dir", str(out), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _logged_steps(phase: Path) -> set[int]:
    rows = []
    try:
        rows = _rows(phase / "log.jsonl")
    except json.JSONDecodeError:  # read while a line is being written
        pass
    return {r["step"] for r in rows if "loss" in r}


DYNAMIC = {"dynamic_sampling": {"enabled": True, "max_resample": 2}}
MASTERY = {**DYNAMIC, "curriculum": {"mastery_window": 2, "mastery_threshold": 0.3, "mastery_pass": 0.3}}
REFERENCE = {"guidance": {"mode": "reference", "members": 1}}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "limit", "steps", "ckpt", "kill_at", "training", "generations", "settings"),
    [
        ("staged", 16, 4, 2, 3, {}, 4, None),  # killed after checkpoint-2, during step 4
        ("none", 8, 6, 4, 5, {}, 6, None),  # 8 prompts = 4 generation batches an epoch: resumes at the epoch boundary
        # a generation batch of 3 optimizer steps (steps 1-3, 4-6): checkpoint-4 falls inside the second, whose
        # buffer, with reference-guided GRPO, also holds the rows' `guided` marks
        ("staged", 16, 6, 4, 5, {"steps_per_generation": 3}, 2, REFERENCE),
        # each generation trained on twice (steps 1-2, 3-4, 5): checkpoint-3 falls inside the second
        ("none", 8, 5, 3, 4, {"num_iterations": 2, "save_steps": 3}, 3, None),
        # dynamic sampling: extra generation rounds of fresh prompts, then the same with the mastery curriculum
        ("staged", 16, 4, 2, 3, {}, None, DYNAMIC),
        ("mastery", 16, 4, 2, 3, {}, None, MASTERY),
    ],
    ids=["staged", "none_epoch_boundary", "inside_steps_per_generation_guided", "inside_num_iterations",
         "dynamic_sampling", "mastery"],
)
@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, schedule, limit, steps, ckpt, kill_at, training, generations,
                                                  settings):
    from safetensors.torch import load_file

    config = _write_config(tmp_path, schedule=schedule, limit=limit, steps=steps, training=training, phase=settings)
    full, killed = tmp_path / "full", tmp_path / "killed"
    p_full = _start(tmp_path, config, full)
    p_kill = _start(tmp_path, config, killed)
    phase = killed / "cpr"
    deadline = time.time() + 240
    while True:
        if (phase / f"checkpoint-{ckpt}" / COMPLETE_MARKER).is_file() and kill_at in _logged_steps(phase):
            os.kill(p_kill.pid, signal.SIGKILL)
            break
        assert p_kill.poll() is None, f"the run ended before it could be killed: {p_kill.stderr.read()[-3000:]}"
        assert time.time() < deadline, "the run never reached the kill point"
        time.sleep(0.02)
    p_kill.wait()
    assert p_kill.returncode == -signal.SIGKILL
    assert not (phase / "adapter").exists() and not (phase / f"checkpoint-{ckpt + 2}" / COMPLETE_MARKER).exists()
    buffered = (phase / f"checkpoint-{ckpt}" / GENERATION_BUFFER_FILE.format(rank=0)).is_file()
    assert buffered == bool(training)  # only a checkpoint inside a generation batch holds its buffer
    if not training:
        assert max(r["step"] for r in _rows(phase / "scored_completions.jsonl")) >= ckpt  # scored past the checkpoint

    _, err = p_full.communicate(timeout=240)
    assert p_full.returncode == 0, err[-3000:]
    p_resume = _start(tmp_path, config, killed, "--resume")
    _, err = p_resume.communicate(timeout=240)
    assert p_resume.returncode == 0, err[-3000:]

    a = load_file(str(full / "cpr" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(phase / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert any(k.endswith("lora_B.weight") and float(v.abs().max()) > 0 for k, v in a.items())  # it learned

    # the prompt order (ids per step) and every scored completion, no duplicates from the lost interval
    keys = ("step", "id", "reward", "match_f1", "correct")
    full_rows = [tuple(r[k] for k in keys) for r in _rows(full / "cpr" / "scored_completions.jsonl")]
    resumed_rows = [tuple(r[k] for k in keys) for r in _rows(phase / "scored_completions.jsonl")]
    if generations is not None:
        assert len(full_rows) == generations * 8 * training.get("steps_per_generation", 1)
    assert resumed_rows == full_rows
    after = [r[1] for r in full_rows if r[0] >= ckpt]
    assert (after or training) and after == [r[1] for r in resumed_rows if r[0] >= ckpt]
    # the trainer logs: same reward, loss and guidance metrics at every step
    def by_step(root: Path) -> dict[int, tuple]:
        return {r["step"]: (r.get("reward"), r["loss"], sorted((k, v) for k, v in r.items() if k.startswith("guidance/")))
                for r in _rows(root / "log.jsonl") if "loss" in r}

    assert by_step(phase) == by_step(full / "cpr")
    assert sorted(by_step(phase)) == list(range(1, steps + 1))
    # the curriculum's own record of the order agrees
    def fingerprint(root: Path) -> str:
        saved = json.loads((root / f"checkpoint-{steps}" / "trainer_state.json").read_text())["stateful_callbacks"]
        return saved["CurriculumStateCallback"]["attributes"]["curriculum_state"]["fingerprint"]

    assert fingerprint(phase) == fingerprint(full / "cpr")
    if settings and "guidance" in settings:
        key = "guidance/reward" if settings["guidance"]["mode"] == "reference" else "guidance/hint_steps"
        guided = {r["step"]: r[key] for r in _rows(full / "cpr" / "log.jsonl") if key in r}
        # the references scored / the hints given in every generation round, the resumed ones too
        assert sorted(guided) == list(range(1, steps + 1, training.get("steps_per_generation", 1)))
        assert all(v > 0 for v in guided.values()), guided
    elif settings:
        # the groups replaced and the extra rounds, counted over the resume too
        totals = json.loads((full / "summary.json").read_text())["phases"][0]["dynamic_sampling"]
        assert json.loads((killed / "summary.json").read_text())["phases"][0]["dynamic_sampling"] == totals
        assert totals["dropped_groups"] > 0 and totals["extra_rounds"] > 0 and totals["refilled_groups"] > 0
        assert len(full_rows) == 8 * (steps + totals["extra_rounds"])  # every generation round scored


# --------------------------------------------------------------------------------------
# the supervised warm start: checkpoints, Ctrl-C, --resume
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_interrupted_warm_start_resumes_from_its_checkpoint_exactly(tmp_path, monkeypatch, one_thread):
    """Ctrl-C during step 3 of a 6-step warm start (checkpoints every 2 steps): --resume trains steps 3-6 only,
    from checkpoint-2, and ends with the uninterrupted warm start's adapter and losses."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    import cpr.training.sft
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment

    run_sft, steps_run = cpr.training.sft.run_sft, []

    class Steps(TrainerCallback):
        def __init__(self, stop_at):
            self.stop_at = stop_at

        def on_step_end(self, args, state, control, **kwargs):
            steps_run.append(state.global_step)
            if state.global_step == self.stop_at:
                raise KeyboardInterrupt  # as Ctrl-C would, between two checkpoints

    def run(out: Path, *, stop_at: int | None = None, resume: bool = False) -> dict:
        steps_run.clear()
        monkeypatch.setattr(cpr.training.sft, "run_sft",
                            lambda *a, **k: run_sft(*a, **k, callbacks=[Steps(stop_at)]))
        cfg = tiny_run_config(
            "warm", out, seed=5, lora_r=8, limit=8, heldout=0, phases=[], evaluation={"final": False},
            warm_start={"enabled": True, "max_steps": 6, "save_steps": 2, "learning_rate": 5e-3,
                        "per_device_train_batch_size": 2, "max_length": 512},
        )
        return run_experiment(config_from_dict(cfg), resume=resume)

    full, killed = tmp_path / "full", tmp_path / "killed"
    assert run(full)["status"] == "finished" and steps_run == [1, 2, 3, 4, 5, 6]
    assert [p.name for p in sorted((full / "warm_start").glob("checkpoint-*"))] == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"]
    with pytest.raises(KeyboardInterrupt):
        run(killed, stop_at=3)
    ws = killed / "warm_start"
    assert checkpoint_status(ws / "checkpoint-2") == "complete" and not (ws / "checkpoint-4").exists()
    assert not (ws / "adapter").exists() and not (ws / WARM_START_DONE).exists()
    assert json.loads((killed / "summary.json").read_text())["status"] == "interrupted"

    assert run(killed, resume=True)["status"] == "finished"
    assert steps_run == [3, 4, 5, 6]  # from checkpoint-2, not from the start
    a = load_file(str(full / "warm_start" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(ws / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert any(k.endswith("lora_B.weight") and float(v.abs().max()) > 0 for k, v in a.items())  # it learned

    def losses(root: Path) -> list[tuple[int, float]]:
        history = json.loads((root / "warm_start" / "trainer_state.json").read_text())["log_history"]
        return [(r["step"], r["loss"]) for r in history if "loss" in r]

    assert [s for s, _ in losses(killed)] == [s for s, _ in losses(full)] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in losses(killed)] == pytest.approx([v for _, v in losses(full)], abs=1e-6)


@pytest.mark.slow
def test_sigint_in_the_warm_start_is_one_line_and_keeps_the_checkpoints(tmp_path):
    """A real Ctrl-C (SIGINT) through the recipe: exit 130, no traceback, one line (console and run.log)
    naming the last checkpoint and the --resume command; the checkpoints stay."""
    import re

    cfg = tiny_run_config(
        "sigint", tmp_path / "unused", seed=5, lora_r=8, limit=8, heldout=0, phases=[], evaluation={"final": False},
        warm_start={"enabled": True, "max_steps": 200, "save_steps": 2, "learning_rate": 5e-3,
                    "per_device_train_batch_size": 2, "max_length": 512},
    )
    config, out = tmp_path / "sigint.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = ["recipes/cpr_curriculum.py", "--config", str(config), "--output-dir", str(out)]
    p = subprocess.Popen([sys.executable, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, cwd=REPO)
    deadline = time.time() + 240
    while not (out / "warm_start" / "checkpoint-2" / COMPLETE_MARKER).is_file():
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.time() < deadline, "the warm start never saved checkpoint-2"
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if "interrupted" in x]
    assert len(lines) == 1, err[-3000:]
    pattern = (rf"\[cpr\] interrupted \(Ctrl-C\) during warm_start \(last complete checkpoint "
               rf"{re.escape(str(out / 'warm_start'))}/checkpoint-(\d+)\); everything written so far is kept in "
               rf"{re.escape(str(out))}; continue with: python {re.escape(' '.join(command))} --resume")
    step = int(re.fullmatch(pattern, lines[0]).group(1))
    assert lines[0][len("[cpr] "):] in (out / "run.log").read_text()
    assert checkpoint_status(out / "warm_start" / f"checkpoint-{step}") == "complete"
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


# --------------------------------------------------------------------------------------
# a phase killed after its last checkpoint
# --------------------------------------------------------------------------------------


def test_training_done_reads_the_checkpoints_own_step(tmp_path):
    done = _ckpt(tmp_path, 6, state=json.dumps({"global_step": 6, "max_steps": 6}))
    mid = _ckpt(tmp_path, 3, state=json.dumps({"global_step": 3, "max_steps": 6}))
    by_epochs = _ckpt(tmp_path, 9, state=json.dumps({"global_step": 9, "max_steps": 0}))
    assert training_done(done) and not training_done(mid) and not training_done(by_epochs)
    assert not training_done(_ckpt(tmp_path, 12, state="{"))


def register_length_reward(monkeypatch) -> None:
    """A ``length`` reward (completion length / 100, capped at 1: a spread in every group, so GRPO learns)."""
    from cpr import rewards as R
    from cpr.steps import completion_text

    class Length(R.RewardFunction):
        name = "length"

        def __init__(self, **_):
            pass

        def score(self, completions, kwargs):
            return [min(len(completion_text(c)), 100) / 100 for c in completions]

    monkeypatch.setitem(R.REWARD_FUNCTIONS, "length", Length)


def constant_lr_config(out: Path, *, steps: int, save_steps: int, **sections) -> dict:
    """A one-phase GRPO run with a constant learning rate (every step moves the adapter)."""
    return tiny_run_config(
        "last", out, seed=5, lora_r=8, limit=8, heldout=0,
        training={"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16,
                  "temperature": 1.0, "beta": 0.04, "logging_steps": 1, "disable_tqdm": True},
        phases=["cpr"],
        phase_settings={"cpr": {"rewards": ["format", "length"], "training": {
            "max_steps": steps, "save_steps": save_steps, "learning_rate": 1.0e-2, "lr_scheduler_type": "constant"}}},
        evaluation={"final": False}, **sections,
    )


@pytest.mark.slow
def test_a_phase_killed_after_its_last_checkpoint_trains_no_further_step(tmp_path, monkeypatch, one_thread):
    """Killed after checkpoint-3 (max_steps 3) and before phase_done.json (during selection, say): --resume
    goes on to the adapter without a step 4 (with a constant learning rate a step 4 would move it)."""
    from safetensors.torch import load_file

    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment

    register_length_reward(monkeypatch)
    out = tmp_path / "run"
    cfg = config_from_dict(constant_lr_config(out, steps=3, save_steps=3))
    assert run_experiment(cfg)["status"] == "finished"
    phase = out / "cpr"
    final = load_file(str(phase / "adapter" / "adapter_model.safetensors"))
    (phase / "phase_done.json").unlink()  # what a kill after checkpoint-3 leaves
    shutil.rmtree(phase / "adapter")
    summary = run_experiment(cfg, resume=True)
    assert summary["status"] == "finished" and summary["phases"][0]["steps"] == 3
    assert [p.name for p in phase.iterdir() if p.name.startswith(("checkpoint-", "abandoned"))] == ["checkpoint-3"]
    assert [r["step"] for r in _rows(phase / "log.jsonl") if "loss" in r] == [1, 2, 3]
    resumed = load_file(str(phase / "adapter" / "adapter_model.safetensors"))
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)
    assert any(k.endswith("lora_B.weight") and float(v.abs().max()) > 0 for k, v in final.items())  # it learned


# --------------------------------------------------------------------------------------
# a damaged checkpoint or adapter
# --------------------------------------------------------------------------------------


def _weights(folder: Path) -> Path:
    from safetensors.torch import save_file

    path = folder / "adapter_model.safetensors"
    save_file({"lora_A.weight": torch.arange(1000, dtype=torch.float32)}, str(path))
    return path


@pytest.mark.parametrize("damage", ["truncated_adapter", "garbage_state", "missing_state", "truncated_optimizer"])
def test_a_damaged_last_checkpoint_is_set_aside_and_the_previous_one_resumed(tmp_path, caplog, damage):
    for step in (2, 4):
        folder = _ckpt(tmp_path, step, complete=False)
        _weights(folder)
        torch.save({"state": {}}, folder / "optimizer.pt")
        (folder / COMPLETE_MARKER).write_text(json.dumps({"files": sorted(os.listdir(folder))}))
    last = tmp_path / "checkpoint-4"
    if damage == "truncated_adapter":
        data = (last / "adapter_model.safetensors").read_bytes()
        (last / "adapter_model.safetensors").write_bytes(data[:-100])
        problem = f"{last / 'adapter_model.safetensors'} does not load (Error while deserializing header: incomplete"
    elif damage == "garbage_state":
        (last / "trainer_state.json").write_bytes(b"\xff\xfe" * 100)
        problem = f"{last / 'trainer_state.json'} does not read as JSON (UnicodeDecodeError: "
    elif damage == "missing_state":
        (last / "trainer_state.json").unlink()
        problem = f"{last / 'trainer_state.json'} is missing"
    else:
        data = (last / "optimizer.pt").read_bytes()
        (last / "optimizer.pt").write_bytes(data[: len(data) // 2])
        problem = f"{last / 'optimizer.pt'} is not a whole torch file (truncated?)"
    assert checkpoint_status(last) == "corrupt" and checkpoint_problem(last).startswith(problem)
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None and last_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    state = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    with caplog.at_level("WARNING", logger="cpr.training"):
        assert prepare_resume(tmp_path, True, state) == tmp_path / "checkpoint-2"
    moved = [p.name for p in tmp_path.iterdir() if p.name.startswith("abandoned-checkpoint-4-")]
    assert len(moved) == 1 and not last.exists()
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith(f"phase {tmp_path.name}: checkpoint-4 is corrupt ({problem}")
    assert line.endswith(f"); moved aside to {moved[0]}; resuming from checkpoint-2")


def test_an_adapter_that_does_not_load_or_holds_nan_is_refused(tmp_path):
    from safetensors.torch import save_file

    from cpr.errors import InputError
    from cpr.models import check_adapter_weights

    path = _weights(tmp_path)
    check_adapter_weights(tmp_path)  # whole and finite
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(InputError, match=rf"^{path} field '--adapter': the adapter's weights do not load \(Error while "
                                         "deserializing header: incomplete metadata"):
        check_adapter_weights(tmp_path, field="--adapter")
    weights = torch.zeros(10, 10)
    weights[3, :4] = math.nan
    weights[5, 0] = math.inf
    save_file({"a.lora_A.weight": torch.ones(3), "b.lora_B.weight": weights}, str(path))
    with pytest.raises(InputError, match=rf"^{path} field 'x': 5 non-finite weights \(NaN or Inf\) in 1 tensors, "
                                         r"the first b.lora_B.weight: the file is damaged or its training diverged$"):
        check_adapter_weights(tmp_path, field="x")


def test_cpr_eval_refuses_an_adapter_with_nan_weights_in_one_line(tmp_path, capsys):
    from conftest import tiny_model
    from safetensors.torch import save_file

    from cpr.cli import main

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": tiny_model()}))
    save_file({"lora_B.weight": torch.full((2, 2), math.nan)}, str(adapter / "adapter_model.safetensors"))
    rc = main(["eval", "--model", tiny_model(), "--adapter", str(adapter), "--benchmark", "crystal", "--data",
               str(REPO / "data" / "samples" / "mathvision" / "test_subset.jsonl"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"cpr eval: error: {adapter / 'adapter_model.safetensors'} field '--adapter': 4 non-finite weights (NaN or "
        "Inf) in 1 tensors, the first lora_B.weight: the file is damaged or its training diverged")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_warm_start_killed_after_its_last_checkpoint_trains_no_further_step(tmp_path, monkeypatch, one_thread):
    """Killed after the warm start's checkpoint-4 (max_steps 4) and before its adapter was saved: --resume saves
    that checkpoint's adapter without a step 5 (with a constant learning rate a step 5 would move it)."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    import cpr.training.sft
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment

    run_sft, steps_run = cpr.training.sft.run_sft, []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps_run.append(state.global_step)

    monkeypatch.setattr(cpr.training.sft, "run_sft", lambda *a, **k: run_sft(*a, **k, callbacks=[Steps()]))
    cfg = config_from_dict(tiny_run_config(
        # 10 records, 2 a step: 5 steps an epoch, so step 4 ends inside one (at an epoch's end the loop stops itself)
        "warm", tmp_path / "run", seed=5, lora_r=8, limit=10, heldout=0, phases=[], evaluation={"final": False},
        warm_start={"enabled": True, "max_steps": 4, "save_steps": 2, "learning_rate": 5e-3,
                    "per_device_train_batch_size": 2, "max_length": 512, "extra": {"lr_scheduler_type": "constant"}},
    ))
    assert run_experiment(cfg)["status"] == "finished" and steps_run == [1, 2, 3, 4]
    ws = tmp_path / "run" / "warm_start"
    final = load_file(str(ws / "adapter" / "adapter_model.safetensors"))
    shutil.rmtree(ws / "adapter")  # what a kill after checkpoint-4 leaves
    (ws / WARM_START_DONE).unlink()
    steps_run.clear()
    assert run_experiment(cfg, resume=True)["status"] == "finished"
    assert steps_run == [] and sorted(p.name for p in ws.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    resumed = load_file(str(ws / "adapter" / "adapter_model.safetensors"))
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)
    losses = [r["step"] for r in json.loads((ws / "trainer_state.json").read_text())["log_history"] if "loss" in r]
    assert losses == [1, 2, 3, 4]
