"""The LoRA fine-tuning baseline (cpr.ablation.lora_sft, recipes/sft_lora.py): the M3CoT ranges,
the config (an experiment config's warm_start section, no GRPO phase), and a tiny run whose adapter then
seeds a GRPO phase (init_adapter)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from conftest import SAMPLES_DIR, tiny_model, tiny_run_config

from cpr.ablation.lora_sft import check_m3cot_ranges, load_sft_config, main
from cpr.errors import ConfigError
from cpr.training.sft import SFTSettings
from cpr.training.warm_start import warm_start_settings

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, **warm_start) -> dict:
    return tiny_run_config(
        "sft", tmp_path / "sft_run", seed=5,
        evaluation={"max_new_tokens": 16, "batch_size": 2},
        warm_start={"max_steps": 3, "learning_rate": 5.0e-5, "per_device_train_batch_size": 2, "max_length": 512,
                    **warm_start},
    )


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("settings", "world", "field", "message"),
    [
        ({"per_device_train_batch_size": 16}, 1, "warm_start.per_device_train_batch_size",
         "batch size 16 (per_device_train_batch_size 16 x gradient_accumulation_steps 1 x 1 processes) is not one of "
         "the M3CoT baseline's [2, 4, 8]"),
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, 4, "warm_start.per_device_train_batch_size",
         "batch size 16"),
        ({"learning_rate": 1e-4}, 1, "warm_start.learning_rate",
         "learning rate 0.0001 is outside the M3CoT baseline's range [1e-06, 8e-05]"),
        ({"max_length": 1024}, 1, "warm_start.max_length", "max_length 1024 is not the M3CoT baseline's 512"),
    ],
)
def test_m3cot_ranges_are_errors(settings, world, field, message):
    base = {"per_device_train_batch_size": 4, "learning_rate": 2e-5, "max_length": 512}
    with pytest.raises(ConfigError) as e:
        check_m3cot_ranges(SFTSettings(**{**base, **settings}), mode="error", world_size=world)
    assert e.value.field == field and message in e.value.message and "--ranges warn" in e.value.message


def test_m3cot_ranges_inside_and_warn(caplog):
    assert check_m3cot_ranges(SFTSettings(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          learning_rate=8e-5, max_length=512)) == []
    assert check_m3cot_ranges(SFTSettings(per_device_train_batch_size=1, gradient_accumulation_steps=2,
                                          learning_rate=1e-6, max_length=512), world_size=4) == []
    with caplog.at_level(logging.WARNING, logger="cpr.ablation"):
        problems = check_m3cot_ranges(SFTSettings(learning_rate=5e-3, per_device_train_batch_size=3), mode="warn")
    assert len(problems) == 2 and "learning rate 0.005" in problems[1]
    assert "SFT baseline: batch size 3" in caplog.text
    with pytest.raises(ConfigError, match="must be error or warn, got 'loud'"):
        check_m3cot_ranges(SFTSettings(), mode="loud")


def test_config_sections_and_errors(tmp_path, capsys):
    data = _config(tmp_path, extra={"gradient_accumulation_steps": 2})
    data.update({"phases": ["cpr"], "phase_settings": {"cpr": {"training": {"max_steps": 9}}},
                 "training": {"max_steps": 9}})
    cfg = load_sft_config(_write(tmp_path, data))  # the GRPO phases are left out, the warm start is on
    assert cfg.phases == [] and cfg.phase_settings == {} and cfg.warm_start.enabled
    settings = warm_start_settings(cfg)
    assert (settings.seed, settings.max_steps, settings.gradient_accumulation_steps) == (5, 3, 2)
    assert cfg.lora.r == 4
    with pytest.raises(ConfigError, match="unknown key") as e:
        load_sft_config(_write(tmp_path, {**_config(tmp_path), "warm_start": {"max_step": 3}}))
    assert e.value.field == "warm_start.max_step"
    with pytest.raises(ConfigError) as e:
        load_sft_config(_write(tmp_path, {**_config(tmp_path), "lora": {"r": 0}}))
    assert e.value.field == "lora.r"
    # settings outside the M3CoT ranges stop the recipe before anything is written
    assert main(["--config", str(_write(tmp_path, _config(tmp_path, learning_rate=5e-3)))]) == 2
    assert "learning rate 0.005 is outside the M3CoT baseline's range" in capsys.readouterr().err
    assert not (tmp_path / "sft_run").exists()


def test_demo_config_and_warm_start_settings(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_sft_config(REPO / "recipes" / "configs" / "sft_lora_demo.yaml", ["warm_start.max_steps=7"])
    settings = warm_start_settings(cfg)
    # demo.yaml's task, test items and warm-start settings: the tiny model needs a learning rate past M3CoT's
    assert settings.max_steps == 7 and settings.learning_rate == 2e-3
    assert check_m3cot_ranges(settings, mode="warn") == [
        "learning rate 0.002 is outside the M3CoT baseline's range [1e-06, 8e-05]"]
    from cpr.training.config import load_config

    task = load_config(REPO / "recipes" / "configs" / "demo.yaml")
    assert cfg.data.model_dump() == task.data.model_dump() and cfg.rewards == task.rewards
    assert cfg.model.name_or_path == task.model.name_or_path and cfg.evaluation.benchmarks[0].name == "crystal"
    assert {k: getattr(cfg.warm_start, k) for k in ("learning_rate", "per_device_train_batch_size", "warmup_ratio")} == {
        k: getattr(task.warm_start, k) for k in ("learning_rate", "per_device_train_batch_size", "warmup_ratio")}

    demo = load_config(REPO / "recipes" / "configs" / "demo_tabmwp.yaml")
    ws = warm_start_settings(demo)
    assert (ws.max_steps, ws.learning_rate, ws.per_device_train_batch_size, ws.max_length, ws.seed) == (
        150, 5e-3, 8, 512, 42)
    assert ws.logging_steps == 7 and (ws.save_strategy, ws.save_steps) == ("steps", 37)  # a quarter of max_steps


@pytest.mark.slow
def test_sft_recipe_trains_scores_and_seeds_a_grpo_phase(tmp_path, capsys, one_thread):
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment

    path = _write(tmp_path, _config(tmp_path))
    assert main(["--config", str(path), "--set", "warm_start.max_steps=2",
                 "--set", "evaluation.final_splits=[test, validation]"]) == 0
    out = tmp_path / "sft_run"
    summary = json.loads((out / "summary.json").read_text())
    adapter = out / "warm_start" / "adapter"
    assert summary["status"] == "finished" and summary["final_adapter"] == str(adapter) and summary["phases"] == []
    state = json.loads((out / "warm_start" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and len([h for h in state["log_history"] if "loss" in h]) == 2
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    metrics = json.loads((out / "final_eval" / "crystal" / "metrics.json").read_text())
    assert metrics["overall"]["n"] == 2 and metrics["split"] == "test" and metrics["adapter"] == str(adapter)
    assert list(metrics["overall"]) == ["n", "accuracy", "match_f1", "precision", "recall", "steps", "lis",
                                        "ordered_f1", "lucky_guess_rate"]
    assert summary["final_eval"]["crystal"] == metrics["overall"]
    # evaluation.final_splits lists validation too: scored into final_eval/validation/
    val = json.loads((out / "final_eval" / "validation" / "crystal" / "metrics.json").read_text())
    assert val["overall"]["n"] == 2 and val["split"] == "validation" and val["adapter"] == str(adapter)
    assert summary["final_eval_validation"]["crystal"] == val["overall"]
    # a second run into the same folder needs --resume (or --overwrite)
    assert main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"sft_lora: error: field 'output_dir': {out} already holds a run ({out / 'config.yaml'}): pass --resume "
        "to continue it, --overwrite to delete it and start over, or choose another output_dir"
    )

    # a GRPO phase starts from the SFT adapter: its LoRA rank is the adapter's (4), not lora.r (8)
    grpo = {**{k: v for k, v in _config(tmp_path).items() if k != "warm_start"},
            "output_dir": str(tmp_path / "grpo"), "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            "training": {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 16,
                         "save_steps": 1},
            "phases": ["cpr"],
            "phase_settings": {"cpr": {"init_adapter": str(adapter), "curriculum": {"schedule": "none"},
                                       "training": {"max_steps": 1, "learning_rate": 1e-3}}},
            "evaluation": {"final": False, "max_new_tokens": 16}}
    result = run_experiment(config_from_dict(grpo))
    (phase,) = result["phases"]
    assert phase["init_adapter"] == str(adapter) and phase["steps"] == 1
    assert summary["model"] == tiny_model(data=True)
    trained = tmp_path / "grpo" / "cpr" / "adapter"
    assert json.loads((trained / "adapter_config.json").read_text())["r"] == 4
    from safetensors.torch import load_file

    start, end = load_file(str(adapter / "adapter_model.safetensors")), load_file(str(trained / "adapter_model.safetensors"))
    assert set(start) == set(end)


def test_sft_overwrite_with_bad_data_keeps_the_previous_run(tmp_path, capsys, monkeypatch):
    """The baseline claims its folder like the runner: a malformed data file under --overwrite is
    one error line, and the previous run's files stay byte-identical."""
    import shutil

    import cpr.models

    monkeypatch.setattr(cpr.models, "load_model_and_processor", lambda *a, **k: pytest.fail("a model was loaded"))
    data = tmp_path / "tabmwp"
    shutil.copytree(SAMPLES_DIR / "tabmwp", data)
    (data / "problems_test1k_subset.json").write_text('{"1": \n')
    cfg = _config(tmp_path)
    cfg["data"]["train"][0]["path"] = str(data)
    path = _write(tmp_path, cfg)
    run = tmp_path / "sft_run"
    for name, content in (("config.yaml", b"old"), ("summary.json", b'{"status": "finished"}'),
                          ("warm_start/adapter/adapter_model.safetensors", b"\x00w"), ("final_eval/metrics.md", b"| Acc |")):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(content)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["--config", str(path), "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"sft_lora: error: {data / 'problems_test1k_subset.json'}:2: malformed JSON (Expecting value)")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
