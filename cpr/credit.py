"""Step-level credit (a phase's ``credit: step``; docs/method.md section 4, "Step-level credit", which gives the
formulas and the reasons for them).

The step-scoring reward (:class:`cpr.rewards.StepF1Reward`, :class:`cpr.rewards.CPRReward`) splits its reward
over the completion's parts (:meth:`cpr.rewards.StepF1Reward.credit_split`). The process advantage is
DeepSeekMath's process supervision (Shao et al. 2024, arXiv 2402.03300, section 4.1.3) in its sum form,
``A~_t = sum_{end(j) >= t} r~_j``, and a token's advantage is ``A_i + w * A~_t`` (``w = credit_weight``);
tokens outside any part, and every token of an unparsable or unmappable completion, get ``A_i`` alone.
Characters map to tokens exactly (:func:`token_char_spans`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

#: Values of a phase's ``credit`` setting.
CREDIT_MODES = ("completion", "step")
#: Step indices (1-based) with their own logged means; later steps count in the overall means only.
LOGGED_STEP_INDICES = 8
#: GRPO loss types whose per-token loss takes a ``(B, T)`` advantage token by token (TRL 1.16 ``_compute_loss``;
#: ``vespo`` weighs whole sequences by the advantage's sign).
TOKEN_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")

_JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_ANSWER_RE = re.compile(r'"answer"\s*:\s*("(?:[^"\\]|\\.)*")', re.DOTALL)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class CompletionCredit:
    """The reward of one completion split over its parts (what a step-scoring reward function keeps).

    Attributes:
        format: :attr:`cpr.steps.ParsedCompletion.format` (``"none"``: unparsable).
        step_rewards: reward of each parsed step, in the reward's units.
        matched: whether each step matched a reference step with credit > 0.
        answer_reward: the answer span's reward (the completion's answer term).
    """

    text: str
    format: str
    steps: tuple[str, ...]
    answer: str
    step_rewards: tuple[float, ...]
    matched: tuple[bool, ...]
    answer_reward: float

    @property
    def parsable(self) -> bool:
        """False for format ``none`` (no steps, no answer): it gets the completion-level advantage only."""
        return self.format != "none"


def combine(credits: Sequence[CompletionCredit], weights: Sequence[float]) -> CompletionCredit:
    """One :class:`CompletionCredit` of a completion scored by several step-scoring functions (the same text and
    parse): rewards summed with the functions' reward ``weights``, a step matched when it is in any.

    Raises:
        ValueError: no credits, or credits of different texts.
    """
    if not credits:
        raise ValueError("no credits to combine")
    first = credits[0]
    if any(c.text != first.text or c.steps != first.steps for c in credits):
        raise ValueError("credits of different completions cannot be combined")
    n = len(first.steps)
    return CompletionCredit(
        first.text, first.format, first.steps, first.answer,
        tuple(sum(w * c.step_rewards[k] for c, w in zip(credits, weights, strict=True)) for k in range(n)),
        tuple(any(c.matched[k] for c in credits) for k in range(n)),
        sum(w * c.answer_reward for c, w in zip(credits, weights, strict=True)))


def _normal(text: str) -> str:
    return " ".join(_CONTROL_RE.sub("", text).split())


def _loose(text: str) -> re.Pattern[str]:
    """``text`` with any run of whitespace between its words."""
    return re.compile(r"\s+".join(re.escape(w) for w in text.split()))


def _json_literals(text: str, start: int) -> list[tuple[int, int, str]]:
    out = []
    for m in _JSON_STRING_RE.finditer(text, start):
        try:
            value = json.loads(m.group(0), strict=False)
        except ValueError:
            continue
        out.append((m.start() + 1, m.end() - 1, _normal(value)))
    return out


def part_char_spans(credit: CompletionCredit) -> list[tuple[int, int] | None]:
    """Character spans ``[start, end)`` in ``credit.text`` of each step, then of the answer (``None``: not found).

    JSON formats: the steps are the string literals after the ``"reasoning_steps"`` key whose decoded value is
    the step (escapes and unicode decoded), taken in order, the span the literal's content; the answer is the
    last ``"answer": "..."`` literal. Other formats: each step is found after the previous one with any
    whitespace between its words (the parser joins lines), the answer after the last step (last occurrence).
    A step that appears twice maps to its two occurrences in turn.
    """
    text, spans = credit.text, []
    if not credit.parsable:
        return [None] * (len(credit.steps) + 1)
    pos = 0
    if credit.format in ("json", "json_span"):
        key = text.find('"reasoning_steps"')
        literals = _json_literals(text, key + len('"reasoning_steps"')) if key != -1 else []
        i = 0
        for step in credit.steps:
            want, j = _normal(step), i
            while j < len(literals) and literals[j][2] != want:
                j += 1
            if j < len(literals):
                spans.append(literals[j][:2])
                i, pos = j + 1, literals[j][1]
            else:
                spans.append(None)
        answers = list(_JSON_ANSWER_RE.finditer(text))
        if answers:
            m = answers[-1]
            spans.append((m.start(1) + 1, m.end(1) - 1))
            return spans
    else:
        for step in credit.steps:
            m = _loose(step).search(text, pos)
            spans.append((m.start(), m.end()) if m else None)
            pos = m.end() if m else pos
    found = list(_loose(credit.answer).finditer(text, pos)) if credit.answer.split() else []
    spans.append((found[-1].start(), found[-1].end()) if found else None)
    return spans


def token_char_spans(tokenizer: Any, ids: Sequence[int], text: str | None = None) -> list[tuple[int, int]] | None:
    """Character span ``[start, end)`` in ``decode(ids, skip_special_tokens=True)`` of each token of ``ids``.

    A fast tokenizer's offsets are used when re-encoding the text gives back ``ids`` (special tokens, which
    decode to nothing, taken out); otherwise the spans come from decoding every prefix of ``ids``: token ``t``
    ends where ``decode(ids[:t + 1])`` stops agreeing with the text, so a token that holds only part of a
    character's bytes ends where the character starts (an empty span) and the token completing it covers it.
    Exact either way: the spans tile the text. ``text`` given and different from the decoded ids: ``None``.
    """
    ids = [int(i) for i in ids]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    if text is not None and decoded != text:
        return None
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    if getattr(tokenizer, "is_fast", False):
        kept = [i for i in ids if i not in special]
        enc = tokenizer(decoded, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == kept:
            offsets, out, k, end = enc["offset_mapping"], [], 0, 0
            for i in ids:
                if i in special:
                    out.append((end, end))
                else:
                    out.append((int(offsets[k][0]), int(offsets[k][1])))
                    end, k = int(offsets[k][1]), k + 1
            return out
    prefixes = tokenizer.batch_decode([ids[:t + 1] for t in range(len(ids))], skip_special_tokens=True)
    out, end = [], 0
    for p in prefixes:
        new = max(end, len(os.path.commonprefix([p, decoded])))
        out.append((end, new))
        end = new
    return out


def token_parts(token_spans: Sequence[tuple[int, int]], part_spans: Sequence[tuple[int, int] | None]) -> list[int]:
    """Per token, the index of the first part whose characters it touches (``-1``: none). A token with an
    empty span (part of a character's bytes) counts as touching the character it starts."""
    found = sorted((a, b, j) for j, s in enumerate(part_spans) if s is not None for a, b in [s])
    out = []
    for start, end in token_spans:
        end = max(end, start + 1)
        out.append(min((j for a, b, j in found if start < b and a < end), default=-1))
    return out


def normalised_group(rewards: Sequence[Sequence[float] | None]) -> list[list[float] | None]:
    """DeepSeekMath section 4.1.3: the part rewards of one group's completions (``None``: an unparsable one,
    left out) normalised together, ``(r - mean) / (std + 1e-4)`` (std with Bessel's correction and the
    ``1e-4`` of TRL's completion-level normalisation; 0 with fewer than two rewards)."""
    pool = [r for rs in rewards if rs is not None for r in rs]
    if not pool:
        return [None if rs is None else [] for rs in rewards]
    mean = sum(pool) / len(pool)
    std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - 1)) if len(pool) > 1 else 0.0
    return [None if rs is None else [(r - mean) / (std + 1e-4) for r in rs] for rs in rewards]


