"""Ablation files: the shipped YAML files, the errors, --list's command lines (which must build exactly
the configs the ablation runs in-process), --only, and what a rerun does with existing run folders."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from ablation_runs import base_config, write_run

from cpr.ablation.sweep import load_ablation, main, plan, run_config
from cpr.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs"
SHIPPED = ["ablation_weights.yaml", "ablation_weights_demo.yaml", "ablation_strategies.yaml",
           "ablation_strategies_demo.yaml", "reproduce_strategies.yaml", "reproduce_weights.yaml"]


def _in_tmp(name: str, tmp_path: Path):
    """A shipped ablation file with its output folder moved to tmp_path."""
    data = yaml.safe_load((CONFIGS / name).read_text())
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "abl"), "base_config": str(REPO / data["base_config"])}))
    return path, load_ablation(path)


def _finish(folder: Path, adapter_of: str = "adapter") -> str:
    """A finished run folder whose final adapter is a stand-in (validation only reads adapter_config.json)."""
    adapter = folder / adapter_of
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (folder / "summary.json").write_text(json.dumps({"status": "finished", "final_adapter": str(adapter)}))
    return str(adapter)


def _parse_recipe(command: str) -> dict:
    """What a listed recipe command line would run: its argument parser and config loader."""
    import argparse

    from cpr.ablation.lora_sft import load_sft_config
    from cpr.training.cli import add_arguments
    from cpr.training.config import config_from_args

    argv = shlex.split(command)
    recipe = next(a for a in argv if a.endswith(".py"))
    args = argv[argv.index(recipe) + 1:]
    if recipe.endswith("cpr_curriculum.py"):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return config_from_args(parser.parse_args(args)).to_dict()
    assert recipe.endswith("sft_lora.py")
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return load_sft_config(args[args.index("--config") + 1], overrides).to_dict()


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_files_list_commands_that_build_the_runs_configs(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    path, ab = _in_tmp(name, tmp_path)
    runs = plan(ab)
    starters = {r.name for r in runs if any(str(v).startswith("@") for _, v in r.pairs)}
    for run in runs:  # a run that others start from has finished: every listed line is a recipe command
        if any(str(v) == f"@{run.name}" for r in runs for _, v in r.pairs):
            _finish(tmp_path / "abl" / run.name)
    assert main(["--config", str(path), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [ln for ln in out if not ln.startswith("#")]
    described = {ln.split(": ", 1)[0][2:]: ln.split(": ", 1)[1] for ln in out if ln.startswith("# ") and ": " in ln}
    assert lines[-1] == f"python recipes/reward_ablation.py --config {path} --table-only"
    assert len(lines) == len(runs) + 1 and starters <= set(described)
    for run, line in zip(runs, lines, strict=False):
        assert line.endswith(f"recipes/reward_ablation.py --config {path} --only {run.name} --resume")
        built = run_config(ab, run)
        assert built.output_dir == str(tmp_path / "abl" / run.name) and built.run_name == f"{ab.name}-{run.name}"
        assert _parse_recipe(described[run.name]) == built.to_dict(), run.name
        # every run scores the table's split itself (its final evaluation)
        assert built.evaluation.final and ab.table.split in built.evaluation.final_splits, run.name


def test_weights_demo_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _, ab = _in_tmp("ablation_weights_demo.yaml", tmp_path)
    warm, *runs = plan(ab)
    assert [r.name for r in runs] == ["aw0.80_sw0.20", "aw0.70_sw0.30", "aw0.65_sw0.35", "aw0.50_sw0.50",
                                      "aw0.35_sw0.65", "aw0.20_sw0.80"]
    exp = run_config(ab, warm)
    assert exp.phases == [] and exp.warm_start.enabled and exp.evaluation.final_splits == ["validation"]
    with pytest.raises(ConfigError, match=r"run 'aw0.80_sw0.20' starts from run 'warm_start'.s adapter, and that "
                                          r"run has not finished: run it first \(--only warm_start\)"):
        run_config(ab, runs[0])
    adapter = _finish(tmp_path / "abl" / "warm_start", "warm_start/adapter")
    for run, (a, s) in zip(runs, [(0.8, 0.2), (0.7, 0.3), (0.65, 0.35), (0.5, 0.5), (0.35, 0.65), (0.2, 0.8)], strict=True):
        exp = run_config(ab, run)
        params = exp.phase("cpr").reward_params["cpr"]
        assert (params["answer_weight"], params["step_weight"], params["wrong_answer_scale"]) == (a, s, 0.3)
        assert exp.phases == ["cpr"] and exp.seed == 42 and not exp.warm_start.enabled
        assert exp.phase("cpr").init_adapter == adapter and exp.phase("cpr").training["max_steps"] == 6
        assert exp.evaluation.final_splits == ["validation"]


def test_strategy_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _, ab = _in_tmp("ablation_strategies_demo.yaml", tmp_path)
    adapter = _finish(tmp_path / "abl" / "warm_start")
    runs = {r.name: run_config(ab, r) for r in plan(ab)}
    comp = runs["composite"]  # the settings of phases it does not train are left out
    assert comp.phases == ["composite"] and list(comp.phase_settings) == ["composite"]
    assert comp.phase("composite").init_adapter == adapter and comp.phase("composite").training == {}
    assert runs["cpr"].phase("cpr").curriculum["schedule"] == "none" and runs["cpr"].phase("cpr").training["max_steps"] == 6
    cur = runs["cpr_curriculum"]
    assert cur.phases == ["answer_only", "cpr"]
    assert cur.phase("answer_only").init_adapter == adapter and cur.phase("cpr").init_adapter is None
    # Answer-Only phases score steps for the figure with weight 0: the training reward is unchanged
    for phase in (runs["answer_only"].phase("answer_only"), cur.phase("answer_only")):
        assert phase.rewards == ["format", "accuracy", "step_f1"] and phase.reward_weights == [1.0, 1.0, 0.0]
    sft = runs["sft"]  # the SFT baseline: the warm start's settings, no GRPO phase
    assert sft.phases == [] and sft.warm_start.enabled and sft.warm_start.learning_rate == 8e-5
    assert sft.seed == 42 and sft.data.test_size == 8
    assert runs["warm_start"].phases == [] and runs["warm_start"].warm_start.learning_rate == 5e-3


def _write(tmp_path: Path, **data) -> Path:
    path = tmp_path / "abl.yaml"
    runs = [{"name": "aw0.80_sw0.20", "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": 0.8}},
            {"name": "aw0.50_sw0.50", "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": 0.5}}]
    path.write_text(yaml.safe_dump({"kind": "weights", "base_config": str(base_config(tmp_path)),
                                    "output_dir": str(tmp_path / "o"), "set": {"phases": ["cpr"]}, "runs": runs, **data}))
    return path


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"weigths": [[0.5, 0.5]]}, "weigths", "unknown key"),
        ({"runs": []}, "runs", "at least 1 item"),
        ({"runs": [{"name": "a b"}]}, "runs[0].name", "should match pattern"),
        ({"runs": [{"name": "a"}, {"name": "a"}]}, "runs[1].name", "run name 'a' is used twice"),
        ({"runs": [{"name": "a", "recipe": "dpo"}]}, "runs[0].recipe", "'cpr_curriculum' or 'sft_lora'"),
        ({"runs": [{"name": "a", "set": {"phase_settings.cpr.init_adapter": "@b"}}, {"name": "b"}]},
         "runs[0].set.phase_settings.cpr.init_adapter", "'@b' names no earlier run (runs: a, b)"),
        ({"table": {"split": "train"}}, "table.split", "'validation' or 'test'"),
        ({"table": {"kl_limit": 0}}, "table.kl_limit", "greater than 0"),
        ({"seeds": [1, 1]}, "seeds", "a seed is listed twice"),
        ({"base_config": "nope.yaml"}, "base_config", "experiment config not found"),
    ],
)
def test_file_errors_name_the_key(tmp_path, extra, field, message):
    path = _write(tmp_path, **extra)
    with pytest.raises(ConfigError) as e:
        load_ablation(path)
    assert e.value.field == field and message in e.value.message and e.value.path == str(path)


def test_invalid_run_config_names_run_and_key(tmp_path, capsys):
    path = _write(tmp_path, set={"training.num_generations": 3})
    assert main(["--config", str(path), "--list"]) == 2
    err = capsys.readouterr().err
    assert "run 'aw0.80_sw0.20': the global generation batch" in err and "num_generations" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [weights\n")
    with pytest.raises(ConfigError, match="invalid YAML") as e:
        load_ablation(bad)
    assert e.value.path == str(bad)


def test_list_only_and_unknown_names(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, name="w", launcher="accelerate launch --num_processes 2")
    assert main(["--config", str(path), "--list", "--only", "aw0.50_sw0.50"]) == 0
    out = capsys.readouterr().out.splitlines()[1:]
    assert out == [
        "# aw0.50_sw0.50: " + shlex.join([
            "recipes/cpr_curriculum.py", "--config", str(tmp_path / "base.yaml"), "--set", "phases=[cpr]",
            "--set", "phase_settings.cpr.reward_params.cpr.answer_weight=0.5",
            "--set", f"output_dir={tmp_path / 'o' / 'aw0.50_sw0.50'}", "--set", "run_name=w-aw0.50_sw0.50"]),
        shlex.join(["accelerate", "launch", "--num_processes", "2", "recipes/reward_ablation.py", "--config", str(path),
                    "--only", "aw0.50_sw0.50", "--resume"]),
        "# when they have finished: the table",
        f"python recipes/reward_ablation.py --config {path} --table-only",
    ]
    for argv in (["--list", "--only", "aw0.10_sw0.90"], ["--only", "aw0.10_sw0.90"]):
        assert main(["--config", str(path), *argv]) == 2
        assert "no run named 'aw0.10_sw0.90'; runs: aw0.80_sw0.20, aw0.50_sw0.50" in capsys.readouterr().err


def test_list_prints_the_commands_alone(tmp_path, capsys, monkeypatch, caplog):
    """--list checks every run's config but prints the list alone: not, run by run, that the ablation's
    phases leave out the base config's settings of the other phase (which a run started alone still says)."""
    import logging

    monkeypatch.chdir(REPO)
    path, ab = _in_tmp("ablation_weights.yaml", tmp_path)
    with caplog.at_level(logging.INFO):
        assert main(["--config", str(path), "--list"]) == 0
    captured = capsys.readouterr()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert captured.err == "" and captured.out.startswith("# runs, in order")


