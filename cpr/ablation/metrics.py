"""The ablation tables' numbers from a run's training logs (docs/method.md section 7).

Inputs: rows of ``<phase>/scored_completions.jsonl`` (one per completion a reward function scored:
``reward``, ``correct``, ``match_f1``, ...) and training rows of ``<phase>/log.jsonl`` (``loss``,
``grad_norm``, ``reward``, ``kl``, ``rewards/<name>/mean``, ...; non-finite values logged as ``"nan"``,
``"inf"``, ``"-inf"``). A statistic undefined on its rows is ``None`` with the reason in words, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cpr.errors import InputError

__all__ = ["as_number", "discrimination", "first_nonfinite", "kl_max", "reward_f1_correlation", "stability"]

#: Log keys whose NaN / infinite value marks a diverged run (plus every key starting ``rewards/``).
NONFINITE_KEYS = ("loss", "grad_norm", "kl", "reward", "reward_std")


def as_number(value: Any) -> float | None:
    """A logged value as a float (``"nan"``, ``"inf"``, ``"-inf"`` included); ``None`` for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = value.strip().lower() if isinstance(value, str) else None
    return float(text) if text in ("nan", "inf", "-inf", "infinity", "-infinity") else None


def _finite(row: Mapping[str, Any], key: str) -> float | None:
    v = as_number(row.get(key))
    return v if v is not None and math.isfinite(v) else None


def _values(rows: Sequence[Mapping[str, Any]], keys: tuple[str, ...]) -> list[list[float]]:
    """Each row's ``keys`` as finite floats; InputError naming the row and key otherwise."""
    out = []
    for i, row in enumerate(rows):
        if (key := next((k for k in keys if k not in row), None)) is not None:
            raise InputError(f"scored completion row {i} has no {key!r} (keys: {sorted(row)})", field=key)
        if None in (values := [_finite(row, k) for k in keys]):
            raise InputError(f"scored completion row {i} has " + ", ".join(f"{k} {row[k]!r}" for k in keys),
                             field=keys[0])
        out.append(values)
    return out


def discrimination(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean reward of the completions with a correct answer minus that of those with a wrong one: ``{"value",
    "mean_correct", "mean_wrong", "n_correct", "n_wrong", "reason"}``; ``value`` is ``None`` (``reason`` says
    why) when a class is empty. Raises ``InputError`` for a row without ``reward`` / ``correct``, a
    ``correct`` that is not a boolean (the ``step_f1`` reward's rows carry ``None``), or a non-finite
    reward."""
    for i, row in enumerate(rows):
        if not isinstance(row.get("correct"), bool):
            what = (f"has no 'correct' (keys: {sorted(row)})" if "correct" not in row else
                    f"({row.get('reward_function')!r}) has correct={row['correct']!r}, not true/false")
            raise InputError(f"scored completion row {i} {what}", field="correct")
    rewards = [r[0] for r in _values(rows, ("reward",))]
    correct = [r for r, row in zip(rewards, rows, strict=True) if row["correct"]]
    wrong = [r for r, row in zip(rewards, rows, strict=True) if not row["correct"]]
    mean_c = sum(correct) / len(correct) if correct else None
    mean_w = sum(wrong) / len(wrong) if wrong else None
    reason = ("no scored completions" if not rows else "no completion with a correct answer" if not correct
              else "no completion with a wrong answer" if not wrong else None)
    return {"value": None if reason else mean_c - mean_w, "mean_correct": mean_c, "mean_wrong": mean_w,
            "n_correct": len(correct), "n_wrong": len(wrong), "reason": reason}


def reward_f1_correlation(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pearson correlation of each completion's reward with its step Match F1 (``scipy.stats.pearsonr``):
    ``{"r", "p_value", "n", "reason"}``; ``r`` and ``p_value`` are ``None`` (with ``reason``) for fewer than
    two completions or constant rewards or F1 values. Raises InputError as :func:`discrimination`."""
    pairs = _values(rows, ("reward", "match_f1"))
    rewards, f1s = [p[0] for p in pairs], [p[1] for p in pairs]
    reason = None
    if len(pairs) < 2:
        reason = f"{len(pairs)} scored completion(s): a correlation needs at least 2"
    elif min(rewards) == max(rewards):
        reason = f"every reward equals {rewards[0]:g}: the correlation is undefined"
    elif min(f1s) == max(f1s):
        reason = f"every Match F1 equals {f1s[0]:g}: the correlation is undefined"
    if reason is not None:
        return {"r": None, "p_value": None, "n": len(pairs), "reason": reason}
    from scipy.stats import pearsonr

    result = pearsonr(rewards, f1s)
    return {"r": float(result.statistic), "p_value": float(result.pvalue), "n": len(pairs), "reason": None}


def kl_max(train_rows: Iterable[Mapping[str, Any]], *, step_key: str = "step") -> dict[str, Any]:
    """The largest finite logged ``kl`` and its step: ``{"value", "step", "n"}`` (``n``: finite KL values)."""
    kls = [(v, row.get(step_key)) for row in train_rows if (v := _finite(row, "kl")) is not None]
    best = max(kls, key=lambda x: x[0], default=(None, None))
    return {"value": best[0], "step": best[1], "n": len(kls)}


def first_nonfinite(train_rows: Iterable[Mapping[str, Any]], *, step_key: str = "step") -> dict[str, Any] | None:
    """``{"step", "key", "value"}`` of the first NaN / infinite value of :data:`NONFINITE_KEYS` or a
    ``rewards/*`` key in the training rows, or ``None``."""
    for row in train_rows:
        for key, raw in row.items():
            v = as_number(raw)
            if (key in NONFINITE_KEYS or key.startswith("rewards/")) and v is not None and not math.isfinite(v):
                return {"step": row.get(step_key), "key": key, "value": str(raw)}
    return None


def stability(train_rows: Sequence[Mapping[str, Any]], kl_limit: float | None, *, step_key: str = "step",
              guard_events: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The stability flag: unstable when a logged loss, grad norm, KL or reward is NaN or infinite, a logged
    KL exceeds ``kl_limit`` (a project choice; ``None``: no limit), or a divergence guard recorded a ``nan``
    or ``kl`` event (a NaN it skipped or stopped at may never reach the log; ``zero_std`` counts not). Returns
    ``{"stable", "reason", "nonfinite", "kl_over": {"step", "value"} | None, "guard"}``; ``reason`` names the
    first non-finite value, the first KL over the limit and / or the first guard event."""
    bad = first_nonfinite(train_rows, step_key=step_key)
    over = next(({"step": r.get(step_key), "value": v} for r in train_rows
                 if kl_limit is not None and (v := _finite(r, "kl")) is not None and v > kl_limit), None)
    guard = next((dict(e) for e in guard_events if e.get("condition") in ("nan", "kl")), None)
    reasons = [f"{bad['key']} = {bad['value']} at step {bad['step']}"] if bad else []
    if over is not None:
        reasons.append(f"KL {over['value']:.3g} > {kl_limit:g} at step {over['step']}")
    if guard is not None:
        reasons.append(f"guard {guard.get('condition')} ({guard.get('action')}) at step "
                       f"{guard.get(step_key, guard.get('step'))}: {guard.get('reason')}")
    return {"stable": not reasons, "reason": "; ".join(reasons) or None, "nonfinite": bad, "kl_over": over,
            "guard": guard}
