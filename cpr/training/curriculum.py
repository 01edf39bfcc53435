"""CPR-Curriculum: a seeded, resumable easy-to-hard prompt order for TRL's GRPOTrainer (docs/method.md section 6).

:class:`CurriculumSampler` replaces TRL's ``RepeatSampler`` (same GRPO structure and length), picking each
generation batch's prompts from the difficulty buckets the schedule (:class:`CurriculumConfig`) allows at that
point of training. :class:`CurriculumGRPOTrainer` returns it from ``_get_train_sampler`` (:class:`cpr.trl_internals.TrainSamplerHook`), the hook TRL's own
trainers override and its maintainers point to for custom sampling (huggingface/trl#2801; the public
``get_train_dataloader`` would mean copying TRL's). Epoch ``e`` yields generation batches ``[e * B, (e + 1) * B)``
(``B = num_rows // batch_size``) of one global sequence, so a run longer than an epoch continues the curriculum;
on resume the Trainer skips the epoch's consumed micro-batches with accelerate's ``skip_first_batches``, whose
multi-process wrapper does not forward ``set_epoch``, so :class:`CurriculumStateCallback` sets it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler
from trl import GRPOTrainer

from cpr.errors import ConfigError, InputError
from cpr.training.checkpoints import CheckpointState
from cpr.trl_internals import TrainSamplerHook, repeat_sampler_shape

logger = logging.getLogger(__name__)

SCHEDULES: tuple[str, ...] = ("staged", "linear", "none")
STATE_FORMAT = "cpr.curriculum/1"


@dataclass
class CurriculumConfig:
    """Schedule of the CPR-Curriculum (docs/method.md section 6, a **choice** of the project); each field's
    ``metadata["help"]`` says what it does. Validated on construction (:meth:`validate`)."""

    schedule: str = field(default="staged", metadata={"help": (
        "How the prompt mix moves from easy to hard: 'staged' (bucket sets unlocked at fixed fractions of "
        "training), 'linear' (per-bucket sampling weights interpolated from linear_start to linear_end over "
        "training) or 'none' (TRL's seeded permutation, no curriculum).")})
    buckets: tuple[str, ...] = field(default=("easy", "medium", "hard"), metadata={"help": (
        "Difficulty bucket names, easiest first; every value of the dataset's 'difficulty' column must be one.")})
    stage_fractions: tuple[float, ...] = field(default=(0.3, 0.6), metadata={"help": (
        "staged: fractions of training at which the next bucket is added (strictly increasing, each in (0, 1], "
        "one fewer than buckets). The default trains on easy only for the first 30% of generation batches, "
        "easy+medium until 60%, then on all prompts, each stage in the data's own proportions.")})
    linear_start: tuple[float, ...] = field(default=(1.0, 0.0, 0.0), metadata={"help": (
        "linear: per-bucket sampling weights at the start (one per bucket, non-negative, normalised to sum 1).")})
    linear_end: str | tuple[float, ...] = field(default="data", metadata={"help": (
        "linear: per-bucket weights at the end: 'data' (the dataset's own proportions, the mix it is evaluated "
        "on; default), 'uniform' (equal weights, oversamples a rare hard bucket) or one weight per bucket.")})

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
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (tuples become lists); :meth:`from_dict` inverts it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def validate(self) -> None:
        """Check every value the schedule uses; raise :class:`ConfigError` naming ``curriculum.<key>``."""

        def fail(key: str, message: str) -> None:
            raise ConfigError(message, field=f"curriculum.{key}")

        if self.schedule not in SCHEDULES:
            fail("schedule", f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        b = self.buckets
        if not isinstance(b, tuple):
            fail("buckets", f"must be a list of bucket names, got {b!r}")
        if not b:
            fail("buckets", "needs at least one bucket name")
        if not all(isinstance(x, str) and x for x in b):
            fail("buckets", f"bucket names must be non-empty strings, got {list(b)}")
        if len(set(b)) != len(b):
            fail("buckets", f"bucket names must be unique, got {list(b)}")
        fr = self.stage_fractions
        if self.schedule == "staged":
            if not isinstance(fr, tuple) or len(fr) != len(b) - 1:
                fail("stage_fractions",
                     f"needs {len(b) - 1} fractions (one fewer than the {len(b)} buckets), got {fr!r}")
            for x in fr:
                if not _is_number(x) or not 0.0 < x <= 1.0:
                    fail("stage_fractions", f"each fraction must be a number in (0, 1], got {x!r}")
            if any(x >= y for x, y in zip(fr, fr[1:], strict=False)):
                fail("stage_fractions", f"fractions must be strictly increasing, got {list(fr)}")
        if self.schedule == "linear":
            for key in ("linear_start", "linear_end"):
                w = getattr(self, key)
                if key == "linear_end" and isinstance(w, str):
                    if w not in ("data", "uniform"):
                        fail(key, f"unknown value {w!r}; expected 'data', 'uniform' or one weight per bucket")
                    continue
                if not isinstance(w, tuple) or len(w) != len(b):
                    fail(key, f"needs one weight per bucket ({len(b)}), got {w!r}")
                for x in w:
                    if not _is_number(x) or not math.isfinite(x) or x < 0:
                        fail(key, f"weights must be finite and non-negative, got {x!r}")
                if sum(w) <= 0:
                    fail(key, f"weights must not all be zero, got {list(w)}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def total_generation_batches(
    max_steps: int, gradient_accumulation_steps: int, repeat_count: int, batches_per_epoch: int
) -> int:
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
    """One line naming ``phase`` and each bucket of ``config`` that none of the training records'
    ``difficulties`` falls in (with every bucket's count), or ``None``: every bucket has records, or the
    schedule is ``none`` (which ignores buckets). An ``easy -> hard`` schedule over such data never leaves the
    buckets it has (e.g. 28 TabMWP records of grades 3-4: all easy, bucket mix 100/0/0 throughout)."""
    if config.schedule == "none":
        return None
    counts = {b: 0 for b in config.buckets}
    for d in difficulties:
        if d in counts:
            counts[d] += 1
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

    Args:
        difficulties: one bucket name per dataset row; record_ids: row ids, to name a bad row in errors.
        mini_repeat_count, batch_size, repeat_count: as ``RepeatSampler``'s (``num_generations``, unique prompts
            per generation batch, ``num_iterations * steps_per_generation``).
        total_batches: generation batches in the run (:func:`total_generation_batches`; not for ``none``);
            batch ``b`` is drawn at training fraction ``min(b / total_batches, 1)``.
        config: the schedule; seed: seed of the sampler's own ``torch.Generator``.

    The order is a pure function of the arguments, the same on every rank:

    - ``none``: epoch ``e`` is the ``(e+1)``-th ``torch.randperm(num_rows)`` of a generator seeded with
      ``seed``, cut into ``batch_size`` chunks (the tail dropped): what ``RepeatSampler(shuffle=True,
      seed=seed)`` yields on its ``(e+1)``-th iteration.
    - ``staged`` / ``linear``: batch ``b`` gets per-bucket weights (:meth:`bucket_mix`); its slots are split
      among buckets by smooth weighted round-robin (each bucket within about one prompt of its scheduled
      cumulative share); each bucket hands out its prompts in a seeded permutation, refilled when exhausted
      (prompts already in the batch last, so a prompt repeats within a batch only when its pool is smaller
      than the batch); the batch is shuffled. ``staged`` weights are the data's proportions restricted to the
      unlocked buckets. An empty bucket set falls back to the next non-empty one (staged), or an empty
      bucket's weight moves to the next harder non-empty bucket (linear), with a warning.

    Raises:
        InputError: a difficulty that is not a bucket name (names the value, row and id).
        ConfigError: a bad size, a missing ``total_batches``, fewer rows than ``batch_size``.
    """

    def __init__(self, difficulties: Sequence[str], mini_repeat_count: int, batch_size: int, repeat_count: int,
                 total_batches: int | None, config: CurriculumConfig, seed: int,
                 record_ids: Sequence[str] | None = None) -> None:
        for name, value in (("mini_repeat_count", mini_repeat_count), ("batch_size", batch_size),
                            ("repeat_count", repeat_count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if config.schedule != "none" and not (isinstance(total_batches, int) and total_batches >= 1):
            raise ConfigError(f"schedule {config.schedule!r} needs the number of generation batches in the run "
                              f"(a positive integer, derived from max_steps), got {total_batches!r}",
                              field="total_batches")
        self.config, self.seed, self.epoch = config, seed, 0
        self.mini_repeat_count, self.batch_size, self.repeat_count = mini_repeat_count, batch_size, repeat_count
        self.total_batches = total_batches if config.schedule != "none" else None
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
        self._rng = torch.Generator()
        self._rng.manual_seed(seed)
        self._queues: list[deque[int]] = [deque() for _ in config.buckets]
        self._credit = [0.0] * len(config.buckets)
        self._fingerprint: str | None = None
        self.resumed_position: dict[str, Any] | None = None

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
            return stage_sets, None
        if self.config.schedule == "none":
            return stage_sets, None
        start = self._shift_empty(list(self.config.linear_start), "linear_start")
        end = self.config.linear_end
        if end == "data":
            end = [n / self.num_rows for n in sizes]
        else:
            end = self._shift_empty([1.0] * len(names) if end == "uniform" else list(end), "linear_end")
        return stage_sets, ([w / sum(start) for w in start], [w / sum(end) for w in end])

    def _shift_empty(self, weights: list[float], name: str) -> list[float]:
        """Move the weight of empty buckets to the next harder non-empty bucket (else the nearest easier)."""
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
        """Scheduled sampling weight of each bucket for global generation batch ``batch_index`` (sums to 1;
        ``none``: the data's bucket proportions, the expected mix of a random permutation)."""
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
        """Unique prompt indices of global generation batch ``batch_index`` (``batch_size`` of them)."""
        self._extend_to(batch_index + 1)
        return list(self._batches[batch_index])

    def order_for_epoch(self, epoch: int) -> list[int]:
        """Unique prompt indices of epoch ``epoch``, batch after batch (the sampler repeats them)."""
        first = epoch * self.batches_per_epoch
        return [i for b in range(first, first + self.batches_per_epoch) for i in self.generation_batch(b)]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next ``__iter__`` yields (called by the Trainer / accelerate)."""
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
        """The arguments the order depends on (compared on resume)."""
        keys = ("seed", "num_rows", "bucket_sizes", "batch_size", "mini_repeat_count", "repeat_count", "total_batches")
        return {"config": self.config.to_dict(), **{k: getattr(self, k) for k in keys}}

    def fingerprint(self) -> str:
        """``sha256:`` hash of the identity, the per-row buckets and the run's batches (``none``: the first epoch)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(json.dumps(self._identity(), sort_keys=True).encode())
            h.update((",".join(map(str, self._bucket_of)) + "|").encode())
            n = self.total_batches if self.total_batches is not None else self.batches_per_epoch
            self._extend_to(n)
            for batch in self._batches[:n]:
                h.update((",".join(map(str, batch)) + ";").encode())
            self._fingerprint = "sha256:" + h.hexdigest()
        return self._fingerprint

    def state_dict(self, micro_batches_in_epoch: int = 0, epoch: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state: identity, fingerprint and the position after ``micro_batches_in_epoch``
        per-rank dataloader batches of ``epoch`` (default: the current one), what the Trainer skips on resume."""
        epoch = self.epoch if epoch is None else epoch
        batch = epoch * self.batches_per_epoch + micro_batches_in_epoch // self.repeat_count
        position = {"epoch": epoch, "micro_batches_in_epoch": micro_batches_in_epoch, "generation_batch": batch,
                    "training_fraction": self.training_fraction(batch), "bucket_mix": self.bucket_mix(batch)}
        return {"format": STATE_FORMAT, **self._identity(), "batches_per_epoch": self.batches_per_epoch,
                "epoch": epoch, "position": position, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check that ``state`` describes this sampler's order, then restore its epoch; the saved position is
        kept in ``resumed_position``. Raises :class:`ConfigError` (``curriculum_state.<key>``, both values) for
        another format, config, seed, dataset, batch size, run length or fingerprint."""
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(f"unsupported curriculum state format {state.get('format')!r}; expected {STATE_FORMAT!r}",
                              field="curriculum_state.format")
        for key, mine in self._identity().items():
            if state.get(key) != mine:
                raise ConfigError(f"the checkpoint's curriculum has {key}={state.get(key)!r} but this run has "
                                  f"{mine!r}; resuming would not continue the same prompt order",
                                  field=f"curriculum_state.{key}")
        if state.get("fingerprint") != self.fingerprint():
            raise ConfigError(f"the checkpoint's prompt order (fingerprint {state.get('fingerprint')}) differs from "
                              f"this run's ({self.fingerprint()}): same settings but different difficulties or "
                              "library versions", field="curriculum_state.fingerprint")
        self.set_epoch(int(state["epoch"]))
        self.resumed_position = dict(state["position"])


class CurriculumStateCallback(CheckpointState):
    """Keeps ``trainer.curriculum_sampler`` in step with the Trainer: ``on_epoch_begin`` sets its epoch,
    ``on_step_end`` records its state at the position the Trainer would resume from (kept in each checkpoint's
    ``trainer_state.json``, :class:`~cpr.training.checkpoints.CheckpointState`), ``on_train_begin`` of a resumed
    run loads it. Raises :class:`ConfigError` for a checkpoint without the state, or another order."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.curriculum_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"curriculum_state": self.curriculum_state}

    @staticmethod
    def _position(args: Any, state: Any, train_dataloader: Any) -> tuple[int, int]:
        """The epoch and the micro-batches to skip at ``global_step``, as the Trainer computes them."""
        ga, n = args.gradient_accumulation_steps, len(train_dataloader)
        steps_per_epoch = max(n // ga + int(n % ga > 0), 1)
        return state.global_step // steps_per_epoch, (state.global_step % steps_per_epoch) * ga

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        saved = self.saved_state(state)
        if state.global_step <= 0:
            return
        if saved is None or saved.get("curriculum_state") is None:
            raise ConfigError(f"resuming at step {state.global_step} from a checkpoint without curriculum state (it "
                              "was not trained with this curriculum); its prompt order cannot be continued",
                              field="curriculum")
        self.trainer.curriculum_sampler.load_state_dict(saved["curriculum_state"])

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        self.trainer.curriculum_sampler.set_epoch(self._position(args, state, train_dataloader)[0])

    def on_step_end(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        epoch, micro = self._position(args, state, train_dataloader)
        sampler_state = self.trainer.curriculum_sampler.state_dict(micro, epoch=epoch)
        self.curriculum_state = {**sampler_state, "global_step": state.global_step}


class CurriculumGRPOTrainer(TrainSamplerHook, GRPOTrainer):
    """``trl.GRPOTrainer`` whose train sampler is a :class:`CurriculumSampler` (``self.curriculum_sampler``,
    seeded with ``args.seed``) when ``curriculum`` is given, with a :class:`CurriculumStateCallback`.

    Raises:
        ConfigError: ``shuffle_dataset`` False, a train dataset that is not a map-style ``datasets.Dataset``, or
            (when training starts) ``max_steps`` not positive with ``staged`` / ``linear``.
        InputError: no ``difficulty`` column, or an unknown difficulty.
    """

    def __init__(self, *args: Any, curriculum: CurriculumConfig | None = None, **kwargs: Any) -> None:
        self.curriculum = curriculum
        self.curriculum_sampler: CurriculumSampler | None = None
        super().__init__(*args, **kwargs)
        if curriculum is None:
            return
        if not self.args.shuffle_dataset:
            raise ConfigError("must be True with a curriculum (the curriculum always shuffles within buckets)",
                              field="shuffle_dataset")
        if not hasattr(self.train_dataset, "column_names"):
            raise ConfigError("a curriculum needs a map-style datasets.Dataset as train_dataset", field="train_dataset")
        self.add_callback(CurriculumStateCallback(self))

    def train_sampler(self, dataset: Any = None) -> Sampler | None:
        """The :class:`CurriculumSampler` of ``dataset`` (default the train dataset); ``None`` (TRL's
        ``RepeatSampler``) without a curriculum."""
        if self.curriculum is None:
            return None
        source = dataset if dataset is not None else self.train_dataset
        if "difficulty" not in source.column_names and len(source) == len(self.train_dataset):
            source = self.train_dataset  # remove_unused_columns may have dropped the column from `dataset`
        if "difficulty" not in source.column_names:
            raise InputError(f"the training dataset has no 'difficulty' column (columns: {source.column_names})",
                             field="difficulty")
        _, batch_size, repeat_count = repeat_sampler_shape(self)
        total = None
        if self.curriculum.schedule != "none":  # fewer rows than batch_size: the sampler says so
            total = total_generation_batches(self.args.max_steps, self.args.gradient_accumulation_steps,
                                             repeat_count, max(len(source) // batch_size, 1))
        self.curriculum_sampler = CurriculumSampler(
            source["difficulty"], self.num_generations, batch_size, repeat_count, total, self.curriculum,
            self.args.seed, record_ids=source["id"] if "id" in source.column_names else None,
        )
        return self.curriculum_sampler
