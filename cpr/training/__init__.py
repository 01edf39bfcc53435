"""Training: configuration, the supervised LoRA warm start / SFT baseline, and GRPO phases.

Modules (one concept each; heavy dependencies such as torch, transformers and TRL are imported
lazily, so import what you need from the submodule, e.g. ``from cpr.training.sft import SFTSettings, run_sft``):

* :mod:`~cpr.training.config`: the experiment config (one YAML file), validated before anything loads;
* :mod:`~cpr.training.splits`: training / validation / test records;
* :mod:`~cpr.training.runner`: :func:`~cpr.training.runner.run_experiment`, the orchestration of a run;
* :mod:`~cpr.training.preflight`: are the model and the step encoder available;
* :mod:`~cpr.training.policy`: loading, LoRA config, adapters;
* :mod:`~cpr.training.warm_start`: the supervised LoRA warm start, and supervised LoRA training;
* :mod:`~cpr.training.sft`: ``SFTSettings`` and ``run_sft`` (TRL's ``SFTTrainer``);
* :mod:`~cpr.training.phase`: one GRPO phase (``GRPOConfig``, trainer, final adapter);
* :mod:`~cpr.training.guards`: divergence guards, TRL's generation-batch state, the checkpoint completion marker;
* :mod:`~cpr.training.checkpoints`: checkpoint markers and status, resume preparation;
* :mod:`~cpr.training.selection`: the best checkpoint of a phase on the validation split;
* :mod:`~cpr.training.evaluate`: the eval hook, scoring an adapter on a split, the final evaluation;
* :mod:`~cpr.training.oom`: out-of-memory errors that name the settings to lower;
* :mod:`~cpr.training.logs`: the run's text log, JSON lines trainer logs, scored completions;
* :mod:`~cpr.training.cli`: ``cpr train``.
"""