def test_a_run_overriding_a_shared_key_lists_it_once(tmp_path, capsys, monkeypatch):
    """set: {phases: [cpr]} for every run, phases: [answer_only] for one: its line says answer_only only."""
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, runs=[{"name": "phase1", "set": {"phases": ["answer_only"]}},
                                  {"name": "cpr", "set": {"phase_settings.cpr.init_adapter": "@phase1"}}])
    assert main(["--config", str(path), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    phase1 = next(ln for ln in out if ln.startswith("# phase1: "))
    assert phase1.count("phases=") == 1 and "--set 'phases=[answer_only]'" in phase1
    assert _parse_recipe(phase1.split(": ", 1)[1])["phases"] == ["answer_only"]
    # a run from another run's adapter, before that one finished: named by its @
    assert "--set phase_settings.cpr.init_adapter=@phase1" in next(ln for ln in out if ln.startswith("# cpr: "))
    assert f"python recipes/reward_ablation.py --config {path} --only phase1 --resume" in out


def test_seeds_give_one_run_each_except_runs_without_phases(tmp_path):
    path = _write(tmp_path, seeds=[1, 2], runs=[{"name": "base", "set": {"phases": []}}, {"name": "cpr", "label": "CPR"}])
    ab = load_ablation(path)
    runs = plan(ab)
    assert [(r.name, r.label, r.group, r.seed) for r in runs] == [
        ("base", "base", "base", None), ("cpr-s1", "CPR", "cpr", 1), ("cpr-s2", "CPR", "cpr", 2)]
    assert run_config(ab, runs[2]).seed == 2 and run_config(ab, runs[0]).seed == 3


def test_cpr_ablate_is_registered():
    from cpr.cli import build_parser

    args = build_parser(only="ablate").parse_args(["ablate", "--config", "x.yaml", "--table-only"])
    assert args.table_only and args.config == "x.yaml" and callable(args.func)


def test_reruns_skip_done_folders_and_refuse_unfinished_or_stale_ones(tmp_path, capsys):
    """Finished and diverged runs are results: skipped (their config.yaml must match); an unfinished
    folder needs --resume; a folder made with other settings is an error naming the key."""
    path = _write(tmp_path, runs=[{"name": "a", "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": 0.8}},
                                  {"name": "b", "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": 0.5}},
                                  {"name": "c", "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": 0.35}}])
    ab = load_ablation(path)
    a, b, c = plan(ab)
    for run, done in ((a, {}), (b, {"diverged": {"phase": "cpr", "step": 3, "condition": "nan", "reason": "nan loss"}})):
        folder = write_run(tmp_path / "o" / run.name, weights=(0.8, 0.2), phases={"cpr": {"log": []}}, **done)
        (folder / "config.yaml").write_text(yaml.safe_dump(run_config(ab, run).to_dict()))
    write_run(tmp_path / "o" / "c", weights=(0.35, 0.65), finished=False, phases={"cpr": {"log": []}})
    assert main(["--config", str(path), "--only", "a,b"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.rindex('{\n "ran"'):])
    assert result["skipped"] == ["a", "b"] and result["ran"] == [] and result["statuses"]["b"] == "diverged"
    assert main(["--config", str(path), "--only", "c"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "pass --resume to continue it" in err
    stale = yaml.safe_load((tmp_path / "o" / "a" / "config.yaml").read_text())
    stale["phase_settings"]["cpr"]["reward_params"]["cpr"]["answer_weight"] = 0.7
    (tmp_path / "o" / "a" / "config.yaml").write_text(yaml.safe_dump(stale))
    assert main(["--config", str(path), "--only", "a"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run made with another config" in err
    assert "phase_settings.cpr.reward_params.cpr.answer_weight was 0.7, now 0.8" in err


def test_reproduce_plans_three_seeds_of_each_strategy_at_one_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _, ab = _in_tmp("reproduce_strategies.yaml", tmp_path)
    runs = plan(ab)
    assert [r.name for r in runs] == ["untrained", "warm_start"] + [
        f"{n}-s{s}" for n in ("answer_only", "composite", "cpr", "cpr_curriculum") for s in (1, 2, 3)]
    _finish(tmp_path / "abl" / "warm_start")
    steps = {}
    for run in runs[2:]:
        cfg = run_config(ab, run)
        assert cfg.seed == run.seed == int(run.name[-1]) and cfg.data.test[0].options == {"size": 90, "seed": 2026}
        steps.setdefault(run.group, set()).add(sum(cfg.phase(p).training["max_steps"] for p in cfg.phases))
    assert steps == {"answer_only": {80}, "composite": {80}, "cpr": {80}, "cpr_curriculum": {80}}  # one budget
    (tmp_path / "w").mkdir()
    _, weights = _in_tmp("reproduce_weights.yaml", tmp_path / "w")
    runs = plan(weights)  # the shared warm start once, then the five weight pairs the paper reports per seed
    assert [r.name for r in runs if r.seed is None] == ["warm_start"] and len(runs) == 1 + 5 * 3
    assert {r.seed for r in runs[1:]} == {1, 2, 3}
