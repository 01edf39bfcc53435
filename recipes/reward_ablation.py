"""Ablations (paper Tables 5 and 6, Figure 5): runs listed as override sets over one experiment config,
trained and scored as ordinary runs, then the table and figures (format: cpr/ablation/sweep.py).

    python recipes/reward_ablation.py --config recipes/configs/ablation_weights_demo.yaml         # offline CPU demo
    python recipes/reward_ablation.py --config recipes/configs/reproduce_strategies.yaml --resume  # make reproduce
    python recipes/reward_ablation.py --config recipes/configs/ablation_weights.yaml --list   # one command per run
    python recipes/reward_ablation.py --config X.yaml --only aw0.65_sw0.35 --resume          # one run, continued
    python recipes/reward_ablation.py --config X.yaml --table-only                           # table from what finished
"""

import os
import sys

if __name__ == "__main__":
    from cpr.errors import quiet_deepspeed_cpu_notice

    quiet_deepspeed_cpu_notice()  # before the demos' tiny models are built
    if any(arg.endswith("_demo.yaml") or "reproduce_" in arg for arg in sys.argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demos and the miniature reproduction never touch the hub
        from cpr_tools import tiny_models  # test and demo tooling: the demos' tiny models

        tiny_models.build_demo_models()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cpr.ablation.sweep import main

    sys.exit(main())
