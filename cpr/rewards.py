"""Reward functions for TRL's ``GRPOTrainer``: format, accuracy, step Match F1 and CPR
(docs/method.md section 4), the reward sets of the paper's strategies, and a registry.

Signature, columns and logged metrics: docs/rewards.md, "Using the reward functions in code". Step F1 is
scored by :mod:`cpr.guarded_matching` (``guard: paper`` = the paper's Match F1) with one shared encoder and
one encode call per batch. A parse failure is a low reward; an encoder exception propagates with context.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from cpr.answers import check_answer, check_answer_mode, is_non_answer
from cpr.credit import CompletionCredit
from cpr.errors import ConfigError, CprError
from cpr.guarded_matching import MONITORS, guarded_scores, prompt_pieces
from cpr.matching import StepScores, get_encoder
from cpr.scoring import STEP_FIELDS, ScoringSettings
from cpr.steps import ParsedCompletion, completion_text, parse_completion

#: Metric names passed to TRL's ``log_metric`` (averaged by TRL over a logging step).
LOGGED_METRICS = ("format/valid_rate", "answer/accuracy", "steps/precision", "steps/recall", "steps/match_f1",
                  "steps/lis", "cpr/discrimination", *MONITORS)

_recorder: Callable[[list[dict[str, Any]]], None] | None = None

#: At most this many characters of a completion are recorded (bounds scored_completions.jsonl on long output).
RECORDED_COMPLETION_CHARS = 2000


@contextmanager
def completion_records_paused() -> Iterator[None]:
    """Within the block, scored completions are not recorded (a baseline's extra completions, which are not
    trained on); the recorder set before is restored after it."""
    global _recorder
    saved, _recorder = _recorder, None
    try:
        yield
    finally:
        _recorder = saved


def set_completion_recorder(recorder: Callable[[list[dict[str, Any]]], None] | None) -> None:
    """Install (or remove, with ``None``) a sink that the ``cpr`` and ``step_f1`` functions call once per
    batch with one dict per completion (``step, id, reward_function, reward, correct, match_f1,
    precision, recall, lis, n_pred, format, completion``); the runner writes ``scored_completions.jsonl``
    from it (the ablation tables' Discrimination and r(F1), paper Table 6). ``step`` is the 1-based
    optimizer step the batch trains (TRL's ``global_step`` + 1: the ``step`` of ``log.jsonl``'s row of
    that batch), ``completion`` the completion's text, cut to :data:`RECORDED_COMPLETION_CHARS`
    characters (``completion_chars`` holds its full length)."""
    global _recorder
    _recorder = recorder


def _column(kwargs: Mapping[str, Any], name: str, n: int, default: Any = ..., required: bool = False) -> list:
    """A dataset column aligned with the completions (``default`` repeated when it is missing)."""
    values = kwargs.get(name)
    if values is None:
        if required:
            raise CprError(f"reward function needs the dataset column '{name}' (got columns: "
                           f"{sorted(k for k in kwargs if not k.startswith(('trainer_', 'log_')))})")
        return [default] * n
    if len(values := list(values)) != n:
        raise CprError(f"column '{name}' has {len(values)} values for {n} completions")
    return values


def _parse_all(completions: Sequence[Any]) -> list[ParsedCompletion]:
    return [parse_completion(completion_text(c)) for c in completions]


def _correctness(parsed: Sequence[ParsedCompletion], kwargs: Mapping[str, Any], mode: str) -> list[bool]:
    n = len(parsed)
    columns = zip(parsed, _column(kwargs, "answer", n, required=True), _column(kwargs, "options", n, ()),
                  _column(kwargs, "question", n, ""), strict=True)
    return [check_answer(p.answer, str(a), options=tuple(o or ()), question=str(q or ""), mode=mode).correct
            for p, a, o, q in columns]


def _as_steps(ref: Any, row: int) -> list[str]:
    if isinstance(ref, str) or not isinstance(ref, Sequence):
        raise CprError(f"row {row}: 'reference_steps' must be a list of strings, got {type(ref).__name__}")
    if not (steps := [str(s).strip() for s in ref if str(s).strip()]):
        raise CprError(f"row {row}: 'reference_steps' is empty; the dataset row is invalid")
    return steps


def _step_scores(parsed: Sequence[ParsedCompletion], kwargs: Mapping[str, Any], settings: ScoringSettings,
                 step_credit: list[tuple[float, ...]] | None = None) -> list[StepScores]:
    from accelerate import PartialState

    n = len(parsed)
    refs = [_as_steps(r, i) for i, r in enumerate(_column(kwargs, "reference_steps", n, required=True))]
    prompts = [prompt_pieces(q, o) for q, o in zip(_column(kwargs, "question", n, ""),
                                                   _column(kwargs, "options", n, ()), strict=True)]
    # the trainer's device once accelerate is set up
    device = settings.device or (str(PartialState().device) if PartialState._shared_state else None)
    encoder = get_encoder(settings.encoder, device=device, batch_size=settings.batch_size)
    try:
        scores, monitors = guarded_scores(
            [list(p.steps) for p in parsed], refs, prompts, encoder=encoder, guard=settings.guard,
            threshold=settings.threshold, alpha=settings.alpha, matching=settings.matching, step_credit=step_credit,
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
    if (log_metric := kwargs.get("log_metric")) is not None:
        for name, value in metrics.items():
            if value is not None and math.isfinite(value):
                log_metric(name, float(value))


def _answer_metrics(parsed: Sequence[ParsedCompletion], correct: Sequence[bool]) -> dict[str, float]:
    return {"answer/accuracy": _mean([1.0 if c else 0.0 for c in correct]),
            "hacking/non_answer_rate": _mean([1.0 if p.format == "none" or is_non_answer(p.answer) else 0.0
                                              for p in parsed])}


def _step_metrics(scores: Sequence[StepScores]) -> dict[str, float]:
    metrics = {f"steps/{k}": _mean([getattr(s, k) for s in scores])
               for k in ("precision", "recall", "match_f1", "lis")}
    return {**metrics, "steps/count": _mean([s.n_pred for s in scores]),
            "hacking/precision_minus_recall": _mean([s.precision - s.recall for s in scores])}


def _record(kwargs: Mapping[str, Any], name: str, rewards: Sequence[float], correct: Sequence[bool] | None,
            scores: Sequence[StepScores], parsed: Sequence[ParsedCompletion], completions: Sequence[Any]) -> None:
    if _recorder is None:
        return
    state = kwargs.get("trainer_state")
    step = int(getattr(state, "global_step", 0)) + 1 if state is not None else None
    ids = kwargs.get("id") or [None] * len(rewards)
    texts = [completion_text(c) for c in completions]
    _recorder([{"step": step, "id": ids[i], "reward_function": name, "reward": float(rewards[i]),
                "correct": None if correct is None else bool(correct[i]),
                **{k: getattr(s, k) for k in ("match_f1", "precision", "recall", "lis", "n_pred")},
                "format": parsed[i].format, "completion": texts[i][:RECORDED_COMPLETION_CHARS],
                "completion_chars": len(texts[i])} for i, s in enumerate(scores)])


def _is_number(value: Any) -> bool:
    """Whether a reward function's value is a number (``float(value)`` works and it is not text)."""
    if isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class RewardFunction:
    """Base class: a named, picklable callable with TRL's reward signature (docs/rewards.md, "Writing your
    own reward function"). Subclasses implement :meth:`score`; ``__name__`` is the registry name. A value
    outside ``[low, high]`` or not a number raises ``CprError`` naming the reward; NaN / Inf and ``None``
    pass (``none_count``: the ``None`` of the last call, which the divergence guard reads). A class that
    scores steps sets ``needs_encoder`` (the preflight loads ``rewards.encoder``); one whose constructor
    takes ``**settings`` lists their names in ``settings_fields``.
    """

    name: str = ""
    needs_encoder: ClassVar[bool] = False
    scores_steps: ClassVar[bool] = False  # keeps per-step credit in ``last_credit`` (step-level credit)
    settings_fields: ClassVar[tuple[str, ...]] = ()
    low: float = 0.0
    high: float = 1.0
    none_count: int = 0

    @property
    def __name__(self) -> str:  # TRL's get_callable_name reads __name__
        return self.name

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (),
                 **kwargs: Any) -> list[float | None]:
        rewards = self.score(list(completions), kwargs)
        self.none_count = sum(r is None for r in rewards)
        for i, r in enumerate(rewards):
            if r is None:
                continue
            if not _is_number(r):
                raise CprError(f"reward '{self.name}' produced {r!r} ({type(r).__name__}) for completion {i}; a "
                               "reward is a number or None")
            if math.isfinite(r) and not self.low - 1e-9 <= r <= self.high + 1e-9:  # NaN / Inf: the guard's (guards.nan)
                raise CprError(f"reward '{self.name}' produced {r!r} for completion {i}, outside "
                               f"[{self.low}, {self.high}]")
        if rewards:
            _log(kwargs, {f"rewards/{self.name}/none_frac": self.none_count / len(rewards)})
        return rewards

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float | None]:
        """One reward per completion (``None``: no reward for it), in ``[low, high]``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class FormatReward(RewardFunction):
    """1.0 if the completion is a JSON object with a list of string ``reasoning_steps`` and a string
    ``answer`` (docs/method.md section 4), else 0.0."""

    name = "format"

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        rewards = [1.0 if p.json_valid else 0.0 for p in _parse_all(completions)]
        _log(kwargs, {"format/valid_rate": _mean(rewards)})
        return rewards


class AccuracyReward(RewardFunction):
    """1.0 if the parsed answer is correct (:func:`cpr.answers.check_answer` in ``answer_mode``
    ``"strict"``, the default, or ``"crystal"``), else 0.0."""

    name = "accuracy"

    def __init__(self, answer_mode: str = "strict") -> None:
        self.answer_mode = check_answer_mode(answer_mode, "rewards.answer_mode")

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        correct = _correctness(parsed, kwargs, self.answer_mode)
        _log(kwargs, _answer_metrics(parsed, correct))
        return [1.0 if c else 0.0 for c in correct]


class StepF1Reward(RewardFunction):
    """Step Match F1 against the reference steps (docs/method.md section 2), in [0, 1]; with
    ``ordered=True`` Ordered Match F1 (section 3). ``**settings``: the step fields of
    :class:`cpr.scoring.ScoringSettings` (:data:`cpr.scoring.STEP_FIELDS`); ``settings.guard`` is parsed.

    ``last_credit``: after each call, one :class:`cpr.credit.CompletionCredit` per completion, the reward
    split over the predicted steps and the answer (:meth:`credit_split`); step-level credit reads it."""

    name = "step_f1"
    needs_encoder = True
    settings_fields = STEP_FIELDS
    scores_steps: ClassVar[bool] = True

    def __init__(self, ordered: bool = False, **settings: Any) -> None:
        try:
            given = ScoringSettings(**{k: settings.pop(k) for k in STEP_FIELDS if k in settings})
        except ConfigError as e:
            raise ConfigError(e.message, field=f"rewards.{e.field}") from None
        if settings:
            raise TypeError(f"unexpected keyword argument(s) {sorted(settings)}")
        self.settings = replace(given, guard=given.guard_settings())
        self.ordered = bool(ordered)
        self.last_credit: list[CompletionCredit] = []

    def credit_split(self, correct: bool | None, scores: StepScores) -> tuple[float, float]:
        """``(step_scale, answer_term)`` of one completion: predicted step ``k`` with matched credit ``c_k``
        earns ``step_scale * c_k``, the answer ``answer_term``, and these sum to the reward. Match F1 is
        ``2 sum_k c_k / (n_pred + n_ref)`` (``P = C / n_pred``, ``R = C / n_ref``), so ``step_scale =
        2 / (n_pred + n_ref)``, times ``(1 - alpha) + alpha * LIS`` for Ordered F1; no answer term."""
        scale = 2.0 / (scores.n_pred + scores.n_ref)
        if self.ordered:
            scale *= (1.0 - self.settings.alpha) + self.settings.alpha * scores.lis
        return scale, 0.0

    def _score_steps(self, completions: list[Any], parsed: list[ParsedCompletion], kwargs: Mapping[str, Any],
                     correct: Sequence[bool] | None) -> tuple[list[StepScores], list[float]]:
        """The batch's step scores and F (Match F1 or Ordered F1) of each; sets :attr:`last_credit`."""
        credit: list[tuple[float, ...]] = []
        scores = _step_scores(parsed, kwargs, self.settings, credit)
        self.last_credit = []
        for i, (p, s, c) in enumerate(zip(parsed, scores, credit, strict=True)):
            scale, answer = self.credit_split(None if correct is None else correct[i], s)
            self.last_credit.append(CompletionCredit(
                text=completion_text(completions[i]), format=p.format, steps=p.steps, answer=p.answer,
                step_rewards=tuple(scale * x for x in c), matched=tuple(x > 0.0 for x in c), answer_reward=answer))
        return scores, [s.ordered_f1 if self.ordered else s.match_f1 for s in scores]

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        scores, rewards = self._score_steps(completions, parsed, kwargs, None)
        _log(kwargs, _step_metrics(scores))
        _record(kwargs, self.name, rewards, None, scores, parsed, completions)
        return rewards


