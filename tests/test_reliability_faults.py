"""Fault injection: a run killed with SIGKILL at a named point and continued with ``--resume`` ends with the
uninterrupted run's adapter, and its logs hold each step once.

The run (recipe ``cpr_curriculum`` in a subprocess, one torch thread): a warm start of 4 steps (checkpoints every
2), one GRPO phase of 4 steps (checkpoints every 2), both with a constant learning rate (every extra step would move
the adapter), and ``select_best`` on the validation split, then the final evaluation. A prelude in the launching script
kills the process (``os.kill(getpid(), SIGKILL)``: no handler, no cleanup) at the point named by the environment
variable ``CPR_TEST_FAULT``:

* ``warm_start``: after warm-start step 3 (its checkpoint-2 complete);
* ``warm_start_end``: once the warm start's last checkpoint (checkpoint-4 = ``max_steps``) is complete, before
  its adapter is saved;
* ``checkpoint_write``: while the phase saves checkpoint-4 (its files written, ``optimizer.pt`` cut in half, no
  completion marker yet);
* ``selection``: when checkpoint selection starts (checkpoint-4 = ``max_steps`` complete, no ``phase_done.json``);
* ``final_evaluation``: when the final evaluation starts (the phase finished).

Then two ``--resume`` at once: one runs, the other is refused (exit 2, one line) while the first holds the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import tiny_run_config
from launch import write_length_reward_recipe

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

#: Run before the recipe: kills this process at the point named by CPR_TEST_FAULT.
FAULTS = '''import os, signal
FAULT = os.environ.get("CPR_TEST_FAULT")


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


if FAULT == "warm_start":
    from transformers import TrainerCallback
    import cpr.training.sft as sft

    class KillAfterStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                die()

    _run_sft = sft.run_sft
    sft.run_sft = lambda *a, **k: _run_sft(*a, **k, callbacks=[KillAfterStep3()])
elif FAULT == "warm_start_end":
    import cpr.training.checkpoints as checkpoints

    _mark = checkpoints.CompleteMarkerCallback.on_save

    def on_save(self, args, state, control, **kwargs):
        _mark(self, args, state, control, **kwargs)
        if state.global_step == 4:
            die()

    checkpoints.CompleteMarkerCallback.on_save = on_save
elif FAULT == "checkpoint_write":
    import cpr.training.checkpoints as checkpoints

    _on_save = checkpoints.CheckpointCallback.on_save

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 4:
            optimizer = checkpoints.checkpoint_folder(args, state) / "optimizer.pt"
            optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])
            die()
        return _on_save(self, args, state, control, **kwargs)

    checkpoints.CheckpointCallback.on_save = on_save
elif FAULT == "selection":
    import cpr.training.selection as selection
    selection.select_best = die
elif FAULT == "final_evaluation":
    import cpr.training.evaluate as evaluate
    evaluate.final_evaluation = die
'''


def _config(tmp_path: Path) -> Path:
    cfg = tiny_run_config(
        "faults", tmp_path / "unused", seed=5, lora_r=8, limit=10, heldout=2,
        warm_start={"enabled": True, "max_steps": 4, "save_steps": 2, "learning_rate": 5e-3,
                    "per_device_train_batch_size": 2, "max_length": 512, "extra": {"lr_scheduler_type": "constant"}},
        training={"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16,
                  "temperature": 1.0, "beta": 0.04, "logging_steps": 1, "disable_tqdm": True},
        phases=["cpr"],
        phase_settings={"cpr": {"rewards": ["format", "length"], "select_best": True, "select_metric": "match_f1",
                                "training": {"max_steps": 4, "save_steps": 2, "learning_rate": 1.0e-2,
                                             "lr_scheduler_type": "constant"}}},
        evaluation={"final": True, "max_new_tokens": 16, "batch_size": 2},
    )
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(cfg))
    write_length_reward_recipe(tmp_path / "wrapper.py", prelude=FAULTS)
    return path


def _start(tmp_path: Path, out: Path, *extra: str, fault: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    env.pop("CPR_TEST_FAULT", None)
    if fault is not None:
        env["CPR_TEST_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "wrapper.py"), "--config", str(tmp_path / "faults.yaml"), "--output-dir",
         str(out), *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _finish(p: subprocess.Popen, timeout: float = 600) -> str:
    _, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return err


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _adapter(run: Path) -> dict:
    from safetensors.torch import load_file

    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    return load_file(str(Path(summary["final_adapter"]) / "adapter_model.safetensors"))


def _steps_logged(run: Path) -> tuple[list[int], list[int]]:
    """The optimizer steps logged by the warm start (its trainer_state.json) and by the phase (log.jsonl)."""
    warm = json.loads((run / "warm_start" / "trainer_state.json").read_text())["log_history"]
    return [r["step"] for r in warm if "loss" in r], [r["step"] for r in _rows(run / "cpr" / "log.jsonl") if "loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("faults")
    _config(root)
    _finish(_start(root, root / "full"))
    return root / "full", _adapter(root / "full")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["warm_start", "warm_start_end", "checkpoint_write", "selection", "final_evaluation"])
def test_sigkill_at_a_named_point_then_resume_equals_the_uninterrupted_run(tmp_path, uninterrupted, fault):
    full, expected = uninterrupted
    _config(tmp_path)
    run = tmp_path / "killed"
    p = _start(tmp_path, run, fault=fault)
    _, err = p.communicate(timeout=600)
    assert p.returncode == -signal.SIGKILL, f"not killed at {fault}: {err[-3000:]}"

    _finish(_start(tmp_path, run, "--resume"))
    resumed = _adapter(run)
    assert resumed.keys() == expected.keys()
    assert max(float((resumed[k] - expected[k]).abs().max()) for k in expected) == 0.0
    assert _steps_logged(run) == _steps_logged(full) == ([1, 2, 3, 4], [1, 2, 3, 4])
    phase = run / "cpr"
    assert sorted(p.name for p in phase.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert json.loads((phase / "selection.json").read_text())["picked"].endswith(
        Path(json.loads((full / "cpr" / "selection.json").read_text())["picked"]).name)
    if fault == "checkpoint_write":
        [aside] = [p.name for p in phase.iterdir() if p.name.startswith("abandoned-")]
        assert aside.startswith("abandoned-checkpoint-4-")
    assert not (run / "run.lock").exists()


@pytest.mark.slow
def test_two_resumes_at_once_the_second_is_refused(tmp_path):
    import time

    _config(tmp_path)
    run = tmp_path / "killed"
    p = _start(tmp_path, run, fault="warm_start")
    p.communicate(timeout=600)
    assert p.returncode == -signal.SIGKILL
    first = _start(tmp_path, run, "--resume")
    try:
        deadline = time.time() + 120
        lock = run / "run.lock"  # the killed run's may still be there, naming it: wait for the first resume's
        while not (lock.is_file() and lock.read_text().startswith(f"pid {first.pid} ")):
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.05)
        second = _start(tmp_path, run, "--resume")
        _, err = second.communicate(timeout=300)
        assert second.returncode == 2 and "Traceback" not in err
        lines = [x for x in err.splitlines() if x.startswith("cpr_curriculum: error:")]
        assert len(lines) == 1 and f"{run} is in use by another run (pid {first.pid} on " in lines[0]
        assert first.poll() is None  # refused while the first was still running
    finally:
        _finish(first)
    assert _steps_logged(run) == ([1, 2, 3, 4], [1, 2, 3, 4])
    assert (run / "run.log").read_text().count("run faults -> ") == 2  # the killed run and the one resume
