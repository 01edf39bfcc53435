"""Numbers of the ablation tables computed from a run's training logs (paper Table 6; docs/method.md
section 7).

Every function here works on rows already read from a run folder (:mod:`cpr.ablation.run_folder`):

* rows of ``<phase>/scored_completions.jsonl``: one per completion scored by the ``cpr`` (or
  ``step_f1``) reward function, ``{"step", "id", "reward_function", "reward", "correct",
  "match_f1", ...}`` (written by :class:`cpr.training.logs.ScoredCompletionLog`);
* training rows of ``<phase>/log.jsonl``: one per logging step, ``{"step", "loss",
  "grad_norm", "reward", "kl", "rewards/<name>/mean", ...}`` (:class:`cpr.training.logs.JsonlLogCallback`,
  which writes NaN / infinite values as the strings ``"nan"`` / ``"inf"`` / ``"-inf"``).

Definitions (docs/method.md section 7):

* **Discrimination** = mean reward of the completions with a correct answer minus mean reward of
  those with a wrong one, over *every* scored completion of training (not re-estimated afterwards).
  The reward is the value of the scored reward function (``cpr``), i.e. the term the ablated
  weights change, not the weighted sum with the format reward.
* **r(F1)** = Pearson correlation of that reward with the completion's step Match F1, over the same
  completions (``scipy.stats.pearsonr``).
* **KL max** = the largest finite ``kl`` of the training log rows.
* **Stability**: a run is unstable when a logged loss, grad norm, KL or reward (``reward``,
  ``reward_std``, ``rewards/*``) is NaN or infinite, when the logged KL exceeds a configured
  limit (a project **choice**, ``table.kl_limit`` in the ablation config), or when the runner's
  divergence guards (:mod:`cpr.training.guards`) recorded a ``nan`` or ``kl`` event.

A statistic that is undefined on the given rows (no completion with a wrong answer, a constant
reward, fewer than two completions) is returned as ``None`` with the reason in words, never as 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cpr.errors import InputError

__all__ = [
    "NONFINITE_KEYS",
    "UNSTABLE_GUARD_CONDITIONS",
    "as_number",
    "discrimination",
    "first_nonfinite",
    "kl_max",
    "reward_f1_correlation",
    "stability",
]

#: Log keys whose NaN / infinite value marks a diverged run (plus every key starting ``rewards/``).
NONFINITE_KEYS: tuple[str, ...] = ("loss", "grad_norm", "kl", "reward", "reward_std")

_NONFINITE_STRINGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}


def as_number(value: Any) -> float | None:
    """A logged value as a float: numbers as they are, the strings ``"nan"`` / ``"inf"`` /
    ``"-inf"`` (how :class:`cpr.training.logs.JsonlLogCallback` writes non-finite values) as
    NaN / infinity; ``None`` for anything else (missing, booleans, other strings)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NONFINITE_STRINGS.get(value.strip().lower())
    return None


def _checked_rows(rows: Sequence[Mapping[str, Any]], need: tuple[str, ...], what: str) -> None:
    for i, row in enumerate(rows):
        for key in need:
            if key not in row:
                raise InputError(f"{what} row {i} has no {key!r} (keys: {sorted(row)})", field=key)