def suffix_sums(values: Sequence[float]) -> list[float]:
    """``out[k] = sum(values[k:])``: the process advantage of part ``k``'s tokens (the parts ending at or
    after them)."""
    return list(accumulate(reversed(values), initial=0.0))[:0:-1]


def process_advantages(rewards: Sequence[Sequence[float] | None], group_size: int) -> list[list[float] | None]:
    """Per completion (in TRL's order: ``group_size`` consecutive completions per prompt), the process advantage
    of each of its parts (:func:`normalised_group`, then :func:`suffix_sums`); ``None`` for an unparsable one.

    Raises:
        ValueError: a number of completions that is not a multiple of ``group_size``.
    """
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} completions do not form groups of {group_size}")
    out: list[list[float] | None] = []
    for g in range(0, len(rewards), group_size):
        out += [None if n is None else suffix_sums(n) for n in normalised_group(rewards[g:g + group_size])]
    return out


def token_advantages(completion_advantages: Any, token_part: Sequence[Sequence[int] | None],
                     part_advantages: Sequence[Sequence[float] | None], length: int, weight: float) -> Any:
    """The ``(B, T)`` token advantages: ``A_i + weight * part_advantages[i][token_part[i][t]]`` where the token
    is in a part, ``A_i`` elsewhere, past a completion's tokens and for a completion whose ``token_part`` or
    ``part_advantages`` is ``None``.

    Args:
        completion_advantages: ``(B,)`` tensor, GRPO's completion-level advantages.
        token_part: per completion, :func:`token_parts` of its first ``len`` tokens (at most ``length``).
        part_advantages: per completion, :func:`process_advantages`.
        length: ``T``, the padded completion length; weight: ``w`` of the process term.
    """
    import torch

    base = completion_advantages.reshape(-1, 1)
    extra = torch.zeros((base.shape[0], length), dtype=base.dtype)
    for i, (parts, adv) in enumerate(zip(token_part, part_advantages, strict=True)):
        if parts is None or adv is None:
            continue
        for t, j in enumerate(parts[:length]):
            if j >= 0:
                extra[i, t] = adv[j]
    return base + weight * extra.to(base.device)