def cpr_value(correct: bool, f1: float, answer_weight: float, step_weight: float, wrong_answer_scale: float) -> float:
    """Causal Process Reward of one completion (docs/method.md section 4):
    ``c * (a_w + s_w * F) + (1 - c) * lam * s_w * F``, c in {0, 1}, F in [0, 1]; range [0, a_w + s_w]."""
    c = 1.0 if correct else 0.0
    return c * (answer_weight + step_weight * f1) + (1.0 - c) * wrong_answer_scale * step_weight * f1


class CPRReward(StepF1Reward):
    """Causal Process Reward: answer correctness coupled multiplicatively with step Match F1.

    ``answer_weight`` a_w (0.65, paper Table 6 / curriculum phase 2), ``step_weight`` s_w (0.35),
    ``wrong_answer_scale`` lambda (0.3, official code; 0 = pure multiplicative), ``answer_mode``
    (``"strict"`` or ``"crystal"``), ``ordered`` (Ordered Match F1 for F; the paper: no), ``**settings``
    (:class:`StepF1Reward`). Logs what the other functions log and ``cpr/discrimination``: mean
    CPR of correct minus wrong answers (when both occur).
    """

    name = "cpr"

    def __init__(self, answer_weight: float = 0.65, step_weight: float = 0.35,
                 wrong_answer_scale: float = 0.3, answer_mode: str = "strict", ordered: bool = False,
                 **settings: Any) -> None:
        for key, value in (("answer_weight", answer_weight), ("step_weight", step_weight),
                           ("wrong_answer_scale", wrong_answer_scale)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=f"rewards.cpr.{key}")
        if wrong_answer_scale > 1:
            raise ConfigError(f"must be in [0, 1], got {wrong_answer_scale}", field="rewards.cpr.wrong_answer_scale")
        if answer_weight + step_weight <= 0:
            raise ConfigError("answer_weight + step_weight must be > 0", field="rewards.cpr.answer_weight")
        self.answer_weight = float(answer_weight)
        self.step_weight = float(step_weight)
        self.wrong_answer_scale = float(wrong_answer_scale)
        self.answer_mode = check_answer_mode(answer_mode, "rewards.answer_mode")
        super().__init__(ordered, **settings)
        self.high = self.answer_weight + self.step_weight

    def credit_split(self, correct: bool | None, scores: StepScores) -> tuple[float, float]:
        """As :meth:`StepF1Reward.credit_split` for :func:`cpr_value`: the step part ``(c + (1 - c) lam) s_w F``
        is split over the steps, the answer gets the answer term ``c * a_w``."""
        scale, _ = super().credit_split(correct, scores)
        c = 1.0 if correct else 0.0
        return scale * self.step_weight * (c + (1.0 - c) * self.wrong_answer_scale), c * self.answer_weight

    def score(self, completions: list[Any], kwargs: Mapping[str, Any]) -> list[float]:
        parsed = _parse_all(completions)
        correct = _correctness(parsed, kwargs, self.answer_mode)
        scores, f1 = self._score_steps(completions, parsed, kwargs, correct)
        rewards = [cpr_value(c, f, self.answer_weight, self.step_weight, self.wrong_answer_scale)
                   for c, f in zip(correct, f1, strict=True)]
        metrics = {"format/valid_rate": _mean([1.0 if p.json_valid else 0.0 for p in parsed]),
                   **_answer_metrics(parsed, correct), **_step_metrics(scores)}
        right = [r for r, c in zip(rewards, correct, strict=True) if c]
        wrong = [r for r, c in zip(rewards, correct, strict=True) if not c]
        if right and wrong:
            metrics["cpr/discrimination"] = _mean(right) - _mean(wrong)
        _log(kwargs, metrics)
        _record(kwargs, self.name, rewards, correct, scores, parsed, completions)
        return rewards


