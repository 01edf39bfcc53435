"""After checkpoint selection the phase's ``adapter/`` folder is the selected adapter, and the last step
stays in its checkpoint (:func:`cpr.training.selection.install_selected`, called by the runner)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import cpr.training.experiment as runner
import cpr.training.selection as selection
from cpr.errors import ConfigError
from cpr.training.checkpoints import COMPLETE_MARKER


def _torch_file(obj) -> bytes:
    """A whole torch file (a zip archive), as transformers and PEFT save them."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


PROCESSOR_FILES = {"preprocessor_config.json": b"{}", "tokenizer.json": b"{}", "training_args.bin": _torch_file("args")}
TRAINER_FILES = {"optimizer.pt": _torch_file("opt"), "scheduler.pt": _torch_file("sched"), "trainer_state.json": b"{}",
                 "rng_state.pth": _torch_file("rng")}


def _adapter_files(step: int) -> dict[str, bytes]:
    """A LoRA adapter whose weights (real safetensors: checkpoints are checked to load) hold the step."""
    import torch
    from safetensors.torch import save

    return {"adapter_model.safetensors": save({"lora_A.weight": torch.full((2, 2), float(step))}),
            "adapter_config.json": json.dumps({"r": 4}).encode(), "README.md": f"card {step}".encode()}


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _contents(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in folder.iterdir()}


def _phase(tmp_path: Path, *, last_checkpoint: bool = True) -> Path:
    """A phase of 4 steps as training leaves it: checkpoint-2, checkpoint-4 (the last step, unless
    ``last_checkpoint`` is off) and the final adapter (step 4's weights with the processor)."""
    phase = tmp_path / "run" / "answer_only"
    steps = (2, 4) if last_checkpoint else (2,)
    for step in steps:
        _write(phase / f"checkpoint-{step}", {**_adapter_files(step), **PROCESSOR_FILES, **TRAINER_FILES,
                                              COMPLETE_MARKER: b"{}"})
    _write(phase / "adapter", {**_adapter_files(4), **PROCESSOR_FILES})
    return phase


def test_the_phase_adapter_becomes_the_selected_checkpoint_and_the_last_step_stays(tmp_path):
    phase = _phase(tmp_path)
    before = {p.name: _contents(p) for p in phase.iterdir()}
    info = selection.install_selected(phase, phase / "checkpoint-2", 4)
    assert info == {"adapter_from": str(phase / "checkpoint-2"), "last_step_adapter": str(phase / "checkpoint-4")}
    # the same files as before (no trainer state), step 2's adapter
    assert _contents(phase / "adapter") == {**_adapter_files(2), **PROCESSOR_FILES}
    # the checkpoints are untouched; nothing else is left in the phase folder
    assert {p.name for p in phase.iterdir()} == {"adapter", "checkpoint-2", "checkpoint-4"}
    assert _contents(phase / "checkpoint-4") == before["checkpoint-4"]
    assert _contents(phase / "checkpoint-2") == before["checkpoint-2"]


def test_the_final_adapter_picked_changes_nothing(tmp_path):
    phase = _phase(tmp_path)
    assert selection.install_selected(phase, phase / "adapter", 4) is None
    assert _contents(phase / "adapter") == {**_adapter_files(4), **PROCESSOR_FILES}


def test_a_last_step_without_a_checkpoint_is_kept_beside(tmp_path):
    phase = _phase(tmp_path, last_checkpoint=False)
    info = selection.install_selected(phase, phase / "checkpoint-2", 4)
    kept = phase / selection.LAST_STEP_ADAPTER
    assert info == {"adapter_from": str(phase / "checkpoint-2"), "last_step_adapter": str(kept)}
    assert _contents(kept) == {**_adapter_files(4), **PROCESSOR_FILES}
    assert _contents(phase / "adapter") == {**_adapter_files(2), **PROCESSOR_FILES}


def test_a_pick_without_an_adapter_is_refused(tmp_path):
    phase = _phase(tmp_path)
    (phase / "checkpoint-2" / "adapter_config.json").unlink()
    with pytest.raises(ConfigError, match="no LoRA adapter"):
        selection.install_selected(phase, phase / "checkpoint-2", 4)
    assert _contents(phase / "adapter") == {**_adapter_files(4), **PROCESSOR_FILES}


def test_the_runner_hands_on_the_pick_and_its_summary_names_the_phase_adapter(tmp_path, monkeypatch):
    """What a user takes as the phase's result (``summary.json`` ``phases[i].adapter``) is the adapter the
    closing table scores for the phase and the next phase starts from."""
    phase = _phase(tmp_path)
    monkeypatch.setattr(selection, "select_best", lambda *a: {"picked": str(phase / "checkpoint-2"), "scores": []})
    state = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    run = SimpleNamespace(out=phase.parent, state=state, cfg=None, splits=None, templates=None, model_path="model")
    spec = SimpleNamespace(name="answer_only", phase=SimpleNamespace(select_best=True))
    result = {"phase": "answer_only", "steps": 4, "adapter": str(phase / "adapter")}
    handed = runner.select_best(run, spec, result)
    assert handed == phase / "checkpoint-2"
    assert _contents(Path(result["adapter"])) == {**_adapter_files(2), **PROCESSOR_FILES}
    assert (result["adapter_from"], result["last_step_adapter"]) == (str(handed), str(phase / "checkpoint-4"))
