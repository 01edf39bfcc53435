"""Figures of run folders and ablations (PNG, matplotlib's Agg canvas; no pyplot state).

Per run (:func:`run_figures`): reward components, KL, step Match F1 against accuracy, the hack
monitors (:data:`cpr.guard.MONITORS`) against the ``reward_hacking`` guard's bounds, and the
difficulty-bucket mix over training. Per ablation (:func:`ablation_figures`): the training-dynamics
figure of a strategy comparison (paper Figure 5: Match F1 and accuracy against training step, one
colour per strategy, NaN divergence marked) and bar charts of the table's columns.

Steps on the x axes are *global* training steps: the phases of a run follow each other (phase 2's
step 1 is drawn at phase 1's last step + 1; :meth:`cpr.ablation.run_folder.RunFolder.phase_logs`),
and phase boundaries are drawn as dotted vertical lines.

What the curves are:

* training-batch values come from ``<phase>/log.jsonl``: ``steps/match_f1`` (logged by the
  ``cpr`` / ``step_f1`` reward functions; the answer-only phase logs none) and ``answer/accuracy``
  (logged by ``accuracy`` and ``cpr``; strict answer checking, shown in percent);
* evaluation values come from the eval hook's ``<phase>/eval_history.jsonl`` when present
  (greedy decoding on the validation split; accuracy in percent, ``evaluation.answer_mode``);
* a run's **divergence** is the first training log row with a NaN / infinite loss, grad norm,
  KL or reward (:func:`cpr.ablation.metrics.first_nonfinite`), or the divergence guards' first
  ``nan`` event if earlier (:func:`divergence`); it is marked with a red ``X`` at that step, at the
  height of the curve's last finite value.

**Bucket mix** (a project choice): the mix of difficulty buckets the policy actually trained on at
each step, counted from the ids of the completions in ``scored_completions.jsonl`` joined with the
difficulty of the run's training records (loaded through the run's own ``config.yaml``, so the
buckets are those the sampler used). It is exact and has one point per step, where the
alternative, the ``curriculum_state.json`` of checkpoints, gives the *scheduled* sampling weights
at checkpoint steps only; :func:`bucket_mix_from_checkpoints` reads that one for runs without
scored completions (phases trained with answer-only rewards score none).
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
from cpr.training.checkpoints import checkpoint_step, checkpoints_of

__all__ = [
    "ablation_figures",
    "bucket_mix_from_checkpoints",
    "bucket_mix_from_completions",
    "difficulty_by_id",
    "divergence",
    "folder_kind",
    "kl_guard_limit",
    "plot_bucket_mix",
    "plot_f1_vs_accuracy",
    "plot_hack_monitors",
    "plot_kl",
    "plot_reward_components",
    "plot_table",
    "plot_training_dynamics",
    "run_figures",
    "training_dynamics_figure",
]

_NAN_MARKER = {"marker": "X", "markersize": 11, "color": "red", "markeredgecolor": "black", "linestyle": "none"}


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (8.0, 4.5)) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def _series(rows: Sequence[Mapping[str, Any]], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    """Finite values of ``key`` against global step."""
    xs, ys = [], []
    for row in rows:
        v = as_number(row.get(key))
        x = row.get("global_step")
        if v is None or x is None or not math.isfinite(v):
            continue
        xs.append(x)
        ys.append(v * scale)
    return xs, ys


def _broken(xs: Sequence[float], ys: Sequence[float], logs: Sequence[PhaseLogs]) -> tuple[list[float], list[float]]:
    """The series with a gap (NaN) at each phase boundary, so a line does not join two phases."""
    bounds = [p.offset + 0.5 for p in logs[1:]]
    out_x: list[float] = []
    out_y: list[float] = []
    for x, y in zip(xs, ys, strict=True):
        if out_x and any(out_x[-1] < b < x for b in bounds):
            out_x.append(math.nan)
            out_y.append(math.nan)
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


def _phase_lines(ax: Any, logs: Sequence[PhaseLogs], color: str = "grey") -> None:
    for p in logs[1:]:
        ax.axvline(p.offset + 0.5, color=color, linestyle=":", linewidth=1, alpha=0.6)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def divergence(logs: Sequence[PhaseLogs]) -> dict[str, Any] | None:
    """Where a run first went non-finite: the first NaN / infinite loss, grad norm, KL or reward of
    its training logs, or the first ``nan`` event of the divergence guards (``guard_events.jsonl``;
    a step the guard skipped or stopped at may never reach the training log), whichever comes first.

    Returns:
        ``{"step": global step, "key", "value"}`` (for a guard event ``key`` is ``"guard nan"`` and
        ``value`` its reason), or ``None``.
    """
    found = []
    logged = first_nonfinite([r for p in logs for r in p.train], step_key="global_step")
    if logged is not None:
        found.append(logged)
    event = next((e for p in logs for e in p.guard_events if e.get("condition") == "nan"), None)
    if event is not None and event.get("global_step") is not None:
        found.append({"step": event["global_step"], "key": "guard nan", "value": event.get("reason")})
    return min(found, key=lambda d: d["step"]) if found else None


def _height_at(xs: Sequence[int], ys: Sequence[float], step: int) -> float:
    before = [y for x, y in zip(xs, ys, strict=True) if x <= step]
    if before:
        return before[-1]
    return ys[0] if ys else 0.0


# ---------------------------------------------------------------------------------------------
# per run
# ---------------------------------------------------------------------------------------------


def plot_reward_components(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """Total reward and each reward function's mean (``rewards/<name>/mean``) per training step."""
    logs = run.phase_logs()
    fig, axes = _figure()
    ax = axes[0][0]
    rows = [r for p in logs for r in p.train]
    keys = ["reward"] + sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    drawn = False
    styles = ("-", "--", "-.", ":")
    for i, key in enumerate(keys):
        xs, ys = _series(rows, key)
        if xs:
            label = "total (weighted sum)" if key == "reward" else key.split("/")[1]
            ax.plot(*_broken(xs, ys, logs), color=f"C{i}", linestyle=styles[i % len(styles)],
                    linewidth=2.2 if key == "reward" else 1.4, label=label)
            drawn = True
    div = divergence(logs)
    if div is not None:
        xs, ys = _series(rows, "reward")
        ax.plot([div["step"]], [_height_at(xs, ys, div["step"])], label=f"first {div['key']} = {div['value']}", **_NAN_MARKER)
    _phase_lines(ax, logs)
    ax.set(xlabel="training step (all phases)", ylabel="reward (training batch mean)",
           title=f"Reward components: {run.path.name}")
    if drawn:
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "no reward logged")
    return _save(fig, path, dpi)


