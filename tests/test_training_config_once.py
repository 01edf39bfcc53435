"""Each config section that becomes a library object is built once, by ``load_config``, and every user reads
that object: the phase's curriculum (``CurriculumConfig``), the data's buckets (``BucketConfig``), the warm
start's ``SFTSettings`` (``warm_start.extra``: its ``trl.SFTConfig`` fields) and each phase's merged
``training`` (its ``trl.GRPOConfig`` keyword arguments). Each test makes the parser fail once the config has
loaded, so a user that parsed the raw section again would fail; the ``guards`` section is a
``GuardsConfig`` field itself (tests/test_training_config.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import SAMPLES_DIR, tiny_run_config

from cpr.training.config import load_config
from cpr.training.config_checks import phase_training_args, warm_start_settings


def _load(tmp_path: Path, **sections):
    data = tiny_run_config("once", tmp_path / "run", **sections)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def _refuse(*_args, **_kwargs):
    raise AssertionError("a config section was parsed again after load_config")


TRAINING = {"per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 4}


def test_the_curriculum_is_built_once_and_is_what_the_trainers_sampler_reads(tmp_path, monkeypatch):
    from cpr.training import trainer as grpo_trainer
    from cpr.training.build import build_phases
    from cpr.training.curriculum import CurriculumConfig, CurriculumSampler
    from cpr.training.phase import train_phase
    from cpr.training.splits import load_run_data

    cfg = _load(tmp_path, training=TRAINING, phases=["cpr"],
                phase_settings={"cpr": {"curriculum": {"schedule": "staged", "stage_fractions": [0.25, 0.75]}}})
    curriculum = cfg.phase("cpr").curriculum_config
    assert isinstance(curriculum, CurriculumConfig)
    assert (curriculum.schedule, curriculum.stage_fractions, curriculum.buckets) == (
        "staged", (0.25, 0.75), ("easy", "medium", "hard"))
    assert cfg.phase("cpr").curriculum_config is curriculum  # built once
    assert cfg.to_dict()["phase_settings"]["cpr"]["curriculum"] == {"schedule": "staged", "stage_fractions": [0.25, 0.75]}

    monkeypatch.setattr(CurriculumConfig, "from_dict", _refuse)
    spec = build_phases(cfg)["cpr"]
    assert spec.curriculum is curriculum

    seen = {}

    class Stop(Exception):
        pass

    class Trainer(grpo_trainer.CprGRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["trainer"] = self
            raise Stop

    monkeypatch.setattr(grpo_trainer, "CprGRPOTrainer", Trainer)
    splits, templates = load_run_data(cfg)
    with pytest.raises(Stop):
        train_phase(cfg, spec, splits, templates, cfg.model.name_or_path, None, False)
    trainer = seen["trainer"]
    assert trainer.curriculum is curriculum
    sampler = trainer.train_sampler()
    assert isinstance(sampler, CurriculumSampler) and sampler.config is curriculum


def test_the_buckets_are_built_once_and_are_what_the_loaders_bucket_with(tmp_path, monkeypatch):
    from cpr.data import BucketConfig
    from cpr.training.splits import load_splits

    every_grade = {"field": "grade", "hard": list(range(1, 9))}
    cfg = _load(tmp_path, training=TRAINING, data={"train": [{"source": "tabmwp", "path": str(SAMPLES_DIR / "tabmwp"), "limit": 8}],
                                "validation_size": 2, "test_size": 2,
                                "buckets": {"fields": {"tabmwp": every_grade}, "steps": {"easy_max": 2, "medium_max": 5}}})
    buckets = cfg.data.bucket_config
    assert isinstance(buckets, BucketConfig)
    assert (buckets.steps.easy_max, buckets.steps.medium_max) == (2, 5)
    assert buckets.fields["tabmwp"].mapping == {str(g): "hard" for g in range(1, 9)}
    assert cfg.data.bucket_config is buckets

    monkeypatch.setattr(BucketConfig, "from_dict", _refuse)
    splits = load_splits(cfg.data)
    assert splits.counts() == {"train": 4, "validation": 2, "test": 2}
    assert set(splits.train.column("difficulty")) == {"hard"}  # the samples are all easy by the default table


def test_the_warm_start_settings_are_built_once_and_are_what_it_trains_and_the_launch_checks_read(tmp_path, monkeypatch):
    from cpr.training import warm_start
    from cpr.training.preflight import process_group_timeout
    from cpr.training.sft import SFTSettings

    cfg = _load(tmp_path, training=TRAINING, phases=["answer_only"],
                warm_start={"enabled": True, "max_steps": 12,
                            "extra": {"gradient_accumulation_steps": 2, "extra": {"ddp_timeout": 4321, "weight_decay": 0.1}}})
    settings = warm_start_settings(cfg)
    assert isinstance(settings, SFTSettings)
    assert (settings.max_steps, settings.logging_steps, settings.save_steps, settings.seed) == (12, 1, 3, 3)
    assert settings.gradient_accumulation_steps == 2  # warm_start.extra: SFTSettings fields
    assert settings.extra == {"ddp_timeout": 4321, "weight_decay": 0.1}  # its extra: trl.SFTConfig fields
    assert warm_start_settings(cfg) is settings

    monkeypatch.setattr(SFTSettings, "__init__", _refuse)
    # the SFTConfig's ddp_timeout, over TRL's 1800 of the phase (the raw warm_start.extra holds SFTSettings
    # fields, never ddp_timeout: reading it gave 1800)
    assert process_group_timeout(cfg) == 4321.0
    seen = {}

    def train_lora(cfg_, settings_, out, records, **kwargs):
        seen.update(settings=settings_, records=len(records))
        return Path(out) / "adapter"

    monkeypatch.setattr(warm_start, "train_lora", train_lora)
    warm_start.run_warm_start(cfg, None, tmp_path / "warm_start")
    assert seen == {"settings": settings, "records": 4} and seen["settings"] is settings


def test_each_phases_training_arguments_are_merged_once_and_are_what_its_grpo_config_gets(tmp_path, monkeypatch):
    from cpr.training import config_checks as config_module
    from cpr.training.build import build_phases

    cfg = _load(tmp_path, training={**TRAINING, "learning_rate": 1.0e-4, "beta": 0.02},
                phase_settings={"cpr": {"training": {"learning_rate": 5.0e-6, "max_steps": 6}}})
    args = cfg.phase("cpr").training_args
    assert args == {"per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 6, "learning_rate": 5.0e-6,
                    "beta": 0.02, "seed": 3, "output_dir": str(tmp_path / "run" / "cpr"), "run_name": "once-cpr"}
    assert cfg.phase("answer_only").training_args["learning_rate"] == 1.0e-4
    given = copy.deepcopy(args)
    copied = phase_training_args(cfg, "cpr")
    assert copied == args and copied is not args
    copied["max_steps"] = 99  # a caller's changes stay its own
    assert cfg.phase("cpr").training_args == given

    monkeypatch.setattr(config_module, "_merge", _refuse)
    spec = build_phases(cfg)["cpr"]
    assert (spec.args.learning_rate, spec.args.max_steps, spec.args.beta, spec.args.seed) == (5.0e-6, 6, 0.02, 3)
    assert spec.args.output_dir == str(tmp_path / "run" / "cpr")
