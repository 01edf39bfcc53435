"""Experiment configuration: one YAML file describes a whole run (both phases).

The sections are the fields of :class:`ExperimentConfig` (examples in recipes/configs/, a table in
docs/training.md); ``phase_settings`` are merged over the built-in :data:`PHASE_PRESETS`. Three modules:
:mod:`~cpr.training.config.sections` (the sections as strict pydantic models, which check keys and types; the
``training`` sections against ``trl.GRPOConfig``'s fields and types), :mod:`~cpr.training.config.checks` (what
needs more than a type: phases resolved, paths, data sources, rewards, the warm start's settings) and
:mod:`~cpr.training.config.loading` (OmegaConf reads the YAML and applies ``--set`` overrides). :func:`load_config`
checks everything before any model, dataset or encoder loads, an invalid value raising
:class:`cpr.errors.ConfigError` that names its dotted key and the file.
"""

from cpr.training.config.checks import (
    num_processes,
    phase_reward_weights,
    phase_training_args,
    warm_start_settings,
)
from cpr.training.config.loading import (
    apply_overrides,
    config_from_args,
    config_from_dict,
    load_config,
    read_run_config,
    read_yaml,
)
from cpr.training.config.sections import (
    DEFAULT_GUARD_ACTIONS,
    DEFAULT_HACKING_BOUNDS,
    EVAL_SPLITS,
    PHASE_PRESETS,
    DataConfig,
    DataSourceConfig,
    DynamicSamplingConfig,
    EvalBenchmarkConfig,
    ExperimentConfig,
    GuardsConfig,
    KLGuardConfig,
    NanGuardConfig,
    PhaseConfig,
    RewardHackingGuardConfig,
    ZeroStdGuardConfig,
)

__all__ = ["DEFAULT_GUARD_ACTIONS", "DEFAULT_HACKING_BOUNDS", "EVAL_SPLITS", "PHASE_PRESETS", "DataConfig",
           "DataSourceConfig", "DynamicSamplingConfig", "EvalBenchmarkConfig", "ExperimentConfig", "GuardsConfig",
           "KLGuardConfig", "NanGuardConfig", "PhaseConfig", "RewardHackingGuardConfig", "ZeroStdGuardConfig",
           "apply_overrides", "config_from_args", "config_from_dict", "load_config", "num_processes",
           "phase_reward_weights", "phase_training_args", "read_run_config", "read_yaml", "warm_start_settings"]
