"""Figures of run folders and ablations (PNG; matplotlib's Agg canvas, no pyplot state).

Per run: reward components, KL, step Match F1 against accuracy, the hack monitors against the
``reward_hacking`` guard's bounds, the difficulty-bucket mix; per ablation: bars of the table's columns
and the training dynamics of a strategy comparison (paper Figure 5). x axes: global training steps
across the phases (dotted lines: phase boundaries); a red ``X``: the first non-finite value (:func:`divergence`).
The bucket mix: :func:`bucket_mix` (the records behind the scored completions, a project choice).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpr.ablation.metrics import as_number, first_nonfinite
from cpr.ablation.run_folder import PhaseLogs, RunFolder, read_run
from cpr.errors import InputError

__all__ = ["ablation_figures", "bound_on_scale", "bucket_mix", "bucket_mix_from_checkpoints", "bucket_mix_from_completions",
           "difficulty_by_id", "divergence", "folder_kind", "kl_guard_limit", "kl_off", "learning_curves", "plot_bucket_mix",
           "plot_f1_vs_accuracy", "plot_hack_monitors", "plot_kl", "plot_learning_curves",
           "plot_reward_components", "plot_table", "plot_training_dynamics", "training_dynamics_figure"]

_NAN_MARKER = {"marker": "X", "markersize": 11, "color": "red", "markeredgecolor": "black", "linestyle": "none"}
_MARKERS = ("o", "s", "^", "D", "v", "P", "<", ">", "*", "h")
_STEP = "training step (all phases)"


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (8.0, 4.5)) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return Path(path)


def _series(rows: Sequence[Mapping[str, Any]], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    """The finite values of ``key`` against global step."""
    pts = [(r["global_step"], v * scale) for r in rows
           if (v := as_number(r.get(key))) is not None and math.isfinite(v) and r.get("global_step") is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _broken(xs: Sequence[float], ys: Sequence[float], logs: Sequence[PhaseLogs]) -> tuple[list[float], list[float]]:
    """The series with a NaN at each phase boundary, so a line does not join two phases."""
    bounds, out = [p.offset + 0.5 for p in logs[1:]], []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i and any(xs[i - 1] < b < x for b in bounds):
            out.append((math.nan, math.nan))
        out.append((x, y))
    return [p[0] for p in out], [p[1] for p in out]


def _phase_lines(ax: Any, logs: Sequence[PhaseLogs], color: str = "grey") -> None:
    for p in logs[1:]:
        ax.axvline(p.offset + 0.5, color=color, linestyle=":", linewidth=1, alpha=0.6)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def divergence(logs: Sequence[PhaseLogs]) -> dict[str, Any] | None:
    """``{"step": global step, "key", "value"}`` of the first non-finite value of the training logs
    or the first ``nan`` guard event (``key`` ``"guard nan"``, ``value`` its reason), whichever is first."""
    found = [d for d in [first_nonfinite([r for p in logs for r in p.train], step_key="global_step")] if d]
    event = next((e for p in logs for e in p.guard_events if e.get("condition") == "nan"), None)
    if event is not None and event.get("global_step") is not None:
        found.append({"step": event["global_step"], "key": "guard nan", "value": event.get("reason")})
    return min(found, key=lambda d: d["step"]) if found else None


def _mark_divergence(ax: Any, logs: Sequence[PhaseLogs], xs: Sequence[int], ys: Sequence[float], **kw: Any) -> bool:
    """A red X at the first divergence, at the height of the curve's last value before it; whether drawn."""
    div = divergence(logs)
    if div is not None:
        before = [y for x, y in zip(xs, ys, strict=True) if x <= div["step"]]
        ax.plot([div["step"]], [before[-1] if before else ys[0] if ys else 0.0], **_NAN_MARKER, **kw)
    return div is not None


