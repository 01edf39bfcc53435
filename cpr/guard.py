"""Guarded step scoring for training rewards: Match F1 that repetition, restatement and loose
matches cannot inflate.

The paper's Match F1 (CRYSTAL paper, section 3; :mod:`cpr.matching`) pays one full match for any
predicted / reference pair with cosine similarity above tau, one-to-one, greedily. A policy
trained against it can buy recall without reasoning: near-copies of one step each match a
*different* reference step, restatements of the question match reference steps that mention
the same entities, and generic or foreign steps clear tau = 0.35 against most references. The
guarded scorer keeps the matcher and changes three things, each switchable
(:class:`GuardSettings`, the ``rewards.guard`` config key):

``duplicates``
    With ``d_j`` the largest cosine similarity of predicted step ``j`` to another step of the
    same completion, a step with ``d_j >= duplicate_threshold`` (a near-duplicate, whichever
    comes first) may match a reference step ``r`` only if ``S[j, r] >= d_j``: it must be at
    least as close to ``r`` as to its copy. Copies collapse onto the reference steps their
    original can take (exact copies: only a reference step equal to them), and every copy still
    counts in the precision denominator, so repeating a step can only lower the reward. A
    reference with two near-identical steps (a list and the same list sorted) keeps full credit
    for a completion that states both, since each is closer to its own reference step.
``restatement``
    With ``q(x)`` the largest similarity of a step to the prompt (the question, its sentences,
    the option texts), the similarity of predicted step ``p`` to reference step ``r`` is scaled
    by ``clip((max(S[p, r], q(r)) + restatement_margin - q(p)) / restatement_margin, 0, 1)``
    before matching: unchanged while ``p`` restates the prompt no more than it resembles ``r``
    (or than ``r`` itself restates the prompt), down to zero once it is closer to the prompt by
    the margin. A step that restates the question as the reference does keeps its credit; the
    question's own sentences cannot stand in for reasoning steps that merely mention the same
    entities, and earn only part of a step that restates the prompt in other words.
``full_credit_similarity``
    A match is worth ``min(1, (S - tau) / (full_credit_similarity - tau))`` instead of 1, so
    credit grows from 0 at tau to 1 at paraphrase-level similarity. Generic steps and steps
    of another item that clear tau against every reference step no longer earn full marks.
    ``None``: every match is worth 1 (the paper).

With all three off (``guard: paper``) the scores are the paper's Match F1, bit for bit
(:func:`cpr.matching.score_batch`). Evaluation (``cpr eval``, ``cpr score``, the eval hook)
always uses the paper's metric; only training rewards are guarded.

Under guarded scoring a :class:`~cpr.matching.StepScores` holds ``n_matched`` = the number of
matched pairs, and credit-weighted ``precision = C / n_pred``, ``recall = C / n_ref`` with
``C`` the summed credit; ``match_f1 = 2PR / (P + R)``, LIS and Ordered F1 as in the paper.

Defaults were chosen from measurements on the bundled samples and the CRYSTAL gallery
(``benchmarks/guard_calibration.py`` prints them; README, "Reward hacking").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from cpr.errors import ConfigError
from cpr.matching import StepEncoder, StepScores, lis_ratio, match_pairs

__all__ = [
    "GUARD_PRESETS",
    "GuardSettings",
    "MONITORS",
    "guarded_scores",
    "prompt_pieces",
]

# Tolerance of the guards' comparisons: two matrix products can round the same dot product of float32
# embeddings differently in the last place (identical strings must compare equal).
_EPS = 1e-6

#: Per-batch hack monitors logged through TRL's ``log_metric`` (README, "Reward hacking").
MONITORS = (
    "hacking/duplicate_rate",
    "hacking/restatement_rate",
    "hacking/precision_minus_recall",
    "hacking/non_answer_rate",
    "steps/count",
)


@dataclass(frozen=True)
class GuardSettings:
    """How training rewards guard step scoring (module docstring).

    Attributes:
        duplicates: collapse near-duplicate predicted steps.
        duplicate_threshold: cosine similarity in (0, 1] at which a step is a near-duplicate of
            an earlier one (also the threshold of the duplicate-rate monitor).
        restatement: discount matches of steps that restate the prompt.
        restatement_margin: width in [0, 1) of the restatement discount (0: all or nothing; also
            used by the restatement-rate monitor).
        full_credit_similarity: similarity in (tau, 1] at which a match earns full credit;
            ``None`` = every match earns 1.
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

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what ``rewards.guard`` accepts)."""
        return asdict(self)

    @classmethod
    def parse(cls, value: Any, *, threshold: float | None = None, field: str = "rewards.guard") -> GuardSettings:
        """The settings a ``rewards.guard`` value stands for; the one place they are validated.

        Args:
            value: ``"guarded"`` / ``None`` (the defaults), ``"paper"`` (all off), a mapping of
                :class:`GuardSettings` fields (unset ones keep their default; ``preset:
                paper`` starts from all off), or a :class:`GuardSettings`.
            threshold: tau, to check ``full_credit_similarity > tau``.
            field: the config key named in errors.

        Raises:
            ConfigError: an unknown preset or key, a wrong type or a value out of range (names
                ``field`` and the key).
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
            if preset not in GUARD_PRESETS:
                raise ConfigError(f"must be one of {', '.join(GUARD_PRESETS)}, got {preset!r}", field=f"{field}.preset")
            known = {f.name for f in fields(cls)}
            for key in data:
                if key not in known:
                    raise ConfigError(f"unknown key; known: {sorted(known | {'preset'})}", field=f"{field}.{key}")
            out = cls(**{**GUARD_PRESETS[preset].to_dict(), **data})
        else:
            raise ConfigError(f"expected 'guarded', 'paper' or a mapping, got {type(value).__name__}", field=field)
        out._check(threshold, field)
        return out

    def _check(self, threshold: float | None, field: str) -> None:
        for key in ("duplicates", "restatement"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"expected true or false, got {getattr(self, key)!r}", field=f"{field}.{key}")

        def number(key: str, low: float, high: float, low_open: bool, high_open: bool) -> None:
            v = getattr(self, key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            ok = ok and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
            if not ok:
                span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
                raise ConfigError(f"must be a number in {span}, got {v!r}", field=f"{field}.{key}")

        number("duplicate_threshold", 0.0, 1.0, True, False)
        number("restatement_margin", 0.0, 1.0, False, True)
        if self.full_credit_similarity is not None:
            number("full_credit_similarity", 0.0 if threshold is None else threshold, 1.0, True, False)


#: ``rewards.guard`` presets: ``guarded`` (default for training rewards) and ``paper`` (all off).
GUARD_PRESETS: dict[str, GuardSettings] = {
    "guarded": GuardSettings(),
    "paper": GuardSettings(duplicates=False, restatement=False, full_credit_similarity=None),
}


@functools.lru_cache(maxsize=8192)
def _pieces(question: str, options: tuple[str, ...]) -> tuple[str, ...]:
    from cpr.data.text import split_sentences

    parts = [question.strip(), *split_sentences(question), *(o.strip() for o in options)] if question.strip() else [
        o.strip() for o in options
    ]
    return tuple(dict.fromkeys(p for p in parts if p))


def prompt_pieces(question: str | None, options: Sequence[str] | None = ()) -> tuple[str, ...]:
    """The prompt texts a step can restate: the whole question, its sentences (LaTeX-aware,
    :func:`cpr.data.text.split_sentences`) and the non-blank option texts, without repeats.
    Cached per ``(question, options)``."""
    return _pieces(str(question or ""), tuple(str(o) for o in (options or ())))


def _scores(n_pred: int, n_ref: int, pairs: list[tuple[int, int, float]], credit: float, alpha: float) -> StepScores:
    precision, recall = credit / n_pred, credit / n_ref
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0.0
    lis = lis_ratio(pairs)
    return StepScores(n_pred, n_ref, len(pairs), precision, recall, f1, lis, f1 * ((1.0 - alpha) + alpha * lis))


def guarded_scores(
    predicted: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    prompts: Sequence[Sequence[str]],
    *,
    encoder: StepEncoder,
    guard: GuardSettings,
    threshold: float,
    alpha: float,
    matching: str = "greedy",
) -> tuple[list[StepScores], dict[str, float]]:
    """Step scores of a batch under ``guard``, and the batch's step-level hack monitors.

    One encoder call embeds every new string of the batch (reference steps and prompt pieces
    pinned in the encoder's cache, completion steps in its LRU).

    Args:
        predicted: per sample, the predicted steps (may be empty).
        references: per sample, the reference steps (non-empty, checked by the caller).
        prompts: per sample, the prompt pieces (:func:`prompt_pieces`); empty: the restatement
            rule and monitor skip that sample.
        encoder, threshold, alpha, matching: as :func:`cpr.matching.score_batch`.
        guard: the settings; :attr:`GuardSettings.is_paper` gives the paper's scores exactly.

    Returns:
        ``(scores, monitors)``: one :class:`~cpr.matching.StepScores` per sample, and
        ``{"hacking/duplicate_rate", "hacking/restatement_rate"}``, each the share of the batch's
        predicted steps that are near-duplicates (``>= duplicate_threshold``) of an earlier step of
        their completion, resp. above tau to the prompt and discounted to zero by the restatement
        rule against every reference step; a rate with no step to count is left out. Both are
        computed whatever the settings apply.
    """
    table, index = encoder.embedding_table(
        [
            ([t for ref in references for t in ref], True),
            ([t for pieces in prompts for t in pieces], True),
            ([t for pred in predicted for t in pred], False),
        ]
    )
    full = guard.full_credit_similarity
    scores: list[StepScores] = []
    n_steps = n_dup = n_prompted = n_restated = 0
    for pred, ref, pieces in zip(predicted, references, prompts, strict=True):
        if not pred:
            scores.append(StepScores(0, len(ref), 0, 0.0, 0.0, 0.0, 1.0, 0.0))
            continue
        p, r = table[[index[t] for t in pred]], table[[index[t] for t in ref]]
        sim = p @ r.T
        allowed = np.ones(sim.shape, dtype=bool)
        if len(pred) > 1:
            pp = p @ p.T
            np.fill_diagonal(pp, -np.inf)
            n_dup += int((np.tril(pp, -1).max(axis=1) >= guard.duplicate_threshold).sum())  # copies of an earlier step
            d = pp.max(axis=1)
            if guard.duplicates:
                allowed &= (d < guard.duplicate_threshold)[:, None] | (sim >= d[:, None] - _EPS)
        n_steps += len(pred)
        eff = sim
        if pieces:
            q = table[[index[t] for t in pieces]]
            q_pred, q_ref = (p @ q.T).max(axis=1), (r @ q.T).max(axis=1)
            m = guard.restatement_margin
            room = np.maximum(sim, q_ref[None, :]) + m - q_pred[:, None] + _EPS  # >= m: full credit, <= 0: none
            n_prompted += len(pred)
            n_restated += int(((q_pred > threshold) & (room <= 0).all(axis=1)).sum())
            if guard.restatement:
                eff = sim * (np.clip(room / m, 0.0, 1.0) if m > 0 else (room > 0).astype(sim.dtype))
        pairs = match_pairs(np.where(allowed, eff, -np.inf) if not allowed.all() else eff, threshold, matching)
        if full is None:
            credit = float(len(pairs))
        else:
            credit = sum(min(1.0, (s - threshold) / (full - threshold)) for _, _, s in pairs)
        scores.append(_scores(len(pred), len(ref), pairs, credit, alpha))
    monitors = {}
    if n_steps:
        monitors["hacking/duplicate_rate"] = n_dup / n_steps
    if n_prompted:
        monitors["hacking/restatement_rate"] = n_restated / n_prompted
    return scores, monitors
