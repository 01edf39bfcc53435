"""LoRA fine-tuning baseline (the M3CoT paper's): supervised LoRA on the reference steps and answers
in the output JSON format, then scored on the test split like the GRPO runs.

    python recipes/sft_lora.py --config recipes/configs/sft_lora_demo.yaml          # offline CPU demo
    python recipes/sft_lora.py --config X.yaml --set sft.learning_rate=5e-5 --resume

The adapter lands in <output_dir>/sft/adapter; a GRPO phase can start from it with
``phase_settings.<phase>.init_adapter: <output_dir>/sft/adapter``.
"""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    if any(arg.endswith("_demo.yaml") for arg in sys.argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demos never touch the hub
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
        import tiny_models  # test and demo tooling: the demos' tiny model, built where missing

        tiny_models.build_demo_models()
    from cpr.ablation.cli import sft_main

    sys.exit(sft_main())