#: name -> reward function class
REWARD_FUNCTIONS: dict[str, type[RewardFunction]] = {"format": FormatReward, "accuracy": AccuracyReward,
                                                     "step_f1": StepF1Reward, "cpr": CPRReward}
#: name -> weighted list of (reward function name, default weight): the paper's strategies
REWARD_SETS: dict[str, list[tuple[str, float]]] = {
    "answer_only": [("format", 1.0), ("accuracy", 1.0)],
    "composite": [("format", 1.0), ("accuracy", 1.0), ("step_f1", 1.0)],
    "cpr": [("format", 1.0), ("cpr", 1.0)],
}


def register_reward_function(cls: type[RewardFunction]) -> type[RewardFunction]:
    """Register a :class:`RewardFunction` subclass under ``cls.name`` (usable as a decorator), so
    configs can list it. Raises ``ValueError`` for a missing or taken name."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    if REWARD_FUNCTIONS.get(cls.name, cls) is not cls:
        raise ValueError(f"a reward function named {cls.name!r} is already registered")
    REWARD_FUNCTIONS[cls.name] = cls
    return cls


def import_reward_modules(entries: Sequence[str], *, field: str = "modules") -> list[ModuleType]:
    """Import the modules named by ``entries`` (a config's ``reward_modules``) so that their
    :func:`register_reward_function` calls fill the registry: a path ending in ``.py`` as module
    ``<file stem>`` (its folder is not put on ``sys.path``), anything else by module name from ``sys.path``.
    An entry imported again gives the module already imported.

    Raises:
        ConfigError: field ``<field>[i]``: a file that does not exist, a module not found, or a file whose
            module name is taken by another module.
    """
    modules = []
    for i, entry in enumerate(entries):
        key = f"{field}[{i}]"
        if not entry.endswith(".py"):
            try:
                modules.append(importlib.import_module(entry))
            except ModuleNotFoundError as e:
                if e.name is None or not (entry == e.name or entry.startswith(e.name + ".")):  # a module the entry's own code imports
                    raise
                raise ConfigError(f"no module named {e.name!r} on sys.path (PYTHONPATH); a file is named by its "
                                  "path ending in .py", field=key) from None
            continue
        path = Path(entry).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"no such file: {path}", field=key)
        name, loaded = path.stem, sys.modules.get(path.stem)
        if loaded is not None:
            if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
                modules.append(loaded)
                continue
            raise ConfigError(f"module name {name!r} of {path} is taken by {getattr(loaded, '__file__', None) or loaded!r}; "
                              "rename the file", field=key)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        modules.append(module)
    return modules


def reward_parameters(cls: type[RewardFunction]) -> frozenset[str] | None:
    """The parameter names reward function class ``cls`` takes: its constructor's named parameters and,
    when it takes ``**settings``, its ``settings_fields``; ``None`` when it takes any keyword (a
    ``**kwargs`` without ``settings_fields``)."""
    if cls.__init__ is object.__init__:
        return frozenset()
    sig = inspect.signature(cls.__init__).parameters
    names = {n for n, p in sig.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values()):
        return frozenset(names | set(cls.settings_fields)) if cls.settings_fields else None
    return frozenset(names)


def get_reward_function(name: str, *, shared: Mapping[str, Any] | None = None, **params: Any) -> RewardFunction:
    """Build the reward function registered as ``name`` with ``params`` and the ``shared`` settings it takes
    (of the one ``rewards:`` config section: step settings go to functions that score steps, ``answer_mode``
    to those that check answers).

    Raises:
        ConfigError: unknown name (lists the known ones), a parameter in ``params`` the function does not
            take (field ``rewards.<name>.<parameter>``, listing those it takes) or an invalid one (key named).
    """
    if name not in REWARD_FUNCTIONS:
        raise ConfigError(f"unknown reward function {name!r}; known: {sorted(REWARD_FUNCTIONS)} "
                          f"(weighted sets: {sorted(REWARD_SETS)})", field="rewards")
    cls = REWARD_FUNCTIONS[name]
    takes = reward_parameters(cls)
    if takes is not None:
        for key in sorted(set(params) - takes):
            raise ConfigError(f"reward function {name!r} takes no parameter {key!r}; it takes: "
                              f"{', '.join(sorted(takes)) or 'none'}", field=f"rewards.{name}.{key}")
    given = {k: v for k, v in dict(shared or {}).items() if takes is None or k in takes}
    try:
        return cls(**{**given, **params})
    except TypeError as e:
        raise ConfigError(f"invalid parameter for reward {name!r}: {e}", field=f"rewards.{name}") from None


def get_reward_set(names: str | Sequence[str], weights: Sequence[float] | None = None,
                   params: Mapping[str, Mapping[str, Any]] | None = None,
                   **shared: Any) -> tuple[list[RewardFunction], list[float]]:
    """Reward functions and weights (TRL's ``reward_funcs`` / ``reward_weights``) of ``names`` (a set of
    :data:`REWARD_SETS` or a list of :data:`REWARD_FUNCTIONS` names), with ``weights`` (default: the
    set's, or 1.0 each), per-function ``params`` (``{"cpr": {"answer_weight": 0.65}}``, each a parameter the
    function takes) and ``shared`` settings for the functions that take them (step settings, ``answer_mode``).

    Raises:
        ConfigError: unknown names, a weight count that does not match, negative or non-finite weights, a
            parameter in ``params`` its function does not take (field ``rewards.<function>.<parameter>``).
    """
    if isinstance(names, str):
        if names not in REWARD_SETS:
            raise ConfigError(f"unknown reward set {names!r}; known: {sorted(REWARD_SETS)}", field="rewards")
        func_names, default_weights = [n for n, _ in REWARD_SETS[names]], [w for _, w in REWARD_SETS[names]]
    else:
        func_names, default_weights = list(names), [1.0] * len(names)
    weights = list(default_weights if weights is None else weights)
    if len(weights) != len(func_names):
        raise ConfigError(f"{len(weights)} reward weights for {len(func_names)} reward functions "
                          f"{func_names}", field="reward_weights")
    for i, w in enumerate(weights):
        if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"weight {i} must be a finite number >= 0, got {w!r}", field="reward_weights")
    params = dict(params or {})
    if unknown := set(params) - set(func_names):
        raise ConfigError(f"parameters given for reward functions not in use: {sorted(unknown)}",
                          field="reward_params")
    funcs = [get_reward_function(n, shared=shared, **dict(params.get(n, {}))) for n in func_names]
    return funcs, [float(w) for w in weights]
