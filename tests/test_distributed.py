"""Two CPU processes (torchrun, gloo): a whole run (warm start, both phases, the eval hook,
checkpoint selection, final evaluation) finishes without a deadlock, only the main process writes
the run's files, and a refused output folder stops both processes at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")

pytestmark = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed next to python")


def _launch(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", "29517", "recipes/cpr_curriculum.py",
           "--config", "recipes/configs/demo_tabmwp.yaml", "--output-dir", str(out), *extra,
           "--set", "warm_start.max_steps=20", "--set", "training.per_device_train_batch_size=8",
           "--set", "training.max_completion_length=32", "--set", "evaluation.max_new_tokens=32",
           "--set", "evaluation.eval_steps=2", "--set", "training.report_to=none"]
    for phase in ("answer_only", "cpr"):
        cmd += ["--set", f"phase_settings.{phase}.training.max_steps=4",
                "--set", f"phase_settings.{phase}.training.save_steps=2"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_cpu_processes_run_both_phases_and_refuse_together(tmp_path):
    out = tmp_path / "ddp"
    done = _launch(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("[cpr] run demo_tabmwp ->") == 1  # the other process logs warnings only
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and [p["phase"] for p in summary["phases"]] == ["answer_only", "cpr"]
    assert all(p["steps"] == 4 for p in summary["phases"])
    # the eval hook ran at steps 2 and 4 of each phase, written once (by the main process)
    for phase in ("answer_only", "cpr"):
        rows = [json.loads(line) for line in (out / phase / "eval_history.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [2, 4]
        assert (out / phase / "checkpoint-4" / "checkpoint_complete.json").is_file()
    assert json.loads((out / "final_eval" / "crystal" / "metrics.json").read_text())["overall"]["n"] == 8

    before = (out / "summary.json").read_text()
    refused = _launch(out)
    assert refused.returncode != 0
    line = f"cpr_curriculum: error: field 'output_dir': {out} already holds a run ({out / 'config.yaml'})"
    assert refused.stderr.count(line) == 2  # both processes refuse; neither waits for the other
    assert (out / "summary.json").read_text() == before
    shutil.rmtree(out)