def _line_plot(run: RunFolder, path: str | Path, labels: dict[str, str], *, title: str, ylabel: str,
               limit: float | None = None, no_data: str | None = None, dpi: int = 120) -> Path:
    """The log's ``labels`` keys against step, an X at the first divergence, an optional limit line."""
    logs = run.phase_logs()
    rows = [r for p in logs for r in p.train]
    fig, axes = _figure()
    ax = axes[0][0]
    drawn = [k for k in labels if _series(rows, k)[0]]
    for i, key in enumerate(drawn):
        ax.plot(*_broken(*_series(rows, key), logs), color=f"C{i}", linestyle=("-", "--", "-.", ":")[i % 4],
                linewidth=2.2 if i == 0 and len(drawn) > 1 else 1.4, label=labels[key])
    if drawn and limit is not None:
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"limit {limit:g}")
    div = divergence(logs) or {}
    _mark_divergence(ax, logs, *_series(rows, next(iter(labels))), label=f"first {div.get('key')} = {div.get('value')}")
    _phase_lines(ax, logs)
    ax.set(xlabel=_STEP, ylabel=ylabel, title=f"{title}: {run.path.name}")
    if drawn:
        ax.legend(fontsize=8)
    else:
        _no_data(ax, no_data or f"no {ylabel} logged")
    return _save(fig, path, dpi)


