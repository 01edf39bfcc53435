"""CPR-Curriculum: a seeded, resumable easy-to-hard prompt order for TRL's GRPOTrainer.

docs/method.md section 6: the sampler moves from easy to hard over training (**choice** of schedule:
``staged`` or ``linear``), keeps GRPO's structure (each prompt repeated ``num_generations``
times within a generation batch, the same order on every rank), is seeded, and resumes exactly.

Pieces:

- :class:`CurriculumConfig`: the schedule (from the ``curriculum`` section of a YAML config).
- :class:`CurriculumSampler`: a drop-in for TRL's ``RepeatSampler`` (``trl/trainer/utils.py``)
  that yields the same GRPO structure but picks the unique prompts of each generation batch
  from the difficulty buckets the schedule allows at that point of training.
- :func:`total_generation_batches`: how many generation batches a run with ``max_steps``
  optimizer steps consumes (mirrors ``transformers.Trainer``'s epoch / step arithmetic).
- :class:`CurriculumGRPOTrainer`: ``trl.GRPOTrainer`` with only ``_get_train_sampler``
  overridden, plus :class:`CurriculumStateCallback`, which keeps the sampler on the right epoch,
  writes ``curriculum_state.json`` into every checkpoint and verifies the order on resume.

How the pieces fit HF Trainer (transformers 5.x, accelerate 1.x, trl 1.x):

- GRPO's train dataloader yields, per rank, one slice of a *generation batch* per micro-step:
  the sampler repeats each generation batch ``repeat_count = num_iterations *
  steps_per_generation`` times, and one global dataloader step takes ``generation_batch_size``
  consecutive indices (``per_device_train_batch_size * steps_per_generation`` on each rank,
  rank r taking the r-th contiguous slice). So a generation batch lasts ``repeat_count``
  micro-steps, and ``gradient_accumulation_steps`` micro-steps make one optimizer step.
- ``len(sampler)`` equals ``RepeatSampler``'s: ``(num_rows // batch_size)`` generation batches per
  epoch. The Trainer derives ``num_train_epochs = ceil(max_steps / steps_per_epoch)`` from it and
  calls ``set_epoch(epoch)`` before each epoch; epoch ``e`` yields generation batches
  ``[e * batches_per_epoch, (e + 1) * batches_per_epoch)`` of one global sequence, so a run
  longer than one pass continues the curriculum instead of restarting at easy.
- On resume the Trainer rebuilds the dataloader, sets the epoch ``global_step // steps_per_epoch``
  and skips ``(global_step % steps_per_epoch) * gradient_accumulation_steps`` batches with
  accelerate's ``skip_first_batches``. The sampler itself never skips. With more than one process,
  accelerate's skipping wrapper does not forward ``set_epoch`` to the sampler, so
  :class:`CurriculumStateCallback` sets it in ``on_epoch_begin`` from the same formula.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from cpr.errors import ConfigError, InputError
from cpr.io import atomic_write_json

logger = logging.getLogger(__name__)

SCHEDULES: tuple[str, ...] = ("staged", "linear", "none")
LINEAR_END_NAMES: tuple[str, ...] = ("data", "uniform")
STATE_FILE_NAME = "curriculum_state.json"
STATE_FORMAT = "cpr.curriculum/1"


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclass
class CurriculumConfig:
    """Schedule of the CPR-Curriculum (docs/method.md section 6, a **choice** of the project).

    Built from the ``curriculum`` mapping of a YAML config with :meth:`from_dict`; every field
    carries its help text in ``metadata["help"]`` (as TRL's configs do). ``validate()`` runs on
    construction.

    Raises:
        ConfigError: a value is invalid; ``field`` is ``"curriculum.<key>"``.
    """

    schedule: str = field(
        default="staged",
        metadata={
            "help": "How the prompt mix moves from easy to hard: 'staged' (bucket sets unlocked at "
            "fixed fractions of training), 'linear' (per-bucket sampling weights interpolated from "
            "linear_start to linear_end over training) or 'none' (TRL's seeded permutation, no "
            "curriculum)."
        },
    )
    buckets: tuple[str, ...] = field(
        default=("easy", "medium", "hard"),
        metadata={
            "help": "Difficulty bucket names, easiest first; every value of the dataset's "
            "'difficulty' column must be one of them."
        },
    )
    stage_fractions: tuple[float, ...] = field(
        default=(0.3, 0.6),
        metadata={
            "help": "staged: fractions of training at which the next bucket is added (strictly "
            "increasing, each in (0, 1], one fewer than buckets). The default trains on easy only "
            "for the first 30% of generation batches, easy+medium until 60%, then on all prompts. "
            "Within a stage prompts are drawn in the data's own proportions."
        },
    )
    linear_start: tuple[float, ...] = field(
        default=(1.0, 0.0, 0.0),
        metadata={
            "help": "linear: per-bucket sampling weights at the start of training (one per bucket, "
            "non-negative, normalised to sum 1). The default starts with easy prompts only."
        },
    )
    linear_end: str | tuple[float, ...] = field(
        default="data",
        metadata={
            "help": "linear: per-bucket sampling weights at the end of training: 'data' (the "
            "dataset's own bucket proportions, so training ends on the mix it is evaluated on; the "
            "default), 'uniform' (equal weight per bucket, oversamples a rare hard bucket) or "
            "explicit weights, one per bucket."
        },
    )

    def __post_init__(self) -> None:
        self.buckets = _as_tuple(self.buckets)
        self.stage_fractions = _as_tuple(self.stage_fractions)
        self.linear_start = _as_tuple(self.linear_start)
        if not isinstance(self.linear_end, str):
            self.linear_end = _as_tuple(self.linear_end)
        self.validate()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, prefix: str = "curriculum") -> CurriculumConfig:
        """Build a config from a YAML mapping (lists become tuples).

        Raises:
            ConfigError: an unknown key (``field="<prefix>.<key>"``) or an invalid value.
        """
        data = {} if data is None else data
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping, got {type(data).__name__}", field=prefix)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ConfigError(f"unknown key; expected one of {', '.join(names)}", field=f"{prefix}.{key}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (tuples become lists); ``from_dict`` inverts it."""
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def validate(self) -> None:
        """Check every value; raise :class:`ConfigError` naming ``curriculum.<key>``.

        Schedule-specific keys (``stage_fractions`` for staged, ``linear_*`` for linear) are
        checked only for their schedule.
        """
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}",
                field="curriculum.schedule",
            )
        if not isinstance(self.buckets, tuple):
            raise ConfigError(
                f"must be a list of bucket names, got {self.buckets!r}", field="curriculum.buckets"
            )
        if not self.buckets:
            raise ConfigError("needs at least one bucket name", field="curriculum.buckets")
        if not all(isinstance(b, str) and b for b in self.buckets):
            raise ConfigError(
                f"bucket names must be non-empty strings, got {list(self.buckets)}",
                field="curriculum.buckets",
            )
        if len(set(self.buckets)) != len(self.buckets):
            raise ConfigError(
                f"bucket names must be unique, got {list(self.buckets)}", field="curriculum.buckets"
            )
        if self.schedule == "staged":
            self._validate_fractions()
        elif self.schedule == "linear":
            self._validate_weights(self.linear_start, "linear_start")
            if isinstance(self.linear_end, str):
                if self.linear_end not in LINEAR_END_NAMES:
                    raise ConfigError(
                        f"unknown value {self.linear_end!r}; expected 'data', 'uniform' or one weight per bucket",
                        field="curriculum.linear_end",
                    )
            else:
                self._validate_weights(self.linear_end, "linear_end")

    def _validate_fractions(self) -> None:
        key = "curriculum.stage_fractions"
        fr = self.stage_fractions
        if not isinstance(fr, tuple) or len(fr) != len(self.buckets) - 1:
            raise ConfigError(
                f"needs {len(self.buckets) - 1} fractions (one fewer than the {len(self.buckets)} buckets), got {fr!r}",
                field=key,
            )
        for x in fr:
            if not _is_number(x) or not (0.0 < x <= 1.0):
                raise ConfigError(f"each fraction must be a number in (0, 1], got {x!r}", field=key)
        for a, b in zip(fr, fr[1:], strict=False):
            if not a < b:
                raise ConfigError(f"fractions must be strictly increasing, got {list(fr)}", field=key)

    def _validate_weights(self, weights: Any, name: str) -> None:
        key = f"curriculum.{name}"
        if not isinstance(weights, tuple) or len(weights) != len(self.buckets):
            raise ConfigError(
                f"needs one weight per bucket ({len(self.buckets)}), got {weights!r}", field=key
            )
        for w in weights:
            if not _is_number(w) or not math.isfinite(w) or w < 0:
                raise ConfigError(f"weights must be finite and non-negative, got {w!r}", field=key)
        if sum(weights) <= 0:
            raise ConfigError(f"weights must not all be zero, got {list(weights)}", field=key)


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# --------------------------------------------------------------------------------------------------
# Step arithmetic
# --------------------------------------------------------------------------------------------------


