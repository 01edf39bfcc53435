"""Figures of runs and ablations (cpr.ablation.figures) from handwritten run folders."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from ablation_runs import SAMPLES, scored, train_row, write_run
from PIL import Image

from cpr.ablation import figures
from cpr.ablation.run_folder import read_run
from cpr.errors import InputError


def _png_ok(path: Path, min_colours: int = 5) -> None:
    assert path.is_file() and path.stat().st_size > 5_000, path
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 400 and im.height >= 300
        colours = np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0)
    assert len(colours) >= min_colours  # something is drawn, not a blank canvas


def _two_phase_run(folder: Path, nan_at: int | None = 2) -> Path:
    """answer_only: 4 steps (accuracy only); cpr: 3 steps with step F1; a NaN loss at cpr step ``nan_at``."""
    ao = [train_row(s, **{"answer/accuracy": 0.25 * s, "rewards/accuracy/mean": 0.25 * s}) for s in (1, 2, 3, 4)]
    cpr = [train_row(s, **{"answer/accuracy": 0.5, "steps/match_f1": 0.1 * s, "rewards/cpr/mean": 0.3 * s})
           for s in (1, 2, 3)]
    if nan_at is not None:
        cpr[nan_at - 1]["loss"] = "nan"
    return write_run(folder, phases={
        "answer_only": {"steps": 4, "log": ao,
                        "eval_history": [{"step": 2, "benchmark": "crystal", "accuracy": 50.0, "match_f1": 0.2}]},
        "cpr": {"steps": 3, "log": cpr, "scored": [scored(1, 1.0, True, 1.0)]},
    })


def test_global_steps_follow_the_phases(tmp_path):
    ao, cpr = read_run(_two_phase_run(tmp_path / "r")).phase_logs()
    assert (ao.offset, cpr.offset) == (0, 4)
    assert [r["global_step"] for r in cpr.train] == [5, 6, 7]
    # a scored completion's step is the optimizer step it trains (cpr's step 1: global step 5)
    assert ao.eval_history[0]["global_step"] == 2 and cpr.scored[0]["global_step"] == 5


def test_training_dynamics_marks_the_first_nan(tmp_path):
    run = read_run(_two_phase_run(tmp_path / "r"))
    fig = figures.training_dynamics_figure([("CPR-Curriculum", run)])
    ax_f1, ax_acc = fig.axes[:2]
    nan_f1 = [ln for ln in ax_f1.lines if ln.get_marker() == "X"]
    nan_acc = [ln for ln in ax_acc.lines if ln.get_marker() == "X"]
    assert len(nan_f1) == len(nan_acc) == 1
    # cpr step 2 = global step 6; height: the curve's last finite value at or before that step
    assert list(nan_f1[0].get_xdata()) == [6] and list(nan_f1[0].get_ydata()) == [pytest.approx(0.2)]
    assert list(nan_acc[0].get_xdata()) == [6] and list(nan_acc[0].get_ydata()) == [pytest.approx(50.0)]
    f1_train = next(ln for ln in ax_f1.lines if ln.get_label() == "CPR-Curriculum (training batch)")
    assert list(f1_train.get_xdata()) == [5, 6, 7]  # answer-only logs no step F1
    acc_train = next(ln for ln in ax_acc.lines if ln.get_label() == "CPR-Curriculum (training batch)")
    xs, ys = list(acc_train.get_xdata()), list(acc_train.get_ydata())
    assert xs[:4] == [1, 2, 3, 4] and math.isnan(xs[4]) and xs[5:] == [5, 6, 7]  # the line breaks between phases
    assert ys[:4] + ys[5:] == pytest.approx([25, 50, 75, 100, 50, 50, 50])
    acc_eval = next(ln for ln in ax_acc.lines if ln.get_label() == "CPR-Curriculum (validation)")
    assert list(acc_eval.get_xdata()) == [2] and list(acc_eval.get_ydata()) == [50.0]
    # a NaN the guard stopped at (no NaN row in log.jsonl): marked from guard_events.jsonl
    guarded = _two_phase_run(tmp_path / "g", nan_at=None)
    (guarded / "cpr" / "guard_events.jsonl").write_text(json.dumps(
        {"step": 3, "condition": "nan", "action": "stop", "reason": "non-finite grad_norm (nan)", "values": {}}) + "\n")
    assert figures.divergence(read_run(guarded).phase_logs()) == {
        "step": 7, "key": "guard nan", "value": "non-finite grad_norm (nan)"}
    stable = read_run(_two_phase_run(tmp_path / "s", nan_at=None))
    fig2 = figures.training_dynamics_figure([("stable", stable)])
    assert not [ln for ax in fig2.axes for ln in ax.lines if ln.get_marker() == "X"]
    _png_ok(figures.plot_training_dynamics([("a", run), ("b", stable)], tmp_path / "dyn.png"))


def test_seeds_of_one_label_are_drawn_under_their_mean(tmp_path):
    runs = []
    for seed, f1 in ((1, [0.2, 0.4]), (2, [0.4, 0.8])):
        rows = [train_row(s, **{"answer/accuracy": 0.5, "steps/match_f1": v}) for s, v in zip((1, 2), f1, strict=True)]
        runs.append(("CPR", read_run(write_run(tmp_path / f"cpr-s{seed}", phases={"cpr": {"steps": 2, "log": rows}}))))
    fig = figures.training_dynamics_figure(runs)
    ax_f1 = fig.axes[0]
    mean = [ln for ln in ax_f1.lines if ln.get_label() == "CPR (training batch, mean of 2)"]
    assert len(mean) == 1 and list(mean[0].get_xdata()) == [1, 2]
    assert list(mean[0].get_ydata()) == pytest.approx([0.3, 0.6])
    thin = [ln for ln in ax_f1.lines if ln.get_linewidth() < 1 and not ln.get_label().startswith("CPR")]
    assert sorted(list(ln.get_ydata()) for ln in thin) == [pytest.approx([0.2, 0.4]), pytest.approx([0.4, 0.8])]


def _run_with_data(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    from cpr.data import load_records

    records = load_records("tabmwp", SAMPLES / "tabmwp", limit=12)
    difficulty = {r.id: r.difficulty for r in records}
    ids = [r.id for r in records]
    rows = [scored(1, 1.0, True, 1.0, rid=ids[0]), scored(1, 0.0, False, 0.0, rid=ids[1]),
            scored(1, 0.5, True, 0.5, rid=ids[1], fn="step_f1"),  # another function: not counted twice
            scored(2, 0.2, False, 0.2, rid=ids[2]), scored(2, 0.4, False, 0.4, rid=ids[3]),
            scored(2, 0.4, False, 0.4, rid=ids[4])]
    folder = write_run(tmp_path / "run", phases={"cpr": {"steps": 2, "log": [train_row(1), train_row(2)], "scored": rows}})
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["model"] = {"name_or_path": "models/unused"}
    config["data"] = {"train": [{"source": "tabmwp", "path": str(SAMPLES / "tabmwp"), "limit": 12}],
                      "validation_size": 2, "test_size": 2}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder, difficulty


def test_bucket_mix_from_scored_completion_ids(tmp_path):
    folder, difficulty = _run_with_data(tmp_path)
    run = read_run(folder)
    assert figures.difficulty_by_id(run) == difficulty
    ids = [json.loads(x)["id"] for x in (folder / "cpr" / "scored_completions.jsonl").read_text().splitlines()]
    mix = figures.bucket_mix_from_completions(run, difficulty)
    assert [m["global_step"] for m in mix] == [1, 2]
    assert mix[0]["counts"] == dict(Counter(difficulty[i] for i in ids[:2]))
    assert mix[1]["counts"] == dict(Counter(difficulty[i] for i in ids[3:]))
    assert sum(mix[1]["shares"].values()) == pytest.approx(1.0)
    with pytest.raises(InputError, match=r"scored completion of record '.*' \(step 1\): no such record") as e:
        figures.bucket_mix_from_completions(run, {k: v for k, v in difficulty.items() if k != ids[0]})
    assert e.value.record_id == ids[0]


def test_bucket_mix_from_checkpoints(tmp_path):
    folder = _two_phase_run(tmp_path / "r")
    for step, mix in ((2, {"easy": 1.0, "medium": 0.0, "hard": 0.0}), (3, {"easy": 0.5, "medium": 0.5, "hard": 0.0})):
        path = folder / "cpr" / f"checkpoint-{step}" / "trainer_state.json"
        path.parent.mkdir(parents=True)
        state = {"attributes": {"curriculum_state": {"position": {"bucket_mix": mix}}}}
        path.write_text(json.dumps({"stateful_callbacks": {"CurriculumStateCallback": state}}))
    mix = figures.bucket_mix_from_checkpoints(read_run(folder))
    assert [(m["global_step"], m["shares"]["easy"]) for m in mix] == [(6, 1.0), (7, 0.5)]
    _png_ok(figures.plot_bucket_mix(mix, tmp_path / "mix.png", source="checkpoints"))


def test_run_figures_write_every_png(tmp_path):
    folder, difficulty = _run_with_data(tmp_path)
    run = read_run(folder)
    mix, source = figures.bucket_mix(run)  # scored completions first, else the checkpoints
    assert source == "scored completions" and mix == figures.bucket_mix_from_completions(run, difficulty)
    paths = [figures.plot_reward_components(run, tmp_path / "figs" / "reward.png"),
             figures.plot_kl(run, tmp_path / "figs" / "kl.png", kl_limit=2.0),
             figures.plot_f1_vs_accuracy(run, tmp_path / "figs" / "f1.png"),
             figures.plot_hack_monitors(run, tmp_path / "figs" / "hack.png"),
             figures.plot_bucket_mix(mix, tmp_path / "figs" / "mix.png", source=source)]
    for path in paths:
        _png_ok(path)
    unscored = write_run(tmp_path / "r", phases={"answer_only": {"steps": 1, "log": [train_row(1)]}})
    assert figures.bucket_mix(read_run(unscored)) == ([], "checkpoints' curriculum state")
    assert figures.folder_kind(folder) == "run"
    with pytest.raises(InputError, match="neither a run folder"):
        figures.folder_kind(tmp_path / "figs")


def test_kl_limit_is_the_runs_guard_limit(tmp_path):
    folder = _two_phase_run(tmp_path / "r")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert figures.kl_guard_limit(read_run(folder)) == 10.0  # no guards section: the guard's default
    for guards, limit in (({"kl": {"limit": 7.5}}, 7.5), ({"kl": {"enabled": False, "limit": 7.5}}, None),
                          ({"enabled": False}, None)):
        (folder / "config.yaml").write_text(yaml.safe_dump({**config, "guards": guards}))
        assert figures.kl_guard_limit(read_run(folder)) == limit
    (folder / "config.yaml").unlink()
    assert figures.kl_guard_limit(read_run(folder)) is None


def _drawn(monkeypatch):
    """The figures the plot functions save, in order (their axes hold what was drawn)."""
    saved = []
    real = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path, dpi=120: (saved.append(fig), real(fig, path, dpi))[1])
    return saved


def test_a_run_with_beta_0_says_no_kl_in_words(tmp_path, monkeypatch):
    """TRL logs no KL with beta 0: the KL panel says so, instead of an empty frame (or "no KL logged" when the
    run's config does not give beta 0)."""
    saved = _drawn(monkeypatch)
    rows = [{k: v for k, v in train_row(s).items() if k != "kl"} for s in (1, 2)]
    folder = write_run(tmp_path / "r", phases={"cpr": {"steps": 2, "log": rows}})
    config = yaml.safe_load((folder / "config.yaml").read_text())
    for effective, text in (({"cpr": {"beta": 0.0}}, "beta 0: no KL (TRL logs the KL only when training.beta > 0)"),
                            ({"cpr": {"beta": 0.04}}, "no KL logged"), (None, "no KL logged")):
        (folder / "config.yaml").write_text(yaml.safe_dump({**config, "training_effective": effective}))
        assert figures.kl_off(read_run(folder)) is (text.startswith("beta"))
        _png_ok(figures.plot_kl(read_run(folder), tmp_path / "kl.png", kl_limit=2.0))
        ax = saved[-1].axes[0]
        assert [t.get_text() for t in ax.texts] == [text] and not ax.lines  # nor a limit line over nothing


def test_a_hack_monitor_bound_far_above_the_values_does_not_flatten_them(tmp_path, monkeypatch):
    """steps/count around 3 to 4 against its bound 30: the panel spans the values and names the bound in the
    legend; a rate near its bound keeps the dashed line."""
    assert figures.bound_on_scale([3.0, 4.0], 30.0) is False and figures.bound_on_scale([0.2, 0.3], 0.25) is True
    assert figures.bound_on_scale([0.1], 0.2) is True and figures.bound_on_scale([0.1], 0.21) is False
    assert figures.bound_on_scale([], 30.0) is True
    saved = _drawn(monkeypatch)
    rows = [train_row(s, **{"steps/count": c, "hacking/duplicate_rate": 0.2}) for s, c in ((1, 3.0), (2, 4.0), (3, 3.5))]
    folder = write_run(tmp_path / "r", phases={"cpr": {"steps": 3, "log": rows}})
    _png_ok(figures.plot_hack_monitors(read_run(folder), tmp_path / "hack.png"))
    axes = {ax.get_title(): ax for ax in saved[-1].axes}
    steps, duplicates = axes["steps/count"], axes["hacking/duplicate_rate"]
    assert steps.get_ylim()[1] < 5.0  # the values' range, not up to 30
    assert [t.get_text() for t in steps.get_legend().get_texts()] == ["training batch", "bound 30 (above the axis)"]
    assert [t.get_text() for t in duplicates.get_legend().get_texts()] == ["training batch", "bound 0.25"]
    assert duplicates.get_ylim()[1] > 0.25


def test_plot_table_skips_missing_values(tmp_path):
    table = {"name": "t", "split": "test",
             "columns": [{"title": "Acc", "key": "accuracy", "decimals": 2}, {"title": "KL", "key": "kl_max", "decimals": 3}],
             "rows": [{"label": "a", "accuracy": 50.0, "kl_max": None}, {"label": "b", "accuracy": 25.0, "kl_max": 0.3}]}
    _png_ok(figures.plot_table(table, tmp_path / "t.png"))


def _scores(f1: float, acc: float, sf1: float, sacc: float) -> dict:
    return {"greedy": {"match_f1": f1, "accuracy": acc}, "sampled": {"match_f1": sf1, "accuracy": sacc}}


def test_learning_curves_average_seeds_point_by_point_and_start_at_the_warm_start(tmp_path):
    diagnosis = {
        "warm_start|val0x9": _scores(0.5, 50.0, 0.4, 40.0),
        # two seeds of 'cpr', 4 steps of 16 completions, checkpoints at steps 2 and 4
        "cpr|seed1|val0x9|": {**_scores(0.6, 60.0, 0.5, 50.0), "completions": 64,
                              "curve": {"2": _scores(0.52, 52.0, 0.42, 42.0), "4": _scores(0.6, 60.0, 0.5, 50.0)}},
        "cpr|seed2|val0x9|": {**_scores(0.7, 70.0, 0.6, 60.0), "completions": 64,
                              "curve": {"4": _scores(0.7, 70.0, 0.6, 60.0), "2": _scores(0.56, 54.0, 0.44, 44.0)}},
        "no_curve|seed1|val0x9|": _scores(0.1, 10.0, 0.1, 10.0),
    }
    curves = figures.learning_curves(diagnosis)
    assert list(curves) == ["cpr (val0x9, 2 seeds)"]
    points = curves["cpr (val0x9, 2 seeds)"]
    assert [p["completions"] for p in points] == [0.0, 32.0, 64.0]
    assert points[0]["greedy_match_f1"] == 0.5 and points[0]["sampled_accuracy"] == 40.0
    assert points[1]["greedy_match_f1"] == pytest.approx(0.54)  # (0.52 + 0.56) / 2
    assert points[1]["greedy_accuracy"] == pytest.approx(53.0) and points[1]["sampled_match_f1"] == pytest.approx(0.43)
    assert points[2]["greedy_match_f1"] == pytest.approx(0.65) and points[2]["seeds"] == 2
    _png_ok(figures.plot_learning_curves(curves, tmp_path / "curves.png"))


def test_learning_curves_refuse_a_curve_without_completions_or_warm_start():
    row = {**_scores(0.6, 60.0, 0.5, 50.0), "curve": {"2": _scores(0.6, 60.0, 0.5, 50.0)}}
    with pytest.raises(InputError, match="no 'completions'"):
        figures.learning_curves({"warm_start|val0x9": _scores(0.5, 50.0, 0.4, 40.0), "cpr|seed1|val0x9|": row})
    with pytest.raises(InputError, match="no warm start"):
        figures.learning_curves({"cpr|seed1|val0x9|": {**row, "completions": 32}})
