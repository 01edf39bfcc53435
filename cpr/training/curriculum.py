"""CPR-Curriculum: a seeded, resumable easy-to-hard prompt order for TRL's GRPOTrainer (docs/method.md section 6).

:class:`CurriculumSampler` replaces TRL's ``RepeatSampler``; :class:`cpr.training.trainer.CprGRPOTrainer` returns
it from ``_get_train_sampler`` (:func:`cpr.trl_internals.train_sampler_hook`, the hook TRL's maintainers point to
for custom sampling, huggingface/trl#2801). Epoch ``e`` yields generation batches ``[e * B, (e + 1) * B)``
(``B = num_rows // batch_size``) of one global sequence, so a run longer than an epoch continues the curriculum.
:class:`CurriculumStateCallback` sets the epoch (accelerate's ``skip_first_batches`` does not forward it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler

from cpr.errors import ConfigError, InputError
from cpr.training.checkpoints import CheckpointState

logger = logging.getLogger(__name__)

SCHEDULES: tuple[str, ...] = ("staged", "linear", "mastery", "none")
#: The prior pass rate of a prompt not seen yet (its mastery weight is the largest, p (1 - p) = 0.25).
UNSEEN_PASS_RATE = 0.5
STATE_FORMAT = "cpr.curriculum/1"


@dataclass
class CurriculumConfig:
    """Schedule of the CPR-Curriculum (docs/method.md section 6); fields documented in ``metadata["help"]``."""

    schedule: str = field(default="staged", metadata={"help": (
        "How the prompt mix moves from easy to hard: 'staged' (bucket sets unlocked at stage_fractions of "
        "training), 'linear' (per-bucket weights from linear_start to linear_end), 'mastery' (buckets opened by "
        "the online pass rate; prompts weighted by p (1 - p)) or 'none' (TRL's seeded permutation).")})
    buckets: tuple[str, ...] = field(default=("easy", "medium", "hard"), metadata={"help": (
        "Difficulty bucket names, easiest first; every value of the dataset's 'difficulty' column must be one.")})
    stage_fractions: tuple[float, ...] = field(default=(0.3, 0.6), metadata={"help": (
        "staged: fractions of training (generation batches) at which the next bucket is added (strictly "
        "increasing, each in (0, 1], one fewer than buckets), each stage in the data's own proportions.")})
    linear_start: tuple[float, ...] = field(default=(1.0, 0.0, 0.0), metadata={"help": (
        "linear: per-bucket sampling weights at the start (one per bucket, non-negative, normalised to sum 1).")})
    linear_end: str | tuple[float, ...] = field(default="data", metadata={"help": (
        "linear: per-bucket weights at the end: 'data' (the dataset's own proportions, the mix it is evaluated "
        "on; default), 'uniform' (equal weights, oversamples a rare hard bucket) or one weight per bucket.")})
    mastery_threshold: float = field(default=0.7, metadata={"help": (
        "mastery: the next bucket opens when the hardest open bucket's online pass rate (the mean pass rate of "
        "its last mastery_window groups) reaches this value, in (0, 1].")})
    mastery_window: int = field(default=8, metadata={"help": (
        "mastery: groups (one prompt's num_generations completions) of a bucket its online pass rate averages; "
        "a bucket needs this many before the next one can open.")})
    mastery_floor: float = field(default=0.05, metadata={"help": (
        "mastery: a prompt's sampling weight within the open buckets is max(p (1 - p), floor), p its last "
        "group's pass rate (0.5 unseen), so that mastered and hopeless prompts still come back; in (0, 0.25].")})
    mastery_reward: str | None = field(default=None, metadata={"help": (
        "mastery: the reward function whose value decides whether a completion passes (null: the phase's last "
        "reward function, accuracy in answer_only and cpr in cpr).")})
    mastery_pass: float = field(default=0.5, metadata={"help": (
        "mastery: a completion passes when mastery_reward is at least this value (0.5: a correct answer for "
        "accuracy and for cpr, whose wrong answers score at most lambda x s_w = 0.105).")})

    def __post_init__(self) -> None:
        for name in ("buckets", "stage_fractions", "linear_start", "linear_end"):
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        self.validate()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, prefix: str = "curriculum") -> CurriculumConfig:
        """A config from a YAML mapping; raises :class:`ConfigError` for an unknown key (``<prefix>.<key>``)."""
        data = {} if data is None else data
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping, got {type(data).__name__}", field=prefix)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ConfigError(f"unknown key; expected one of {', '.join(names)}", field=f"{prefix}.{key}")
        try:
            return cls(**data)
        except ConfigError as e:  # validate() names curriculum.<key>
            raise ConfigError(e.message, field=prefix + e.field.removeprefix("curriculum")) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (tuples become lists); :meth:`from_dict` inverts it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def validate(self) -> None:
        """Check every value the schedule uses; raise :class:`ConfigError` naming ``curriculum.<key>``."""

        def check(key: str, ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message, field=f"curriculum.{key}")

        check("schedule", self.schedule in SCHEDULES,
              f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        b = self.buckets
        check("buckets", isinstance(b, tuple), f"must be a list of bucket names, got {b!r}")
        check("buckets", bool(b), "needs at least one bucket name")
        check("buckets", all(isinstance(x, str) and x for x in b),
              f"bucket names must be non-empty strings, got {list(b)}")
        check("buckets", len(set(b)) == len(b), f"bucket names must be unique, got {list(b)}")
        fr = self.stage_fractions
        if self.schedule == "staged":
            check("stage_fractions", isinstance(fr, tuple) and len(fr) == len(b) - 1,
                  f"needs {len(b) - 1} fractions (one fewer than the {len(b)} buckets), got {fr!r}")
            for x in fr:
                check("stage_fractions", _is_number(x) and 0.0 < x <= 1.0,
                      f"each fraction must be a number in (0, 1], got {x!r}")
            check("stage_fractions", all(x < y for x, y in zip(fr, fr[1:], strict=False)),
                  f"fractions must be strictly increasing, got {list(fr)}")
        if self.schedule == "linear":
            for key in ("linear_start", "linear_end"):
                w = getattr(self, key)
                if key == "linear_end" and isinstance(w, str):
                    check(key, w in ("data", "uniform"),
                          f"unknown value {w!r}; expected 'data', 'uniform' or one weight per bucket")
                    continue
                check(key, isinstance(w, tuple) and len(w) == len(b),
                      f"needs one weight per bucket ({len(b)}), got {w!r}")
                for x in w:
                    check(key, _is_number(x) and math.isfinite(x) and x >= 0,
                          f"weights must be finite and non-negative, got {x!r}")
                check(key, sum(w) > 0, f"weights must not all be zero, got {list(w)}")
        if self.schedule == "mastery":
            t, w, f, pr = self.mastery_threshold, self.mastery_window, self.mastery_floor, self.mastery_pass
            check("mastery_threshold", _is_number(t) and 0.0 < t <= 1.0, f"must be a number in (0, 1], got {t!r}")
            check("mastery_window", isinstance(w, int) and not isinstance(w, bool) and w >= 1,
                  f"must be a positive integer, got {w!r}")
            check("mastery_floor", _is_number(f) and 0.0 < f <= 0.25,
                  f"must be a number in (0, 0.25] (p (1 - p) is at most 0.25), got {f!r}")
            check("mastery_pass", _is_number(pr) and math.isfinite(pr), f"must be a finite number, got {pr!r}")
            r = self.mastery_reward
            check("mastery_reward", r is None or (isinstance(r, str) and bool(r)),
                  f"must be a reward function name or null, got {r!r}")

    def identity(self) -> dict[str, Any]:
        """:meth:`to_dict` without ``mastery_*`` unless ``mastery``: what the order depends on (checked on resume)."""
        out = self.to_dict()
        return out if self.schedule == "mastery" else {k: v for k, v in out.items() if not k.startswith("mastery_")}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def derived_seed(*parts: Any) -> int:
    """A 63-bit seed from JSON-serialisable ``parts`` (sha256), the same on every process and platform."""
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:8], "big") >> 1


def weighted_draw(weights: torch.Tensor, n: int, exclude: Sequence[int], seed: int) -> list[int]:
    """``n`` row indices drawn with probabilities proportional to ``weights`` (shape ``(rows,)``, non-negative,
    not all zero), without replacement, by ``torch.multinomial`` on a generator seeded with ``seed``. Rows in
    ``exclude`` are left out when enough others have weight; rows repeat only when fewer than ``n`` have weight."""
    w = weights.clone()
    if exclude:
        kept = w.clone()
        kept[list(exclude)] = 0.0
        if int((kept > 0).sum()) >= n:
            w = kept
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(w, n, replacement=int((w > 0).sum()) < n, generator=g).tolist()


def total_generation_batches(max_steps: int, gradient_accumulation_steps: int, repeat_count: int,
                             batches_per_epoch: int) -> int:
    """Generation batches a GRPO run of ``max_steps`` optimizer steps draws from the sampler, as transformers'
    Trainer counts: an epoch has ``L = batches_per_epoch * repeat_count`` micro-batches per rank and ``S =
    ceil(L / gradient_accumulation_steps)`` optimizer steps; ``max_steps = q * S + r`` consumes ``q *
    batches_per_epoch + ceil(r * gradient_accumulation_steps / repeat_count)``. Raises :class:`ConfigError`
    naming a non-positive argument."""
    for name, value in (("max_steps", max_steps), ("gradient_accumulation_steps", gradient_accumulation_steps),
                        ("repeat_count", repeat_count), ("batches_per_epoch", batches_per_epoch)):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"must be a positive integer to size the curriculum, got {value!r}", field=name)
    steps_per_epoch = max(math.ceil(batches_per_epoch * repeat_count / gradient_accumulation_steps), 1)
    full_epochs, rest = divmod(max_steps, steps_per_epoch)
    return full_epochs * batches_per_epoch + math.ceil(rest * gradient_accumulation_steps / repeat_count)


def empty_buckets_message(config: CurriculumConfig, difficulties: Sequence[str | None], phase: str) -> str | None:
    """A warning naming each bucket of ``config`` that no value of ``difficulties`` falls in, with every
    bucket's count; ``None`` when all have records or the schedule is ``none``."""
    if config.schedule == "none":
        return None
    found = Counter(difficulties)
    counts = {b: found[b] for b in config.buckets}
    empty = [b for b, n in counts.items() if n == 0]
    if not empty:
        return None
    names = ", ".join(repr(b) for b in empty)
    sizes = ", ".join(f"{b} {n}" for b, n in counts.items())
    return (f"phase {phase}: curriculum bucket{'s' if len(empty) > 1 else ''} {names} "
            f"{'have' if len(empty) > 1 else 'has'} no training records ({sizes}); the {config.schedule} schedule "
            "trains on the other buckets only (check data.buckets or the data's difficulty)")