def total_generation_batches(
    max_steps: int, gradient_accumulation_steps: int, repeat_count: int, batches_per_epoch: int
) -> int:
    """Number of generation batches a GRPO run of ``max_steps`` optimizer steps draws from the sampler.

    Mirrors ``transformers.Trainer.set_initial_training_values`` / ``_run_epoch``: one epoch has
    ``L = batches_per_epoch * repeat_count`` micro-batches per rank (``repeat_count`` =
    ``num_iterations * steps_per_generation`` micro-batches per generation batch) and
    ``S = ceil(L / gradient_accumulation_steps)`` optimizer steps (the last one may use fewer
    micro-batches). ``max_steps = q * S + r`` steps then consume ``q`` whole epochs plus
    ``r * gradient_accumulation_steps`` micro-batches, i.e.
    ``q * batches_per_epoch + ceil(r * gradient_accumulation_steps / repeat_count)`` generation batches.
    With the default ``steps_per_generation == gradient_accumulation_steps`` and one iteration this
    is ``max_steps`` (one generation batch per optimizer step).

    Raises:
        ConfigError: a non-positive argument (``field`` names it; ``max_steps`` for the run length).
    """
    for name, value in (
        ("max_steps", max_steps),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
        ("repeat_count", repeat_count),
        ("batches_per_epoch", batches_per_epoch),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"must be a positive integer to size the curriculum, got {value!r}", field=name)
    steps_per_epoch = max(math.ceil(batches_per_epoch * repeat_count / gradient_accumulation_steps), 1)
    full_epochs, rest = divmod(max_steps, steps_per_epoch)
    return full_epochs * batches_per_epoch + math.ceil(rest * gradient_accumulation_steps / repeat_count)


