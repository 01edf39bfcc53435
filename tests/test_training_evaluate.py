"""The pieces split out of the runner that need no training: evaluation.final_splits (config, folders,
summary keys, which records each split scores), the ablation plan's use of it, reading old run
folders, the policy's model path, and the exit codes of ``cpr train`` (a diverged run exits 3)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import TABMWP_RUN

from cpr.errors import ConfigError
from cpr.training.config import config_from_dict
from cpr.training.evaluate import benchmark_records, final_eval_dir, final_eval_key, summary_entries

REPO = Path(__file__).resolve().parents[1]
TABMWP = REPO / "data" / "samples" / "tabmwp"

BASE: dict = TABMWP_RUN


def _cfg(**evaluation):
    data = copy.deepcopy(BASE)
    data["evaluation"] = evaluation
    return config_from_dict(data)


def test_final_splits_default_and_values():
    assert _cfg().evaluation.final_splits == ["test"]
    assert _cfg(final_splits=["validation", "test"]).evaluation.final_splits == ["validation", "test"]
    assert _cfg(final=False, final_splits=[]).evaluation.final_splits == []


@pytest.mark.parametrize(
    ("evaluation", "key", "message"),
    [
        ({"final_splits": ["train"]}, "evaluation.final_splits[0]", "must be 'test' or 'validation', got 'train'"),
        ({"final_splits": ["test", "test"]}, "evaluation.final_splits", "a split is listed twice: ['test', 'test']"),
        ({"final_splits": []}, "evaluation.final_splits",
         "no split to score: list test and / or validation, or set evaluation.final: false"),
        ({"final_splits": "test"}, "evaluation.final_splits", "expected a list, got str"),
    ],
)
def test_final_splits_errors_name_the_key(evaluation, key, message):
    with pytest.raises(ConfigError) as e:
        _cfg(**evaluation)
    assert e.value.field == key and e.value.message == message


def test_final_eval_folders_and_summary_keys(tmp_path):
    assert final_eval_dir(tmp_path, "test") == tmp_path / "final_eval"
    assert final_eval_dir(tmp_path, "validation") == tmp_path / "final_eval" / "validation"
    assert (final_eval_key("test"), final_eval_key("validation")) == ("final_eval", "final_eval_validation")
    assert summary_entries({"test": {"crystal": {"n": 2}}, "validation": {}}) == {
        "final_eval": {"crystal": {"n": 2}}, "final_eval_validation": {}}
    with pytest.raises(ConfigError) as e:
        final_eval_dir(tmp_path, "train")
    assert str(e.value) == "field 'split': unknown split 'train'; expected one of test, validation"


def test_benchmark_records_of_each_split():
    from cpr.training.splits import load_splits

    cfg = _cfg()
    splits = load_splits(cfg.data)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (9, 3, 0)
    ((name, records, limit),) = benchmark_records(cfg, splits, "validation")
    assert (name, [r.id for r in records], limit) == ("crystal", [r.id for r in splits.validation], None)
    assert benchmark_records(cfg, splits, "test") == []  # no test records: nothing to score (the runner skips it)

    data = copy.deepcopy(BASE)
    data["data"]["test_size"] = 2
    data["evaluation"] = {"benchmarks": [{"name": "crystal", "limit": 1}]}
    cfg = config_from_dict(data)
    splits = load_splits(cfg.data)
    ((name, records, limit),) = benchmark_records(cfg, splits, "test")
    assert (name, [r.id for r in records], limit) == ("crystal", [r.id for r in splits.test], 1)


def test_evaluate_adapter_refuses_a_split_without_records(tmp_path):
    from cpr.training.evaluate import final_evaluation

    with pytest.raises(ConfigError) as e:
        final_evaluation(_cfg(), None, adapter=None, run_dir=tmp_path, label="x", on=["test"])
    assert str(e.value) == "field 'data.test_size': no test records to score: give data.test or data.test_size"
    with pytest.raises(ConfigError, match=r"no LoRA adapter \(adapter_config.json\) in "):
        final_evaluation(_cfg(), None, adapter=tmp_path, run_dir=tmp_path, label="x", on=["validation"])


def test_run_folder_reads_the_final_evaluation_of_each_split(tmp_path):
    from cpr.ablation.run_folder import read_run

    def write(sub: str, accuracy: float) -> None:
        path = tmp_path / sub / "crystal" / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"overall": {"n": 2, "accuracy": accuracy}}))

    run = read_run(tmp_path)
    assert run.eval_metrics("validation") is None
    write("final_eval/validation", 100.0)
    assert run.eval_metrics("validation")["overall"]["accuracy"] == 100.0
    assert run.eval_metrics("test") is None
    write("final_eval", 50.0)
    assert run.eval_metrics("test")["overall"]["accuracy"] == 50.0
    with pytest.raises(ConfigError, match="unknown split 'train'"):
        run.eval_metrics("train")


def test_cpr_train_exit_codes(tmp_path, monkeypatch, capsys):
    import cpr.training.experiment
    from cpr.cli import error_exit_code, main
    from cpr.training.divergence import TrainingDivergedError
    from cpr.training.oom import TrainingOutOfMemoryError

    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    error = TrainingDivergedError("phase cpr diverged at step 2: nan loss")

    def diverge(cfg, *, resume=False, overwrite=False):
        raise error

    monkeypatch.setattr(cpr.training.experiment, "run_experiment", diverge)
    assert main(["train", "--config", str(path)]) == 3
    assert capsys.readouterr().err == "cpr train: error: phase cpr diverged at step 2: nan loss\n"
    assert error_exit_code(error) == 3 and error_exit_code(TrainingOutOfMemoryError("x")) == 2
    assert error_exit_code(ConfigError("bad", field="k")) == 2
    assert main(["train", "--config", str(path), "--set", "evaluation.final_splits=[train]"]) == 2
    assert capsys.readouterr().err == (
        f"cpr train: error: {path} (--set evaluation.final_splits=[train]) field 'evaluation.final_splits[0]': "
        "must be 'test' or 'validation', got 'train'\n"
    )
    monkeypatch.setattr(cpr.training.experiment, "run_experiment", lambda cfg, *, resume=False, overwrite=False: {"status": "finished"})
    assert main(["train", "--config", str(path)]) == 0


OWN_DATA = [{"source": "tabmwp", "path": str(TABMWP), "limit": 2}]


def test_the_eval_hook_scores_the_validation_split_never_the_test_split(tmp_path):
    """The hook and best_checkpoint.json use the validation split (each benchmark without its own
    data, capped at its limit); the test split and benchmarks with their own data (test sets) are
    left to the final evaluation."""
    from cpr.training.evaluate import eval_hook, hook_benchmarks
    from cpr.training.splits import load_splits

    data = copy.deepcopy(BASE)
    data["data"]["test_size"] = 2
    data["evaluation"] = {"eval_steps": 2, "benchmarks": [{"name": "crystal", "limit": 2},
                                                          {"name": "m3cot", "data": OWN_DATA}]}
    cfg = config_from_dict(data)
    splits = load_splits(cfg.data)
    validation = [r.id for r in splits.validation]
    assert len(validation) == 3 and not set(validation) & {r.id for r in splits.test}
    assert [(n, [r.id for r in recs], limit) for n, recs, limit in hook_benchmarks(cfg, splits)] == [
        ("crystal", validation, 2)]
    (spec,) = eval_hook(cfg, splits, None, tmp_path).benchmarks
    assert spec.name == "crystal" and len(spec.selected) == 2 and {r.id for r in spec.selected} <= set(validation)
    assert [n for n, _, _ in benchmark_records(cfg, splits, "test")] == ["crystal", "m3cot"]  # the final evaluation
    cfg.evaluation.benchmarks = []  # none listed: crystal on the validation split, all of it
    assert [(n, len(recs), limit) for n, recs, limit in hook_benchmarks(cfg, splits)] == [("crystal", 3, None)]


@pytest.mark.parametrize(
    ("evaluation", "data", "key", "message"),
    [
        ({"eval_steps": 2, "metric_for_best": "m3cot/accuracy",
          "benchmarks": [{"name": "crystal"}, {"name": "m3cot", "data": OWN_DATA}]}, {},
         "evaluation.metric_for_best",
         "'m3cot/accuracy' would pick the best checkpoint on a benchmark the eval hook does not score: the hook "
         "scores the validation split (crystal); a benchmark with its own data is a test set, scored once by the "
         "final evaluation"),
        ({"eval_steps": 2, "benchmarks": [{"name": "crystal", "data": OWN_DATA}]}, {}, "evaluation.metric_for_best",
         "the hook scores the validation split (no benchmark without its own data)"),
        ({"eval_steps": 2}, {"validation_size": 0}, "evaluation.eval_steps",
         "the eval hook scores the validation split, which is empty: set data.validation or data.validation_size, "
         "or evaluation.eval_steps: null"),
    ],
)
def test_a_config_that_would_select_on_test_is_refused(evaluation, data, key, message):
    raw = copy.deepcopy(BASE)
    raw["data"].update(data)
    raw["evaluation"] = evaluation
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert e.value.field == key and message in e.value.message



def _foreign_adapter(folder: Path, base: str) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    return folder


def test_hand_over_and_final_evaluation_refuse_an_adapter_of_another_base(tmp_path):
    """The runner's adapter loads (a phase's init_adapter or hand-over, the final evaluation) go
    through the base check before any model loads."""
    from types import SimpleNamespace

    from cpr.training.evaluate import final_evaluation
    from cpr.training.policy import with_adapter

    adapter = _foreign_adapter(tmp_path / "adapter", "org/base-a")
    with pytest.raises(ConfigError) as e:
        with_adapter(SimpleNamespace(name_or_path="org/base-b"), adapter, _cfg(), zero3=False,
                     field="phase_settings.cpr.init_adapter")
    assert str(e.value).startswith(f"field 'phase_settings.cpr.init_adapter': LoRA adapter {adapter} was trained on "
                                   "base model 'org/base-a', not on 'org/base-b' (the names differ")
    with pytest.raises(ConfigError) as e:
        final_evaluation(_cfg(), None, adapter=adapter, run_dir=tmp_path / "ev", label="x", on=["validation"],
                         model_path="org/base-b")
    assert e.value.field == "adapter" and "model.allow_base_mismatch" in e.value.message
    assert not (tmp_path / "ev").exists()


def test_evaluation_decoding_reaches_the_hook_but_not_checkpoint_selection(tmp_path):
    from cpr.training.evaluate import eval_hook, generation_settings
    from cpr.training.splits import load_splits

    decoding = {"mode": "sampled", "temperature": 0.7, "top_p": 0.95, "samples": 3, "seed": 9}
    cfg = _cfg(decoding=decoding, eval_steps=1, metric_for_best="crystal/sampled_match_f1")
    assert generation_settings(cfg, progress=False).decoding.samples == 3
    assert generation_settings(cfg, progress=False, greedy=True).decoding.mode == "greedy"  # what selection uses
    hook = eval_hook(cfg, load_splits(cfg.data), None, tmp_path)
    assert hook.generation.decoding.temperature == 0.7 and hook.metric_for_best == "crystal/sampled_match_f1"
    # mean@k metrics exist only with sampled decoding
    with pytest.raises(ConfigError, match="a metric of sampled decoding") as e:
        _cfg(eval_steps=1, metric_for_best="crystal/sampled_match_f1")
    assert e.value.field == "evaluation.metric_for_best"


def test_the_paper_rows_go_only_beside_crystals_test_set():
    from cpr.training.evaluate import on_crystal_test

    held_out = _cfg()  # the test split a share of the TabMWP training records
    assert not on_crystal_test(held_out, "crystal", "test")
    data = copy.deepcopy(BASE)
    data["data"]["test"] = [{"source": "crystal", "path": "waybarrios/CRYSTAL", "split": "test"}]
    crystal = config_from_dict(data)
    assert on_crystal_test(crystal, "crystal", "test")
    assert not on_crystal_test(crystal, "crystal", "validation") and not on_crystal_test(crystal, "m3cot", "test")
    data["evaluation"] = {"benchmarks": [{"name": "crystal", "data": [{"source": "tabmwp", "path": str(TABMWP)}]}]}
    assert not on_crystal_test(config_from_dict(data), "crystal", "test")  # the benchmark's own data decides
