"""The code paths a multi-GPU run takes that a CPU run would not show: evaluation on the process's
accelerator, the process group's timeout from ``ddp_timeout``, the LoRA adapter's dtype across phases,
vLLM's image-size limits, freeing a vLLM engine between phases and the shared ``output_dir`` check
(two gloo processes)."""

from __future__ import annotations

import copy
import datetime
import gc
import json
import shutil
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TABMWP_RUN, tiny_model
from launch import BIN, start

from cpr.errors import ConfigError
from cpr.training.config import config_from_dict

BASE: dict = {**TABMWP_RUN, "run_name": "gpu"}


def _cfg(**sections):
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data)


class _Stop(Exception):
    pass


def test_evaluation_loads_the_policy_on_the_process_device(monkeypatch):
    """Checkpoint selection and the final evaluation (score_adapters) load the model on the accelerator."""
    import cpr.models
    from cpr.distributed import process_state
    from cpr.training.evaluate import score_adapters

    seen = {}

    def spy(path, **kwargs):
        seen.update(kwargs, path=path)
        raise _Stop

    monkeypatch.setattr(cpr.models, "load_model_and_processor", spy)
    with pytest.raises(_Stop):
        score_adapters(_cfg(), "models/unused", [None], lambda model, processor: None)
    assert seen["path"] == "models/unused"
    assert seen["device"] == str(process_state().device) == "cpu"


def test_process_group_timeout_comes_from_ddp_timeout(monkeypatch):
    import accelerate

    import cpr.distributed as D
    from cpr.training.experiment import run_experiment
    from cpr.training.preflight import process_group_timeout

    assert process_group_timeout(_cfg()) == 1800.0  # TrainingArguments' default
    cfg = _cfg(training={"ddp_timeout": 7200}, phases=["answer_only", "cpr"],
               phase_settings={"cpr": {"training": {"ddp_timeout": 9000}}})
    assert process_group_timeout(cfg) == 9000.0  # the largest of the phases'

    made = {}
    monkeypatch.setattr(accelerate, "PartialState", lambda **kwargs: made.update(kwargs) or "state")
    assert D.process_state(timeout_s=90) == "state"
    assert made["timeout"] == datetime.timedelta(seconds=90)

    asked = {}

    def first_state(**kwargs):
        asked.update(kwargs)
        raise _Stop

    monkeypatch.setattr(D, "process_state", first_state)
    with pytest.raises(_Stop):
        run_experiment(cfg)
    assert asked == {"timeout_s": 9000.0}  # the runner creates the process group with it


@pytest.mark.slow
def test_phase_two_reloads_the_adapter_in_the_dtype_phase_one_trained(tmp_path):
    """TRL creates a ZeRO-3 phase's adapter with autocast_adapter_dtype=False (bf16 on a bf16 model); the
    next phase's reload keeps it bf16 (PEFT's default would upcast it to fp32)."""
    import torch
    from peft import get_peft_model

    from cpr.models import load_model_and_processor
    from cpr.training import policy

    path = tiny_model()
    cfg = _cfg(model={"name_or_path": path, "dtype": "bfloat16"}, lora={"r": 4, "alpha": 8, "dropout": 0.0})
    model, _ = load_model_and_processor(path, dtype="bfloat16", device="cpu", gradient_checkpointing=False)
    phase1 = get_peft_model(model, policy.lora_config(cfg, path), autocast_adapter_dtype=False)
    assert {p.dtype for n, p in phase1.named_parameters() if "lora_" in n} == {torch.bfloat16}
    phase1.save_pretrained(tmp_path / "adapter")

    base, _ = load_model_and_processor(path, dtype="bfloat16", device="cpu", gradient_checkpointing=False)
    phase2 = policy.with_adapter(base, tmp_path / "adapter", cfg, zero3=True)
    lora = {n: p for n, p in phase2.named_parameters() if "lora_" in n}
    assert lora and {p.dtype for p in lora.values()} == {torch.bfloat16}
    assert all(p.requires_grad for p in lora.values())


