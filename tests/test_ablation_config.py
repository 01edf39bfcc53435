"""Ablation configs and plans: the shipped YAML files, the errors, and --list's command lines,
which must build exactly the configs the ablation runs in-process."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from ablation_runs import base_config

from cpr.ablation.cli import main
from cpr.ablation.plan import plan_ablation, validate_run
from cpr.ablation.spec import ablation_config_from_dict, load_ablation_config
from cpr.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs"
SHIPPED = ["ablation_weights.yaml", "ablation_weights_demo.yaml", "ablation_strategies.yaml",
           "ablation_strategies_demo.yaml", "reproduce_strategies.yaml", "reproduce_weights.yaml"]


def _in_tmp(name: str, tmp_path: Path):
    """A shipped ablation config with its output folder moved to tmp_path, and a stand-in shared
    adapter (validation only checks that adapter_config.json exists)."""
    data = yaml.safe_load((CONFIGS / name).read_text())
    data["output_dir"] = str(tmp_path / "abl")
    data["base_config"] = str(REPO / data["base_config"])
    cfg = ablation_config_from_dict(data, config_path=str(CONFIGS / name))
    if cfg.shared_start.type != "none":
        (tmp_path / "abl" / "shared_adapter").mkdir(parents=True)
        (tmp_path / "abl" / "shared_adapter" / "adapter_config.json").write_text("{}")
    return cfg


def _parse_recipe(command: str):
    """What the listed recipe command line would run: its argument parser and config loader."""
    import argparse

    from cpr.ablation.sft_baseline import load_sft_baseline_config
    from cpr.training.cli import add_arguments, config_from_args

    argv = shlex.split(command)
    recipe = next(a for a in argv if a.endswith(".py"))
    args = argv[argv.index(recipe) + 1:]
    if recipe.endswith("cpr_curriculum.py"):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return config_from_args(parser.parse_args(args)).to_dict()
    assert recipe.endswith("sft_lora.py")
    config = args[args.index("--config") + 1]
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return load_sft_baseline_config(config, overrides).to_dict()


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_list_commands_that_build_the_planned_configs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = _in_tmp(name, tmp_path)
    plan = plan_ablation(cfg)
    assert plan.runs
    for run in plan.runs:
        built = validate_run(plan, run)
        command = plan.command(run)
        if run.type == "base":
            assert command.endswith(f"--only {run.name}")
            continue
        assert _parse_recipe(command) == built.to_dict(), run.name


def test_weights_demo_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = plan_ablation(_in_tmp("ablation_weights_demo.yaml", tmp_path))
    assert [r.name for r in plan.runs] == ["aw0.80_sw0.20", "aw0.70_sw0.30", "aw0.65_sw0.35", "aw0.50_sw0.50",
                                          "aw0.35_sw0.65", "aw0.20_sw0.80"]
    assert plan.names[0] == "shared_start"
    for run in plan.runs:
        exp = validate_run(plan, run)
        a, s = run.weights
        params = exp.phase("cpr").reward_params["cpr"]
        assert (params["answer_weight"], params["step_weight"], params["wrong_answer_scale"]) == (a, s, 0.3)
        assert exp.phases == ["cpr"] and exp.seed == 42 and not exp.warm_start.enabled
        assert exp.phase("cpr").init_adapter == str(tmp_path / "abl" / "shared_adapter")
        assert exp.output_dir == str(tmp_path / "abl" / run.name)
        assert exp.phase("cpr").training["max_steps"] == 6
    lines = plan.commands("recipes/configs/ablation_weights_demo.yaml")
    assert lines[1] == ("python recipes/reward_ablation.py --config recipes/configs/ablation_weights_demo.yaml "
                        "--only shared_start")
    assert sum(ln.startswith("python recipes/cpr_curriculum.py --config") for ln in lines) == 6
    # each run scores the validation split itself (demo.yaml's evaluation.final: false leaves out test)
    assert all(exp.evaluation.final and exp.evaluation.final_splits == ["validation"]
               for exp in (validate_run(plan, r) for r in plan.runs))
    assert lines[-2:] == ["# when they have finished: the table (each run scores the validation split itself)",
                          "python recipes/reward_ablation.py --config recipes/configs/ablation_weights_demo.yaml "
                          "--table-only"]


def test_strategy_runs_drop_settings_of_phases_they_do_not_train(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = plan_ablation(_in_tmp("ablation_strategies_demo.yaml", tmp_path))
    comp = plan.get("composite")
    exp = validate_run(plan, comp)
    assert exp.phases == ["composite"] and list(exp.phase_settings) == ["composite"]
    assert "phase_settings.answer_only.training.max_steps=6" in comp.dropped
    assert exp.phase("composite").init_adapter == str(tmp_path / "abl" / "shared_adapter")
    cpr = validate_run(plan, plan.get("cpr"))
    assert cpr.phase("cpr").curriculum["schedule"] == "none" and cpr.phase("cpr").training["max_steps"] == 6
    cur = validate_run(plan, plan.get("cpr_curriculum"))
    assert cur.phases == ["answer_only", "cpr"]
    assert cur.phase("answer_only").init_adapter is not None and cur.phase("cpr").init_adapter is None
    # Answer-Only phases score steps for the figure with weight 0: the training reward is unchanged
    ans = validate_run(plan, plan.get("answer_only")).phase("answer_only")
    for phase in (ans, cur.phase("answer_only")):
        assert phase.rewards == ["format", "accuracy", "step_f1"] and phase.reward_weights == [1.0, 1.0, 0.0]
    sft = validate_run(plan, plan.get("sft"))
    assert sft.sft.learning_rate == 8e-5 and sft.sft.seed == 42 and sft.experiment.data.test_size == 8
    base = plan.get("base")
    assert base.adapter == str(tmp_path / "abl" / "shared_adapter")


def _weights(tmp_path, **extra):
    return {"kind": "weights", "base_config": str(base_config(tmp_path)), "output_dir": str(tmp_path / "o"), **extra}


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"weigths": [[0.5, 0.5]]}, "weigths", "unknown key"),
        ({"weights": [[0.5]]}, "weights[0]", "expected [answer_weight, step_weight]"),
        ({"weights": [[0.5, -0.1]]}, "weights[0]", "weights must be >= 0"),
        ({"weights": [[0.5, 0.5], [0.5, 0.5]]}, "weights", "a weight pair is listed twice (aw0.50_sw0.50)"),
        ({"runs": [{"name": "x"}]}, "runs", "applies to kind strategies only"),
        ({"table": {"split": "train"}}, "table.split", "must be one of validation, test"),
        ({"table": {"kl_limit": 0}}, "table.kl_limit", "must be > 0"),
        ({"shared_start": {"type": "once"}}, "shared_start.type", "must be one of none, warm_start, phases"),
        ({"set": {"a..b": 1}}, "set.a..b", "not a dotted config key"),
        ({"figure": {"file": "x.svg"}}, "figure.file", "expected a PNG file name"),
    ],
)
def test_config_errors_name_the_key(tmp_path, extra, field, message):
    with pytest.raises(ConfigError) as e:
        ablation_config_from_dict(_weights(tmp_path, **extra), config_path="abl.yaml")
    assert e.value.field == field and message in e.value.message and e.value.path == "abl.yaml"


def test_strategy_entry_errors(tmp_path):
    def strategies(runs, **extra):
        return {"kind": "strategies", "base_config": str(base_config(tmp_path)), "output_dir": "o", "runs": runs,
                **extra}

    with pytest.raises(ConfigError, match="run name 'a' is used twice"):
        ablation_config_from_dict(strategies([{"name": "a"}, {"name": "a"}]))
    with pytest.raises(ConfigError, match="'shared_start' cannot name a run folder"):
        ablation_config_from_dict(strategies([{"name": "shared_start"}]))
    with pytest.raises(ConfigError, match="applies to runs of type sft only") as e:
        ablation_config_from_dict(strategies([{"name": "a", "sft": {"max_steps": 1}}]))
    assert e.value.field == "runs[0].sft"
    with pytest.raises(ConfigError, match="adapter: shared_start needs a shared_start section"):
        ablation_config_from_dict(strategies([{"name": "b", "type": "base", "adapter": "shared_start"}]))
    with pytest.raises(ConfigError, match="experiment config not found") as e:
        ablation_config_from_dict({**strategies([{"name": "a"}]), "base_config": "nope.yaml"})
    assert e.value.field == "base_config"


def test_invalid_run_config_names_run_and_key(tmp_path):
    plan = plan_ablation(ablation_config_from_dict(_weights(tmp_path, set={"training.num_generations": 3})))
    with pytest.raises(ConfigError, match="run 'aw0.80_sw0.20': the global generation batch") as e:
        validate_run(plan, plan.runs[0])
    assert e.value.field.endswith("num_generations")
    plan = plan_ablation(ablation_config_from_dict(_weights(tmp_path, set={"phases": ["answer_only"]})))
    with pytest.raises(ConfigError, match="does not train phase 'cpr'"):
        validate_run(plan, plan.runs[0])
    composite = {"phases": ["composite"]}
    plan = plan_ablation(ablation_config_from_dict(_weights(tmp_path, set=composite, phase="composite")))
    with pytest.raises(ConfigError, match=r"run 'aw0.80_sw0.20': parameters given for reward functions not in use"):
        validate_run(plan, plan.runs[0])


def test_cli_list_and_unknown_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump(_weights(tmp_path, weights=[[0.7, 0.3], [0.65, 0.35]])))
    assert main(["--config", str(path), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if not ln.startswith("#")][:2] == [
        shlex.join(["python", "recipes/cpr_curriculum.py", "--config", str(tmp_path / "base.yaml"),
                    "--set", "phase_settings.cpr.reward_params.cpr.answer_weight=0.7",
                    "--set", "phase_settings.cpr.reward_params.cpr.step_weight=0.3",
                    "--set", "evaluation.final=true", "--set", "evaluation.final_splits=[test, validation]",
                    "--set", f"output_dir={tmp_path / 'o' / 'aw0.70_sw0.30'}",
                    "--set", "run_name=ablation_weights-aw0.70_sw0.30"]),
        shlex.join(["python", "recipes/cpr_curriculum.py", "--config", str(tmp_path / "base.yaml"),
                    "--set", "phase_settings.cpr.reward_params.cpr.answer_weight=0.65",
                    "--set", "phase_settings.cpr.reward_params.cpr.step_weight=0.35",
                    "--set", "evaluation.final=true", "--set", "evaluation.final_splits=[test, validation]",
                    "--set", f"output_dir={tmp_path / 'o' / 'aw0.65_sw0.35'}",
                    "--set", "run_name=ablation_weights-aw0.65_sw0.35"]),
    ]
    assert main(["--config", str(path), "--only", "aw0.10_sw0.90"]) == 2
    err = capsys.readouterr().err
    assert "no run named 'aw0.10_sw0.90'; runs: aw0.70_sw0.30, aw0.65_sw0.35" in err


def test_cpr_ablate_is_registered():
    from cpr.cli import build_parser

    args = build_parser(only="ablate").parse_args(["ablate", "--config", "x.yaml", "--table-only"])
    assert args.table_only and args.config == "x.yaml" and callable(args.func)


def test_load_ablation_config_reads_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [weights\n")
    with pytest.raises(ConfigError, match="invalid YAML") as e:
        load_ablation_config(bad)
    assert e.value.path == str(bad)


def test_execute_run_refuses_unfinished_folders_and_skips_done_ones(tmp_path):
    from ablation_runs import write_run

    from cpr.ablation.runner import execute_run

    data = _weights(tmp_path, weights=[[0.8, 0.2], [0.5, 0.5], [0.35, 0.65]])
    plan = plan_ablation(ablation_config_from_dict(data))
    a, b, c = plan.runs
    write_run(Path(a.output_dir), weights=(0.8, 0.2), finished=False, phases={"cpr": {"log": []}})
    with pytest.raises(ConfigError, match="holds an unfinished run: pass --resume to continue it, or delete the folder"):
        execute_run(plan, a)
    write_run(Path(b.output_dir), weights=(0.5, 0.5), phases={"cpr": {"log": []}})
    assert execute_run(plan, b) == "skipped"
    write_run(Path(c.output_dir), weights=(0.35, 0.65), phases={"cpr": {"log": []}},
              diverged={"phase": "cpr", "step": 3, "condition": "nan", "reason": "nan loss", "checkpoint": None})
    assert execute_run(plan, c) == "skipped"  # a diverged run is a result, never resumed

    shared = plan_ablation(ablation_config_from_dict({**data, "shared_start": {"type": "warm_start"}}))
    with pytest.raises(ConfigError, match=r"run 'aw0.80_sw0.20' starts from the shared adapter .* run the shared "
                                          r"start first \(--only shared_start\)"):
        execute_run(shared, shared.runs[0], resume=True)


def test_reproduce_plans_three_seeds_of_each_strategy_at_one_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = plan_ablation(_in_tmp("reproduce_strategies.yaml", tmp_path))
    assert [r.name for r in plan.runs] == ["untrained", "warm_start"] + [
        f"{n}-s{s}" for n in ("answer_only", "composite", "cpr", "cpr_curriculum") for s in (1, 2, 3)]
    steps = {}
    for run in plan.runs[2:]:
        cfg = validate_run(plan, run)
        assert cfg.seed == int(run.name[-1]) and cfg.data.test[0].options == {"size": 90, "seed": 0}
        steps[run.group] = sum(cfg.phase(p).training["max_steps"] for p in cfg.phases)
    assert steps == {"answer_only": 75, "composite": 75, "cpr": 75, "cpr_curriculum": 75}  # the same budget
    weights = plan_ablation(_in_tmp("reproduce_weights.yaml", tmp_path / "w"))
    assert len(weights.runs) == 6 * 3 and {r.seed for r in weights.runs} == {1, 2, 3}
