"""Comparison tooling: reward-weight ablation (paper Table 6), strategy comparison (paper Table 5
and Figure 5), the LoRA fine-tuning baseline, and figures of run folders.

Training, the shared warm start and every evaluation are :mod:`cpr.training`'s own
(:mod:`~cpr.training.runner`, :mod:`~cpr.training.warm_start`, :mod:`~cpr.training.evaluate`),
so each row of a table is trained and scored as an ordinary run. Modules (heavy dependencies are
imported lazily):

* :mod:`~cpr.ablation.spec`: the ablation config (``kind: weights | strategies``);
* :mod:`~cpr.ablation.plan`: each run as overrides of one experiment config, and ``--list``'s command lines;
* :mod:`~cpr.ablation.runner`: :func:`run_ablation` (shared start, runs, evaluations, table, figures);
* :mod:`~cpr.ablation.sft_baseline`: the M3CoT-style LoRA SFT baseline;
* :mod:`~cpr.ablation.run_folder`, :mod:`~cpr.ablation.metrics`, :mod:`~cpr.ablation.tables`:
  reading run folders and computing the tables' numbers from their logs;
* :mod:`~cpr.ablation.figures`: PNG figures of runs and ablations (the notebook calls them);
* :mod:`~cpr.ablation.cli`: ``cpr ablate``, ``recipes/reward_ablation.py``, ``recipes/sft_lora.py``.
"""

from cpr.ablation.cli import register

__all__ = ["register"]
