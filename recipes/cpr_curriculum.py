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
    """Parse the arguments, build the demo's tiny models (demo configs only) and run :func:`train`; the exit code
    (errors as one line on standard error: :func:`cpr.errors.run_command`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cpr.errors import quiet_deepspeed_cpu_notice, run_command
    from cpr.training.cli import add_arguments

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
    return run_command("cpr_curriculum", train, args)


def train(args: argparse.Namespace) -> int:
    """The run, step by step (``cpr train`` runs the same: :func:`cpr.training.experiment.run_experiment`)."""
    from cpr.training.build import build_phases
    from cpr.training.check import run_check
    from cpr.training.cli import experiment_config
    from cpr.training.experiment import (
        close,
        final_evaluation,
        finished_phase,
        hand_over,
        load_data,
        open_run,
        select_best,
        train_phase,
        warm_start,
    )

    if args.check:  # validate the run and estimate its per-GPU memory; nothing trains
        return run_check(args)
    cfg = experiment_config(args)  # the config, validated before any model loads
    phases = build_phases(cfg)  # each phase's GRPOConfig, reward functions and weights, curriculum
    # the run folder locked and claimed, run.log and config.yaml; a failure inside goes into summary.json
    with open_run(cfg, phases, resume=args.resume, overwrite=args.overwrite) as run:
        load_data(run)
        handover = warm_start(run)  # the supervised warm start's adapter, or None
        for spec in phases.values():
            if (done := finished_phase(run, spec)) is not None:  # --resume: a phase that finished before
                handover = done
                continue
            result = train_phase(run, spec, handover)
            best = select_best(run, spec, result)  # the best checkpoint on validation, or the last step
            handover = hand_over(run, spec, result, best)
        final_evaluation(run, handover)
        close(run)  # summary.json and the closing table
    return 0


if __name__ == "__main__":
    sys.exit(main())