def kl_guard_limit(run: RunFolder) -> float | None:
    """The KL limit of the run's divergence guard: ``guards.kl.limit`` of its ``config.yaml`` (the
    guard's default where the file leaves it out); ``None`` without a config or with the KL guard off."""
    if run.config is None:
        return None
    from cpr.training.config import KLGuardConfig

    guards = run.config.get("guards") or {}
    kl = guards.get("kl") or {}
    if not guards.get("enabled", True) or not kl.get("enabled", True):
        return None
    return float(kl.get("limit", KLGuardConfig().limit))


def plot_kl(run: RunFolder, path: str | Path, *, kl_limit: float | None = None, dpi: int = 120) -> Path:
    """Logged KL per training step, with a limit line at ``kl_limit`` when given."""
    logs = run.phase_logs()
    fig, axes = _figure()
    ax = axes[0][0]
    rows = [r for p in logs for r in p.train]
    xs, ys = _series(rows, "kl")
    if xs:
        ax.plot(*_broken(xs, ys, logs), color="C0", label="KL (policy vs reference)")
        if kl_limit is not None:
            ax.axhline(kl_limit, color="red", linestyle="--", linewidth=1, label=f"limit {kl_limit:g}")
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "no KL logged")
    div = divergence(logs)
    if div is not None:
        ax.plot([div["step"]], [_height_at(xs, ys, div["step"])], **_NAN_MARKER)
    _phase_lines(ax, logs)
    ax.set(xlabel="training step (all phases)", ylabel="KL", title=f"KL: {run.path.name}")
    return _save(fig, path, dpi)


