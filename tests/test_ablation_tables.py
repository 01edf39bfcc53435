"""Ablation tables (--table-only) from handwritten run folders: every column from the logs, computed by hand.

The runs are written in the runner's layout (tests/ablation_runs.py); the expected Discrimination,
r(F1), KL max and stability flag are worked out by hand below. Editing a log row and rebuilding
changes the table accordingly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from ablation_runs import base_config, overall, scored, train_row, write_jsonl, write_run

from cpr.ablation.run_folder import read_run
from cpr.ablation.sweep import main
from cpr.errors import InputError

PAIRS = [[0.8, 0.2], [0.65, 0.35], [0.5, 0.5], [0.35, 0.65]]


def _ablation(tmp_path: Path, **data) -> Path:
    path = tmp_path / "abl.yaml"
    path.write_text(yaml.safe_dump({"base_config": str(base_config(tmp_path)), "output_dir": str(tmp_path / "abl"),
                                    **data}))
    return path


def _weights_ablation(tmp_path: Path) -> Path:
    runs = [{"name": f"aw{a:.2f}_sw{s:.2f}", "label": f"{a:.2f}/{s:.2f}",
             "set": {"phase_settings.cpr.reward_params.cpr.answer_weight": a,
                     "phase_settings.cpr.reward_params.cpr.step_weight": s}} for a, s in PAIRS]
    return _ablation(tmp_path, kind="weights", set={"phases": ["cpr"]}, table={"split": "validation", "kl_limit": 2.0},
                     runs=runs)


def build(path: Path) -> dict:
    """``--table-only``: the table JSON, with its markdown under ``"md"``."""
    assert main(["--config", str(path), "--table-only"]) == 0
    data = yaml.safe_load(path.read_text())
    stem = Path(data["output_dir"]) / f"ablation_{data['kind']}"
    return {**json.loads(stem.with_suffix(".json").read_text()), "md": stem.with_suffix(".md").read_text()}


# Run 0.80/0.20: four cpr completions (rewards 1.0, 0.8 correct; 0.12, 0.0 wrong; F1 1.0, 0.6, 0.4, 0.0)
# plus one step_f1 row that the table must ignore; KL 0.0, 0.35, 1.2, 0.5 over four steps.
def _run_a(folder: Path) -> Path:
    return write_run(
        folder,
        weights=(0.8, 0.2),
        phases={"cpr": {
            "steps": 4,
            "log": [train_row(1, kl=0.0), train_row(2, kl=0.35),
                    {"step": 2, "eval_crystal/accuracy": 0.0, "epoch": 1.0},
                    train_row(3, kl=1.2), train_row(4, kl=0.5),
                    {"step": 4, "train_runtime": 3.0, "train_loss": 0.1}],
            "scored": [scored(0, 1.0, True, 1.0), scored(0, 0.8, True, 0.6), scored(1, 0.12, False, 0.4),
                       scored(1, 0.0, False, 0.0), scored(1, 0.3, None, 0.3, fn="step_f1")],
        }},
        metrics={"validation": overall(75.0, 0.5, 0.6, 0.45), "test": overall(10.0, 0.1, 0.1, 0.1)},
    )


# Run 0.65/0.35: a NaN grad norm at step 3; both completions correct; not yet scored on validation.
def _run_b(folder: Path) -> Path:
    return write_run(
        folder, weights=(0.65, 0.35),
        phases={"cpr": {"steps": 3,
                        "log": [train_row(1, kl=0.1), train_row(2, kl=0.2), train_row(3, grad_norm="nan", kl=0.3)],
                        "scored": [scored(0, 1.0, True, 1.0), scored(1, 0.5, True, 0.2)]}},
    )


# Run 0.50/0.50: unfinished (no summary.json); its KL 2.5 at step 2 exceeds the limit.
def _run_c(folder: Path) -> Path:
    return write_run(
        folder, weights=(0.5, 0.5), finished=False,
        phases={"cpr": {"log": [train_row(1, kl=0.4), train_row(2, kl=2.5)],
                        "scored": [scored(0, 0.9, True, 0.8), scored(0, 0.1, False, 0.3)]}},
    )


@pytest.fixture
def weights_setup(tmp_path):
    path = _weights_ablation(tmp_path)
    _run_a(tmp_path / "abl" / "aw0.80_sw0.20")
    _run_b(tmp_path / "abl" / "aw0.65_sw0.35")
    _run_c(tmp_path / "abl" / "aw0.50_sw0.50")
    return path


def test_every_column_from_the_logs(weights_setup):
    table = build(weights_setup)
    a, b, c, d = table["rows"]
    assert [r["name"] for r in table["rows"]] == ["aw0.80_sw0.20", "aw0.65_sw0.35", "aw0.50_sw0.50", "aw0.35_sw0.65"]

    # finished, scored on validation (not test)
    assert (a["status"], a["evaluated"], a["answer_weight"], a["step_weight"]) == ("finished", True, 0.8, 0.2)
    assert (a["accuracy"], a["match_f1"], a["recall"], a["n_eval"]) == (75.0, 0.5, 0.45, 4)
    # cpr rows only: (1.0 + 0.8) / 2 - (0.12 + 0.0) / 2
    assert a["discrimination"] == pytest.approx(0.84) and a["n_scored"] == 4
    # deviations from the means 0.48 / 0.5: products sum 0.568, squares 0.7328 and 0.52
    assert a["r_f1"] == pytest.approx(0.568 / math.sqrt(0.7328 * 0.52), abs=1e-12)
    assert (a["kl_max"], a["kl_max_step"], a["stable"]) == (1.2, 3, True)
    assert a["n_logged_steps"] == 4  # the eval and closing rows are not training steps

    assert (b["status"], b["evaluated"], b["accuracy"]) == ("finished", False, None)
    assert b["discrimination"] is None
    assert b["discrimination_detail"]["reason"] == "no completion with a wrong answer"
    assert b["r_f1"] == pytest.approx(1.0)  # two points
    assert b["stable"] is False and b["stability"]["reason"] == "grad_norm = nan at step 3"
    assert b["kl_max"] == 0.3

    assert (c["status"], c["accuracy"]) == ("unfinished", None)
    assert c["discrimination"] == pytest.approx(0.8)
    assert c["stable"] is False and c["stability"]["reason"] == "KL 2.5 > 2 at step 2"

    assert d["status"] == "not started"
    assert all(d[k] is None for k in ("accuracy", "discrimination", "r_f1", "kl_max", "stable"))

    # the paper's rows are kept apart, labelled: one per started run with the weights of a paper row
    assert [p["label"] for p in table["paper"]] == ["0.80/0.20", "0.65/0.35", "0.50/0.50"]
    assert table["paper"][1]["accuracy"] == 82.70


def test_markdown_shows_status_and_paper_rows(weights_setup):
    md = build(weights_setup)["md"]
    lines = md.splitlines()
    row_a = next(ln for ln in lines if ln.startswith("| 0.80/0.20 | this run"))
    assert row_a == "| 0.80/0.20 | this run (finished) | 75.00 | 0.500 | 0.450 | 0.840 | 0.920 | 1.200 | yes | 4 | 4 |"
    assert "| 0.65/0.35 | this run (not evaluated) | - | - | - | - | 1.000 | 0.300 | no (grad_norm = nan at step 3) | - | 2 |" in md
    assert "| 0.50/0.50 | this run (unfinished) |" in md and "| 0.35/0.65 | this run (not started) |" in md
    assert "| 0.80/0.20 | paper, Table 6 | 81.79 | 0.676 | 0.553 | 0.865 | 0.338 | 1.274 | - | - | - |" in md
    assert "0.65/0.35: Discrim. undefined (no completion with a wrong answer)" in md
    assert "validation split" in md


def test_table_follows_the_logs(weights_setup):
    before = build(weights_setup)["rows"][0]
    folder = weights_setup.parent / "abl" / "aw0.80_sw0.20" / "cpr"
    rows = [json.loads(x) for x in (folder / "scored_completions.jsonl").read_text().splitlines()]
    rows[2]["reward"] = 0.4  # the wrong completion with F1 0.4 now earns 0.4
    write_jsonl(folder / "scored_completions.jsonl", rows)
    log = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines()]
    log[4]["kl"] = 1.9  # step 4
    write_jsonl(folder / "log.jsonl", log)
    after = build(weights_setup)["rows"][0]
    assert before["discrimination"] == pytest.approx(0.84)
    assert after["discrimination"] == pytest.approx(0.9 - 0.2)
    # means 0.55 / 0.5: products 0.54, squares 0.59 and 0.52
    assert after["r_f1"] == pytest.approx(0.54 / math.sqrt(0.59 * 0.52), abs=1e-12)
    assert (after["kl_max"], after["kl_max_step"]) == (1.9, 4)
    log[3]["loss"] = "nan"  # step 3
    write_jsonl(folder / "log.jsonl", log)
    assert build(weights_setup)["rows"][0]["stability"]["reason"] == "loss = nan at step 3"
    assert (weights_setup.parent / "abl" / "ablation_weights.png").stat().st_size > 5_000


def test_malformed_log_line_is_located(tmp_path, capsys):
    path = _weights_ablation(tmp_path)
    folder = _run_a(tmp_path / "abl" / "aw0.80_sw0.20")
    lines = (folder / "cpr" / "log.jsonl").read_text().splitlines()
    lines[1] = "{broken"
    (folder / "cpr" / "log.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["--config", str(path), "--table-only"]) == 2
    assert "log.jsonl:2: malformed JSON" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"log.jsonl:2: malformed JSON"):
        read_run(folder).phase_logs()


def test_resumed_logs_keep_the_latest_attempt(tmp_path):
    """A resumed run's logs are cut back to its checkpoint (the runner's rollback_logs), so the
    table reads each step once: attempt 1 logged steps 1-3 and was killed, attempt 2 resumed from
    checkpoint-1 and logged 2-4."""
    from cpr.training.logs import rollback_logs

    rows = [scored(1, 1.0, True, 1.0), scored(2, 0.0, False, 0.0), scored(3, 0.5, True, 0.5)]
    folder = write_run(tmp_path / "r", phases={"cpr": {"steps": 4, "scored": rows,
                                                       "log": [train_row(1, kl=0.1), train_row(2, kl=0.9), train_row(3, kl=5.0)]}})
    rollback_logs(folder / "cpr", 1)
    with open(folder / "cpr" / "log.jsonl", "a") as f:
        f.write("".join(json.dumps(train_row(s, kl=k)) + "\n" for s, k in ((2, 0.2), (3, 0.3), (4, 0.4))))
    with open(folder / "cpr" / "scored_completions.jsonl", "a") as f:
        f.write(json.dumps(scored(2, 0.7, True, 0.7)) + "\n")
    (logs,) = read_run(folder).phase_logs()
    assert [r["kl"] for r in logs.train] == [0.1, 0.2, 0.3, 0.4]
    assert [r["reward"] for r in logs.scored] == [1.0, 0.7]


def _strategies_ablation(tmp_path: Path, **data) -> Path:
    runs = [{"name": "base", "label": "Base", "set": {"phases": []}},
            {"name": "composite", "label": "Composite", "set": {"phases": ["composite"]}},
            {"name": "cpr_curriculum", "label": "CPR-Curriculum"}]
    return _ablation(tmp_path, kind="strategies", runs=runs, **data)


def test_strategies_table_on_the_test_split(tmp_path):
    path = _strategies_ablation(tmp_path)
    out = tmp_path / "abl"
    write_run(out / "base", phases={}, kind="base", metrics={"test": overall(25.0, 0.3, 0.4, 0.25, steps=1.5, lis=0.9,
                                                                           ordered_f1=0.28)})
    write_run(out / "composite", phases={"composite": {"steps": 3, "log": [train_row(1), train_row(2, loss="nan")]}},
              metrics={"test": overall(12.5, 0.2, 0.3, 0.15), "validation": overall(99.0, 0.9, 0.9, 0.9)})
    write_run(out / "cpr_curriculum", phases={"answer_only": {"steps": 2, "log": [train_row(1), train_row(2)]},
                                              "cpr": {"steps": 2, "log": [train_row(1), train_row(2)]}},
              metrics={"test": overall(50.0, 0.6, 0.7, 0.55, steps=3.0, lis=0.8, ordered_f1=0.56)})
    table = build(path)
    base, comp, cur = table["rows"]
    assert [c["title"] for c in table["columns"]] == ["Acc", "Match F1", "P", "R", "Steps", "LIS", "Ord. F1", "Lucky"]
    assert (base["accuracy"], base["steps"], base["lis"], base["ordered_f1"], base["stable"]) == (25.0, 1.5, 0.9, 0.28, None)
    assert comp["accuracy"] == 12.5  # the test split, not validation
    assert comp["stable"] is False and comp["stability"]["reason"] == "loss = nan at step 2"
    assert cur["stable"] is True and cur["phases"] == ["answer_only", "cpr"]
    md = table["md"]
    # a run evaluated before the lucky-guess rate existed shows "-" there
    assert "| CPR-Curriculum | this run (finished) | 50.00 | 0.600 | 0.700 | 0.550 | 3.00 | 0.800 | 0.560 | - | yes | 4 |" in md
    assert "| Qwen2.5-VL-3B base | paper, Table 4 (CRYSTAL test) | 39.85 |" in md
    assert "Discrim." not in md


def test_strategies_table_gets_the_lucky_guess_and_sampled_columns(tmp_path):
    runs = [{"name": "answer_only", "label": "Answer-Only", "set": {"phases": ["answer_only"]}},
            {"name": "cpr_curriculum", "label": "CPR-Curriculum"}]
    path = _ablation(tmp_path, kind="strategies", runs=runs, table={"paper": False})
    sampled = {"decoding": {"mode": "sampled", "temperature": 1.0, "top_p": 1.0, "samples": 4, "seed": 0}}
    # answer-only: 3 of 4 greedy answers right, 2 of them with Match F1 below 0.5 (lucky 50%)
    write_run(tmp_path / "abl" / "answer_only", phases={"answer_only": {"steps": 1, "log": [train_row(1)]}},
              evaluation=sampled, metrics={"test": {**overall(75.0, 0.3, 0.5, 0.2), "lucky_guess_rate": 50.0,
                                                    "sampled_accuracy": 56.25, "sampled_match_f1": 0.25,
                                                    "pass_at_k": 100.0}})
    write_run(tmp_path / "abl" / "cpr_curriculum", phases={"cpr": {"steps": 1, "log": [train_row(1)]}},
              evaluation=sampled, metrics={"test": {**overall(50.0, 0.6, 0.7, 0.55), "lucky_guess_rate": 0.0,
                                                    "sampled_accuracy": 43.75, "sampled_match_f1": 0.5,
                                                    "pass_at_k": 75.0}})
    table = build(path)
    assert [c["title"] for c in table["columns"]][7:] == ["Lucky", "Acc mean@4", "Match F1 mean@4", "Acc pass@4"]
    assert [r["lucky_guess_rate"] for r in table["rows"]] == [50.0, 0.0]
    md = table["md"]
    assert "| Answer-Only | this run (finished) | 75.00 | 0.300 | 0.500 | 0.200 | 2.00 | 1.000 | 0.300 | 50.00 | 56.25 | 0.250 | 100.00 | yes | 4 |" in md
    assert "Acc mean@4, Match F1 mean@4, Acc pass@4: sampled decoding" in md


def test_a_run_stopped_by_a_divergence_guard(tmp_path):
    """A guard with action stop ended the composite run at step 2: the NaN never reached log.jsonl,
    but guard_events.jsonl and summary.json (status diverged) say so."""
    path = _strategies_ablation(tmp_path)
    out = tmp_path / "abl"
    event = {"step": 2, "condition": "nan", "action": "stop", "reason": "non-finite loss (nan)", "values": {"loss": "nan"}}
    write_run(out / "composite", finished=False,
              diverged={"phase": "composite", "step": 2, "condition": "nan", "reason": "non-finite loss (nan)",
                        "checkpoint": str(out / "composite" / "composite" / "checkpoint-2")},
              phases={"composite": {"log": [train_row(1)],
                                    "guard_events": [{"step": 1, "condition": "zero_std", "action": "warn",
                                                      "reason": "no signal", "values": {}}, event]}})
    table = build(path)
    row = table["rows"][1]
    assert row["status"] == "diverged" and row["evaluated"] is False and row["accuracy"] is None
    assert row["stable"] is False
    assert row["stability"]["reason"] == "guard nan (stop) at step 2: non-finite loss (nan)"  # zero_std is no instability
    md = table["md"]
    assert "| Composite | this run (diverged: composite step 2, nan) | - |" in md


def test_seeds_give_one_run_each_and_mean_and_std_rows(tmp_path):
    path = _ablation(tmp_path, kind="strategies", seeds=[1, 2, 3], table={"split": "test"},
                     runs=[{"name": "base", "set": {"phases": []}}, {"name": "cpr", "label": "CPR", "set": {"phases": ["cpr"]}}])
    out = tmp_path / "abl"
    write_run(out / "base", phases={}, kind="base", metrics={"test": overall(30.0, 0.2, 0.2, 0.2)})
    # Match F1 0.5, 0.6 and 0.8: mean 0.6333, sample std sqrt(((-.1333)^2 + (-.0333)^2 + .1667^2) / 2) = 0.1528
    for seed, acc, f1 in ((1, 40.0, 0.5), (2, 50.0, 0.6)):
        write_run(out / f"cpr-s{seed}", phases={"cpr": {"steps": 2, "log": [train_row(1), train_row(2)]}},
                  metrics={"test": overall(acc, f1, 0.7, 0.4)})
    cpr = build(path)["rows"][1]
    assert cpr["status"] == "not started" and cpr["n_seeds"] == 2  # seed 3 has not run yet
    write_run(out / "cpr-s3", phases={"cpr": {"steps": 2, "log": [train_row(1), train_row(2)]}},
              metrics={"test": overall(60.0, 0.8, 0.7, 0.4)})
    table = build(path)
    base, cpr = table["rows"]
    assert base["label"] == "base" and base["accuracy"] == 30.0 and "accuracy_std" not in base
    assert (cpr["label"], cpr["status"], cpr["seeds"], cpr["n_seeds"]) == ("CPR", "finished", [1, 2, 3], 3)
    assert cpr["accuracy"] == pytest.approx(50.0) and cpr["accuracy_std"] == pytest.approx(10.0)
    assert cpr["match_f1"] == pytest.approx(0.63333, abs=1e-5) and cpr["match_f1_std"] == pytest.approx(0.15275, abs=1e-5)
    assert cpr["precision_std"] == pytest.approx(0.0)
    assert [r["seed"] for r in table["seed_rows"]] == [None, 1, 2, 3]
    md = table["md"]
    assert "| CPR | this run, 3 of 3 seeds (finished) | 50.00 ± 10.00 | 0.633 ± 0.153 |" in md
    assert "mean ± sample standard deviation over the seeds [1, 2, 3]" in md
    assert "| CPR | 2 | finished | 50.00 | 0.600 |" in md and "| base | - | finished | 30.00 |" in md


def test_curriculum_lead_over_the_warm_start_and_answer_only(tmp_path):
    runs = [{"name": "warm_start", "set": {"phases": []}},
            {"name": "answer_only", "label": "Answer-Only", "set": {"phases": ["answer_only"]}},
            {"name": "cpr_curriculum", "label": "CPR-Curriculum"}]
    path = _ablation(tmp_path, kind="strategies", seeds=[1, 2], table={"split": "test", "paper": False}, runs=runs)
    out = tmp_path / "abl"
    write_run(out / "warm_start", phases={}, kind="base", metrics={"test": overall(90.0, 0.3, 0.9, 0.2)})
    # Answer-Only Match F1 0.4, 0.5 (mean 0.45, std 0.0707); CPR-Curriculum 0.6, 0.7 (mean 0.65, std 0.0707)
    for name, f1s in (("answer_only", (0.4, 0.5)), ("cpr_curriculum", (0.6, 0.7))):
        for seed, f1 in zip((1, 2), f1s, strict=True):
            write_run(out / f"{name}-s{seed}", phases={"cpr": {"steps": 1, "log": [train_row(1)]}},
                      metrics={"test": overall(90.0, f1, 0.9, f1)})
    table = build(path)
    lead = table["curriculum_lead"]
    assert lead["ratio"] == pytest.approx(0.65 / 0.45) and lead["over_answer_only"] == pytest.approx(0.2)
    assert lead["over_warm_start"] == pytest.approx(0.35) and lead["two_std"] == pytest.approx(2 * 0.1 / 2 ** 0.5)
    assert ("CPR-Curriculum / Answer-Only Match F1: 1.44 (the paper's Table 5: 0.633 / 0.429 = 1.48). CPR-Curriculum's "
            "Match F1 minus the warm start's: +0.350, minus Answer-Only's: +0.200; twice the larger seed standard "
            "deviation: 0.141.") in table["md"]
