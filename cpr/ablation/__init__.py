"""Ablations and baselines: a sweep of override sets over one experiment config (:mod:`~cpr.ablation.sweep`),
its tables (:mod:`~cpr.ablation.tables`, :mod:`~cpr.ablation.metrics`) read from the run folders
(:mod:`~cpr.ablation.run_folder`), figures of runs and ablations (:mod:`~cpr.ablation.figures`) and the
LoRA SFT baseline (:mod:`~cpr.ablation.lora_sft`)."""

from cpr.ablation.sweep import register

__all__ = ["register"]