def test_without_zero3_phase_two_trains_the_fp32_adapter_phase_one_trained(tmp_path):
    """Single process or DDP (issue 33): TRL creates the adapter with PEFT's default, fp32 on a bf16 model, and
    the optimizer has no fp32 master weights; the next phase's reload keeps it fp32, every value as saved (a
    reload in the bf16 base's dtype rounded them, and AdamW then updated bf16 weights directly)."""
    import torch
    from peft import get_peft_model
    from safetensors.torch import load_file

    from cpr.models import load_model_and_processor
    from cpr.training import policy

    path = tiny_model()
    cfg = _cfg(model={"name_or_path": path, "dtype": "bfloat16"}, lora={"r": 4, "alpha": 8, "dropout": 0.0})
    model, _ = load_model_and_processor(path, dtype="bfloat16", device="cpu", gradient_checkpointing=False)
    phase1 = get_peft_model(model, policy.lora_config(cfg, path))
    with torch.no_grad():
        for n, p in phase1.named_parameters():
            if "lora_" in n:
                p.copy_(torch.linspace(0.1, 0.2, p.numel()).reshape(p.shape) + 1e-5)  # not representable in bf16
    assert {p.dtype for n, p in phase1.named_parameters() if "lora_" in n} == {torch.float32}
    phase1.save_pretrained(tmp_path / "adapter")
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))

    base, _ = load_model_and_processor(path, dtype="bfloat16", device="cpu", gradient_checkpointing=False)
    phase2 = policy.with_adapter(base, tmp_path / "adapter", cfg, zero3=False)
    lora = {n: p for n, p in phase2.named_parameters() if "lora_" in n}
    assert lora and {p.dtype for p in lora.values()} == {torch.float32}
    assert all(p.requires_grad for p in lora.values())
    for key, value in saved.items():
        name = key.replace(".weight", ".default.weight")
        assert torch.equal(lora[name].detach(), value), name


def test_the_adapter_dtype_rule_reads_the_trainers_deepspeed_stage(tmp_path):
    """ZeRO-3 is read from the phase's training arguments: a GRPOConfig without DeepSpeed is not ZeRO-3, a
    DeepSpeed plugin of stage 3 is, one of stage 2 (fp32 master weights, TRL's fp32 adapter) is not."""
    from trl import GRPOConfig

    from cpr.training.policy import deepspeed_zero3

    assert deepspeed_zero3(GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")) is False
    assert deepspeed_zero3(SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3))) is True
    assert deepspeed_zero3(SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=2))) is False


def test_free_vllm_engine_drops_it_and_empties_the_cuda_cache(monkeypatch):
    import torch

    from cpr.training import policy

    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))

    shut = []

    class Engine:
        def shutdown(self):  # vLLM's in-process teardown, where the installed vLLM has it
            shut.append(True)

    engine = Engine()
    alive = weakref.ref(engine)
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(llm=engine, mode="colocate"))
    hook = SimpleNamespace(trainer=trainer)  # a callback still holds the trainer
    del engine
    assert policy.free_vllm_engine(trainer) is True
    gc.collect()
    assert alive() is None and trainer.vllm_generation.llm is None and emptied == [True] and shut == [True]
    assert hook.trainer is trainer
    assert policy.free_vllm_engine(trainer) is False  # nothing left
    assert policy.free_vllm_engine(SimpleNamespace()) is False  # transformers generation