def check_credit(credit: Any, weight: Any, reward_funcs: Sequence[Any], *, loss_type: str = "grpo",
                 off_policy_mask_threshold: float | None = None, dynamic_sampling: bool = False,
                 field: str = "credit") -> None:
    """Check a phase's ``credit`` and ``credit_weight`` against its reward functions and loss (the one check,
    for the config and the trainer).

    Raises:
        ConfigError: an unknown ``credit``, a weight that is not a finite number >= 0, or with ``step``: no
            step-scoring reward function, a sequence-level loss (``vespo``), TRL's off-policy sequence mask or
            dynamic sampling (the messages say why). Names the key under ``field``'s parent.
    """
    from cpr.errors import ConfigError, check_choice

    check_choice(credit, CREDIT_MODES, field)
    parent = field.rpartition(".")[0]
    prefix = f"{parent}." if parent else ""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise ConfigError(f"must be a finite number >= 0, got {weight!r}", field=f"{prefix}credit_weight")
    if credit != "step":
        return
    if not any(getattr(f, "scores_steps", False) for f in reward_funcs):
        raise ConfigError(f"credit: step needs a reward function that scores steps (cpr, step_f1); the phase has "
                          f"{[getattr(f, '__name__', f) for f in reward_funcs]}", field=field)
    training = f"{prefix}training"
    if loss_type not in TOKEN_LOSS_TYPES:
        raise ConfigError(f"credit: step needs a token-level loss ({', '.join(TOKEN_LOSS_TYPES)}), got {loss_type!r}",
                          field=f"{training}.loss_type")
    if dynamic_sampling:
        raise ConfigError("credit: step cannot be combined with dynamic sampling yet: the step credit it reads is "
                          "the last generation round's, while a dynamically sampled batch mixes groups of several "
                          "rounds; turn one of them off", field=f"{prefix}dynamic_sampling.enabled")
    if off_policy_mask_threshold is not None:
        raise ConfigError("credit: step cannot be combined with the off-policy sequence mask (it keeps or drops a "
                          "sequence by its advantage's sign)", field=f"{training}.off_policy_mask_threshold")


