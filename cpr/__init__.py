"""cpr: GRPO training of vision-language models on process rewards.

Implements the CRYSTAL paper's step metrics (Match F1, LIS ratio, Ordered Match F1),
the Causal Process Reward (CPR) and the two-phase CPR-Curriculum on top of TRL's
``GRPOTrainer`` with PEFT LoRA adapters (arXiv 2603.13099).
"""

__version__ = "0.1.0"