def plot_hack_monitors(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """The hack monitors per training step, one panel each, with the bound of the run's
    ``guards.reward_hacking`` (its config, else the defaults) as a dashed red line."""
    from cpr.guard import MONITORS
    from cpr.training.config import DEFAULT_HACKING_BOUNDS

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
        if key in bounds:
            ax.axhline(bounds[key], color="red", linestyle="--", linewidth=1, label=f"bound {bounds[key]:g}")
        ax.legend(fontsize=7)
        _phase_lines(ax, logs)
        ax.set(xlabel="training step (all phases)", title=key)
    axes[1][2].set_axis_off()
    fig.suptitle(f"Hack monitors: {run.path.name}")
    return _save(fig, path, dpi)


def plot_f1_vs_accuracy(run: RunFolder, path: str | Path, *, dpi: int = 120) -> Path:
    """Step Match F1 against answer accuracy: one point per logged training step (colour: step),
    and the eval hook's evaluations (black-edged squares) when present."""
    logs = run.phase_logs()
    fig, axes = _figure(size=(6.5, 5.0))
    ax = axes[0][0]
    pts = []
    for row in (r for p in logs for r in p.train):
        acc, f1 = as_number(row.get("answer/accuracy")), as_number(row.get("steps/match_f1"))
        if acc is not None and f1 is not None and math.isfinite(acc) and math.isfinite(f1):
            pts.append((row["global_step"], acc * 100, f1))
    if pts:
        sc = ax.scatter([p[1] for p in pts], [p[2] for p in pts], c=[p[0] for p in pts], cmap="viridis", s=25,
                        label="training batch")
        fig.colorbar(sc, ax=ax, label="training step")
    evals = [(r["global_step"], r.get("accuracy"), r.get("match_f1")) for p in logs for r in p.eval_history]
    evals = [e for e in evals if isinstance(e[1], (int, float)) and isinstance(e[2], (int, float))]
    if evals:
        ax.scatter([e[1] for e in evals], [e[2] for e in evals], marker="s", s=45, facecolor="none",
                   edgecolor="black", label="validation (eval hook)")
    if pts or evals:
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "no step Match F1 logged (answer-only phases log none)")
    ax.set(xlabel="answer accuracy (%)", ylabel="step Match F1", xlim=(-2, 102), ylim=(-0.02, 1.02),
           title=f"Step F1 vs accuracy: {run.path.name}")
    return _save(fig, path, dpi)


def difficulty_by_id(run: RunFolder) -> dict[str, str]:
    """Record id -> difficulty bucket of the run's training, validation and test records, loaded
    with the data section of the run's ``config.yaml`` (relative data paths are read from the
    working directory, as the run did).

    Raises:
        InputError: the run folder has no ``config.yaml``, or its data cannot be loaded.
    """
    from cpr.training.config import DataConfig, DataSourceConfig
    from cpr.training.splits import load_splits

    if not run.config or not isinstance(run.config.get("data"), dict):
        raise InputError("no config.yaml with a data section: the records' buckets are unknown", path=run.path)
    raw = dict(run.config["data"])
    try:
        for key in ("train", "validation", "test"):
            raw[key] = [DataSourceConfig(**src) for src in raw.get(key) or []]
        data = DataConfig(**raw)
    except ValueError as e:  # a key the data section does not have (pydantic's ValidationError)
        raise InputError(f"invalid data section: {' '.join(str(e).split())}", path=run.path / "config.yaml", field="data") from None
    splits = load_splits(data)
    return {r.id: r.difficulty or "unknown" for part in (splits.train, splits.validation, splits.test) for r in part}


