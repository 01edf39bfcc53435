"""The reward-weight ablation end to end on the tiny Qwen2.5-VL (CPU): a warm-start run, two weight
pairs starting from its adapter, two GRPO steps each, validation scores (each run's own final
evaluation), the table from the real logs; --table-only, reruns, --only with --resume.

The warm start (60 supervised steps on 4 records) makes the tiny model answer some of its
training prompts right at temperature 1, so the scored completions hold both correct and wrong
answers and every column of the table is defined. The expected numbers are recomputed here from
the run folders' files with plain Python / numpy, independently of cpr.ablation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from ablation_runs import write_jsonl
from conftest import tiny_run_config

from cpr.ablation.sweep import load_ablation, main, run_ablation

PAIRS = [(0.8, 0.2), (0.5, 0.5)]


@pytest.fixture(scope="module")
def ablation(tmp_path_factory, one_thread_module):
    tmp = tmp_path_factory.mktemp("weights")
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_run_config(
        "e2e", tmp / "unused", lora_r=16,
        warm_start={"enabled": True, "max_steps": 60, "learning_rate": 5.0e-3, "per_device_train_batch_size": 4},
        training={"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 96,
                  "temperature": 1.0, "logging_steps": 1, "save_steps": 2, "beta": 0.04},
        phases=["answer_only", "cpr"],
        phase_settings={"answer_only": {"training": {"max_steps": 2}},
                        "cpr": {"curriculum": {"schedule": "none"},
                                "training": {"max_steps": 2, "learning_rate": 5.0e-5}}},
        evaluation={"max_new_tokens": 96, "batch_size": 4},
    )))
    config = tmp / "ablation.yaml"
    weights = [{"name": f"aw{a:.2f}_sw{s:.2f}", "label": f"{a:.2f}/{s:.2f}",
                "set": {"phase_settings.cpr.init_adapter": "@warm_start",
                        "phase_settings.cpr.reward_params.cpr.answer_weight": a,
                        "phase_settings.cpr.reward_params.cpr.step_weight": s}} for a, s in PAIRS]
    config.write_text(yaml.safe_dump({
        "kind": "weights", "name": "e2e", "base_config": str(base), "output_dir": str(tmp / "abl"),
        "set": {"phases": ["cpr"], "warm_start.enabled": False, "evaluation.final_splits": ["validation"]},
        "table": {"split": "validation", "kl_limit": 2.0},
        "runs": [{"name": "warm_start", "set": {"phases": [], "warm_start.enabled": True}}, *weights],
    }))
    cfg = load_ablation(config)
    result = run_ablation(cfg)
    return cfg, result, config


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _expected(folder: Path) -> dict:
    scored = [r for r in _rows(folder / "cpr" / "scored_completions.jsonl") if r["reward_function"] == "cpr"]
    right = [r["reward"] for r in scored if r["correct"]]
    wrong = [r["reward"] for r in scored if not r["correct"]]
    log = [r for r in _rows(folder / "cpr" / "log.jsonl") if "reward" in r]
    metrics = json.loads((folder / "final_eval" / "validation" / "crystal" / "metrics.json").read_text())["overall"]
    return {
        "n_right": len(right), "n_wrong": len(wrong), "n": len(scored),
        "discrimination": sum(right) / len(right) - sum(wrong) / len(wrong) if right and wrong else None,
        "r_f1": float(np.corrcoef([r["reward"] for r in scored], [r["match_f1"] for r in scored])[0, 1]),
        "kl_max": max(r["kl"] for r in log),
        "metrics": metrics,
    }


@pytest.mark.slow
def test_weights_ablation_fills_every_column_from_the_logs(ablation):
    cfg, result, _ = ablation
    out = Path(cfg.output_dir)
    assert result["ran"] == ["warm_start", "aw0.80_sw0.20", "aw0.50_sw0.50"]
    table = json.loads((out / "ablation_weights.json").read_text())
    warm, *rows = table["rows"]  # the warm start's own row: scored, no training logs
    assert warm["evaluated"] and warm["n_eval"] == 2 and warm["n_scored"] == 0 and warm["stable"] is None
    warm_adapter = str(out / "warm_start" / "warm_start" / "adapter")
    for (a, s), row in zip(PAIRS, rows, strict=True):
        folder = out / row["name"]
        exp = _expected(folder)
        assert exp["n_right"] and exp["n_wrong"], "the warm start should give correct and wrong answers"
        assert row["status"] == "finished" and row["evaluated"] and row["n_eval"] == 2
        assert (row["accuracy"], row["match_f1"], row["recall"]) == (
            exp["metrics"]["accuracy"], exp["metrics"]["match_f1"], exp["metrics"]["recall"])
        assert row["n_scored"] == exp["n"] == 2 * 8  # two steps of 2 prompts x 4 generations
        assert row["discrimination"] == pytest.approx(exp["discrimination"], abs=1e-9)
        assert row["r_f1"] == pytest.approx(exp["r_f1"], abs=1e-9)
        assert row["kl_max"] == pytest.approx(exp["kl_max"]) and row["stable"] is True
        # the weights reached the reward: c * (a + s F) + (1 - c) * 0.3 * s F for every scored completion
        for r in _rows(folder / "cpr" / "scored_completions.jsonl"):
            c, f = float(r["correct"]), r["match_f1"]
            assert r["reward"] == pytest.approx(c * (a + s * f) + (1 - c) * 0.3 * s * f, abs=1e-6)
        # every run started from the warm-start run's adapter
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["phases"][0]["init_adapter"] == warm_adapter
        # the run's own final evaluation: validation only (evaluation.final_splits)
        assert summary["final_eval_validation"]["crystal"] == exp["metrics"] and "final_eval" not in summary
        assert not (folder / "final_eval" / "crystal").exists()
    md = (out / "ablation_weights.md").read_text()
    assert "| 0.80/0.20 | this run (finished) |" in md and "| 0.80/0.20 | paper, Table 6 |" in md
    assert (out / "ablation_weights.png").stat().st_size > 5_000


@pytest.mark.slow
def test_rebuilt_table_follows_an_edited_log_and_reruns_skip(ablation, capsys):
    cfg, _, config = ablation
    out = Path(cfg.output_dir)
    path = out / "aw0.80_sw0.20" / "cpr" / "scored_completions.jsonl"
    rows = _rows(path)
    i = next(k for k, r in enumerate(rows) if r["correct"])
    rows[i]["reward"] += 0.5  # one correct completion earns 0.5 more
    write_jsonl(path, rows)
    before = json.loads((out / "ablation_weights.json").read_text())["rows"][1]
    assert main(["--config", str(config), "--table-only"]) == 0
    after = json.loads((out / "ablation_weights.json").read_text())["rows"][1]
    n_right = sum(1 for r in rows if r["correct"])
    assert after["discrimination"] == pytest.approx(before["discrimination"] + 0.5 / n_right, abs=1e-9)
    assert after["r_f1"] != before["r_f1"]
    # a second full run trains nothing and scores nothing again
    result = run_ablation(cfg)
    assert result["ran"] == [] and result["skipped"] == ["warm_start", "aw0.80_sw0.20", "aw0.50_sw0.50"]
    # a run killed during its final evaluation: --only NAME needs --resume, which skips its finished
    # phase and scores it again into the same folder (greedy decoding: the same numbers)
    folder = out / "aw0.50_sw0.50"
    scores = folder / "final_eval" / "validation"
    first = json.loads((scores / "crystal" / "metrics.json").read_text())["overall"]
    shutil.rmtree(scores)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    assert main(["--config", str(config), "--only", "aw0.50_sw0.50"]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    assert main(["--config", str(config), "--only", "aw0.50_sw0.50", "--resume"]) == 0
    assert '"ran": [\n  "aw0.50_sw0.50"\n ]' in capsys.readouterr().out
    assert json.loads((scores / "crystal" / "metrics.json").read_text())["overall"] == first
    assert json.loads((folder / "summary.json").read_text())["status"] == "finished"