# --------------------------------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------------------------------


class CurriculumSampler(Sampler[int]):
    """Easy-to-hard drop-in for TRL's ``RepeatSampler`` (same GRPO structure and length).

    Args:
        difficulties: one bucket name per dataset row (the dataset's ``difficulty`` column).
        mini_repeat_count: times each prompt index is repeated consecutively (= ``num_generations``).
        batch_size: unique prompts per generation batch (= ``generation_batch_size // num_generations``).
        repeat_count: times each generation batch is repeated (= ``num_iterations * steps_per_generation``).
        total_batches: generation batches in the whole run (:func:`total_generation_batches`);
            batch ``b`` is drawn at training fraction ``min(b / total_batches, 1)``. Required for
            ``staged`` and ``linear``, ignored by ``none``.
        config: the schedule.
        seed: seed of the sampler's own ``torch.Generator`` (the global RNG is never used).
        record_ids: optional row ids, used only to name a bad row in errors.

    Order (a pure function of the arguments; identical on every rank):

    - ``none``: TRL's behaviour. Epoch ``e`` is the ``(e+1)``-th ``torch.randperm(num_rows)`` of a
      generator seeded with ``seed``, cut into ``batch_size`` chunks (the incomplete tail dropped):
      exactly what ``RepeatSampler(shuffle=True, seed=seed)`` yields on its ``(e+1)``-th iteration.
    - ``staged`` / ``linear``: one global sequence of generation batches. For batch ``b`` the
      schedule gives per-bucket weights (:meth:`bucket_mix`); the ``batch_size`` slots are split
      among buckets by smooth weighted round-robin (so each bucket's realised count stays within
      about one prompt of its scheduled cumulative share), each bucket hands out its prompts
      in a seeded permutation, without replacement until the bucket is exhausted, then refills
      with a fresh permutation (prompts already in the current batch are put last, so a prompt
      repeats within a batch only when its bucket set is smaller than the batch), and the batch
      is shuffled. ``staged`` weights are the data's bucket proportions restricted to the
      unlocked buckets, i.e. prompts of the unlocked pool are drawn uniformly.
    - A bucket set with no records (e.g. stage 1 with no easy prompts) falls back to the next
      non-empty set (staged) or moves that bucket's weight to the next harder non-empty bucket
      (linear), with a logged warning. When the allowed pool is smaller than ``batch_size``,
      prompts repeat (sampling with replacement across passes).
    - ``set_epoch(e)`` selects generation batches ``[e * B, (e + 1) * B)``, ``B = num_rows //
      batch_size``; iteration does not advance the epoch by itself (like ``DistributedSampler``).

    Yields, for each generation batch of the epoch, the batch ``repeat_count`` times, each index
    ``mini_repeat_count`` times in a row (as ``RepeatSampler``).

    Raises:
        InputError: a difficulty value that is not a bucket name (names the value, row and id).
        ConfigError: a bad size, a missing ``total_batches``, fewer rows than ``batch_size``.
    """

    def __init__(
        self,
        difficulties: Sequence[str],
        mini_repeat_count: int,
        batch_size: int,
        repeat_count: int,
        total_batches: int | None,
        config: CurriculumConfig,
        seed: int,
        record_ids: Sequence[str] | None = None,
    ) -> None:
        config.validate()
        for name, value in (
            ("mini_repeat_count", mini_repeat_count),
            ("batch_size", batch_size),
            ("repeat_count", repeat_count),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"must be an integer, got {seed!r}", field="seed")
        if config.schedule != "none" and (
            not isinstance(total_batches, int) or isinstance(total_batches, bool) or total_batches < 1
        ):
            raise ConfigError(
                f"schedule {config.schedule!r} needs the number of generation batches in the run "
                f"(a positive integer, derived from max_steps), got {total_batches!r}",
                field="total_batches",
            )
        self.config = config
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.total_batches = total_batches if config.schedule != "none" else None
        self.seed = seed
        self.epoch = 0

        index = {name: k for k, name in enumerate(config.buckets)}
        self._bucket_of: list[int] = []
        for row, value in enumerate(difficulties):
            if value not in index:
                rid = str(record_ids[row]) if record_ids is not None else None
                raise InputError(
                    f"row {row}: difficulty {value!r} is not one of the curriculum buckets "
                    f"{list(config.buckets)}",
                    record_id=rid,
                    field="difficulty",
                )
            self._bucket_of.append(index[value])
        self.num_rows = len(self._bucket_of)
        if self.num_rows < batch_size:
            raise ConfigError(
                f"the dataset has {self.num_rows} rows, fewer than the {batch_size} unique prompts of one "
                "generation batch (generation_batch_size // num_generations)",
                field="generation_batch_size",
            )
        self.batches_per_epoch = self.num_rows // batch_size
        self._members: list[list[int]] = [[] for _ in config.buckets]
        for row, k in enumerate(self._bucket_of):
            self._members[k].append(row)
        self.bucket_sizes: dict[str, int] = {
            b: len(m) for b, m in zip(config.buckets, self._members, strict=True)
        }

        self._stage_sets, self._linear_ends = self._prepare_schedule()
        # Lazily extended global sequence of generation batches (unique prompt indices).
        self._batches: list[list[int]] = []
        self._rng = torch.Generator()
        self._rng.manual_seed(seed)
        self._queues: list[deque[int]] = [deque() for _ in config.buckets]
        self._credit: list[float] = [0.0 for _ in config.buckets]
        self._fingerprint: str | None = None
        self.resumed_position: dict[str, Any] | None = None

    # ---- schedule ---------------------------------------------------------------------------------

    def _prepare_schedule(self) -> tuple[list[tuple[int, ...]], tuple[list[float], list[float]] | None]:
        sizes = [len(m) for m in self._members]
        names = self.config.buckets
        stage_sets: list[tuple[int, ...]] = []
        linear: tuple[list[float], list[float]] | None = None
        if self.config.schedule == "staged":
            for stage in range(len(names)):
                s = stage
                while sum(sizes[: s + 1]) == 0:
                    s += 1  # the last stage holds every row, so this stops
                if s != stage:
                    logger.warning(
                        "curriculum stage %d (buckets %s) has no records; using buckets %s instead",
                        stage + 1,
                        list(names[: stage + 1]),
                        list(names[: s + 1]),
                    )
                stage_sets.append(tuple(k for k in range(s + 1) if sizes[k] > 0))
        elif self.config.schedule == "linear":
            start = self._shift_empty(list(self.config.linear_start), "linear_start")
            end_spec = self.config.linear_end
            if end_spec == "data":
                end = [sizes[k] / self.num_rows for k in range(len(names))]
            elif end_spec == "uniform":
                end = self._shift_empty([1.0] * len(names), "linear_end")
            else:
                end = self._shift_empty(list(end_spec), "linear_end")
            linear = (_normalise(start), _normalise(end))
        return stage_sets, linear

    def _shift_empty(self, weights: list[float], name: str) -> list[float]:
        """Move the weight of empty buckets to the next harder non-empty bucket (else the nearest easier)."""
        sizes = [len(m) for m in self._members]
        out = [0.0] * len(weights)
        for k, w in enumerate(weights):
            if w == 0 or sizes[k] > 0:
                out[k] += w
                continue
            harder = [j for j in range(k + 1, len(sizes)) if sizes[j] > 0]
            target = harder[0] if harder else max(j for j in range(k) if sizes[j] > 0)
            logger.warning(
                "curriculum bucket %r has no records; its %s weight %g goes to %r",
                self.config.buckets[k],
                name,
                w,
                self.config.buckets[target],
            )
            out[target] += w
        return out

    def training_fraction(self, batch_index: int) -> float:
        """``min(batch_index / total_batches, 1)``; 1.0 for the ``none`` schedule."""
        if self.total_batches is None:
            return 1.0
        return min(batch_index / self.total_batches, 1.0)

    def _weights(self, batch_index: int) -> list[float]:
        sizes = [len(m) for m in self._members]
        if self.config.schedule == "none":
            return [s / self.num_rows for s in sizes]
        f = self.training_fraction(batch_index)
        if self.config.schedule == "staged":
            stage = sum(1 for x in self.config.stage_fractions if f >= x)
            allowed = self._stage_sets[stage]
            total = sum(sizes[k] for k in allowed)
            return [sizes[k] / total if k in allowed else 0.0 for k in range(len(sizes))]
        assert self._linear_ends is not None
        start, end = self._linear_ends
        return [(1.0 - f) * s + f * e for s, e in zip(start, end, strict=True)]

    def bucket_mix(self, batch_index: int) -> dict[str, float]:
        """Scheduled sampling weight of each bucket for global generation batch ``batch_index`` (sums to 1).

        ``none``: the data's bucket proportions (the expected mix of a random permutation).
        """
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        return dict(zip(self.config.buckets, self._weights(batch_index), strict=True))

    # ---- order ------------------------------------------------------------------------------------

    def _extend_to(self, num_batches: int) -> None:
        while len(self._batches) < num_batches:
            if self.config.schedule == "none":
                perm = torch.randperm(self.num_rows, generator=self._rng).tolist()
                for i in range(self.batches_per_epoch):
                    self._batches.append(perm[i * self.batch_size : (i + 1) * self.batch_size])
            else:
                self._batches.append(self._draw_batch(len(self._batches)))

    def _draw_batch(self, batch_index: int) -> list[int]:
        weights = self._weights(batch_index)
        active = [k for k, w in enumerate(weights) if w > 0]
        for k in range(len(weights)):
            if weights[k] <= 0:
                self._credit[k] = 0.0
        picks: list[int] = []
        taken: set[int] = set()
        for _ in range(self.batch_size):
            for k in active:
                self._credit[k] += weights[k]
            best = max(active, key=lambda k: (self._credit[k], -k))  # ties go to the easier bucket
            self._credit[best] -= 1.0
            row = self._next_from(best, taken)
            picks.append(row)
            taken.add(row)
        order = torch.randperm(self.batch_size, generator=self._rng).tolist()
        return [picks[i] for i in order]

    def _next_from(self, bucket: int, taken: set[int]) -> int:
        queue = self._queues[bucket]
        if not queue:
            members = self._members[bucket]
            perm = [members[i] for i in torch.randperm(len(members), generator=self._rng).tolist()]
            queue.extend([r for r in perm if r not in taken] + [r for r in perm if r in taken])
        return queue.popleft()

    def generation_batch(self, batch_index: int) -> list[int]:
        """Unique prompt indices of global generation batch ``batch_index`` (``batch_size`` of them)."""
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        self._extend_to(batch_index + 1)
        return list(self._batches[batch_index])

    def order_for_epoch(self, epoch: int) -> list[int]:
        """Unique prompt indices of epoch ``epoch``, batch after batch (``batches_per_epoch * batch_size``).

        Iterating the sampler after ``set_epoch(epoch)`` yields this list with each batch repeated
        ``repeat_count`` times and each index ``mini_repeat_count`` times.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        first = epoch * self.batches_per_epoch
        self._extend_to(first + self.batches_per_epoch)
        return [i for b in self._batches[first : first + self.batches_per_epoch] for i in b]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch that the next ``__iter__`` yields (called by HF Trainer / accelerate)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        first = self.epoch * self.batches_per_epoch
        self._extend_to(first + self.batches_per_epoch)
        for batch in self._batches[first : first + self.batches_per_epoch]:
            for _ in range(self.repeat_count):
                for index in batch:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        """Indices per epoch; equals ``RepeatSampler``'s length for the same arguments."""
        return self.batches_per_epoch * self.batch_size * self.mini_repeat_count * self.repeat_count

    # ---- resume -----------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        """The arguments the order depends on (compared on resume)."""
        return {
            "config": self.config.to_dict(),
            "seed": self.seed,
            "num_rows": self.num_rows,
            "bucket_sizes": self.bucket_sizes,
            "batch_size": self.batch_size,
            "mini_repeat_count": self.mini_repeat_count,
            "repeat_count": self.repeat_count,
            "total_batches": self.total_batches,
        }

    def fingerprint(self) -> str:
        """``sha256:`` hash of the identity, the per-row buckets and the order of the run's batches.

        Covers generation batches ``[0, total_batches)`` (``none``: the first epoch).
        """
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
        """JSON-serialisable state: identity, fingerprint and position.

        Args:
            micro_batches_in_epoch: per-rank dataloader batches consumed in ``epoch`` (what HF
                Trainer skips on resume: ``(global_step % steps_per_epoch) * gradient_accumulation_steps``).
            epoch: the epoch of that position; defaults to the current ``self.epoch``.

        The position's ``generation_batch`` is ``epoch * batches_per_epoch +
        micro_batches_in_epoch // repeat_count`` (a generation batch lasts ``repeat_count`` micro-batches).
        """
        epoch = self.epoch if epoch is None else epoch
        batch = epoch * self.batches_per_epoch + micro_batches_in_epoch // self.repeat_count
        return {
            "format": STATE_FORMAT,
            **self._identity(),
            "batches_per_epoch": self.batches_per_epoch,
            "epoch": epoch,
            "position": {
                "epoch": epoch,
                "micro_batches_in_epoch": micro_batches_in_epoch,
                "generation_batch": batch,
                "training_fraction": self.training_fraction(batch),
                "bucket_mix": self.bucket_mix(batch),
            },
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Verify that ``state`` describes this sampler's order, then restore its epoch.

        Skipping within the epoch is left to HF Trainer (``skip_first_batches``); the sampler
        always yields whole epochs. The saved position is kept in ``resumed_position``.

        Raises:
            ConfigError: a different format, config, seed, dataset, batch size or run length
                (``field="curriculum_state.<key>"``, naming both values) or a different fingerprint.
        """
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(
                f"unsupported curriculum state format {state.get('format')!r}; expected {STATE_FORMAT!r}",
                field="curriculum_state.format",
            )
        for key, mine in self._identity().items():
            saved = state.get(key)
            if saved != mine:
                raise ConfigError(
                    f"the checkpoint's curriculum has {key}={saved!r} but this run has {mine!r}; "
                    "resuming would not continue the same prompt order",
                    field=f"curriculum_state.{key}",
                )
        if state.get("fingerprint") != self.fingerprint():
            raise ConfigError(
                f"the checkpoint's prompt order (fingerprint {state.get('fingerprint')}) differs from this "
                f"run's ({self.fingerprint()}): same settings but different difficulties or library versions",
                field="curriculum_state.fingerprint",
            )
        self.set_epoch(int(state["epoch"]))
        self.resumed_position = dict(state["position"])


def _normalise(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


# --------------------------------------------------------------------------------------------------
# Trainer integration
# --------------------------------------------------------------------------------------------------


def find_curriculum_sampler(dataloader: Any) -> CurriculumSampler | None:
    """The :class:`CurriculumSampler` inside a (possibly accelerate-wrapped) dataloader, or None.

    Follows ``batch_sampler`` / ``sampler`` attributes (DataLoaderShard -> BatchSamplerShard /
    SkipBatchSampler -> BatchSampler -> sampler).
    """
    frontier = [dataloader]
    for _ in range(6):
        nxt = []
        for obj in frontier:
            if isinstance(obj, CurriculumSampler):
                return obj
            for attr in ("batch_sampler", "sampler"):
                child = getattr(obj, attr, None)
                if child is not None and child is not obj:
                    nxt.append(child)
        frontier = nxt
    return None


def _resume_position(args: Any, state: Any, train_dataloader: Any) -> tuple[int, int]:
    """(epoch, micro-batches to skip) for ``state.global_step``, as ``Trainer._init_training_state`` computes it."""
    ga = args.gradient_accumulation_steps
    steps_per_epoch = max(len(train_dataloader) // ga + int(len(train_dataloader) % ga > 0), 1)
    return state.global_step // steps_per_epoch, (state.global_step % steps_per_epoch) * ga


class CurriculumStateCallback(TrainerCallback, ExportableState):
    """Keeps a :class:`CurriculumSampler` in step with HF Trainer and checkpoints its state.

    - ``on_epoch_begin``: ``sampler.set_epoch(global_step // steps_per_epoch)``, the epoch the
      Trainer is about to run (needed on multi-process resume, where accelerate's
      ``skip_first_batches`` wrapper does not forward ``set_epoch``).
    - ``on_step_end``: refreshes the sampler state for the position Trainer would resume from.
      Through ``ExportableState`` it is stored in ``trainer_state.json`` of each checkpoint.
    - ``on_save``: writes it to ``<output_dir>/checkpoint-<step>/curriculum_state.json``.
    - ``on_train_begin`` of a resumed run (``global_step > 0``): loads the state stored in the
      checkpoint's ``trainer_state.json`` into the sampler, which verifies config, sizes and fingerprint.

    Raises:
        ConfigError: the dataloader has no CurriculumSampler, a resumed checkpoint has no
            curriculum state, or the order differs (from :meth:`CurriculumSampler.load_state_dict`).
        FileNotFoundError: the checkpoint folder to write into does not exist.
    """

    def __init__(self) -> None:
        self.curriculum_state: dict[str, Any] | None = None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"curriculum_state": self.curriculum_state}}

    @staticmethod
    def _sampler(train_dataloader: Any) -> CurriculumSampler:
        sampler = find_curriculum_sampler(train_dataloader)
        if sampler is None:
            raise ConfigError("the train dataloader has no CurriculumSampler", field="curriculum")
        return sampler

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        if state.global_step <= 0:
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[-1]
        curriculum_state = (saved or {}).get("attributes", {}).get("curriculum_state")
        if curriculum_state is None:
            raise ConfigError(
                f"resuming at step {state.global_step} from a checkpoint without curriculum state "
                "(it was not trained with this curriculum); its prompt order cannot be continued",
                field="curriculum",
            )
        self._sampler(train_dataloader).load_state_dict(curriculum_state)

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        epoch, _ = _resume_position(args, state, train_dataloader)
        self._sampler(train_dataloader).set_epoch(epoch)

    def on_step_end(self, args, state, control, train_dataloader=None, **kwargs):  # noqa: D102
        epoch, micro = _resume_position(args, state, train_dataloader)
        self.curriculum_state = self._sampler(train_dataloader).state_dict(micro, epoch=epoch)
        self.curriculum_state["global_step"] = state.global_step

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        if not args.should_save:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"checkpoint folder {folder} not found; cannot write {STATE_FILE_NAME}")
        atomic_write_json(os.path.join(folder, STATE_FILE_NAME), self.curriculum_state)


class CurriculumGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose train sampler is a :class:`CurriculumSampler`.

    Args:
        *args, **kwargs: as ``GRPOTrainer``.
        curriculum: the schedule; ``None`` keeps TRL's ``RepeatSampler`` unchanged.

    With a curriculum, the training dataset must be a map-style ``datasets.Dataset`` with a
    ``difficulty`` column and ``args.shuffle_dataset`` must be True; ``staged`` / ``linear`` need
    ``args.max_steps > 0``. The sampler is built from ``num_generations``,
    ``generation_batch_size // num_generations``, ``num_iterations * steps_per_generation``,
    :func:`total_generation_batches` of ``max_steps`` and ``args.seed``; it is kept in
    ``self.curriculum_sampler``. A :class:`CurriculumStateCallback` is added.

    Raises:
        ConfigError: ``max_steps`` not positive (``field="max_steps"``), ``shuffle_dataset`` False,
            or an iterable train dataset.
        InputError: no ``difficulty`` column, or an unknown difficulty value.
    """

    def __init__(self, *args: Any, curriculum: CurriculumConfig | None = None, **kwargs: Any) -> None:
        self.curriculum = curriculum
        self.curriculum_sampler: CurriculumSampler | None = None
        super().__init__(*args, **kwargs)
        if curriculum is None:
            return
        curriculum.validate()
        if curriculum.schedule != "none" and self.args.max_steps <= 0:
            raise ConfigError(
                f"must be > 0 with the {curriculum.schedule!r} curriculum (the schedule is laid out over "
                f"the run's generation batches), got {self.args.max_steps}",
                field="max_steps",
            )
        if not self.args.shuffle_dataset:
            raise ConfigError(
                "must be True with a curriculum (the curriculum always shuffles within buckets)",
                field="shuffle_dataset",
            )
        if not hasattr(self.train_dataset, "column_names"):
            raise ConfigError(
                "a curriculum needs a map-style datasets.Dataset as train_dataset", field="train_dataset"
            )
        self.add_callback(CurriculumStateCallback())

    def _get_train_sampler(self, dataset: Any = None) -> Sampler:
        if self.curriculum is None:
            return super()._get_train_sampler(dataset)
        source = dataset if dataset is not None else self.train_dataset
        if "difficulty" not in source.column_names and len(source) == len(self.train_dataset):
            source = self.train_dataset  # remove_unused_columns may have dropped the column from `dataset`
        if "difficulty" not in source.column_names:
            raise InputError(
                f"the training dataset has no 'difficulty' column (columns: {source.column_names})",
                field="difficulty",
            )
        batch_size = self.args.generation_batch_size // self.num_generations
        repeat_count = self.num_iterations * self.args.steps_per_generation
        total = None
        if self.curriculum.schedule != "none":
            total = total_generation_batches(
                self.args.max_steps,
                self.args.gradient_accumulation_steps,
                repeat_count,
                max(len(source) // batch_size, 1),  # fewer rows than batch_size: the sampler says so
            )
        ids = source["id"] if "id" in source.column_names else None
        self.curriculum_sampler = CurriculumSampler(
            difficulties=source["difficulty"],
            mini_repeat_count=self.num_generations,
            batch_size=batch_size,
            repeat_count=repeat_count,
            total_batches=total,
            config=self.curriculum,
            seed=self.args.seed,
            record_ids=ids,
        )
        return self.curriculum_sampler
