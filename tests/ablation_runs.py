"""Helpers of the ablation tests: handwritten run folders in the layout of cpr.training.experiment.

A run folder written here holds exactly what the ablation reads: ``config.yaml`` (the resolved
config: phases and the cpr weights), ``<phase>/log.jsonl`` (trainer log rows),
``<phase>/scored_completions.jsonl``, ``<phase>/eval_history.jsonl``, ``<phase>/phase_done.json``,
``summary.json`` and the evaluation ``metrics.json`` of a split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from conftest import tiny_run_config

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def overall(accuracy: float, match_f1: float, precision: float, recall: float, steps: float = 2.0,
            lis: float = 1.0, ordered_f1: float | None = None, n: int = 4) -> dict[str, Any]:
    return {"n": n, "accuracy": accuracy, "match_f1": match_f1, "precision": precision, "recall": recall,
            "steps": steps, "lis": lis, "ordered_f1": match_f1 if ordered_f1 is None else ordered_f1}


def write_run(
    folder: Path,
    *,
    phases: dict[str, dict[str, Any]],
    finished: bool = True,
    weights: tuple[float, float] | None = None,
    metrics: dict[str, dict[str, Any]] | None = None,
    kind: str = "grpo",
    diverged: dict[str, Any] | None = None,
    evaluation: dict[str, Any] | None = None,
) -> Path:
    """A run folder. ``phases``: name -> {"log": rows, "scored": rows, "eval_history": rows,
    "guard_events": rows, "steps": n}; ``metrics``: split ("test" / "validation") -> overall summary;
    ``diverged``: the summary's ``diverged`` entry of a run a guard stopped (status ``diverged``);
    ``evaluation``: the config's evaluation section."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {name: {"name": name} for name in phases}
    if weights is not None:
        settings.setdefault("cpr", {"name": "cpr"})["reward_params"] = {
            "cpr": {"answer_weight": weights[0], "step_weight": weights[1], "wrong_answer_scale": 0.3}
        }
    config = {"run_name": folder.name, "output_dir": str(folder), "phases": list(phases), "phase_settings": settings}
    if evaluation is not None:
        config["evaluation"] = evaluation
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    for name, p in phases.items():
        write_jsonl(folder / name / "log.jsonl", p.get("log", []))
        if "scored" in p:
            write_jsonl(folder / name / "scored_completions.jsonl", p["scored"])
        if "eval_history" in p:
            write_jsonl(folder / name / "eval_history.jsonl", p["eval_history"])
        if "guard_events" in p:
            write_jsonl(folder / name / "guard_events.jsonl", p["guard_events"])
        if finished and p.get("steps") is not None:
            (folder / name / "phase_done.json").write_text(json.dumps({"phase": name, "steps": p["steps"]}))
    for split, summary in (metrics or {}).items():
        sub = "final_eval" if split == "test" else "final_eval/validation"
        path = folder / sub / "crystal" / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"benchmark": "crystal", "overall": summary, "groups": {}}), encoding="utf-8")
    if finished or diverged:
        (folder / "summary.json").write_text(json.dumps({
            "run_name": folder.name, "kind": kind, "status": "diverged" if diverged else "finished",
            "phases": [{"phase": n} for n in phases], "diverged": diverged,
            "final_adapter": str(folder / list(phases)[-1] / "adapter") if phases and not diverged else None,
        }), encoding="utf-8")
    return folder


def train_row(step: int, **values: Any) -> dict[str, Any]:
    """A training log row as JsonlLogCallback writes it (loss, grad_norm, reward, kl, ...)."""
    row = {"step": step, "loss": 0.1, "grad_norm": 1.0, "reward": 1.0, "reward_std": 0.5, "kl": 0.01}
    row.update(values)
    return row


def scored(step: int, reward: float, correct: bool | None, f1: float, fn: str = "cpr", rid: str = "16629") -> dict[str, Any]:
    return {"step": step, "id": rid, "reward_function": fn, "reward": reward, "correct": correct, "match_f1": f1,
            "precision": f1, "recall": f1, "lis": 1.0, "n_pred": 2, "format": "json"}


def base_config(tmp: Path) -> Path:
    """A minimal two-phase experiment config on the bundled TabMWP samples."""
    path = tmp / "base.yaml"
    path.write_text(yaml.safe_dump(tiny_run_config(
        "base", tmp / "unused", limit=12,
        warm_start={"enabled": True, "max_steps": 2, "per_device_train_batch_size": 4},
        training={"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16},
        phases=["answer_only", "cpr"],
        phase_settings={
            "answer_only": {"training": {"max_steps": 4, "learning_rate": 1.0e-4}},
            "cpr": {"curriculum": {"schedule": "staged", "stage_fractions": [0.5, 0.75]},
                    "training": {"max_steps": 4, "learning_rate": 5.0e-5}},
        },
        evaluation={"max_new_tokens": 16, "batch_size": 4},
    )), encoding="utf-8")
    return path
