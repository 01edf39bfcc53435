"""The closing report of a run: its adapters side by side on the test split, and the bucket mix of training."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpr.data.records import DIFFICULTIES, Record
from cpr.errors import ConfigError
from cpr.training.config_sections import ExperimentConfig
from cpr.training.logs import read_log

__all__ = ["UNTRAINED", "WARM_START", "bucket_mix", "chance_accuracy", "closing_lines", "compare_stages",
           "phase_bucket_mixes", "stage_adapter"]

#: Stage names of ``evaluation.compare`` besides the phase names.
UNTRAINED, WARM_START = "untrained", "warm_start"
#: The closing table's columns: (title, metric key, decimals), in the paper's order, then the lucky-guess
#: rate and, with ``evaluation.decoding`` ``sampled``, mean@k accuracy and Match F1 and pass@k accuracy.
#: A column no row has a value for is left out.
COLUMNS = (("Acc", "accuracy", 1), ("Match F1", "match_f1", 3), ("P", "precision", 3), ("R", "recall", 3),
            ("Steps", "steps", 2), ("LIS", "lis", 3), ("Ord. F1", "ordered_f1", 3), ("Lucky", "lucky_guess_rate", 1),
            ("Acc m@k", "sampled_accuracy", 1), ("F1 m@k", "sampled_match_f1", 3), ("Acc p@k", "pass_at_k", 1))


def stage_adapter(stage: str, summary: Mapping[str, Any]) -> str | None:
    """The adapter folder of ``stage`` in a run's ``summary`` (``None`` for ``untrained``); ``ConfigError``
    (``evaluation.compare``) for a stage the run did not produce."""
    if stage == UNTRAINED:
        return None
    if stage == WARM_START and summary.get("warm_start_adapter"):
        return str(summary["warm_start_adapter"])
    for phase in summary.get("phases", []):
        if phase.get("phase") == stage and phase.get("handover_adapter"):
            return str(phase["handover_adapter"])
    raise ConfigError(f"the run has no {stage!r} adapter to compare", field="evaluation.compare")


def compare_stages(cfg: ExperimentConfig, splits: Any, summary: Mapping[str, Any], run_dir: str | Path, *,
                   templates: Any = None, model_path: str | None = None) -> list[dict[str, Any]]:
    """Score each stage of ``evaluation.compare`` on the test split (into ``final_eval/stages/<stage>/``) and
    return the table's rows, then ``final``'s: ``{"stage", "adapter", "benchmark", <overall summary>}`` per test
    benchmark (accuracy in percent, the rest in [0, 1]); ``[]`` on processes other than the main one. Raises
    ``ConfigError`` as :func:`stage_adapter`."""
    from cpr.training.evaluate import final_evaluation

    rows = []
    for stage in cfg.evaluation.compare:
        adapter = stage_adapter(stage, summary)
        scored = final_evaluation(cfg, splits, adapter=adapter, run_dir=Path(run_dir) / "final_eval" / "stages" / stage,
                                  label=stage, templates=templates, model_path=model_path, on=["test"])["test"]
        rows += [{"stage": stage, "adapter": adapter, "benchmark": b, **overall} for b, overall in scored.items()]
    if not rows:
        return []
    rows += [{"stage": "final", "adapter": summary.get("final_adapter"), "benchmark": b, **overall}
             for b, overall in (summary.get("final_eval") or {}).items()]
    return rows


def chance_accuracy(records: Sequence[Record]) -> float:
    """Expected accuracy (percent) of a uniform guess among the options; a free-form record counts 0."""
    return 100.0 * sum(1 / len(r.options) for r in records if r.options) / len(records) if records else 0.0


def bucket_mix(phase_dir: str | Path, difficulty: Mapping[str, str], steps: int, parts: int = 3) -> list[dict[str, float]]:
    """Share (percent) of each difficulty bucket among the prompts a phase trained on, in ``parts`` equal spans of
    its ``steps``; ``ConfigError`` for a scored completion of a record not in ``difficulty``."""
    rows = read_log(Path(phase_dir) / "scored_completions.jsonl")
    if not rows or steps < 1:
        return []
    fn = rows[0].get("reward_function")
    counts = [Counter() for _ in range(parts)]
    for row in rows:
        if row.get("reward_function") != fn:
            continue
        if str(row.get("id")) not in difficulty:
            raise ConfigError(f"scored completion of unknown record {row.get('id')!r}", field="scored_completions")
        part = min(parts - 1, max(0, int(row.get("step") or 1) - 1) * parts // steps)  # step: 1-based
        counts[part][difficulty[str(row["id"])]] += 1
    return [{b: 100.0 * c[b] / sum(c.values()) for b in DIFFICULTIES} for c in counts if c]  # a span can be empty


def phase_bucket_mixes(run_dir: str | Path, summary: Mapping[str, Any], train: Sequence[Record]) -> dict[str, list]:
    """``{phase: bucket_mix(...)}`` for the phases of ``summary`` that scored their completions' steps."""
    difficulty = {r.id: r.difficulty or "unknown" for r in train}
    mixes = {p["phase"]: bucket_mix(Path(run_dir) / p["phase"], difficulty, int(p.get("steps") or 0))
             for p in summary.get("phases", [])}
    return {name: mix for name, mix in mixes.items() if mix}


def closing_lines(summary: Mapping[str, Any]) -> list[str]:
    """The closing report's lines: the comparison table (when the run has one) and each phase's bucket mix."""
    lines = []
    rows = summary.get("comparison") or []
    if rows:
        width = max(len(r["stage"]) for r in rows)
        columns = [c for c in COLUMNS if any(isinstance(r.get(c[1]), (int, float)) for r in rows)]
        lines.append(f"  held-out test ({rows[0]['benchmark']}, n {rows[0].get('n', '?')}; chance accuracy "
                     f"{summary.get('chance_accuracy', float('nan')):.1f}%):")
        lines.append("    " + "stage".ljust(width) + "".join(f"  {t:>8}" for t, _, _ in columns))
        for r in rows:
            cells = "".join(f"  {r[k]:>8.{d}f}" if isinstance(r.get(k), (int, float)) else f"  {'-':>8}"
                            for _, k, d in columns)
            lines.append("    " + r["stage"].ljust(width) + cells)
        if any(key == "sampled_accuracy" for _, key, _ in columns):
            lines.append("    (greedy decoding, then m@k: mean over the k sampled completions per item of "
                         "evaluation.decoding, p@k: pass@k; Lucky: % of greedy completions right with Match F1 < 0.5)")
    for phase, mix in (summary.get("bucket_mix") or {}).items():
        spans = " -> ".join("/".join(f"{part[b]:.0f}" for b in DIFFICULTIES) for part in mix)
        lines.append(f"  phase {phase} bucket mix (% easy/medium/hard, thirds of the phase): {spans}")
    return lines
