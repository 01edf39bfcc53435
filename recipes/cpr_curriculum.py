"""CPR-Curriculum: two-phase GRPO training of a vision-language model with LoRA.

Phase 1 trains on answer-only rewards (format + accuracy); its best checkpoint on the
validation split seeds phase 2, which trains on format + CPR with an easy-to-hard curriculum
(CRYSTAL paper, arXiv 2603.13099; docs/method.md section 6). Everything is set in one YAML file.

    python recipes/cpr_curriculum.py                       # offline CPU demo (recipes/configs/demo.yaml)
    python recipes/cpr_curriculum.py --config recipes/configs/demo_tabmwp.yaml   # the real-data CPU demo
    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml recipes/cpr_curriculum.py \\
        --config recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml
    python recipes/cpr_curriculum.py --config X.yaml --resume          # continue a killed run
    python recipes/cpr_curriculum.py --config X.yaml --overwrite       # delete a previous run, start over
    python recipes/cpr_curriculum.py --config X.yaml --phases cpr      # one phase only

Exit code: 0 finished, 2 an error (one line on standard error), 3 a divergence guard stopped the run.
"""

import argparse
import os
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent / "configs" / "demo.yaml"
DEMOS = (DEMO, DEMO.with_name("demo_tabmwp.yaml"))


def main() -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cpr.cli import run_command
    from cpr.errors import quiet_deepspeed_cpu_notice
    from cpr.training.cli import add_arguments, run

    quiet_deepspeed_cpu_notice()  # before the demo's tiny model is built

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, default_config=str(DEMO))
    args = parser.parse_args()
    if Path(args.config).resolve() in DEMOS:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo never touches the hub
        from cpr_tools import tiny_models  # test and demo tooling: the demo's tiny model, built where missing

        tiny_models.build_demo_models(args.config)
        # the demo's own outputs/demo is disposable: running it again replaces it (unless resuming);
        # a demo-based run given another output_dir (an ablation's runs) is never deleted unasked
        own_output = args.output_dir is None and not any(o.startswith("output_dir=") for o in args.overrides)
        args.overwrite = args.overwrite or (own_output and not args.resume)
    # cpr.training.cli.run: the config loaded and validated before any model loads (--check: only checked),
    # then cpr.training.experiment.run_experiment, step by step: each phase built (GRPOConfig, rewards, curriculum),
    # the launch checked, config.yaml written, the data loaded, the warm start, per phase train -> select the
    # best checkpoint -> hand over, the final evaluation and the closing table
    return run_command("cpr_curriculum", run, args)


if __name__ == "__main__":
    sys.exit(main())