def plot_reward_components(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """Total reward and each reward function's mean (``rewards/<name>/mean``) per training step."""
    keys = sorted({k for p in run.phase_logs() for r in p.train for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    return _line_plot(run, path, {"reward": "total (weighted sum)", **{k: k.split("/")[1] for k in keys}},
                      title="Reward components", ylabel="reward", dpi=dpi)


def kl_guard_limit(run: RunFolder) -> float | None:
    """``guards.kl.limit`` of the run's ``config.yaml`` (the guard's default where it is left out);
    ``None`` without a config or with the KL guard off."""
    from cpr.training.config_sections import KLGuardConfig

    guards = (run.config or {}).get("guards") or {}
    kl = guards.get("kl") or {}
    if run.config is None or not guards.get("enabled", True) or not kl.get("enabled", True):
        return None
    return float(kl.get("limit", KLGuardConfig().limit))


def kl_off(run: RunFolder) -> bool:
    """Whether every GRPO phase of the run trained with ``beta`` 0 (its ``config.yaml``'s ``training_effective``),
    so that TRL logged no KL; ``False`` when the config does not say."""
    effective = (run.config or {}).get("training_effective") or {}
    betas = [args.get("beta") for args in effective.values() if isinstance(args, Mapping)]
    return bool(betas) and all(isinstance(b, (int, float)) and b == 0 for b in betas)


def plot_kl(run: RunFolder, path: str | Path, *, kl_limit: float | None = None, dpi: int = 120) -> Path:
    """Logged KL per training step, with a limit line at ``kl_limit`` when given; a run trained with
    ``beta`` 0 (:func:`kl_off`) says so across the panel."""
    no_data = "beta 0: no KL (TRL logs the KL only when training.beta > 0)" if kl_off(run) else None
    return _line_plot(run, path, {"kl": "KL (policy vs reference)"}, title="KL", ylabel="KL", limit=kl_limit,
                      no_data=no_data, dpi=dpi)


def bound_on_scale(values: Sequence[float], bound: float) -> bool:
    """Whether a monitor's dashed bound line is drawn on its panel: without values, or when the bound is at
    most twice the largest value; a bound far above the values would flatten them (``steps/count``'s 30
    against 3 to 5 steps), and the legend names it instead."""
    return not values or bound <= 2 * max(values)


def plot_hack_monitors(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """Each hack monitor (:data:`cpr.guarded_matching.MONITORS`) per training step, with the bound of the run's
    ``guards.reward_hacking`` (else the defaults) as a dashed red line where it does not flatten the values
    (:func:`bound_on_scale`; else named in the legend)."""
    from cpr.guarded_matching import MONITORS
    from cpr.training.config_sections import DEFAULT_HACKING_BOUNDS

    logs = run.phase_logs()
    rows = [r for p in logs for r in p.train]
    guards = (run.config or {}).get("guards") or {}
    bounds = {**DEFAULT_HACKING_BOUNDS, **((guards.get("reward_hacking") or {}).get("bounds") or {})}
    fig, axes = _figure(2, 3, size=(12.0, 6.0))
    for i, key in enumerate(MONITORS):
        ax = axes[i // 3][i % 3]
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(*_broken(xs, ys, logs), color=f"C{i}", marker=".", label="training batch")
        else:
            _no_data(ax, "not logged")
        if key in bounds and bound_on_scale(ys, bounds[key]):
            ax.axhline(bounds[key], color="red", linestyle="--", linewidth=1, label=f"bound {bounds[key]:g}")
        elif key in bounds:  # in the legend only, not stretching the axis
            ax.plot([], [], color="red", linestyle="--", linewidth=1, label=f"bound {bounds[key]:g} (above the axis)")
        ax.legend(fontsize=7)
        _phase_lines(ax, logs)
        ax.set(xlabel=_STEP, title=key)
    axes[1][2].set_axis_off()
    fig.suptitle(f"Hack monitors: {run.path.name}")
    return _save(fig, path, dpi)


def plot_f1_vs_accuracy(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """Step Match F1 against accuracy: a point per logged training step (colour: step) and the eval
    hook's evaluations (black-edged squares)."""
    logs = run.phase_logs()
    fig, axes = _figure(size=(6.5, 5.0))
    ax = axes[0][0]
    pts = [(r["global_step"], a * 100, f) for p in logs for r in p.train
           if (a := as_number(r.get("answer/accuracy"))) is not None and (f := as_number(r.get("steps/match_f1"))) is not None
           and math.isfinite(a) and math.isfinite(f)]
    if pts:
        sc = ax.scatter([p[1] for p in pts], [p[2] for p in pts], c=[p[0] for p in pts], cmap="viridis", s=25,
                        label="training batch")
        fig.colorbar(sc, ax=ax, label="training step")
    evals = [(r.get("accuracy"), r.get("match_f1")) for p in logs for r in p.eval_history
             if isinstance(r.get("accuracy"), (int, float)) and isinstance(r.get("match_f1"), (int, float))]
    if evals:
        ax.scatter(*zip(*evals, strict=True), marker="s", s=45, facecolor="none", edgecolor="black",
                   label="validation (eval hook)")
    if pts or evals:
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "no step Match F1 logged (answer-only phases log none)")
    ax.set(xlabel="answer accuracy (%)", ylabel="step Match F1", xlim=(-2, 102), ylim=(-0.02, 1.02),
           title=f"Step F1 vs accuracy: {run.path.name}")
    return _save(fig, path, dpi)


def difficulty_by_id(run: RunFolder) -> dict[str, str]:
    """Record id -> difficulty bucket of the run's records, loaded with its ``config.yaml``'s data
    section (relative paths from the working directory, as the run read them). Raises ``InputError`` without a
    ``config.yaml`` with a data section, or for data that does not load."""
    from cpr.training.config_sections import DataConfig
    from cpr.training.splits import load_splits

    if not run.config or not isinstance(run.config.get("data"), dict):
        raise InputError("no config.yaml with a data section: the records' buckets are unknown", path=run.path)
    raw = run.config["data"]
    try:
        data = DataConfig(**{**raw, **{key: raw.get(key) or [] for key in ("train", "validation", "test")}})
    except ValueError as e:  # a key the data section does not have (pydantic's ValidationError)
        raise InputError(f"invalid data section: {' '.join(str(e).split())}", path=run.path / "config.yaml", field="data") from None
    splits = load_splits(data)
    return {r.id: r.difficulty or "unknown" for part in (splits.train, splits.validation, splits.test) for r in part}


def bucket_mix_from_completions(run: RunFolder, difficulty: Mapping[str, str]) -> list[dict[str, Any]]:
    """Share of each bucket among the completions scored at each step (one reward function per phase, the
    first in its file, so none is counted twice): ``{"global_step", "phase", "counts": {bucket: n}, "shares":
    {bucket: share}}`` per step, in order. Raises ``InputError`` for a scored completion whose id is no record
    of the run's data."""
    out = []
    for p in run.phase_logs():
        by_step: dict[int, Counter] = {}
        for row in p.scored:
            if row.get("reward_function") != p.scored[0].get("reward_function"):
                continue
            rid = str(row.get("id"))
            if rid not in difficulty:
                raise InputError(f"scored completion of record {rid!r} (step {row.get('step')}): no such record in "
                                 "the run's data", path=run.path / p.name / "scored_completions.jsonl",
                                 record_id=rid, field="id")
            by_step.setdefault(row["global_step"], Counter())[difficulty[rid]] += 1
        out += [{"global_step": s, "phase": p.name, "counts": dict(c),
                 "shares": {k: v / sum(c.values()) for k, v in c.items()}} for s, c in sorted(by_step.items())]
    return out


def bucket_mix_from_checkpoints(run: RunFolder) -> list[dict[str, Any]]:
    """The sampler's scheduled bucket weights of each checkpoint (``trainer_state.json``'s
    ``CurriculumStateCallback`` state, ``position.bucket_mix``): ``{"global_step", "phase", "shares"}`` rows."""
    from cpr.training.checkpoints import checkpoint_step, checkpoints_of

    out = []
    for p in run.phase_logs():
        for ckpt in checkpoints_of(run.path / p.name):
            path = ckpt / "trainer_state.json"
            saved = json.loads(path.read_text(encoding="utf-8")).get("stateful_callbacks", {}) if path.is_file() else {}
            state = ((saved.get("CurriculumStateCallback") or {}).get("attributes") or {}).get("curriculum_state")
            if state is not None:
                mix = (state.get("position") or {}).get("bucket_mix")
                if not isinstance(mix, dict):
                    raise InputError("no position.bucket_mix", path=path, field="position.bucket_mix")
                out.append({"global_step": p.offset + checkpoint_step(ckpt), "phase": p.name, "shares": dict(mix)})
    return out


def bucket_mix(run: RunFolder) -> tuple[list[dict[str, Any]], str]:
    """``(mix, source)``: from the scored completions when the run has any, else from the checkpoints."""
    if any(p.scored for p in run.phase_logs()):
        return bucket_mix_from_completions(run, difficulty_by_id(run)), "scored completions"
    return bucket_mix_from_checkpoints(run), "checkpoints' curriculum state"


def plot_bucket_mix(mix: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "Bucket mix",
                    source: str = "scored completions", dpi: int = 120) -> Path:
    """Stacked shares of the difficulty buckets against training step."""
    from cpr.data import DIFFICULTIES

    fig, axes = _figure()
    ax = axes[0][0]
    if mix:
        present = {b for m in mix for b in m["shares"]}
        buckets = [b for b in DIFFICULTIES if b in present] + sorted(present - set(DIFFICULTIES))
        colors = {"easy": "#4caf50", "medium": "#ff9800", "hard": "#f44336"}
        ax.stackplot([m["global_step"] for m in mix], [[m["shares"].get(b, 0.0) for m in mix] for b in buckets],
                     labels=buckets, colors=[colors.get(b, f"C{i}") for i, b in enumerate(buckets)], alpha=0.85,
                     step="mid")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_ylim(0, 1)
    else:
        _no_data(ax, "no bucket information")
    ax.set(xlabel=_STEP, ylabel="share", title=f"{title} (from {source})")
    return _save(fig, path, dpi)


def training_dynamics_figure(runs: Sequence[tuple[str, RunFolder]], *, title: str | None = None) -> Any:
    """The figure of :func:`plot_training_dynamics` (axes 0: Match F1, axes 1: accuracy). Each label has
    its own colour and marker, and labels drawn first get wider lines, so coinciding curves stay
    visible; runs sharing a label (a strategy's seeds) are drawn thin under their mean."""
    fig, axes = _figure(2, 1, size=(9.0, 7.0))
    panels = ((axes[0][0], "steps/match_f1", 1.0, "match_f1"), (axes[1][0], "answer/accuracy", 100.0, "accuracy"))
    groups: dict[str, list[RunFolder]] = {}
    for label, run in runs:
        groups.setdefault(label, []).append(run)
    drawn = nan_labelled = False
    for i, (label, members) in enumerate(groups.items()):
        color, marker, width = f"C{i % 10}", _MARKERS[i % len(_MARKERS)], max(1.0, 1.0 + 0.8 * (len(groups) - 1 - i))
        logs_of = [m.phase_logs() for m in members]
        for ax, key, scale, hkey in panels:
            for source, style in (("train", "-"), ("eval", "--")):
                curves = []
                for logs in logs_of:
                    rows = [r for p in logs for r in (p.train if source == "train" else p.eval_history)]
                    xs, ys = _series(rows, key, scale) if source == "train" else _series(rows, hkey)
                    if xs:
                        curves.append((xs, ys))
                        if len(members) > 1:
                            ax.plot(*_broken(xs, ys, logs), color=color, linestyle=style, linewidth=0.7, alpha=0.35)
                if not curves:
                    continue
                by_step: dict[int, list[float]] = {}
                for x, y in ((x, y) for xs, ys in curves for x, y in zip(xs, ys, strict=True)):
                    by_step.setdefault(x, []).append(y)
                steps = sorted(by_step)
                what = ("training batch" if source == "train" else "validation") + (
                    f", mean of {len(members)}" if len(members) > 1 else "")
                ax.plot(*_broken(steps, [sum(by_step[x]) / len(by_step[x]) for x in steps], logs_of[-1]), color=color,
                        linestyle=style, linewidth=width, marker=marker, markersize=3 + width, alpha=0.85,
                        label=f"{label} ({what})", **({} if source == "train" else {"markerfacecolor": "white"}))
                drawn = True
            _phase_lines(ax, logs_of[0], color)
        for logs in logs_of:
            rows, label_x = [r for p in logs for r in p.train], None if nan_labelled else "first NaN / inf logged"
            for ax, key, scale, _ in panels:
                if _mark_divergence(ax, logs, *_series(rows, key, scale), label=label_x):
                    drawn = nan_labelled = True
    axes[0][0].set(ylabel="step Match F1", title=title or "Training dynamics")
    axes[1][0].set(xlabel=_STEP, ylabel="answer accuracy (%)")
    for ax, *_ in panels:
        if drawn:
            ax.legend(fontsize=7, ncol=2)
    if not drawn:
        _no_data(axes[0][0], "no training logs")
    return fig


def plot_training_dynamics(runs: Sequence[tuple[str, RunFolder]], path: str | Path, *, title: str | None = None,
                           dpi: int = 120) -> Path:
    """Match F1 (top) and accuracy (bottom) against training step, one colour per label (paper Figure 5):
    solid lines training batches, dashed lines with open markers the eval hook, a red ``X`` the first
    NaN / infinite value (module docstring)."""
    return _save(training_dynamics_figure(runs, title=title), path, dpi)


def plot_table(table: Mapping[str, Any], path: str | Path, *, dpi: int = 120) -> Path:
    """Bars of a table's columns (a panel per column, a bar per row that has a value)."""
    columns, rows, ncols = table["columns"], table["rows"], 3
    nrows = max(1, math.ceil(len(columns) / ncols))
    fig, axes = _figure(nrows, ncols, size=(4.0 * ncols, 3.2 * nrows))
    for k, col in enumerate(columns):
        ax = axes[k // ncols][k % ncols]
        xs = [i for i, r in enumerate(rows) if isinstance(r.get(col["key"]), (int, float))]
        ax.bar(xs, [rows[i][col["key"]] for i in xs], color=[f"C{i % 10}" for i in xs])
        ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=30, ha="right", fontsize=7)
        ax.set_title(col["title"], fontsize=9)
        if not xs:
            _no_data(ax, "no values")
    for k in range(len(columns), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"{table['name']} ({table['split']} split)")
    return _save(fig, path, dpi)


def _table_file(path: Path) -> Path | None:
    return next((p for p in (path / "ablation_strategies.json", path / "ablation_weights.json") if p.is_file()), None)


def folder_kind(path: str | Path) -> str:
    """``"ablation"`` (an ablation folder: its ``ablation_<kind>.json``) or ``"run"`` (a run folder); else
    ``InputError``."""
    path = Path(path)
    if _table_file(path):
        return "ablation"
    if (path / "config.yaml").is_file() or (path / "summary.json").is_file():
        return "run"
    raise InputError("neither a run folder (config.yaml) nor an ablation folder (ablation_*.json)", path=path)


def ablation_figures(ablation_dir: str | Path, out_dir: str | Path | None = None, *, dpi: int = 120) -> dict[str, Path]:
    """The figures of an ablation folder, from its table JSON: ``{"table": <bars>}`` plus, for a strategy
    comparison, ``"training_dynamics"``. Raises ``InputError`` when the folder holds no table."""
    ablation_dir = Path(ablation_dir)
    out_dir = Path(out_dir) if out_dir is not None else ablation_dir
    path = _table_file(ablation_dir)
    if path is None:
        raise InputError("no ablation_*.json table: run the ablation (or --table-only) first", path=ablation_dir)
    return table_figures(json.loads(path.read_text(encoding="utf-8")), out_dir, dpi=dpi)


def table_figures(table: dict[str, Any], out_dir: str | Path, *, dpi: int = 120) -> dict[str, Path]:
    """The figures of an ablation table (:func:`cpr.ablation.tables.build_table`) into ``out_dir``:
    ``{"table": ablation_<kind>.png}`` plus, for a strategy comparison, ``"training_dynamics"``. Raises
    ``InputError`` when a run folder of the table cannot be read."""
    out_dir = Path(out_dir)
    figs = {"table": plot_table(table, out_dir / f"ablation_{table['kind']}.png", dpi=dpi)}
    if table["kind"] == "strategies":  # the runs that trained GRPO phases
        runs = [(r["label"], run) for r in table["runs"] if (run := read_run(r["folder"])).phases]
        figs["training_dynamics"] = plot_training_dynamics(
            runs, out_dir / "training_dynamics.png", title=f"Training dynamics: {table['name']} (Match F1 and accuracy)",
            dpi=dpi)
    return figs


def learning_curves(diagnosis: Mapping[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Validation learning curves of a GRPO diagnosis (the ``diagnosis.json`` of
    ``reports/grpo_diagnosis/grpo_diagnosis.py --curve N``): Match F1 and accuracy against generated completions.

    ``diagnosis`` maps ``"warm_start|val<S>x<N>"`` and ``"<row>|seed<k>|val<S>x<N>|..."`` to
    ``{"greedy": {...}, "sampled": {...}}`` scores (``match_f1`` 0-1, ``accuracy`` percent), a ``--curve`` row also
    to ``curve`` (step -> scores) and ``completions``; step ``s`` of ``S`` stands at ``completions * s / S``.
    Seeds are averaged point by point; each curve starts at the warm start.

    Returns:
        ``"<row> (val<S>x<N>, k seeds)"`` -> points sorted by completions, each ``{"completions",
        "greedy_match_f1", "sampled_match_f1", "greedy_accuracy", "sampled_accuracy", "seeds"}``; rows without
        a curve are left out.

    Raises ``InputError`` when a row with a curve has no ``completions``, or its warm start is missing.
    """
    def point(scores: Mapping[str, Any]) -> dict[str, float]:
        return {f"{mode}_{k}": float(scores[mode][k]) for mode in ("greedy", "sampled") for k in ("match_f1", "accuracy")}

    grouped: dict[tuple[str, str], dict[int, list[dict[str, float]]]] = {}
    for key, result in diagnosis.items():
        parts = key.split("|")
        if len(parts) < 3 or "curve" not in result:
            continue
        name, val = parts[0], parts[2]
        if result.get("completions") is None:
            raise InputError(f"row {key!r} has a curve but no 'completions'")
        steps = {int(s): scores for s, scores in result["curve"].items()}
        last = max(steps)
        per_step = float(result["completions"]) / last
        points = grouped.setdefault((name, val), {})
        for s, scores in steps.items():
            points.setdefault(round(s * per_step), []).append(point(scores))
    out: dict[str, list[dict[str, float]]] = {}
    for (name, val), points in grouped.items():
        start = diagnosis.get(f"warm_start|{val}")
        if start is None:
            raise InputError(f"no warm start 'warm_start|{val}' for the curve of {name!r}")
        curve = [{"completions": 0.0, **point(start), "seeds": 1}]
        seeds = max(len(v) for v in points.values())
        for c in sorted(points):
            curve.append({"completions": float(c), "seeds": len(points[c]),
                          **{k: sum(p[k] for p in points[c]) / len(points[c]) for k in points[c][0]}})
        out[f"{name} ({val}, {seeds} seed{'s' if seeds > 1 else ''})"] = curve
    return out


def plot_learning_curves(curves: Mapping[str, Sequence[Mapping[str, float]]], path: str | Path, *,
                         title: str = "Validation learning curves", dpi: int = 120) -> Path:
    """Match F1 (left) and accuracy (right) against generated completions, greedy (solid) and sampled mean@k
    (dashed), one colour per row of :func:`learning_curves`; the grey line is the warm start's greedy value."""
    fig, axes = _figure(1, 2, size=(12.0, 4.5))
    for col, (metric, label) in enumerate((("match_f1", "Match F1"), ("accuracy", "accuracy (%)"))):
        ax = axes[0][col]
        if not curves:
            _no_data(ax, "no learning curves (run the diagnosis with --curve N)")
        for i, (name, points) in enumerate(curves.items()):
            xs = [p["completions"] for p in points]
            ax.plot(xs, [p[f"greedy_{metric}"] for p in points], marker=_MARKERS[i % len(_MARKERS)], color=f"C{i}",
                    label=f"{name} greedy")
            ax.plot(xs, [p[f"sampled_{metric}"] for p in points], linestyle="--", color=f"C{i}",
                    label=f"{name} sampled")
            if i == 0:
                ax.axhline(points[0][f"greedy_{metric}"], color="grey", linewidth=0.8, linestyle=":")
        ax.set(xlabel="generated completions", ylabel=label, title=label)
    if curves:
        axes[0][0].legend(loc="best", fontsize=7)
    fig.suptitle(title)
    return _save(fig, path, dpi)
