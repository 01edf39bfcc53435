"""LoRA fine-tuning baseline (the M3CoT paper's): supervised LoRA on the reference steps and answers in
the output JSON format (the config's warm_start section, no GRPO phase), scored like the GRPO runs.

    python recipes/sft_lora.py --config recipes/configs/sft_lora_demo.yaml --ranges warn   # offline CPU demo
    python recipes/sft_lora.py --config X.yaml --set warm_start.learning_rate=5e-5 --resume
"""

import os
import sys

if __name__ == "__main__":
    from cpr.errors import quiet_deepspeed_cpu_notice

    quiet_deepspeed_cpu_notice()  # before the demos' tiny models are built
    if any(arg.endswith("_demo.yaml") for arg in sys.argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demos never touch the hub
        from cpr_tools import tiny_models  # test and demo tooling: the demos' tiny model, built where missing

        tiny_models.build_demo_models()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cpr.ablation.lora_sft import main

    sys.exit(main())
