"""Two CPU processes (torchrun, gloo): a whole run (warm start, both phases, the eval hook,
checkpoint selection, final evaluation) finishes without a deadlock, only the main process writes
the run's files, and a refused output folder stops both processes at once. Under a DeepSpeed
launch without CUDA the processes form one CPU group and build a tiny model once. Launcher settings
that cannot work together are refused at start with one line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from launch import BIN, REPO, start

from cpr.cli import run_command
from cpr.training.cli import add_arguments, run

pytestmark = pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not installed next to python")
DEMO = REPO / "recipes" / "configs" / "demo_tabmwp.yaml"


def _torchrun(script: Path | str, args: list, logs: Path, env: dict):
    # --standalone: a rendezvous on a port the OS picks (never a fixed port: other runs share the machine)
    return start([BIN / "torchrun", "--standalone", "--nproc_per_node", "2"], script, args, logs, env)


def _launch(out: Path, logs: Path, *extra: str):
    args = ["--config", DEMO, "--output-dir", out, *extra,
            "--set", "warm_start.max_steps=20", "--set", "training.per_device_train_batch_size=8",
            "--set", "training.max_completion_length=32", "--set", "evaluation.max_new_tokens=32",
            "--set", "evaluation.eval_steps=2", "--set", "training.report_to=none"]
    for phase in ("answer_only", "cpr"):
        args += ["--set", f"phase_settings.{phase}.training.max_steps=4",
                 "--set", f"phase_settings.{phase}.training.save_steps=2"]
    launch = _torchrun(REPO / "recipes" / "cpr_curriculum.py", args, logs, {"ACCELERATE_USE_CPU": "true"})
    launch.wait(600)
    return launch


@pytest.mark.slow
def test_two_cpu_processes_run_both_phases_and_refuse_together(tmp_path):
    out = tmp_path / "ddp"
    done = _launch(out, tmp_path / "logs-run")
    assert done.proc.returncode == 0, done.report()
    ranks = done.rank_stderr()
    # the other process logs warnings only
    assert [ranks[r].count(f"[cpr] run demo_tabmwp -> {out}") for r in (0, 1)] == [1, 0], done.report()
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
    refused = _launch(out, tmp_path / "logs-refused")
    assert refused.proc.returncode != 0
    line = f"cpr_curriculum: error: field 'output_dir': {out} already holds a run ({out / 'config.yaml'})"
    # both processes refuse; neither waits for the other
    assert [refused.rank_stderr()[r].count(line) for r in (0, 1)] == [1, 1], refused.report()
    assert (out / "summary.json").read_text() == before
    shutil.rmtree(out)


PROBE = """
import json, os, sys, time
from cpr.distributed import process_state
from cpr_tools.tiny_models import ensure_tiny_model

state = process_state()
if state.process_index == 0:
    time.sleep(3)  # rank 1 reaches the tiny model first
path = ensure_tiny_model("qwen2_5_vl")  # the main process builds it first (transformers saves on rank 0 only)
print("probe:", json.dumps({"rank": state.process_index, "of": state.num_processes, "files": sorted(os.listdir(path))}))
"""


@pytest.mark.slow
def test_deepspeed_without_cuda_forms_one_cpu_group_that_builds_a_tiny_model_once(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "CPR_CACHE_DIR": str(tmp_path / "cache")}
    launch = _torchrun(tmp_path / "probe.py", [], tmp_path / "logs", env)
    assert launch.wait(300) == 0, launch.report()
    seen = [json.loads(line.removeprefix("probe:")) for f in sorted(tmp_path.glob("logs/*/attempt_0/*/stdout.log"))
            for line in f.read_text().splitlines() if line.startswith("probe:")]
    # one process group of two (not two processes that each believe they are the main one) ...
    assert [(s["rank"], s["of"]) for s in seen] == [(0, 2), (1, 2)], launch.report()
    # ... and the tiny model built by the main process whole (transformers saves on rank 0 only)
    for s in seen:
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(s["files"]), launch.report()


def _recipe(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run_command("cpr_curriculum", run, parser.parse_args(argv))


@pytest.mark.parametrize(
    ("env", "overrides", "line"),
    [
        ({"ACCELERATE_USE_CPU": "true"}, [],
         "field 'ACCELERATE_USE_CPU': ACCELERATE_USE_CPU=true (--cpu, use_cpu: true) with a DeepSpeed config would "
         "train plain DDP around a ZeRO-partitioned model: unset ACCELERATE_USE_CPU (without a GPU, DeepSpeed runs "
         "on CPU processes by itself), or launch without the DeepSpeed config for plain DDP on CPU"),
        ({"ACCELERATE_MIXED_PRECISION": "bf16"}, [],
         "field 'warm_start.extra': accelerate's mixed_precision is bf16 but warm_start.extra and training train "
         "without it (on CPU cpr trains in fp32): launch with --mixed_precision no (or mixed_precision: 'no' in the "
         "accelerate config), or set warm_start.extra.bf16: true and training.bf16: true"),
        ({"ACCELERATE_MIXED_PRECISION": "bf16"}, ["warm_start.enabled=false", "phase_settings.cpr.training.bf16=true"],
         "field 'training': accelerate's mixed_precision is bf16 but training train without it (on CPU cpr trains "
         "in fp32): launch with --mixed_precision no (or mixed_precision: 'no' in the accelerate config), or set "
         "training.bf16: true"),
    ],
    ids=["cpu_flag", "bf16", "bf16_one_phase"],
)
def test_deepspeed_launch_settings_that_cannot_work_are_refused_at_start(
    tmp_path, monkeypatch, capsys, env, overrides, line
):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    argv = ["--config", str(DEMO), "--output-dir", str(out)]
    for o in overrides:
        argv += ["--set", o]
    assert _recipe(argv) == 2
    assert capsys.readouterr().err == f"cpr_curriculum: error: {line}\n"
    assert not out.exists()  # refused before anything was written


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_generation_without_vllm_is_refused_at_start(tmp_path, capsys):
    out = tmp_path / "run"
    assert _recipe(["--config", str(DEMO), "--output-dir", str(out), "--set", "training.use_vllm=true"]) == 2
    assert capsys.readouterr().err == (
        "cpr_curriculum: error: field 'training.use_vllm': training.use_vllm is true but vLLM is not installed "
        "(pip install vllm; it needs a CUDA GPU): install it or set training.use_vllm: false\n")
    assert not out.exists()