def bucket_mix_from_completions(run: RunFolder, difficulty: Mapping[str, str]) -> list[dict[str, Any]]:
    """Share of each difficulty bucket among the completions scored at each training step.

    Counts the rows of one reward function per phase (the first one in the file), so a phase
    scored by two functions is not counted twice.

    Returns:
        One ``{"global_step", "phase", "counts": {bucket: n}, "shares": {bucket: share}}`` per step
        with scored completions, in step order.

    Raises:
        InputError: a scored completion whose id is not a record of the run's data.
    """
    out = []
    for p in run.phase_logs():
        if not p.scored:
            continue
        fn = p.scored[0].get("reward_function")
        by_step: dict[int, Counter] = {}
        for row in p.scored:
            if row.get("reward_function") != fn:
                continue
            rid = str(row.get("id"))
            if rid not in difficulty:
                raise InputError(
                    f"scored completion of record {rid!r} (step {row.get('step')}): no such record in the run's data",
                    path=run.path / p.name / "scored_completions.jsonl", record_id=rid, field="id",
                )
            by_step.setdefault(row["global_step"], Counter())[difficulty[rid]] += 1
        for step in sorted(by_step):
            counts = dict(by_step[step])
            total = sum(counts.values())
            out.append({"global_step": step, "phase": p.name, "counts": counts,
                        "shares": {k: v / total for k, v in counts.items()}})
    return out


def bucket_mix_from_checkpoints(run: RunFolder) -> list[dict[str, Any]]:
    """The curriculum sampler's scheduled bucket weights saved in each checkpoint's
    ``curriculum_state.json`` (``position.bucket_mix``), one point per checkpoint.

    Returns:
        ``{"global_step", "phase", "shares"}`` rows in step order (``[]`` for phases without a curriculum).
    """
    out = []
    for p in run.phase_logs():
        folder = run.path / p.name
        for ckpt in checkpoints_of(folder):
            state_path = ckpt / "curriculum_state.json"
            if not state_path.is_file():
                continue
            state = json.loads(state_path.read_text(encoding="utf-8"))
            step = checkpoint_step(ckpt)
            mix = (state.get("position") or {}).get("bucket_mix")
            if not isinstance(mix, dict):
                raise InputError("no position.bucket_mix", path=state_path, field="position.bucket_mix")
            out.append({"global_step": p.offset + step, "phase": p.name, "shares": dict(mix)})
    return out


def plot_bucket_mix(mix: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "Bucket mix",
                    source: str = "scored completions", dpi: int = 120) -> Path:
    """Stacked shares of the difficulty buckets against training step."""
    from cpr.data import DIFFICULTIES

    fig, axes = _figure()
    ax = axes[0][0]
    if mix:
        present = {b for m in mix for b in m["shares"]}
        buckets = [b for b in DIFFICULTIES if b in present] + sorted(present - set(DIFFICULTIES))
        xs = [m["global_step"] for m in mix]
        ys = [[m["shares"].get(b, 0.0) for m in mix] for b in buckets]
        colors = {"easy": "#4caf50", "medium": "#ff9800", "hard": "#f44336"}
        ax.stackplot(xs, ys, labels=buckets, colors=[colors.get(b, f"C{i}") for i, b in enumerate(buckets)], alpha=0.85,
                     step="mid")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_ylim(0, 1)
    else:
        _no_data(ax, "no bucket information")
    ax.set(xlabel="training step (all phases)", ylabel="share", title=f"{title} (from {source})")
    return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# ablations
# ---------------------------------------------------------------------------------------------


_RUN_MARKERS = ("o", "s", "^", "D", "v", "P", "<", ">", "*", "h")


def _mean_curve(curves: Sequence[tuple[list[int], list[float]]]) -> tuple[list[int], list[float]]:
    """The mean of several ``(steps, values)`` series at each step (over the series that have it)."""
    by_step: dict[int, list[float]] = {}
    for xs, ys in curves:
        for x, y in zip(xs, ys, strict=True):
            by_step.setdefault(x, []).append(y)
    steps = sorted(by_step)
    return steps, [sum(by_step[x]) / len(by_step[x]) for x in steps]


