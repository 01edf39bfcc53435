"""Ablation tables from run folders: the reward-weight table (paper Table 6) and the strategy
comparison (paper Table 5), as JSON and markdown.

Every number comes from files the runs wrote; nothing is re-estimated:

* **Acc, Match F1, P, R, Steps, LIS, Ord. F1** from the run's evaluation on the table's split:
  ``final_eval/<benchmark>/metrics.json`` (test) or ``final_eval/validation/<benchmark>/metrics.json``
  (validation; :mod:`cpr.training.evaluate`, :meth:`cpr.ablation.run_folder.RunFolder.eval_metrics`).
  Accuracy in percent, the rest in [0, 1].
* **Discrimination** and **r(F1)** from every completion scored by ``table.reward_function``
  (``cpr``) during training (``<phase>/scored_completions*.jsonl`` of ``table.phases``), **KL max**
  and **stability** from the training log rows of the same phases (:mod:`cpr.ablation.metrics`).

A run that has not finished is listed with its status (``diverged`` (a divergence guard stopped it:
phase, step and condition shown), ``unfinished`` or ``not started``); its log-derived columns show
what it has logged and its evaluation columns stay empty. A
finished run whose evaluation on the split has not been made yet shows ``not evaluated`` (run the
ablation with ``--evaluate-only``). An undefined statistic is shown as ``-`` with the reason in
the JSON (``*_detail``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from cpr.ablation.metrics import discrimination, kl_max, reward_f1_correlation, stability
from cpr.ablation.paper import paper_weight_row
from cpr.ablation.plan import AblationPlan, PlannedRun
from cpr.ablation.run_folder import DIVERGED, FINISHED, RunFolder, read_run
from cpr.errors import InputError
from cpr.evaluation.benchmarks import get_benchmark
from cpr.evaluation.report import format_value, markdown_table
from cpr.io import atomic_write_json, atomic_write_text

__all__ = [
    "WEIGHTS_COLUMNS",
    "build_strategies_table",
    "build_table",
    "build_weights_table",
    "render_markdown",
    "strategies_row",
    "weights_row",
    "write_table",
]

#: Columns of the weights table after the weights and status: (title, row key, decimals).
WEIGHTS_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("Acc", "accuracy", 2),
    ("Match F1", "match_f1", 3),
    ("Recall", "recall", 3),
    ("Discrim.", "discrimination", 3),
    ("r(F1)", "r_f1", 3),
    ("KL max", "kl_max", 3),
)


def _eval_columns(run: RunFolder, split: str, benchmark: str, keys: tuple[str, ...]) -> dict[str, Any]:
    metrics = run.eval_metrics(split, benchmark) if run.status == FINISHED else None
    out: dict[str, Any] = {k: None for k in keys}
    out["evaluated"] = metrics is not None
    out["n_eval"] = None
    if metrics is not None:
        overall = metrics["overall"]
        missing = [k for k in keys if k not in overall]
        if missing:
            raise InputError(f"no {missing[0]!r} in the overall metrics", path=run.path, field=missing[0])
        out.update({k: overall[k] for k in keys})
        out["n_eval"] = overall.get("n")
    return out


def _log_columns(run: RunFolder, phases: list[str] | None, reward_function: str, kl_limit: float | None) -> dict[str, Any]:
    logs = run.phase_logs(phases)
    train = [r for p in logs for r in p.train]
    scored = [r for p in logs for r in p.scored if r.get("reward_function") == reward_function]
    disc = discrimination(scored)
    corr = reward_f1_correlation(scored)
    kl = kl_max(train, step_key="global_step")
    events = [e for p in logs for e in p.guard_events]
    stab = stability(train, kl_limit, step_key="global_step", guard_events=events)
    return {
        "phases": [p.name for p in logs],
        "n_logged_steps": len(train),
        "n_scored": len(scored),
        "discrimination": disc["value"],
        "discrimination_detail": disc,
        "r_f1": corr["r"],
        "r_f1_detail": corr,
        "kl_max": kl["value"],
        "kl_max_step": kl["step"],
        "stable": stab["stable"] if train or events else None,
        "stability": stab if train or events else {"stable": None, "reason": "no training step logged"},
    }


def _check_weights(run: RunFolder, planned: PlannedRun, phase: str) -> None:
    if not run.config or planned.weights is None:
        return
    params = (((run.config.get("phase_settings") or {}).get(phase) or {}).get("reward_params") or {}).get("cpr") or {}
    for key, want in zip(("answer_weight", "step_weight"), planned.weights, strict=True):
        got = params.get(key)
        if got is not None and not math.isclose(float(got), want, abs_tol=1e-9):
            raise InputError(
                f"the run in {run.path} was trained with {key} {got}, the ablation config asks {want}: "
                f"a stale run folder? move it away or fix the config",
                path=run.path / "config.yaml",
                field=f"phase_settings.{phase}.reward_params.cpr.{key}",
            )


def weights_row(plan: AblationPlan, planned: PlannedRun) -> dict[str, Any]:
    """One row of the weights table (module docstring).

    Returns:
        ``{"name", "label", "answer_weight", "step_weight", "status", "evaluated", "accuracy",
        "match_f1", "recall", "n_eval", "discrimination", "r_f1", "kl_max", "kl_max_step", "stable",
        "phases", "n_logged_steps", "n_scored", "discrimination_detail", "r_f1_detail", "stability"}``.

    Raises:
        InputError: a malformed log or metrics file, or a run folder trained with other weights.
    """
    cfg = plan.config
    run = read_run(planned.output_dir)
    _check_weights(run, planned, cfg.phase)
    a, s = planned.weights or (None, None)
    row: dict[str, Any] = {
        "name": planned.name, "label": planned.label, "answer_weight": a, "step_weight": s,
        "status": run.status, "diverged": run.diverged, "folder": str(run.path), "seed": planned.seed,
    }
    row.update(_eval_columns(run, cfg.split, cfg.table.benchmark, ("accuracy", "match_f1", "recall")))
    row.update(_log_columns(run, cfg.table.phases or [cfg.phase], cfg.table.reward_function, cfg.table.kl_limit))
    return row


def strategies_row(plan: AblationPlan, planned: PlannedRun) -> dict[str, Any]:
    """One row of the strategy comparison: the evaluation columns of the benchmark (paper order)
    plus, for trained runs, the log columns (stability, first non-finite step, KL max).

    Raises:
        InputError: a malformed log or metrics file.
    """
    cfg = plan.config
    keys = tuple(key for _, key, _ in get_benchmark(cfg.table.benchmark).columns)
    run = read_run(planned.output_dir)
    row: dict[str, Any] = {"name": planned.name, "label": planned.label, "type": planned.type,
                           "status": run.status, "diverged": run.diverged, "folder": str(run.path), "seed": planned.seed}
    row.update(_eval_columns(run, cfg.split, cfg.table.benchmark, keys))
    if planned.type == "grpo":
        row.update(_log_columns(run, cfg.table.phases, cfg.table.reward_function, cfg.table.kl_limit))
    else:
        row.update({"stable": None, "stability": {"stable": None, "reason": f"{planned.type}: no GRPO training"}})
    return row


def seed_means(rows: list[dict[str, Any]], planned: list[PlannedRun], keys: list[str]) -> list[dict[str, Any]]:
    """One row per run group (the seeds of one strategy or weight pair; :attr:`PlannedRun.group`), in
    plan order: for each of ``keys`` the mean over the seeds that have a value and ``<key>_std``, their
    sample standard deviation (``None`` with fewer than two); ``seeds`` / ``n_seeds`` (with a value for
    the first key); ``status`` finished when every seed finished, else the first other status; and the
    first seed's other fields (label, weights, n_eval, ...). A group of one run is that run's row."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row, run in zip(rows, planned, strict=True):
        groups.setdefault(run.group, []).append(row)
    out = []
    for group, members in groups.items():
        if len(members) == 1 and members[0]["seed"] is None:
            out.append({**members[0], "group": group})
            continue
        agg = {**members[0], "group": group, "seeds": [m["seed"] for m in members]}
        for key in keys:
            vals = [float(m[key]) for m in members if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
            agg[key] = sum(vals) / len(vals) if vals else None
            agg[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else None
            if key == keys[0]:
                agg["n_seeds"] = len(vals)
        bad = [m for m in members if m["status"] != FINISHED or not m.get("evaluated", True)]
        agg["status"] = bad[0]["status"] if bad else FINISHED
        agg["evaluated"] = all(m.get("evaluated", True) for m in members)
        unstable = [m for m in members if m.get("stable") is False]
        if unstable:
            agg["stable"], agg["stability"] = False, unstable[0]["stability"]
        for key in ("discrimination_detail", "r_f1_detail"):
            agg.pop(key, None)
        out.append(agg)
    return out


def build_weights_table(plan: AblationPlan) -> dict[str, Any]:
    """The weights table of a plan's runs (paper Table 6; module docstring).

    Returns:
        ``{"kind": "weights", "name", "split", "benchmark", "kl_limit", "reward_function",
        "columns", "rows", "paper"}`` (``paper``: the paper's rows for the planned pairs, when
        ``table.paper``).
    """
    cfg = plan.config
    seed_rows = [weights_row(plan, r) for r in plan.runs]
    rows = seed_means(seed_rows, plan.runs, [k for _, k, _ in WEIGHTS_COLUMNS])
    paper = []
    if cfg.table.paper:
        for r in rows:
            p = paper_weight_row(r["answer_weight"], r["step_weight"]) if r.get("answer_weight") is not None else None
            if p is not None:
                paper.append({"label": r["label"], **p.as_dict()})
    return {
        "kind": "weights",
        "name": cfg.name,
        "split": cfg.split,
        "benchmark": cfg.table.benchmark,
        "kl_limit": cfg.table.kl_limit,
        "reward_function": cfg.table.reward_function,
        "phases": cfg.table.phases or [cfg.phase],
        "columns": [{"title": t, "key": k, "decimals": d} for t, k, d in WEIGHTS_COLUMNS],
        "seeds": list(cfg.seeds),
        "rows": rows,
        "seed_rows": seed_rows if cfg.seeds else [],
        "paper": paper,
    }


def build_strategies_table(plan: AblationPlan) -> dict[str, Any]:
    """The strategy comparison of a plan's runs (paper Table 5 columns; module docstring).

    Returns:
        ``{"kind": "strategies", "name", "split", "benchmark", "columns", "rows", "paper"}``
        (``paper``: the CRYSTAL paper's Table 4 rows, when ``table.paper`` and the benchmark is crystal).
    """
    cfg = plan.config
    columns = get_benchmark(cfg.table.benchmark).columns
    paper = []
    if cfg.table.paper and cfg.table.benchmark == "crystal":
        from cpr.paper import PAPER_TABLE4

        paper = [{"label": row.label, **row.as_summary()} for row in PAPER_TABLE4]
    seed_rows = [strategies_row(plan, r) for r in plan.runs]
    keys = [k for _, k, _ in columns] + ["discrimination", "r_f1", "kl_max"]
    return {
        "kind": "strategies",
        "name": cfg.name,
        "split": cfg.split,
        "benchmark": cfg.table.benchmark,
        "kl_limit": cfg.table.kl_limit,
        "columns": [{"title": t, "key": k, "decimals": d} for t, k, d in columns],
        "seeds": list(cfg.seeds),
        "rows": seed_means(seed_rows, plan.runs, keys),
        "seed_rows": seed_rows if cfg.seeds else [],
        "paper": paper,
    }


def build_table(plan: AblationPlan) -> dict[str, Any]:
    """:func:`build_weights_table` or :func:`build_strategies_table`, by the plan's kind."""
    return build_weights_table(plan) if plan.config.kind == "weights" else build_strategies_table(plan)


def _status_cell(row: dict[str, Any]) -> str:
    if row["status"] == DIVERGED:
        d = row.get("diverged") or {}
        return f"diverged: {d.get('phase', '?')} step {d.get('step', '?')}, {d.get('condition', '?')}"
    if row["status"] != FINISHED:
        return row["status"]
    return "finished" if row.get("evaluated") else "not evaluated"


def _numbers_cell(row: dict[str, Any]) -> str:
    if row.get("seeds"):
        return f"this run, {row.get('n_seeds', 0)} of {len(row['seeds'])} seeds ({_status_cell(row)})"
    return f"this run ({_status_cell(row)})"


def _stable_cell(row: dict[str, Any]) -> str:
    if row.get("stable") is None:
        return "-"
    return "yes" if row["stable"] else f"no ({row['stability']['reason']})"


def _cells(row: dict[str, Any], columns: list[dict[str, Any]]) -> list[str]:
    """Each column's value, as ``mean ± std`` where the row has a standard deviation over seeds."""
    out = []
    for c in columns:
        cell = format_value(row.get(c["key"]), c["decimals"])
        std = row.get(f"{c['key']}_std")
        out.append(f"{cell} ± {std:.{c['decimals']}f}" if std is not None and row.get(c["key"]) is not None else cell)
    return out


def render_markdown(table: dict[str, Any]) -> str:
    """The markdown report of a table built by :func:`build_table` (ends with a newline)."""
    columns = table["columns"]
    kind = table["kind"]
    split, bench = table["split"], table["benchmark"]
    if kind == "weights":
        title = f"# Reward-weight ablation: {table['name']}"
        header = ["a_w / s_w", "Numbers", *[c["title"] for c in columns], "Stable", "n eval", "n scored"]
        body = []
        for row in table["rows"]:
            body.append([
                row["label"], _numbers_cell(row), *_cells(row, columns), _stable_cell(row),
                "-" if row.get("n_eval") is None else str(row["n_eval"]), str(row["n_scored"]),
            ])
        for p in table["paper"]:
            body.append([p["label"], "paper, Table 6", *_cells(p, columns), "-", "-", "-"])
        notes = [
            f"Acc (percent), Match F1 and Recall: the final adapter scored on the {split} split ({bench}).",
            f"Discrim. (mean reward of completions with a correct answer minus that of completions with a wrong "
            f"one) and r(F1) (Pearson correlation of reward with step Match F1): every completion scored by the "
            f"`{table['reward_function']}` reward function during training (phases {', '.join(table['phases'])}); "
            f"the reward is that function's value. KL max: the largest logged KL.",
            "Stable: no NaN / infinite loss, grad norm, KL or reward logged"
            + (f", and no logged KL above {table['kl_limit']:g}." if table["kl_limit"] is not None else "."),
        ]
    else:
        title = f"# Strategy comparison: {table['name']}"
        header = ["Strategy", "Numbers", *[c["title"] for c in columns], "Stable", "n"]
        body = []
        for row in table["rows"]:
            body.append([
                row["label"], _numbers_cell(row), *_cells(row, columns), _stable_cell(row),
                "-" if row.get("n_eval") is None else str(row["n_eval"]),
            ])
        for p in table["paper"]:
            body.append([p["label"], "paper, Table 4 (CRYSTAL test)", *_cells(p, columns), "-", "-"])
        notes = [
            f"Every row is scored on the same {split} split ({bench}, the paper's columns; Acc in percent).",
            "Stable: no NaN / infinite loss, grad norm, KL or reward logged during GRPO training"
            + (f", and no logged KL above {table['kl_limit']:g}." if table["kl_limit"] is not None else "."),
        ]
    undefined = [
        f"{row['label']}: {name} undefined ({detail['reason']})"
        for row in table["rows"]
        for name, detail in (("Discrim.", row.get("discrimination_detail")), ("r(F1)", row.get("r_f1_detail")))
        if kind == "weights" and detail and detail.get("reason") and row["status"] != "not started"
    ]
    if table["paper"]:
        notes.append(
            "Rows marked *paper* are copied from the CRYSTAL paper (arXiv 2603.13099) for comparison, not computed here; "
            "they were measured on other data and models."
        )
    if table.get("seeds"):
        notes.insert(0, f"Rows of this run: mean ± sample standard deviation over the seeds {table['seeds']} "
                        "(one run each, listed per seed below).")
    parts = [title, "", markdown_table(header, body), "", *[f"- {n}" for n in notes + undefined]]
    if table.get("seed_rows"):
        per_seed = [[r["label"], str(r.get("seed", "-")), _status_cell(r), *_cells(r, columns)] for r in table["seed_rows"]]
        parts += ["", "Per seed:", "", markdown_table(["Run", "Seed", "Status", *[c["title"] for c in columns]], per_seed)]
    return "\n".join(parts).rstrip() + "\n"


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_table(table: dict[str, Any], out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<stem>.json`` and ``<stem>.md``; return their paths."""
    out_dir = Path(out_dir)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    atomic_write_json(json_path, _json_safe(table))
    atomic_write_text(md_path, render_markdown(table))
    return json_path, md_path

