"""Comparison tooling: reward-weight ablation (paper Table 6), strategy comparison (paper Table 5
and Figure 5), the LoRA fine-tuning baseline, and figures of run folders.

Modules (heavy dependencies are imported lazily):

* :mod:`~cpr.ablation.spec`: the ablation config (``kind: weights | strategies``);
* :mod:`~cpr.ablation.plan`: each run as overrides of one experiment config, and ``--list``'s command lines;
* :mod:`~cpr.ablation.runner`: :func:`run_ablation` (shared start, runs, evaluations, table, figures);
* :mod:`~cpr.ablation.evaluate`: scoring a model or adapter on a split, as the runner's final evaluation;
* :mod:`~cpr.ablation.sft_baseline`: the M3CoT-style LoRA SFT baseline and the shared warm start;
* :mod:`~cpr.ablation.run_folder`, :mod:`~cpr.ablation.metrics`, :mod:`~cpr.ablation.tables`:
  reading run folders and computing the tables' numbers from their logs;
* :mod:`~cpr.ablation.figures`: PNG figures of runs and ablations (the notebook calls them);
* :mod:`~cpr.ablation.cli`: ``cpr ablate``, ``recipes/reward_ablation.py``, ``recipes/sft_lora.py``.
"""

from cpr.ablation.cli import register

__all__ = ["register"]