def training_dynamics_figure(runs: Sequence[tuple[str, RunFolder]], *, title: str | None = None) -> Any:
    """The figure of :func:`plot_training_dynamics` (a ``matplotlib.figure.Figure``; axes 0: Match
    F1, axes 1: accuracy). Each label has its own colour and marker, and labels drawn first get wider
    lines, so curves that coincide (same seed and start) stay visible. Runs sharing a label (the seeds
    of one strategy) are drawn as thin lines under their mean."""
    fig, axes = _figure(2, 1, size=(9.0, 7.0))
    ax_f1, ax_acc = axes[0][0], axes[1][0]
    drawn = False
    nan_labelled = False
    groups: dict[str, list[RunFolder]] = {}
    for label, run in runs:
        groups.setdefault(label, []).append(run)
    for i, (label, members) in enumerate(groups.items()):
        color = f"C{i % 10}"
        marker = _RUN_MARKERS[i % len(_RUN_MARKERS)]
        width = max(1.0, 1.0 + 0.8 * (len(groups) - 1 - i))
        seeds = f", mean of {len(members)}" if len(members) > 1 else ""
        for ax, key, scale, hkey in ((ax_f1, "steps/match_f1", 1.0, "match_f1"),
                                     (ax_acc, "answer/accuracy", 100.0, "accuracy")):
            for source, style in (("train", "-"), ("eval", "--")):
                curves, logs = [], []
                for run in members:
                    logs = run.phase_logs()
                    rows = [r for p in logs for r in (p.train if source == "train" else p.eval_history)]
                    xs, ys = _series(rows, key if source == "train" else hkey, scale if source == "train" else 1.0)
                    if xs:
                        curves.append((xs, ys))
                        if len(members) > 1:
                            ax.plot(*_broken(xs, ys, logs), color=color, linestyle=style, linewidth=0.7, alpha=0.35)
                if not curves:
                    continue
                face = {} if source == "train" else {"markerfacecolor": "white"}
                what = "training batch" if source == "train" else "validation"
                ax.plot(*_broken(*_mean_curve(curves), logs), color=color, linestyle=style, linewidth=width,
                        marker=marker, markersize=3 + width, alpha=0.85, label=f"{label} ({what}{seeds})", **face)
                drawn = True
            if members:
                _phase_lines(ax, members[0].phase_logs(), color)
        for run in members:
            logs = run.phase_logs()
            div = divergence(logs)
            if div is None:
                continue
            rows = [r for p in logs for r in p.train]
            for ax, key, scale in ((ax_f1, "steps/match_f1", 1.0), (ax_acc, "answer/accuracy", 100.0)):
                xs, ys = _series(rows, key, scale)
                ax.plot([div["step"]], [_height_at(xs, ys, div["step"])],
                        label=None if nan_labelled else "first NaN / inf logged", **_NAN_MARKER)
            nan_labelled = True
            drawn = True
    ax_f1.set(ylabel="step Match F1", title=title or "Training dynamics")
    ax_acc.set(xlabel="training step (all phases)", ylabel="answer accuracy (%)")
    if drawn:
        ax_f1.legend(fontsize=7, ncol=2)
        ax_acc.legend(fontsize=7, ncol=2)
    else:
        _no_data(ax_f1, "no training logs")
    return fig


def plot_training_dynamics(runs: Sequence[tuple[str, RunFolder]], path: str | Path, *, title: str | None = None,
                           dpi: int = 120) -> Path:
    """Match F1 (top) and accuracy (bottom) against training step, one colour per run (paper Figure 5).

    Solid lines: training-batch values (``steps/match_f1``, ``answer/accuracy`` x 100); dashed
    lines with open markers: the eval hook's evaluations; runs with the same label (seeds) are drawn
    thin under their mean; a red ``X``: the first NaN / infinite value logged (module docstring).
    Runs without training logs (base model, SFT) are left out.
    """
    return _save(training_dynamics_figure(runs, title=title), path, dpi)


