"""Training: configuration, the supervised LoRA warm start / SFT baseline, and GRPO phases.

Modules import their heavy dependencies (torch, transformers, TRL) lazily; import what you
need from the submodule, e.g. ``from cpr.training.sft import SFTSettings, run_sft``.
"""