def test_server_mode_closes_the_phases_weight_sync_communicator(monkeypatch):
    """vLLM server mode (issue 33): TRL closes a client's weight-sync group only at exit, so each phase's
    trainer would open a second one on the same group port; the phase's is closed when the phase ends (TRL's
    own ``VLLMClient.close_communicator``, on a client that never connected)."""
    from trl.generation.vllm_client import VLLMClient

    from cpr.training import policy

    client = object.__new__(VLLMClient)  # no server here: only the communicator TRL's init_communicator sets
    group = SimpleNamespace(store="tcp store", socket="socket")
    client.communicator = SimpleNamespace(group=group)
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(vllm_client=client, mode="server"))
    assert policy.free_vllm_engine(trainer) is True
    assert client.communicator is None and group.store is None and group.socket is None
    assert policy.free_vllm_engine(trainer) is False  # closed once
    other_ranks = SimpleNamespace(vllm_generation=SimpleNamespace(mode="server"))  # only the main process has one
    assert policy.free_vllm_engine(other_ranks) is False


def test_evaluation_logs_free_memory_before_loading_and_empties_the_cache_after(monkeypatch, caplog):
    """score_adapters (checkpoint selection, the final evaluation) logs the device's free memory before its
    model loads and returns its cached blocks once the model is dropped (issue 33: a phase or vLLM engine
    after it found them reserved)."""
    import logging

    import torch

    from cpr.training import evaluate, policy

    events = []
    monkeypatch.setattr(policy, "device_memory", lambda device: "cuda:0, 3.0 of 8.0 GiB free")
    monkeypatch.setattr(policy, "load_policy", lambda cfg, path, device=None: events.append("load") or ("m", "p"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    with caplog.at_level(logging.INFO, logger=evaluate.logger.name):
        got = evaluate.score_adapters(_cfg(), "models/unused", [None], lambda model, processor: events.append("score") or 7)
    assert got == [7] and events == ["load", "score", "empty_cache"]
    assert "evaluation: device cuda:0, 3.0 of 8.0 GiB free" in caplog.messages


def test_device_memory_reports_cuda_free_memory(monkeypatch):
    import torch

    from cpr.training import policy

    assert policy.device_memory("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: asked.append(d) or (3 * 2**30, 8 * 2**30))
    assert policy.device_memory("cuda:1") == "cuda:1, 3.0 of 8.0 GiB free"
    assert asked == [torch.device("cuda:1")]


def _vllm_cfg(model: str, mode: str = "colocate", **pixels):
    return _cfg(model={"name_or_path": model, "dtype": "float32", **pixels},
                training={"use_vllm": True, "vllm_mode": mode})


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vllm_with_other_pixel_limits_than_the_model_folder_is_refused(mode):
    from cpr.training.preflight import check_launch

    path = tiny_model()  # its processor was saved with min_pixels 3136, max_pixels 12544
    with pytest.raises(ConfigError) as e:
        check_launch(_vllm_cfg(path, mode, max_pixels=6272))
    assert e.value.field == "model.max_pixels"
    message = str(e.value)
    assert "\n" not in message
    assert (f"training.use_vllm: vLLM processes images with the limits saved with {path} (min_pixels 3136, "
            f"max_pixels 12544), not the trainer's (min_pixels 3136, max_pixels 6272), and TRL passes it no "
            f"mm_processor_kwargs") in message
    assert ("trl vllm-serve --model <copy>" in message) == (mode == "server")
    assert '--mm-processor-kwargs \'{"min_pixels": 3136, "max_pixels": 6272}\'' in message or mode == "colocate"


def test_vllm_with_the_model_folders_own_limits_passes_the_pixel_check(tmp_path):
    from cpr.models import load_model_and_processor
    from cpr.training.preflight import check_launch
    from cpr.training.vllm import vllm_image_limits

    copy_dir = tmp_path / "model"
    shutil.copytree(tiny_model(), copy_dir)
    _, processor = load_model_and_processor(str(copy_dir), min_pixels=3136, max_pixels=6272, device="cpu")
    processor.save_pretrained(copy_dir)  # the fix the refusal names
    assert vllm_image_limits(str(copy_dir), 3136, 6272) == ({"min_pixels": 3136, "max_pixels": 6272},) * 2
    with pytest.raises(ConfigError, match="vLLM is not installed"):  # past the pixel check
        check_launch(_vllm_cfg(str(copy_dir), max_pixels=6272))


SHARED_PROBE = """
import json, sys
from cpr.distributed import check_shared_output_dir, process_state
from cpr.errors import ConfigError

state = process_state()
shared, local = sys.argv[1], sys.argv[2] + str(state.process_index)
check_shared_output_dir(shared, state)  # one folder for both: passes
try:
    check_shared_output_dir(local, state)  # each process its own folder at its own path: a node-local disk
    print("probe:", json.dumps({"rank": state.process_index, "error": None}))
except ConfigError as e:
    print("probe:", json.dumps({"rank": state.process_index, "error": str(e)}))
state.destroy_process_group()  # a gloo group left to the interpreter's exit can abort it (SIGABRT)
"""


@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not installed next to python")
def test_output_dir_not_shared_by_every_process_is_refused_on_every_process(tmp_path):
    (tmp_path / "probe.py").write_text(SHARED_PROBE)
    launch = start([BIN / "torchrun", "--standalone", "--nproc_per_node", "2"], tmp_path / "probe.py",
                   [tmp_path / "shared", tmp_path / "local-"], tmp_path / "logs", {"ACCELERATE_USE_CPU": "true"})
    assert launch.wait(300) == 0, launch.report()
    seen = [json.loads(line.removeprefix("probe:")) for f in sorted(tmp_path.glob("logs/*/attempt_0/*/stdout.log"))
            for line in f.read_text().splitlines() if line.startswith("probe:")]
    assert [s["rank"] for s in seen] == [0, 1], launch.report()
    for s in seen:  # both refuse (neither waits for the other), naming the process that does not see the file
        line = f"field 'output_dir': output_dir {tmp_path}/local-{s['rank']} is not shared by every process: process 1 on "
        assert s["error"].startswith(line), s
        assert "a multi-node run needs output_dir on a filesystem every node mounts at the same path" in s["error"]
    assert not any(Path(p).exists() for p in (tmp_path / "shared" / ".cpr-shared-check",
                                              tmp_path / "local-0" / ".cpr-shared-check"))


CLAIM_PROBE = """
import json, sys, time
from pathlib import Path
from cpr.distributed import check_shared_output_dir, process_state
from cpr.errors import ConfigError
from cpr.training.experiment import claim_output_dir

state = process_state()
out = Path(sys.argv[1])
if state.is_main_process:  # the main process removes the check's token late, as a slow filesystem may show it
    unlink = Path.unlink
    Path.unlink = lambda self, *a, **k: (time.sleep(0.5), unlink(self, *a, **k))[1]
check_shared_output_dir(out, state)
try:
    print("probe:", json.dumps({"rank": state.process_index, "claimed": claim_output_dir(out, resume=False,
                                overwrite=False, state=state)}))
except ConfigError as e:
    print("probe:", json.dumps({"rank": state.process_index, "error": str(e)}))
state.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not installed next to python")
def test_every_process_takes_the_main_process_decision_on_a_failed_run(tmp_path):
    """A re-run into a run that failed before training (issue 33): while one process still lists the shared
    check's token in the folder, every process still replaces the failed run, as the main process decides."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("run_name: gpu\n")
    (out / "summary.json").write_text(json.dumps({"status": "failed"}))
    (tmp_path / "probe.py").write_text(CLAIM_PROBE)
    launch = start([BIN / "torchrun", "--standalone", "--nproc_per_node", "2"], tmp_path / "probe.py", [out],
                   tmp_path / "logs", {"ACCELERATE_USE_CPU": "true"})
    assert launch.wait(300) == 0, launch.report()
    seen = [json.loads(line.removeprefix("probe:")) for f in sorted(tmp_path.glob("logs/*/attempt_0/*/stdout.log"))
            for line in f.read_text().splitlines() if line.startswith("probe:")]
    assert seen == [{"rank": 0, "claimed": True}, {"rank": 1, "claimed": True}], launch.report()
