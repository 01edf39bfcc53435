"""Training: the experiment config, the warm start and SFT baseline, the GRPO phases and their runner
(:func:`cpr.training.experiment.run_experiment`). Heavy dependencies (torch, transformers, TRL) are imported by the
submodules, so import what you need from them, e.g. ``from cpr.training.sft import SFTSettings, run_sft``."""