class CurriculumSampler(Sampler[int]):
    """Easy-to-hard drop-in for TRL's ``RepeatSampler`` (same GRPO structure and length).

    ``mini_repeat_count``, ``batch_size``, ``repeat_count``: as ``RepeatSampler``'s (``num_generations``, unique
    prompts per generation batch, ``num_iterations * steps_per_generation``). Batch ``b`` is drawn at training
    fraction ``min(b / total_batches, 1)`` (:func:`total_generation_batches`; not for ``none``).
    ``fresh_rounds``: dynamic sampling's ``max_resample``; ``mastery`` batch ``b`` uses the observations of
    batches ``<= b - observation_lag``.

    The order is a pure function of the arguments, the same on every rank (``none``: as
    ``RepeatSampler(shuffle=True, seed=seed)``). ``staged`` / ``linear`` split each batch's slots among buckets by
    smooth weighted round-robin on :meth:`bucket_mix`; ``mastery``: docs/method.md section 6.

    Raises:
        InputError: a difficulty that is not a bucket name (names the value, row and id).
        ConfigError: a bad size, a missing ``total_batches``, fewer rows than ``batch_size``.
        RuntimeError: ``mastery``: batch ``b`` drawn before batch ``b - observation_lag`` was observed, or an
            observation of a batch older than the last one observed (the trainer's order was not kept).
    """

    def __init__(self, difficulties: Sequence[str], mini_repeat_count: int, batch_size: int, repeat_count: int,
                 total_batches: int | None, config: CurriculumConfig, seed: int,
                 record_ids: Sequence[str] | None = None, fresh_rounds: int = 0, observation_lag: int = 1) -> None:
        for name, value in (("mini_repeat_count", mini_repeat_count), ("batch_size", batch_size),
                            ("repeat_count", repeat_count), ("observation_lag", observation_lag)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if config.schedule != "none" and not (isinstance(total_batches, int) and total_batches >= 1):
            raise ConfigError(f"schedule {config.schedule!r} needs the number of generation batches in the run "
                              f"(a positive integer, derived from max_steps), got {total_batches!r}",
                              field="total_batches")
        self.config, self.seed, self.epoch = config, seed, 0
        self.mini_repeat_count, self.batch_size, self.repeat_count = mini_repeat_count, batch_size, repeat_count
        self.total_batches = total_batches if config.schedule != "none" else None
        if not isinstance(fresh_rounds, int) or isinstance(fresh_rounds, bool) or fresh_rounds < 0:
            raise ConfigError(f"must be a non-negative integer, got {fresh_rounds!r}", field="max_resample")
        self.fresh_rounds, self.observation_lag = fresh_rounds, observation_lag
        index = {name: k for k, name in enumerate(config.buckets)}
        self._bucket_of: list[int] = []
        for row, value in enumerate(difficulties):
            if value not in index:
                rid = None if record_ids is None else str(record_ids[row])
                raise InputError(f"row {row}: difficulty {value!r} is not one of the curriculum buckets "
                                 f"{list(config.buckets)}", record_id=rid, field="difficulty")
            self._bucket_of.append(index[value])
        self.num_rows = len(self._bucket_of)
        if self.num_rows < batch_size:
            raise ConfigError(f"the dataset has {self.num_rows} rows, fewer than the {batch_size} unique prompts of "
                              "one generation batch (generation_batch_size // num_generations)",
                              field="generation_batch_size")
        self.batches_per_epoch = self.num_rows // batch_size
        self._members = [[r for r, b in enumerate(self._bucket_of) if b == k] for k in range(len(config.buckets))]
        self.bucket_sizes = {b: len(m) for b, m in zip(config.buckets, self._members, strict=True)}
        self._sizes = [len(m) for m in self._members]
        self._stage_sets, self._linear_ends = self._prepare_schedule()
        self._batches: list[list[int]] = []  # the global sequence of generation batches, extended lazily
        self._rng = torch.Generator().manual_seed(seed)
        self._queues: list[deque[int]] = [deque() for _ in config.buckets]
        self._credit = [0.0] * len(config.buckets)
        self._fingerprint: str | None = None
        self.resumed_position: dict[str, Any] | None = None
        self._fresh: dict[tuple[int, int], list[int]] = {}
        if config.schedule == "mastery":
            self._init_mastery()

    @property
    def observes(self) -> bool:
        """Whether the order depends on the observed pass rates (``mastery``)."""
        return self.config.schedule == "mastery"

    def _init_mastery(self) -> None:
        n = len(self.config.buckets)
        self._bucket_index = torch.tensor(self._bucket_of, dtype=torch.long)
        self._pass = torch.full((self.num_rows,), math.nan, dtype=torch.float64)
        self._windows: list[deque[float]] = [deque(maxlen=self.config.mastery_window) for _ in range(n)]
        self._open = self._next_open(0)
        self.opened_at: dict[str, int] = {self.config.buckets[k]: 0 for k in range(self._open)}
        self._pending: dict[int, list[tuple[int, float]]] = {}
        self._folded_through = self._observed_through = -1
        self._drawn: dict[int, list[int]] = {}
        self._drawn_fresh: dict[int, list[list[int]]] = {}
        self._mix: dict[int, dict[str, float]] = {}
        self._next_draw = 0

    def _next_open(self, opened: int) -> int:
        """The number of open buckets once the next non-empty bucket after the first ``opened`` opens."""
        k = next((k for k in range(opened, len(self._sizes)) if self._sizes[k]), len(self._sizes))
        return min(k + 1, len(self._sizes))

    def online_pass_rates(self) -> dict[str, float | None]:
        """``mastery``: each bucket's mean pass rate over its last ``mastery_window`` groups (``None``: none yet)."""
        return {b: (sum(w) / len(w) if w else None) for b, w in zip(self.config.buckets, self._windows, strict=True)}

    @property
    def open_buckets(self) -> list[str]:
        """``mastery``: the buckets prompts are drawn from at the latest drawn batch."""
        return list(self.config.buckets[: self._open])

    def _fold_through(self, batch_index: int, drawing: int) -> None:
        """Fold the observations of batches ``<= batch_index`` in, opening buckets from batch ``drawing`` on."""
        cfg = self.config
        for b in sorted(k for k in self._pending if k <= batch_index):
            for row, rate in self._pending.pop(b):
                self._pass[row] = rate
                self._windows[self._bucket_of[row]].append(rate)
            window = self._windows[self._open - 1]
            if (self._open < len(self._sizes) and len(window) == cfg.mastery_window
                    and sum(window) / len(window) >= cfg.mastery_threshold):
                self._open = self._next_open(self._open)
                self.opened_at[cfg.buckets[self._open - 1]] = drawing
                logger.info("mastery curriculum: bucket %r opens at generation batch %d (online pass rate of the "
                            "previous bucket %.3f)", cfg.buckets[self._open - 1], drawing, sum(window) / len(window))
        self._folded_through = max(self._folded_through, batch_index)

    def _mastery_weights(self) -> torch.Tensor:
        """Per-row sampling weights ``max(p (1 - p), floor)`` over the open buckets, 0 elsewhere (float64)."""
        p = torch.where(torch.isnan(self._pass), torch.full_like(self._pass, UNSEEN_PASS_RATE), self._pass)
        w = torch.clamp(p * (1.0 - p), min=self.config.mastery_floor)
        return torch.where(self._bucket_index < self._open, w, torch.zeros_like(w))

    def _mix_of(self, weights: torch.Tensor) -> dict[str, float]:
        total = float(weights.sum())
        return {b: float(weights[self._bucket_index == k].sum()) / total for k, b in enumerate(self.config.buckets)}

    def _draw_mastery(self, batch_index: int) -> None:
        seen = batch_index - self.observation_lag
        if seen > self._observed_through:
            raise RuntimeError(
                f"mastery curriculum: generation batch {batch_index} is drawn before the rewards of batch {seen} "
                f"were observed (last observed: {self._observed_through}); observation_lag "
                f"{self.observation_lag} is too small for this trainer's dataloader")
        self._fold_through(seen, batch_index)
        weights = self._mastery_weights()
        batch = weighted_draw(weights, self.batch_size, (), derived_seed(self.seed, "mastery", batch_index))
        taken, fresh = list(batch), []
        for k in range(1, self.fresh_rounds + 1):
            fresh.append(weighted_draw(weights, self.batch_size, taken,
                                       derived_seed(self.seed, "fresh", batch_index, k)))
            taken += fresh[-1]
        self._drawn[batch_index], self._drawn_fresh[batch_index] = batch, fresh
        self._mix[batch_index] = self._mix_of(weights)

    def observe(self, batch_index: int, rows: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Record each group's prompt row and pass rate for batch ``batch_index`` (a no-op unless ``mastery``).
        Raises ``RuntimeError`` for a batch older than the last observed or already folded in; ``ValueError`` for
        lengths that differ or a rate outside [0, 1]."""
        if not self.observes:
            return
        if batch_index < self._observed_through or batch_index <= self._folded_through:
            raise RuntimeError(f"mastery curriculum: observation of generation batch {batch_index} after batch "
                               f"{max(self._observed_through, self._folded_through)}")
        if len(rows) != len(pass_rates):
            raise ValueError(f"{len(rows)} rows but {len(pass_rates)} pass rates")
        if bad := [r for r in pass_rates if not 0.0 <= r <= 1.0]:
            raise ValueError(f"a pass rate must be in [0, 1], got {bad[0]!r}")
        self._pending.setdefault(batch_index, []).extend((int(i), float(r)) for i, r in zip(rows, pass_rates, strict=True))
        self._observed_through = batch_index

    def fresh_prompts(self, batch_index: int, round_: int) -> list[int]:
        """Prompt indices of extra round ``round_`` of batch ``batch_index``; ``ValueError`` outside 1..fresh_rounds."""
        if not 1 <= round_ <= self.fresh_rounds:
            raise ValueError(f"round {round_} is outside 1..{self.fresh_rounds} (max_resample)")
        if self.observes:
            self.generation_batch(batch_index)
            if batch_index not in self._drawn_fresh:
                raise RuntimeError(f"generation batch {batch_index} precedes the resumed position; no fresh prompts")
            return list(self._drawn_fresh[batch_index][round_ - 1])
        key = (batch_index, round_)
        if key not in self._fresh:
            taken = self.generation_batch(batch_index)
            for k in range(1, round_):
                taken = taken + self.fresh_prompts(batch_index, k)
            per_bucket = self._weights(batch_index)
            w = torch.tensor([per_bucket[b] / self._sizes[b] for b in self._bucket_of], dtype=torch.float64)
            self._fresh[key] = weighted_draw(w, self.batch_size, taken,
                                             derived_seed(self.seed, "fresh", batch_index, round_))
        return list(self._fresh[key])

    def _mastery_state(self, first_batch: int) -> dict[str, Any]:
        keep = sorted(b for b in self._drawn if b >= first_batch)
        return {
            "pass_rate": {str(i): float(self._pass[i]) for i in torch.nonzero(~torch.isnan(self._pass)).flatten().tolist()},
            "windows": [list(w) for w in self._windows], "open": self._open, "opened_at": dict(self.opened_at),
            "pending": {str(b): [list(x) for x in v] for b, v in sorted(self._pending.items())},
            "folded_through": self._folded_through, "observed_through": self._observed_through,
            "next_draw": self._next_draw, "batches": {str(b): list(self._drawn[b]) for b in keep},
            "fresh": {str(b): [list(f) for f in self._drawn_fresh[b]] for b in keep},
            "mix": {str(b): dict(self._mix[b]) for b in keep},
        }

    def _load_mastery(self, state: Mapping[str, Any]) -> None:
        self._init_mastery()
        for i, rate in state["pass_rate"].items():
            self._pass[int(i)] = float(rate)
        for window, saved in zip(self._windows, state["windows"], strict=True):
            window.extend(float(x) for x in saved)
        self._open, self.opened_at = int(state["open"]), {k: int(v) for k, v in state["opened_at"].items()}
        self._pending = {int(b): [(int(i), float(r)) for i, r in v] for b, v in state["pending"].items()}
        self._folded_through, self._observed_through = int(state["folded_through"]), int(state["observed_through"])
        self._next_draw = int(state["next_draw"])
        self._drawn = {int(b): [int(i) for i in v] for b, v in state["batches"].items()}
        self._drawn_fresh = {int(b): [[int(i) for i in f] for f in v] for b, v in state["fresh"].items()}
        self._mix = {int(b): {k: float(x) for k, x in v.items()} for b, v in state["mix"].items()}

    def _prepare_schedule(self) -> tuple[list[tuple[int, ...]], tuple[list[float], list[float]] | None]:
        sizes, names = self._sizes, self.config.buckets
        stage_sets: list[tuple[int, ...]] = []
        if self.config.schedule == "staged":
            for stage in range(len(names)):
                s = stage
                while sum(sizes[: s + 1]) == 0:
                    s += 1  # the last stage holds every row, so this stops
                if s != stage:
                    logger.warning("curriculum stage %d (buckets %s) has no records; using buckets %s instead",
                                   stage + 1, list(names[: stage + 1]), list(names[: s + 1]))
                stage_sets.append(tuple(k for k in range(s + 1) if sizes[k] > 0))
        if self.config.schedule != "linear":
            return stage_sets, None
        start = self._shift_empty(list(self.config.linear_start), "linear_start")
        end = self.config.linear_end
        if end == "data":
            end = [n / self.num_rows for n in sizes]
        else:
            end = self._shift_empty([1.0] * len(names) if end == "uniform" else list(end), "linear_end")
        return stage_sets, ([w / sum(start) for w in start], [w / sum(end) for w in end])

    def _shift_empty(self, weights: list[float], name: str) -> list[float]:
        """Empty buckets' weight moved to the next harder non-empty bucket (else the nearest easier)."""
        sizes, out = self._sizes, [0.0] * len(weights)
        for k, w in enumerate(weights):
            if w == 0 or sizes[k] > 0:
                out[k] += w
                continue
            harder = [j for j in range(k + 1, len(sizes)) if sizes[j] > 0]
            target = harder[0] if harder else max(j for j in range(k) if sizes[j] > 0)
            logger.warning("curriculum bucket %r has no records; its %s weight %g goes to %r",
                           self.config.buckets[k], name, w, self.config.buckets[target])
            out[target] += w
        return out

    def training_fraction(self, batch_index: int) -> float:
        """``min(batch_index / total_batches, 1)``; 1.0 for the ``none`` schedule."""
        return 1.0 if self.total_batches is None else min(batch_index / self.total_batches, 1.0)

    def _weights(self, batch_index: int) -> list[float]:
        sizes = self._sizes
        if self.config.schedule == "none":
            return [s / self.num_rows for s in sizes]
        f = self.training_fraction(batch_index)
        if self.config.schedule == "staged":
            allowed = self._stage_sets[sum(1 for x in self.config.stage_fractions if f >= x)]
            total = sum(sizes[k] for k in allowed)
            return [sizes[k] / total if k in allowed else 0.0 for k in range(len(sizes))]
        start, end = self._linear_ends
        return [(1.0 - f) * s + f * e for s, e in zip(start, end, strict=True)]

    def bucket_mix(self, batch_index: int) -> dict[str, float]:
        """Scheduled sampling weight of each bucket for generation batch ``batch_index`` (sums to 1; ``none``:
        the data's proportions; ``mastery``: the drawn batch's, else the current weights' share)."""
        if self.observes:
            return dict(self._mix[batch_index]) if batch_index in self._mix else self._mix_of(self._mastery_weights())
        return dict(zip(self.config.buckets, self._weights(batch_index), strict=True))

    def _extend_to(self, num_batches: int) -> None:
        while len(self._batches) < num_batches:
            if self.config.schedule == "none":
                perm = torch.randperm(self.num_rows, generator=self._rng).tolist()
                self._batches += [perm[i * self.batch_size: (i + 1) * self.batch_size]
                                  for i in range(self.batches_per_epoch)]
            else:
                self._batches.append(self._draw_batch(len(self._batches)))

    def _draw_batch(self, batch_index: int) -> list[int]:
        weights = self._weights(batch_index)
        active = [k for k, w in enumerate(weights) if w > 0]
        self._credit = [c if w > 0 else 0.0 for c, w in zip(self._credit, weights, strict=True)]
        picks: list[int] = []
        for _ in range(self.batch_size):
            for k in active:
                self._credit[k] += weights[k]
            best = max(active, key=lambda k: (self._credit[k], -k))  # ties go to the easier bucket
            self._credit[best] -= 1.0
            queue = self._queues[best]
            if not queue:
                members = self._members[best]
                perm = [members[i] for i in torch.randperm(len(members), generator=self._rng).tolist()]
                taken = set(picks)
                queue.extend([r for r in perm if r not in taken] + [r for r in perm if r in taken])
            picks.append(queue.popleft())
        return [picks[i] for i in torch.randperm(self.batch_size, generator=self._rng).tolist()]

    def generation_batch(self, batch_index: int) -> list[int]:
        """The ``batch_size`` prompt indices of batch ``batch_index`` (placeholders before a resumed position)."""
        if self.observes:
            while self._next_draw <= batch_index:
                self._draw_mastery(self._next_draw)
                self._next_draw += 1
            return list(self._drawn.get(batch_index, range(self.batch_size)))
        self._extend_to(batch_index + 1)
        return list(self._batches[batch_index])

    def order_for_epoch(self, epoch: int) -> list[int]:
        """Unique prompt indices of epoch ``epoch``, batch after batch."""
        first = epoch * self.batches_per_epoch
        return [i for b in range(first, first + self.batches_per_epoch) for i in self.generation_batch(b)]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next ``__iter__`` yields."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        for b in range(self.epoch * self.batches_per_epoch, (self.epoch + 1) * self.batches_per_epoch):
            batch = self.generation_batch(b)
            for _ in range(self.repeat_count):
                for index in batch:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        """Indices per epoch; equals ``RepeatSampler``'s length for the same arguments."""
        return self.batches_per_epoch * self.batch_size * self.mini_repeat_count * self.repeat_count

    def _identity(self) -> dict[str, Any]:
        keys = ("seed", "num_rows", "bucket_sizes", "batch_size", "mini_repeat_count", "repeat_count", "total_batches")
        extra = {"fresh_rounds": self.fresh_rounds} if self.fresh_rounds else {}
        if self.observes:
            extra["observation_lag"] = self.observation_lag
        return {"config": self.config.identity(), **{k: getattr(self, k) for k in keys}, **extra}

    def fingerprint(self) -> str:
        """``sha256:`` hash of the identity, per-row buckets and the run's batches (``mastery``: none)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(json.dumps(self._identity(), sort_keys=True).encode())
            h.update((",".join(map(str, self._bucket_of)) + "|").encode())
            n = 0 if self.observes else (self.total_batches or self.batches_per_epoch)
            self._extend_to(n)
            for batch in self._batches[:n]:
                h.update((",".join(map(str, batch)) + ";").encode())
            self._fingerprint = "sha256:" + h.hexdigest()
        return self._fingerprint

    def state_dict(self, micro_batches_in_epoch: int = 0, epoch: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state: identity, fingerprint and the position after ``micro_batches_in_epoch``
        per-rank batches of ``epoch`` (default: current); ``mastery`` adds what its draws depend on."""
        epoch = self.epoch if epoch is None else epoch
        batch = epoch * self.batches_per_epoch + micro_batches_in_epoch // self.repeat_count
        position = {"epoch": epoch, "micro_batches_in_epoch": micro_batches_in_epoch, "generation_batch": batch,
                    "training_fraction": self.training_fraction(batch), "bucket_mix": self.bucket_mix(batch)}
        out = {"format": STATE_FORMAT, **self._identity(), "batches_per_epoch": self.batches_per_epoch,
               "epoch": epoch, "position": position, "fingerprint": self.fingerprint()}
        if self.observes:
            position.update(open_buckets=self.open_buckets, online_pass_rate=self.online_pass_rates())
            out["mastery"] = self._mastery_state(batch)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state`` (position kept in ``resumed_position``). Raises :class:`ConfigError`
        (``curriculum_state.<key>``) when it describes another order."""
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(f"unsupported curriculum state format {state.get('format')!r}; expected "
                              f"{STATE_FORMAT!r}", field="curriculum_state.format")
        for key, mine in self._identity().items():
            if state.get(key) != mine:
                raise ConfigError(f"the checkpoint's curriculum has {key}={state.get(key)!r} but this run has "
                                  f"{mine!r}; resuming would not continue the same prompt order",
                                  field=f"curriculum_state.{key}")
        if state.get("fingerprint") != self.fingerprint():
            raise ConfigError(f"the checkpoint's prompt order (fingerprint {state.get('fingerprint')}) differs from "
                              f"this run's ({self.fingerprint()}): same settings but different difficulties or "
                              "library versions", field="curriculum_state.fingerprint")
        if self.observes:
            self._load_mastery(state["mastery"])
        self.set_epoch(int(state["epoch"]))
        self.resumed_position = dict(state["position"])


class CurriculumStateCallback(CheckpointState):
    """Sets ``trainer.curriculum_sampler``'s epoch, saves its state in each checkpoint and loads it on resume.
    Raises :class:`ConfigError` for a checkpoint without the state, or another order."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.curriculum_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"curriculum_state": self.curriculum_state}

    @staticmethod
    def _position(args: Any, state: Any, train_dataloader: Any) -> tuple[int, int]:
        """The epoch and the micro-batches to skip at ``global_step``, as the Trainer computes them."""
        ga = args.gradient_accumulation_steps
        steps_per_epoch = max(math.ceil(len(train_dataloader) / ga), 1)
        return state.global_step // steps_per_epoch, (state.global_step % steps_per_epoch) * ga

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        saved = self.saved_state(state)
        if state.global_step > 0 and (saved or {}).get("curriculum_state") is None:
            raise ConfigError(f"resuming at step {state.global_step} from a checkpoint without curriculum state (it "
                              "was not trained with this curriculum); its prompt order cannot be continued",
                              field="curriculum")
        if saved is not None:
            self.trainer.curriculum_sampler.load_state_dict(saved["curriculum_state"])

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        self.trainer.curriculum_sampler.set_epoch(self._position(args, state, train_dataloader)[0])

    def on_step_end(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        epoch, micro = self._position(args, state, train_dataloader)
        sampler_state = self.trainer.curriculum_sampler.state_dict(micro, epoch=epoch)
        self.curriculum_state = {**sampler_state, "global_step": state.global_step}


def observation_lag(gradient_accumulation_steps: int, repeat_count: int) -> int:
    """Generation batches between a batch's rewards and the first ``mastery`` draw that may use them:
    ``max(1, ceil(2 * gradient_accumulation_steps / repeat_count))``, since transformers' Trainer prefetches an
    optimizer step's micro-batches and accelerate's dataloader one more."""
    return max(1, math.ceil(2 * gradient_accumulation_steps / repeat_count))
