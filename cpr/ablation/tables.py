"""The ablation tables (JSON, markdown), read from the run folders; nothing is re-estimated.

Acc (percent), Match F1, P, R, ...: the final evaluation on ``table.split``; Discrimination, r(F1), KL max and
stability: the training logs of ``table.phases`` (:mod:`cpr.ablation.metrics`). ``kind: weights`` has paper
Table 6's columns, ``strategies`` Table 5's (the paper's rows beside them), then the lucky-guess rate and any
mean@k / pass@k. With ``seeds`` a row is the mean and sample standard deviation over its seeds' runs. An
undefined statistic is ``-`` (its reason in the JSON).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from cpr.ablation.metrics import discrimination, kl_max, reward_f1_correlation, stability
from cpr.ablation.run_folder import DIVERGED, FINISHED, RunFolder, read_run
from cpr.errors import InputError
from cpr.evaluation.report import sampled_columns
from cpr.io import atomic_write_json, atomic_write_text
from cpr.markdown import format_value, markdown_table

__all__ = ["LUCKY_COLUMN", "PAPER_TABLE6", "build_table", "curriculum_lead", "curriculum_lead_line", "render_markdown",
           "write_outputs"]

#: The strategy table's lucky-guess column (greedy completions with a correct answer and Match F1 < 0.5, percent).
LUCKY_COLUMN = ("Lucky", "lucky_guess_rate", 2)
#: The strategy table's sampled-decoding columns: mean@k accuracy and Match F1, pass@k accuracy.
SAMPLED_KEYS = ("sampled_accuracy", "sampled_match_f1", "pass_at_k")
#: Columns a run evaluated before they existed may lack (shown as ``-``).
OPTIONAL_KEYS = (LUCKY_COLUMN[1], *SAMPLED_KEYS)

WEIGHTS_COLUMNS = (("Acc", "accuracy", 2), ("Match F1", "match_f1", 3), ("Recall", "recall", 3),
                   ("Discrim.", "discrimination", 3), ("r(F1)", "r_f1", 3), ("KL max", "kl_max", 3))
#: The CRYSTAL paper's Table 6 (docs/method.md section 7): (a_w, s_w) -> the values of WEIGHTS_COLUMNS.
#: It gives no row for 0.20 / 0.80.
PAPER_TABLE6 = {
    (0.80, 0.20): (81.79, 0.676, 0.553, 0.865, 0.338, 1.274),
    (0.70, 0.30): (82.61, 0.731, 0.627, 0.797, 0.410, 0.456),
    (0.65, 0.35): (82.70, 0.728, 0.634, 0.763, 0.448, 0.372),
    (0.50, 0.50): (79.39, 0.730, 0.629, 0.662, 0.563, 1.218),
    (0.35, 0.65): (78.53, 0.736, 0.642, 0.560, 0.670, 1.684),
}
#: The CRYSTAL paper's Table 5 Match F1 of CPR-Curriculum and of Answer-Only (Qwen2.5-VL-3B).
PAPER_TABLE5_MATCH_F1 = {"cpr_curriculum": 0.633, "answer_only": 0.429}


def curriculum_lead(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """CPR-Curriculum's greedy Match F1 against the rows ``warm_start`` and ``answer_only`` (by group):
    ``{"ratio"}`` (CPR-Curriculum / Answer-Only, the paper's Table 5 gives 0.633 / 0.429), ``{"over_<group>"}``
    (the difference) and ``"two_std"`` (twice the larger seed standard deviation of the rows compared);
    ``None`` without those rows or their values."""
    by, groups = {r["group"]: r for r in rows}, ("cpr_curriculum", "answer_only", "warm_start")
    if not all(isinstance((by.get(g) or {}).get("match_f1"), (int, float)) for g in groups):
        return None
    f1 = {g: float(by[g]["match_f1"]) for g in groups}
    stds = [by[g].get("match_f1_std") or 0.0 for g in f1]
    return {"ratio": f1["cpr_curriculum"] / f1["answer_only"], "over_answer_only": f1["cpr_curriculum"] -
            f1["answer_only"], "over_warm_start": f1["cpr_curriculum"] - f1["warm_start"], "two_std": 2 * max(stds)}


def curriculum_lead_line(lead: dict[str, float]) -> str:
    """The strategy table's line of :func:`curriculum_lead`'s values, beside the paper's Table 5 ratio."""
    paper = PAPER_TABLE5_MATCH_F1
    return (f"CPR-Curriculum / Answer-Only Match F1: {lead['ratio']:.2f} (the paper's Table 5: "
            f"{paper['cpr_curriculum']} / {paper['answer_only']} = {paper['cpr_curriculum'] / paper['answer_only']:.2f})."
            f" CPR-Curriculum's Match F1 minus the warm start's: {lead['over_warm_start']:+.3f}, minus Answer-Only's: "
            f"{lead['over_answer_only']:+.3f}; twice the larger seed standard deviation: {lead['two_std']:.3f}.")


def _weights(run: RunFolder, phases: list[str] | None) -> tuple[float, float] | None:
    """``(answer_weight, step_weight)`` of the ``cpr`` reward in the run's ``config.yaml`` (last such phase)."""
    for name in reversed([p for p in run.phases if phases is None or p in phases]):
        params = ((run.config or {}).get("phase_settings", {}).get(name) or {}).get("reward_params") or {}
        if "answer_weight" in (params.get("cpr") or {}):
            return float(params["cpr"]["answer_weight"]), float(params["cpr"]["step_weight"])
    return None


def _sampled_k(ab: Any, runs: list[Any]) -> int | None:
    """``samples`` of the first run whose ``config.yaml`` asks for ``evaluation.decoding`` ``sampled``."""
    for planned in runs:
        decoding = ((read_run(Path(ab.output_dir) / planned.name).config or {}).get("evaluation") or {}).get("decoding")
        if isinstance(decoding, dict) and decoding.get("mode") == "sampled":
            return int(decoding.get("samples", 4))
    return None


def _row(ab: Any, planned: Any, keys: list[str]) -> dict[str, Any]:
    t = ab.table
    run = read_run(Path(ab.output_dir) / planned.name)
    a_w, s_w = _weights(run, t.phases) or (None, None)
    row: dict[str, Any] = {"name": planned.name, "label": planned.label, "group": planned.group, "seed": planned.seed,
                           "status": run.status, "diverged": run.diverged, "folder": str(run.path),
                           "answer_weight": a_w, "step_weight": s_w}
    metrics = run.eval_metrics(t.split, t.benchmark) if run.status == FINISHED else None
    overall = (metrics or {}).get("overall", {})
    missing = [k for k in keys if metrics is not None and k not in overall and k not in OPTIONAL_KEYS]
    if missing:
        raise InputError(f"no {missing[0]!r} in the overall metrics", path=run.path, field=missing[0])
    row.update({k: overall.get(k) for k in keys}, evaluated=metrics is not None, n_eval=overall.get("n"))
    logs = run.phase_logs(t.phases)
    train = [r for p in logs for r in p.train]
    scored = [r for p in logs for r in p.scored if r.get("reward_function") == t.reward_function]
    events = [e for p in logs for e in p.guard_events]
    disc, corr = discrimination(scored), reward_f1_correlation(scored)
    kl = kl_max(train, step_key="global_step")
    stab = (stability(train, t.kl_limit, step_key="global_step", guard_events=events) if train or events
            else {"stable": None, "reason": "no training step logged"})
    row.update(phases=[p.name for p in logs], n_logged_steps=len(train), n_scored=len(scored),
               discrimination=disc["value"], discrimination_detail=disc, r_f1=corr["r"], r_f1_detail=corr,
               kl_max=kl["value"], kl_max_step=kl["step"], stable=stab["stable"], stability=stab)
    return row


def _seed_means(rows: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """One row per group of seeds: means, ``<key>_std`` (sample std; under two None), status, ``n_seeds``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    out = []
    for members in groups.values():
        if members[0]["seed"] is None:
            out += members
            continue
        agg = {**members[0], "seeds": [m["seed"] for m in members]}
        for key in keys:
            vals = [float(m[key]) for m in members if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
            agg[key] = sum(vals) / len(vals) if vals else None
            agg[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else None
            agg.setdefault("n_seeds", len(vals))
        bad = [m for m in members if m["status"] != FINISHED or not m["evaluated"]]
        agg.update(status=bad[0]["status"] if bad else FINISHED, evaluated=all(m["evaluated"] for m in members))
        unstable = [m for m in members if m["stable"] is False]
        if unstable:
            agg.update(stable=False, stability=unstable[0]["stability"])
        out.append({k: v for k, v in agg.items() if k not in ("discrimination_detail", "r_f1_detail")})
    return out


def build_table(ab: Any, runs: list[Any]) -> dict[str, Any]:
    """The table of an ablation's planned runs (:func:`cpr.ablation.sweep.plan`): ``{"kind", "name", "split",
    "benchmark", "kl_limit", "reward_function", "phases", "columns", "seeds", "rows", "seed_rows", "paper",
    "curriculum_lead", "runs"}`` (``curriculum_lead``: :func:`curriculum_lead`, strategies only); a row holds each column's key, ``status``, ``evaluated``, ``n_eval``, ``n_scored``, ``stable``,
    ``stability`` and the ``*_detail`` reasons. Raises InputError naming a malformed file."""
    from cpr.evaluation.benchmarks import get_benchmark

    t = ab.table
    columns = WEIGHTS_COLUMNS if ab.kind == "weights" else get_benchmark(t.benchmark).columns
    if ab.kind != "weights":
        k = _sampled_k(ab, runs)
        extra = [c for c in sampled_columns(columns, k) if c[1] in SAMPLED_KEYS] if k else []
        columns = (*columns, LUCKY_COLUMN, *extra)
    keys = [k for _, k, _ in columns] + ["discrimination", "r_f1", "kl_max"]
    evals = [k for _, k, _ in columns if k not in ("discrimination", "r_f1", "kl_max")]
    seed_rows = [_row(ab, r, evals) for r in runs]
    rows = _seed_means(seed_rows, list(dict.fromkeys(keys)))
    paper = []
    if t.paper and ab.kind == "weights":
        for r in rows:
            values = r["answer_weight"] is not None and PAPER_TABLE6.get((round(r["answer_weight"], 2),
                                                                          round(r["step_weight"], 2)))
            if values:
                paper.append({"label": r["label"], **dict(zip([k for _, k, _ in columns], values, strict=True))})
    elif t.paper and t.benchmark == "crystal":
        from cpr.paper import PAPER_TABLE4

        paper = [{"label": p.label, **p.as_summary()} for p in PAPER_TABLE4]
    return {"kind": ab.kind, "name": ab.name, "split": t.split, "benchmark": t.benchmark, "kl_limit": t.kl_limit,
            "reward_function": t.reward_function, "phases": t.phases,
            "columns": [{"title": a, "key": k, "decimals": d} for a, k, d in columns], "seeds": list(ab.seeds),
            "rows": rows, "seed_rows": seed_rows if ab.seeds else [], "paper": paper,
            "curriculum_lead": None if ab.kind == "weights" else curriculum_lead(rows),
            "runs": [{"name": r.name, "label": r.label, "folder": str(Path(ab.output_dir) / r.name)} for r in runs]}


def _status(row: dict[str, Any]) -> str:
    if row["status"] == DIVERGED:
        d = row.get("diverged") or {}
        return f"diverged: {d.get('phase', '?')} step {d.get('step', '?')}, {d.get('condition', '?')}"
    return row["status"] if row["status"] != FINISHED else "finished" if row["evaluated"] else "not evaluated"


def _cells(row: dict[str, Any], columns: list[dict[str, Any]]) -> list[str]:
    """Each column's value, ``mean ± std`` where the row has a standard deviation over seeds."""
    out = []
    for c in columns:
        cell, std = format_value(row.get(c["key"]), c["decimals"]), row.get(f"{c['key']}_std")
        out.append(f"{cell} ± {std:.{c['decimals']}f}" if std is not None and row.get(c["key"]) is not None else cell)
    return out


def render_markdown(table: dict[str, Any]) -> str:
    """The markdown report of a table built by :func:`build_table` (ends with a newline)."""
    columns, weights = table["columns"], table["kind"] == "weights"
    split, bench, limit = table["split"], table["benchmark"], table["kl_limit"]
    stable_note = (" during GRPO training" if not weights else "") + (
        f", and no logged KL above {limit:g}." if limit is not None else ".")
    body = []
    for row in table["rows"]:
        numbers = (f"this run, {row.get('n_seeds', 0)} of {len(row['seeds'])} seeds ({_status(row)})"
                   if row.get("seeds") else f"this run ({_status(row)})")
        stable = "-" if row["stable"] is None else "yes" if row["stable"] else f"no ({row['stability']['reason']})"
        body.append([row["label"], numbers, *_cells(row, columns), stable, format_value(row["n_eval"], 0),
                     *([str(row["n_scored"])] if weights else [])])
    source = "paper, Table 6" if weights else "paper, Table 4 (CRYSTAL test)"
    body += [[p["label"], source, *_cells(p, columns), "-", "-", *(["-"] if weights else [])] for p in table["paper"]]
    if weights:
        title, first = f"# Reward-weight ablation: {table['name']}", "a_w / s_w"
        notes = [f"Acc (percent), Match F1 and Recall: the final adapter scored on the {split} split ({bench}).",
                 "Discrim. (mean reward of completions with a correct answer minus that of completions with a wrong "
                 "one) and r(F1) (Pearson correlation of reward with step Match F1): every completion scored by the "
                 f"`{table['reward_function']}` reward function during training (phases "
                 f"{', '.join(table['phases'] or ['all'])}); the reward is that function's value. KL max: the largest "
                 "logged KL."]
    else:
        title, first = f"# Strategy comparison: {table['name']}", "Strategy"
        notes = [f"Every row is scored on the same {split} split ({bench}, the paper's columns; Acc in percent).",
                 "Lucky: the lucky-guess rate, percent of greedy completions with a correct answer and Match F1 "
                 "below 0.5 (the paper's diagnosis of answer-only rewards)."]
        sampled = [c["title"] for c in columns if c["key"].startswith("sampled_") or c["key"] == "pass_at_k"]
        if sampled:
            notes.append(f"{', '.join(sampled)}: sampled decoding (evaluation.decoding); mean@k is the mean over an "
                         "item's k samples, then over items (pass@1 of reasoning-RL papers), pass@k the percent of "
                         "items with a correct sample. The columns before them are greedy.")
    if lead := table.get("curriculum_lead"):
        notes.append(curriculum_lead_line(lead))
    notes.append("Stable: no NaN / infinite loss, grad norm, KL or reward logged" + stable_note)
    if table["seeds"]:
        notes.insert(0, f"Rows of this run: mean ± sample standard deviation over the seeds {table['seeds']} "
                        "(one run each, listed per seed below).")
    if table["paper"]:
        notes.append("Rows marked *paper* are copied from the CRYSTAL paper (arXiv 2603.13099) for comparison, not "
                     "computed here; they were measured on other data and models.")
    notes += [f"{row['label']}: {title_} undefined ({row[key]['reason']})" for row in table["rows"] if weights
              and row["phases"] for key, title_ in (("discrimination_detail", "Discrim."), ("r_f1_detail", "r(F1)"))
              if (row.get(key) or {}).get("reason")]
    header = [first, "Numbers", *[c["title"] for c in columns], "Stable", "n eval" if weights else "n",
              *(["n scored"] if weights else [])]
    parts = [title, "", markdown_table(header, body), "", *[f"- {n}" for n in notes]]
    if table["seed_rows"]:
        per_seed = [[r["label"], str(r["seed"] if r["seed"] is not None else "-"), _status(r), *_cells(r, columns)]
                    for r in table["seed_rows"]]
        parts += ["", "Per seed:", "", markdown_table(["Run", "Seed", "Status", *[c["title"] for c in columns]], per_seed)]
    return "\n".join(parts).rstrip() + "\n"


def write_outputs(ab: Any, runs: list[Any]) -> dict[str, Path]:
    """Write ``ablation_<kind>.json`` / ``.md`` and the figures (:func:`cpr.ablation.figures.table_figures`)
    into the ablation's folder; return ``{what: path}``. Raises ``InputError`` for an unreadable run folder."""
    from cpr.ablation.figures import table_figures

    stem = Path(ab.output_dir) / f"ablation_{ab.kind}"
    table = build_table(ab, runs)
    atomic_write_json(stem.with_suffix(".json"), table)
    atomic_write_text(stem.with_suffix(".md"), render_markdown(table))
    return {"json": stem.with_suffix(".json"), "markdown": stem.with_suffix(".md"), **table_figures(table, ab.output_dir)}