def batch_token_advantages(credits: Sequence[CompletionCredit], completion_ids: Any, completion_mask: Any,
                           advantages: Any, tokenizer: Any, *, group_size: int, weight: float,
                           gather: Any = None, process_index: int = 0) -> tuple[Any, dict[str, float]]:
    """The ``(B, T)`` token advantages of this process's rows of a generation batch, and the metrics to log.

    Args:
        credits: one :class:`CompletionCredit` per local row (a step-scoring reward's ``last_credit``).
        completion_ids, completion_mask: ``(B, T)`` tensors of TRL's output; advantages: ``(B,)``, GRPO's.
        group_size: ``num_generations``; weight: ``w`` of the process term.
        gather: ``gather_object`` of every process's list, concatenated in process order (``None``: one process).

    Returns:
        ``(token_advantages, metrics)``: ``credit/adv_matched`` and ``credit/adv_unmatched`` (mean advantage of
        the tokens of matched, resp. unmatched steps, every step weighing the same), the same per step index
        ``credit/step<k>/adv_matched`` (k = 1 .. :data:`LOGGED_STEP_INDICES`), ``credit/fallback_rate`` (share of
        completions with the completion-level advantage only: unparsable or not mapped to tokens) and
        ``credit/unmapped_steps`` (share of steps found in no token); a mean with nothing to average is left out.

    Raises:
        ValueError: ``credits`` and the rows differ in number.
    """
    n = int(completion_ids.shape[0])
    if len(credits) != n:
        raise ValueError(f"{len(credits)} step credits for {n} completions: the reward function did not score this batch")
    gather = gather or (lambda xs: list(xs))
    token_part: list[list[int] | None] = []
    for credit, ids, mask in zip(credits, completion_ids.tolist(), completion_mask.tolist(), strict=True):
        kept = [i for i, m in zip(ids, mask, strict=True) if m]
        spans = token_char_spans(tokenizer, kept, credit.text) if credit.parsable else None
        token_part.append(None if spans is None else token_parts(spans, part_char_spans(credit)))
    every = gather([[*c.step_rewards, c.answer_reward] if c.parsable else None for c in credits])
    part_adv = process_advantages(every, group_size)[process_index * n:(process_index + 1) * n]
    out = token_advantages(advantages, token_part, part_adv, int(completion_ids.shape[1]), weight)

    rows: list[tuple[int, bool, float]] = []  # (step index, matched, step advantage)
    fallback = unmapped = n_steps = 0
    for i, (credit, parts, adv) in enumerate(zip(credits, token_part, part_adv, strict=True)):
        if parts is None or adv is None:
            fallback += 1
            continue
        present = set(parts)
        for k, matched in enumerate(credit.matched):
            n_steps += 1
            if k not in present:
                unmapped += 1
                continue
            rows.append((k, matched, float(advantages[i]) + weight * adv[k]))
    stats = gather([(len(credits), fallback, n_steps, unmapped, rows)])
    all_rows = [r for s in stats for r in s[4]]
    total, n_fallback, steps, n_unmapped = [sum(s[k] for s in stats) for k in range(4)]
    metrics = {"credit/fallback_rate": n_fallback / total if total else math.nan,
               "credit/unmapped_steps": n_unmapped / steps if steps else math.nan}
    for name, keep in (("matched", True), ("unmatched", False)):
        values = [v for _, m, v in all_rows if m == keep]
        metrics[f"credit/adv_{name}"] = sum(values) / len(values) if values else math.nan
        for k in range(LOGGED_STEP_INDICES):
            values = [v for j, m, v in all_rows if j == k and m == keep]
            metrics[f"credit/step{k + 1}/adv_{name}"] = sum(values) / len(values) if values else math.nan
    return out, {k: v for k, v in metrics.items() if not math.isnan(v)}
