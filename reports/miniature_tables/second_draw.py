"""Score every run of a finished strategy ablation (``make reproduce``'s Table 5) on another test draw of the
generated colour-grid task and print the table in the same layout: mean ± sample standard deviation over seeds.

    python reports/miniature_tables/second_draw.py --ablation recipes/configs/reproduce_strategies.yaml --seed 2027

Each run's final adapter (``summary.json``'s ``final_adapter``; a run without one, the untrained model, is left
out: ``cpr eval`` takes the scoring settings from an adapter's run) is scored with
``cpr eval`` on ``--source synthetic --split test --option size=90 --option seed=SEED`` into
``<run>/draw_<SEED>/crystal`` (skipped where its ``metrics.json`` exists). Then the table is printed with the
CPR-Curriculum / Answer-Only Match F1 ratio and CPR-Curriculum's lead over the warm start and Answer-Only against
twice the larger seed standard deviation (as :mod:`cpr.ablation.tables` gives them for the first draw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from cpr.ablation.sweep import load_ablation, plan
from cpr.ablation.tables import curriculum_lead, curriculum_lead_line
from cpr.markdown import markdown_table

COLUMNS = (("Acc", "accuracy", 2), ("Match F1", "match_f1", 3), ("P", "precision", 3), ("R", "recall", 3),
           ("Steps", "steps", 2), ("Lucky", "lucky_guess_rate", 2))


def score(run_dir: Path, seed: int, size: int) -> dict | None:
    """The run's ``overall`` metrics on the draw (``cpr eval`` first where they are missing); ``None`` for a run
    without an adapter."""
    out = run_dir / f"draw_{seed}" / "crystal"
    if not (out / "metrics.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary.get("status") != "finished":
            sys.exit(f"{run_dir}: status {summary.get('status')!r}, not finished (run the ablation first)")
        if not summary.get("final_adapter"):
            return None
        subprocess.run(["cpr", "eval", "--adapter", summary["final_adapter"], "--benchmark", "crystal", "--source", "synthetic", "--split", "test",
                        "--option", f"size={size}", "--option", f"seed={seed}", "--output", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
    return json.loads((out / "metrics.json").read_text())["overall"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ablation", required=True, help="a finished strategies ablation YAML")
    p.add_argument("--seed", type=int, required=True, help="the test draw's generator seed")
    p.add_argument("--size", type=int, default=90, help="items in the draw")
    args = p.parse_args()
    ab = load_ablation(args.ablation)
    groups: dict[str, tuple[str, list[dict]]] = {}
    for run in plan(ab):
        if (metrics := score(Path(ab.output_dir) / run.name, args.seed, args.size)) is not None:
            groups.setdefault(run.group, (run.label, []))[1].append(metrics)
    body, means = [], []
    for group, (label, rows) in groups.items():
        row, cells = {"group": group}, []
        for _, key, dec in COLUMNS:
            vals = [float(r[key]) for r in rows]
            row[key], row[f"{key}_std"] = statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else None
            std = row[f"{key}_std"]
            cells.append(f"{row[key]:.{dec}f}" + (f" ± {std:.{dec}f}" if std is not None else ""))
        body.append([label, str(len(rows)), *cells])
        means.append(row)
    print(f"Test draw seed {args.seed} ({args.size} items), greedy:\n")
    print(markdown_table(["Run", "Seeds", *[c[0] for c in COLUMNS]], body))
    if lead := curriculum_lead(means):
        print("\n" + curriculum_lead_line(lead))
    return 0


if __name__ == "__main__":
    sys.exit(main())
