"""Guarded step scoring for training rewards (Match F1 that repetition, restatement and loose matches cannot
inflate) and the hack monitors. The matcher of :mod:`cpr.matching` is kept, with three switchable changes
(:class:`GuardSettings`; the rules, their formulas and measured defaults: docs/reward-hacking.md, "What the
guard changes"). Precision and recall are then the summed credit over ``n_pred`` / ``n_ref``; F1, LIS and
Ordered F1 as in the paper. ``guard: paper`` (all off) gives :func:`cpr.matching.score_batch` bit for bit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from cpr.errors import ConfigError, check_choice
from cpr.matching import StepEncoder, StepScores, match_pairs

# Tolerance of the guards' comparisons: two matrix products can round the same dot product of float32
# embeddings differently in the last place (identical strings must compare equal).
_EPS = 1e-6

#: Per-batch hack monitors logged through TRL's ``log_metric`` (docs/reward-hacking.md).
MONITORS = ("hacking/duplicate_rate", "hacking/restatement_rate", "hacking/precision_minus_recall",
            "hacking/non_answer_rate", "steps/count")


@dataclass(frozen=True)
class GuardSettings:
    """How training rewards guard step scoring (module docstring).

    Attributes:
        duplicates: collapse near-duplicate predicted steps.
        duplicate_threshold: cosine similarity in (0, 1] from which a step is a near-duplicate (also
            the duplicate-rate monitor's).
        restatement: discount matches of steps that restate the prompt.
        restatement_margin: width in [0, 1) of the discount (0: all or nothing; also the monitor's).
        full_credit_similarity: similarity in (tau, 1] of a full-credit match; ``None``: every match 1.
    """

    duplicates: bool = True
    duplicate_threshold: float = 0.8
    restatement: bool = True
    restatement_margin: float = 0.15
    full_credit_similarity: float | None = 0.85

    @property
    def is_paper(self) -> bool:
        """True when nothing is guarded: the scores are the paper's Match F1."""
        return not (self.duplicates or self.restatement) and self.full_credit_similarity is None

    @classmethod
    def parse(cls, value: Any, *, threshold: float | None = None, field: str = "rewards.guard") -> GuardSettings:
        """The settings ``value`` stands for, validated (the one place): ``"guarded"`` / ``None`` (the
        defaults), ``"paper"`` (all off), a mapping of fields (unset ones keep their default; ``preset:
        paper`` starts from all off) or a :class:`GuardSettings`; ``threshold`` (tau) bounds
        ``full_credit_similarity`` from below; ``field`` is the config key named in errors.

        Raises:
            ConfigError: an unknown preset or key, a wrong type or a value out of range (names the key).
        """
        if isinstance(value, GuardSettings):
            out = value
        elif value is None or isinstance(value, str):
            if (value or "guarded") not in GUARD_PRESETS:
                raise ConfigError(f"must be one of {', '.join(GUARD_PRESETS)} or a mapping, got {value!r}", field=field)
            out = GUARD_PRESETS[value or "guarded"]
        elif isinstance(value, Mapping):
            data = dict(value)
            preset = data.pop("preset", "guarded")
            check_choice(preset, GUARD_PRESETS, f"{field}.preset")
            known = {f.name for f in fields(cls)}
            for key in data:
                if key not in known:
                    raise ConfigError(f"unknown key; known: {sorted(known | {'preset'})}", field=f"{field}.{key}")
            out = cls(**{**asdict(GUARD_PRESETS[preset]), **data})
        else:
            raise ConfigError(f"expected 'guarded', 'paper' or a mapping, got {type(value).__name__}", field=field)
        for key in ("duplicates", "restatement"):
            if not isinstance(getattr(out, key), bool):
                raise ConfigError(f"expected true or false, got {getattr(out, key)!r}", field=f"{field}.{key}")
        low = 0.0 if threshold is None else threshold
        for key, lo, hi, ok in (
            ("duplicate_threshold", "(0", "1]", lambda v: 0.0 < v <= 1.0),
            ("restatement_margin", "[0", "1)", lambda v: 0.0 <= v < 1.0),
            ("full_credit_similarity", f"({low:g}", "1]", lambda v: low < v <= 1.0),
        ):
            v = getattr(out, key)
            if key == "full_credit_similarity" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ConfigError(f"must be a number in {lo}, {hi}, got {v!r}", field=f"{field}.{key}")
        return out


#: ``rewards.guard`` presets: ``guarded`` (default for training rewards) and ``paper`` (all off).
GUARD_PRESETS: dict[str, GuardSettings] = {
    "guarded": GuardSettings(),
    "paper": GuardSettings(duplicates=False, restatement=False, full_credit_similarity=None),
}


def prompt_pieces(question: str | None, options: Sequence[str] | None = ()) -> tuple[str, ...]:
    """The prompt texts a step can restate: the whole question, its sentences (LaTeX-aware,
    :func:`cpr.data.text.split_sentences`) and the non-blank option texts, without repeats. Cached
    per ``(question, options)``."""
    return _pieces(str(question or ""), tuple(str(o) for o in (options or ())))


@functools.lru_cache(maxsize=8192)
def _pieces(question: str, options: tuple[str, ...]) -> tuple[str, ...]:
    from cpr.data.text import split_sentences

    parts = [question.strip(), *split_sentences(question)] if question.strip() else []
    return tuple(dict.fromkeys(p for p in (*parts, *(o.strip() for o in options)) if p))


def pair_credit(similarity: float, threshold: float, full: float | None) -> float:
    """Credit of a matched pair: ``min(1, (S - tau) / (f - tau))`` with ``f = full_credit_similarity``;
    1.0 when ``full`` is ``None`` (the paper's count of pairs)."""
    return 1.0 if full is None else min(1.0, (similarity - threshold) / (full - threshold))


def guarded_scores(
    predicted: Sequence[Sequence[str]], references: Sequence[Sequence[str]],
    prompts: Sequence[Sequence[str]], *, encoder: StepEncoder, guard: GuardSettings, threshold: float,
    alpha: float, matching: str = "greedy", step_credit: list[tuple[float, ...]] | None = None,
) -> tuple[list[StepScores], dict[str, float]]:
    """Step scores of a batch under ``guard`` with one encoder call, as :func:`cpr.matching.score_batch`;
    ``prompts``: per sample the :func:`prompt_pieces`. ``step_credit`` receives, per sample, each predicted
    step's credit (:func:`pair_credit`, 0.0 unmatched), summing to precision x ``n_pred``.

    Returns:
        ``(scores, monitors)``: one :class:`~cpr.matching.StepScores` per sample, and the shares of the
        predicted steps that are near-duplicates of an earlier step of their completion
        (``hacking/duplicate_rate``), resp. above tau to the prompt and zeroed by the restatement rule
        against every reference step (``hacking/restatement_rate``), whatever ``guard`` applies; a rate
        with no step to count is left out.

    Raises:
        ConfigError: an unknown ``matching``.
        TypeError: a step that is not a string (from the encoder).
    """
    table, index = encoder.embedding_table([([t for ref in references for t in ref], True),
                                            ([t for pieces in prompts for t in pieces], True),
                                            ([t for pred in predicted for t in pred], False)])
    full = guard.full_credit_similarity
    scores: list[StepScores] = []
    n_steps = n_dup = n_prompted = n_restated = 0
    for pred, ref, pieces in zip(predicted, references, prompts, strict=True):
        if not pred:
            scores.append(StepScores.from_pairs(0, len(ref), [], alpha))
            if step_credit is not None:
                step_credit.append(())
            continue
        p, r = table[[index[t] for t in pred]], table[[index[t] for t in ref]]
        sim = eff = p @ r.T
        allowed = np.ones(sim.shape, dtype=bool)
        if len(pred) > 1:
            pp = p @ p.T
            np.fill_diagonal(pp, -np.inf)
            n_dup += int((np.tril(pp, -1).max(axis=1) >= guard.duplicate_threshold).sum())  # copies of an earlier step
            d = pp.max(axis=1)
            if guard.duplicates:
                allowed &= (d < guard.duplicate_threshold)[:, None] | (sim >= d[:, None] - _EPS)
        n_steps += len(pred)
        if pieces:
            q = table[[index[t] for t in pieces]]
            q_pred, q_ref = (p @ q.T).max(axis=1), (r @ q.T).max(axis=1)
            m = guard.restatement_margin
            room = np.maximum(sim, q_ref[None, :]) + m - q_pred[:, None] + _EPS  # >= m: full credit, <= 0: none
            n_prompted += len(pred)
            n_restated += int(((q_pred > threshold) & (room <= 0).all(axis=1)).sum())
            if guard.restatement:
                eff = sim * (np.clip(room / m, 0.0, 1.0) if m > 0 else (room > 0).astype(sim.dtype))
        pairs = match_pairs(eff if allowed.all() else np.where(allowed, eff, -np.inf), threshold, matching)
        credit = None if full is None else sum(pair_credit(s, threshold, full) for _, _, s in pairs)
        scores.append(StepScores.from_pairs(len(pred), len(ref), pairs, alpha, credit))
        if step_credit is not None:
            per_step = [0.0] * len(pred)
            for i, _, s in pairs:
                per_step[i] = pair_credit(s, threshold, full)
            step_credit.append(tuple(per_step))
    rates = {"hacking/duplicate_rate": (n_dup, n_steps), "hacking/restatement_rate": (n_restated, n_prompted)}
    return scores, {name: count / total for name, (count, total) in rates.items() if total}