def plot_table(table: Mapping[str, Any], path: str | Path, *, dpi: int = 120) -> Path:
    """Bar charts of a table's numeric columns (one panel per column, one bar per run; runs
    without a value have no bar)."""
    columns = table["columns"]
    rows = table["rows"]
    ncols = 3
    nrows = max(1, math.ceil(len(columns) / ncols))
    fig, axes = _figure(nrows, ncols, size=(4.0 * ncols, 3.2 * nrows))
    labels = [r["label"] for r in rows]
    for k, col in enumerate(columns):
        ax = axes[k // ncols][k % ncols]
        vals = [r.get(col["key"]) for r in rows]
        xs = [i for i, v in enumerate(vals) if isinstance(v, (int, float))]
        ax.bar(xs, [vals[i] for i in xs], color=[f"C{i % 10}" for i in xs])
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(col["title"], fontsize=9)
        if not xs:
            _no_data(ax, "no values")
    for k in range(len(columns), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"{table['name']} ({table['split']} split)")
    return _save(fig, path, dpi)


def folder_kind(path: str | Path) -> str:
    """``"ablation"`` (an ablation's output folder: ``ablation_plan.json``) or ``"run"`` (a run folder).

    Raises:
        InputError: neither.
    """
    path = Path(path)
    if (path / "ablation_plan.json").is_file():
        return "ablation"
    if (path / "config.yaml").is_file() or (path / "summary.json").is_file():
        return "run"
    raise InputError("neither a run folder (config.yaml) nor an ablation folder (ablation_plan.json)", path=path)


def run_figures(run_dir: str | Path, out_dir: str | Path, *, kl_limit: float | None = None,
                dpi: int = 120) -> dict[str, Path]:
    """Every per-run figure of a run folder, written to ``out_dir``.

    The KL plot draws ``kl_limit``, by default the run's guard limit (:func:`kl_guard_limit`).
    The bucket mix is drawn from the scored completions when the run has any, else from the
    checkpoints' curriculum state, else left out (module docstring).

    Returns:
        ``{"reward_components", "kl", "f1_vs_accuracy", "hack_monitors"[, "bucket_mix"]}`` -> PNG path.
    """
    run = read_run(run_dir)
    out_dir = Path(out_dir)
    figs = {
        "reward_components": plot_reward_components(run, out_dir / "reward_components.png", dpi=dpi),
        "kl": plot_kl(run, out_dir / "kl.png", kl_limit=kl_guard_limit(run) if kl_limit is None else kl_limit, dpi=dpi),
        "f1_vs_accuracy": plot_f1_vs_accuracy(run, out_dir / "f1_vs_accuracy.png", dpi=dpi),
        "hack_monitors": plot_hack_monitors(run, out_dir / "hack_monitors.png", dpi=dpi),
    }
    logs = run.phase_logs()
    if any(p.scored for p in logs):
        mix = bucket_mix_from_completions(run, difficulty_by_id(run))
        source = "scored completions"
    else:
        mix = bucket_mix_from_checkpoints(run)
        source = "checkpoints' curriculum state"
    if mix:
        figs["bucket_mix"] = plot_bucket_mix(mix, out_dir / "bucket_mix.png", title=f"Bucket mix: {run.path.name}",
                                             source=source, dpi=dpi)
    return figs


def ablation_figures(ablation_dir: str | Path, out_dir: str | Path | None = None, *, dpi: int = 120) -> dict[str, Path]:
    """The figures of an ablation folder (``ablation_plan.json`` and the table JSON written by the ablation).

    Returns:
        ``{"table": <bars of the table's columns>}``, plus ``"training_dynamics"`` for a strategy comparison.

    Raises:
        InputError: no plan or no table in the folder.
    """
    ablation_dir = Path(ablation_dir)
    out_dir = Path(out_dir) if out_dir is not None else ablation_dir
    plan_path = ablation_dir / "ablation_plan.json"
    if not plan_path.is_file():
        raise InputError("no ablation_plan.json: not an ablation folder", path=ablation_dir)
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    table_path = ablation_dir / f"ablation_{plan['kind']}.json"
    if not table_path.is_file():
        raise InputError("no table: run the ablation (or --table-only) first", path=table_path)
    table = json.loads(table_path.read_text(encoding="utf-8"))
    figs = {"table": plot_table(table, out_dir / f"ablation_{plan['kind']}.png", dpi=dpi)}
    if plan["kind"] == "strategies":
        runs = [(r["label"], read_run(r["output_dir"])) for r in plan["runs"] if r["type"] == "grpo"]
        figs["training_dynamics"] = plot_training_dynamics(
            runs, out_dir / "training_dynamics.png", title=f"Training dynamics: {plan['name']}", dpi=dpi
        )
    return figs