def discrimination(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean reward of correct-answer completions minus mean reward of wrong-answer ones.

    Args:
        rows: scored completions, each with a numeric ``reward`` and a boolean ``correct``.

    Returns:
        ``{"value", "mean_correct", "mean_wrong", "n_correct", "n_wrong", "reason"}``; ``value``
        (and the mean of an empty class) is ``None`` when either class is empty, with ``reason``
        saying which.

    Raises:
        InputError: a row without ``reward`` / ``correct``, a ``correct`` that is not a boolean
            (rows of the ``step_f1`` reward carry ``None``: they cannot give a discrimination),
            or a reward that is not a finite number.
    """
    _checked_rows(rows, ("reward", "correct"), "scored completion")
    correct: list[float] = []
    wrong: list[float] = []
    for i, row in enumerate(rows):
        c = row["correct"]
        if not isinstance(c, bool):
            raise InputError(
                f"scored completion row {i} ({row.get('reward_function')!r}) has correct={c!r}, not true/false",
                field="correct",
            )
        r = as_number(row["reward"])
        if r is None or not math.isfinite(r):
            raise InputError(f"scored completion row {i} has reward {row['reward']!r}", field="reward")
        (correct if c else wrong).append(r)
    mean_c = sum(correct) / len(correct) if correct else None
    mean_w = sum(wrong) / len(wrong) if wrong else None
    reason = None
    if not correct and not wrong:
        reason = "no scored completions"
    elif not correct:
        reason = "no completion with a correct answer"
    elif not wrong:
        reason = "no completion with a wrong answer"
    value = mean_c - mean_w if mean_c is not None and mean_w is not None else None
    return {
        "value": value,
        "mean_correct": mean_c,
        "mean_wrong": mean_w,
        "n_correct": len(correct),
        "n_wrong": len(wrong),
        "reason": reason,
    }


def reward_f1_correlation(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pearson correlation of each completion's reward with its step Match F1 (``scipy.stats.pearsonr``).

    Args:
        rows: scored completions, each with numeric ``reward`` and ``match_f1``.

    Returns:
        ``{"r", "p_value", "n", "reason"}``; ``r`` and ``p_value`` are ``None`` (with ``reason``)
        when there are fewer than two completions or the rewards or the F1 values are all equal
        (the correlation is undefined).

    Raises:
        InputError: a row without ``reward`` / ``match_f1`` or with a value that is not a finite number.
    """
    _checked_rows(rows, ("reward", "match_f1"), "scored completion")
    rewards, f1s = [], []
    for i, row in enumerate(rows):
        r, f = as_number(row["reward"]), as_number(row["match_f1"])
        if r is None or f is None or not (math.isfinite(r) and math.isfinite(f)):
            raise InputError(
                f"scored completion row {i} has reward {row['reward']!r}, match_f1 {row['match_f1']!r}",
                field="reward",
            )
        rewards.append(r)
        f1s.append(f)
    n = len(rewards)
    reason = None
    if n < 2:
        reason = f"{n} scored completion(s): a correlation needs at least 2"
    elif min(rewards) == max(rewards):
        reason = f"every reward equals {rewards[0]:g}: the correlation is undefined"
    elif min(f1s) == max(f1s):
        reason = f"every Match F1 equals {f1s[0]:g}: the correlation is undefined"
    if reason is not None:
        return {"r": None, "p_value": None, "n": n, "reason": reason}
    from scipy.stats import pearsonr

    result = pearsonr(rewards, f1s)
    return {"r": float(result.statistic), "p_value": float(result.pvalue), "n": n, "reason": None}


def kl_max(train_rows: Iterable[Mapping[str, Any]], *, step_key: str = "step") -> dict[str, Any]:
    """The largest finite logged ``kl`` and the (global) step it was logged at.

    Returns:
        ``{"value", "step", "n"}`` (``n`` = number of finite KL values); ``value`` and ``step``
        are ``None`` when no finite KL was logged.
    """
    best: tuple[float, Any] | None = None
    n = 0
    for row in train_rows:
        v = as_number(row.get("kl"))
        if v is None or not math.isfinite(v):
            continue
        n += 1
        if best is None or v > best[0]:
            best = (v, row.get(step_key))
    return {"value": None if best is None else best[0], "step": None if best is None else best[1], "n": n}


def _watched(key: str) -> bool:
    return key in NONFINITE_KEYS or key.startswith("rewards/")


def first_nonfinite(train_rows: Iterable[Mapping[str, Any]], *, step_key: str = "step") -> dict[str, Any] | None:
    """The first training log row holding a NaN or infinite loss / grad norm / KL / reward.

    Returns:
        ``{"step", "key", "value"}`` of the first such value (keys in :data:`NONFINITE_KEYS` or
        starting with ``rewards/``), or ``None`` when every logged value is finite.
    """
    for row in train_rows:
        for key, raw in row.items():
            if not _watched(key):
                continue
            v = as_number(raw)
            if v is not None and not math.isfinite(v):
                return {"step": row.get(step_key), "key": key, "value": str(raw)}
    return None


#: Divergence-guard conditions (cpr.training.guards) that mark a run unstable; ``zero_std`` (no
#: learning signal) does not.
UNSTABLE_GUARD_CONDITIONS: tuple[str, ...] = ("nan", "kl")


def stability(
    train_rows: Sequence[Mapping[str, Any]],
    kl_limit: float | None,
    *,
    step_key: str = "step",
    guard_events: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The stability flag of a run.

    Args:
        train_rows: training log rows of the phases considered, in training order.
        kl_limit: a logged KL above this marks the run unstable (``None``: no KL limit).
        step_key: the key holding the step to report (e.g. a global step across phases).
        guard_events: rows of ``guard_events.jsonl`` (:class:`cpr.training.guards.GuardEvent`:
            ``step``, ``condition``, ``action``, ``reason``); a ``nan`` or ``kl`` event marks the run
            unstable (a NaN the guard skipped or stopped at may never reach the training log).

    Returns:
        ``{"stable": bool, "reason": str | None, "nonfinite": {...} | None, "kl_over": {"step", "value"} | None,
        "guard": <first nan / kl event> | None}``. ``reason`` names the first non-finite value (key
        and step), the first KL above the limit and / or the first guard event.
    """
    bad = first_nonfinite(train_rows, step_key=step_key)
    over = None
    if kl_limit is not None:
        for row in train_rows:
            v = as_number(row.get("kl"))
            if v is not None and math.isfinite(v) and v > kl_limit:
                over = {"step": row.get(step_key), "value": v}
                break
    guard = next((e for e in guard_events if e.get("condition") in UNSTABLE_GUARD_CONDITIONS), None)
    reasons = []
    if bad is not None:
        reasons.append(f"{bad['key']} = {bad['value']} at step {bad['step']}")
    if over is not None:
        reasons.append(f"KL {over['value']:.3g} > {kl_limit:g} at step {over['step']}")
    if guard is not None:
        reasons.append(
            f"guard {guard.get('condition')} ({guard.get('action')}) at step {guard.get(step_key, guard.get('step'))}: "
            f"{guard.get('reason')}"
        )
    return {
        "stable": not reasons,
        "reason": "; ".join(reasons) or None,
        "nonfinite": bad,
        "kl_over": over,
        "guard": dict(guard) if guard is not None else None,
    }
