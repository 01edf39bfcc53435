"""Reward-weight ablation (paper Table 6) or strategy comparison (paper Table 5 and Figure 5).

One YAML file (recipes/configs/ablation_*.yaml, ``kind: weights | strategies``) lists the runs, each
an ordinary experiment (a base experiment config plus overrides); this recipe trains them, scores
them, and writes the table (markdown + JSON) and figures into the ablation's output folder.

    python recipes/reward_ablation.py --config recipes/configs/ablation_weights_demo.yaml      # offline CPU demo
    python recipes/reward_ablation.py --config recipes/configs/reproduce_strategies.yaml --resume  # make reproduce
    python recipes/reward_ablation.py --config recipes/configs/ablation_weights.yaml --list    # one command per run
    python recipes/reward_ablation.py --config X.yaml --only aw0.65_sw0.35 --resume           # one run, continued
    python recipes/reward_ablation.py --config X.yaml --evaluate-only                         # score finished runs, table
    python recipes/reward_ablation.py --config X.yaml --table-only                            # table from what finished
"""

import os
import sys

if __name__ == "__main__":
    if any(arg.endswith("_demo.yaml") or "reproduce_" in arg for arg in sys.argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demos and the miniature reproduction never touch the hub
    from cpr.ablation.cli import main

    sys.exit(main())
