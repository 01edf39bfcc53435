"""Dynamic sampling for TRL's GRPOTrainer (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2; docs/training.md,
"Dynamic sampling and the mastery curriculum"; docs/method.md section 6 says how this differs from DAPO).

Every process takes the same decisions (rewards gathered before the test) and runs the same number of rounds,
so generation's collective operations (ZeRO-3) stay in step. A replacement comes from the same process: a group
whose rows all lie on one process can be replaced by any informative group of that process, a group split
across processes only by the group at the same position of a later round.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from cpr.errors import CprError
from cpr.training.checkpoints import CheckpointState
from cpr.trl_internals import batch_of, logged_metrics, micro_step, repeat_sampler_shape, rows_of

logger = logging.getLogger("cpr.training")

#: Row tensors padded on the left (prompts) and on the right (completions), with their padding value
#: (``None``: the tokenizer's pad token id); ``*token_type_ids`` cover prompt + completion.
LEFT_PADDED = {"prompt_ids": None, "prompt_mask": 0}
RIGHT_PADDED = {"completion_ids": None, "completion_mask": 0, "old_per_token_logps": 0.0,
                "ref_per_token_logps": 0.0, "sampling_per_token_logps": 0.0, "tool_mask": 1,
                "importance_sampling_ratio": 1.0}
TYPE_IDS = ("token_type_ids", "mm_token_type_ids")


def group_rewards(rewards: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Each completion's weighted reward, ``(rows, functions) @ (functions,)`` with NaN (no reward) counted as
    0 and a row without any reward NaN, as TRL sums them; returned as ``(groups, num_generations)``."""
    total = (rewards * weights.to(rewards.device, rewards.dtype).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(rewards).all(dim=1)] = torch.nan
    return total.view(-1, num_generations)


def zero_variance_groups(totals: torch.Tensor) -> list[bool]:
    """Per group (a row of ``totals``, ``(groups, num_generations)``): whether the unbiased standard deviation of
    its rewards (NaN ignored; undefined below two) is zero, TRL's ``frac_reward_zero_std`` test."""
    count = (~torch.isnan(totals)).sum(dim=1)
    mean = torch.nanmean(totals, dim=1, keepdim=True)
    var = torch.nansum((totals - mean) ** 2, dim=1) / (count - 1).clamp(min=0)
    std = torch.sqrt(var)
    return torch.isclose(std, torch.zeros_like(std)).tolist()


def slot_keys(num_groups: int, num_generations: int, local_rows: int) -> list[Hashable]:
    """Which slots of a generation batch can take each other's groups: a slot (group position) whose
    ``num_generations`` rows all lie on one process (rows ``[p * local_rows, (p + 1) * local_rows)``) gets key
    ``("process", p)``; one split across processes ``("slot", i)``, itself only."""
    keys: list[Hashable] = []
    for i in range(num_groups):
        first, last = i * num_generations // local_rows, ((i + 1) * num_generations - 1) // local_rows
        keys.append(("process", first) if first == last else ("slot", i))
    return keys


def refill(sources: list[tuple[int, int]], empty: list[int], zero: Sequence[bool], round_: int,
           keys: Sequence[Hashable]) -> list[int]:
    """Give the empty slots the informative groups (``zero[j]`` False) of generation round ``round_``, in slot
    order, each to the first empty slot with the same key (:func:`slot_keys`). ``sources[i]`` is slot ``i``'s
    ``(round, slot)`` and is updated in place; returns the slots still empty."""
    candidates: dict[Hashable, list[int]] = {}
    for j, z in enumerate(zero):
        if not z:
            candidates.setdefault(keys[j], []).append(j)
    still: list[int] = []
    for i in empty:
        pool = candidates.get(keys[i])
        if pool:
            sources[i] = (round_, pool.pop(0))
        else:
            still.append(i)
    return still


def _pad(t: torch.Tensor, width: int, value: float | int, left: bool) -> torch.Tensor:
    extra = width - t.size(1)
    if extra <= 0:
        return t
    fill = torch.full((t.size(0), extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if left else [t, fill], dim=1)


def assemble(rounds: Sequence[dict[str, Any]], picks: Sequence[tuple[int, int]], pad_token_id: int) -> dict[str, Any]:
    """The generation batch of ``picks`` (per local row: ``(round, local row)``) from the rounds' outputs, padded to
    the widest round, without ``num_items_in_batch``; :class:`CprError` for a value it cannot split by row."""
    split = [rows_of(r) for r in rounds]
    n = len(picks)
    out: dict[str, Any] = {}
    for key, first in split[0].items():
        if key == "num_items_in_batch" or first is None:
            continue
        values = [s[key] for s in split]
        if isinstance(first, list):
            out[key] = [values[k][i] for k, i in picks]
            continue
        if not isinstance(first, torch.Tensor) or first.ndim == 0 or first.size(0) != n:
            raise CprError(f"dynamic sampling cannot split the generation batch's {key!r} by row "
                           f"({type(first).__name__}{tuple(getattr(first, 'shape', ()))})")
        if key in TYPE_IDS:
            widths = [s["prompt_ids"].size(1) for s in split]
            pw = max(widths)
            cw = max(v.size(1) - w for v, w in zip(values, widths, strict=True))
            values = [torch.cat([_pad(v[:, :w], pw, 0, True), _pad(v[:, w:], cw, 0, False)], dim=1)
                      for v, w in zip(values, widths, strict=True)]
        elif key in LEFT_PADDED or key in RIGHT_PADDED:
            pad = LEFT_PADDED.get(key, RIGHT_PADDED.get(key))
            width = max(v.size(1) for v in values)
            values = [_pad(v, width, pad_token_id if pad is None else pad, key in LEFT_PADDED) for v in values]
        elif first.ndim > 1 and any(v.shape[1:] != first.shape[1:] for v in values):
            raise CprError(f"dynamic sampling cannot join the generation rounds' {key!r}: shapes "
                           f"{[tuple(v.shape) for v in values]}")
        out[key] = torch.stack([values[k][i] for k, i in picks])
    return batch_of(out)


class DynamicSampling(CheckpointState):
    """The curriculum's part of a training generation batch of ``trainer`` (a
    :class:`cpr.training.trainer.CprGRPOTrainer`: its ``curriculum_sampler``, ``mastery_reward`` index and
    ``mastery_pass``), with ``config``, dynamic sampling's (:meth:`rounds`). As a callback it keeps ``totals`` (the
    phase's sums of the logged ``dynamic_sampling/*`` counts) in each checkpoint.
    """

    def __init__(self, trainer: Any, config: Any) -> None:
        self.trainer = trainer
        self.config = config if config is not None and config.enabled else None
        self.totals = dict.fromkeys(("generation_batches", "groups", "dropped_groups", "extra_rounds",
                                     "refilled_groups"), 0)
        self._row_ids: list[Any] | None = None

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"totals": dict(self.totals)}

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        saved = self.saved_state(state)
        if saved is not None:
            self.totals.update({k: int(v) for k, v in saved["totals"].items()})

    def _global_rows(self, prompts: Sequence[int], local_rows: int) -> list[int]:
        """This process's dataset rows of a generation batch of unique ``prompts`` (each ``num_generations`` times)."""
        t = self.trainer
        start = t.accelerator.process_index * local_rows
        return [p for p in prompts for _ in range(t.num_generations)][start:start + local_rows]

    def _observe(self, batch_index: int, prompts: Sequence[int], rewards: torch.Tensor) -> None:
        t = self.trainer
        if not t.curriculum_sampler.observes:
            return
        passed = (rewards[:, t.mastery_reward] >= t.mastery_pass).double()  # NaN (no reward) fails
        rates = passed.view(-1, t.num_generations).mean(dim=1).tolist()
        t.curriculum_sampler.observe(batch_index, list(prompts), rates)

    def _same_on_every_process(self, batch_index: int, what: str, prompts: Sequence[int]) -> None:
        """Raises :class:`CprError` when another process's sampler drew other prompts."""
        if self.trainer.accelerator.num_processes <= 1:
            return
        from accelerate.utils import gather_object

        drawn = gather_object([list(prompts)])
        if any(d != drawn[0] for d in drawn):
            raise CprError(f"generation batch {batch_index}: the processes' samplers drew different {what}: {drawn}")

    def _check_prompts(self, inputs: list[dict[str, Any]], rows: Sequence[int], batch_index: int) -> None:
        dataset = self.trainer.train_dataset
        if "id" not in inputs[0] or "id" not in dataset.column_names:
            return
        if self._row_ids is None:
            self._row_ids = list(dataset["id"])
        got, expected = [x["id"] for x in inputs], [self._row_ids[i] for i in rows]
        if got != expected:
            raise CprError(f"generation batch {batch_index}: the dataloader's prompts {got[:4]}... are not the "
                           f"curriculum sampler's {expected[:4]}...; the sampler and the trainer are out of step")

    def rounds(self, inputs: list[dict[str, Any]], out: dict[str, Any], rewards: torch.Tensor,
               generate: Any) -> dict[str, Any]:
        """The training batch of the generation batch ``inputs`` (this process's rows), whose first round gave
        ``out`` (TRL's batch dict) and ``rewards`` (its gathered ``(processes x rows, reward functions)``
        matrix); ``generate(rows)`` runs a further round, returning the same pair. Hands a ``mastery`` sampler
        each group's pass rate; with dynamic sampling, replaces zero-variance groups by those of extra rounds
        (:func:`refill`). Raises :class:`CprError` when the batch's prompts are not the sampler's, the
        processes' samplers drew different prompts, or a fresh prompt's dataset row has other columns than the
        batch's."""
        t, ds = self.trainer, self.config
        sampler = t.curriculum_sampler
        if sampler is None or (ds is None and not sampler.observes):
            return out
        g, local = t.num_generations, len(inputs)
        batch_index = micro_step(t) // repeat_sampler_shape(t)[2]
        prompts = sampler.generation_batch(batch_index)
        self._same_on_every_process(batch_index, "prompts", prompts)
        self._check_prompts(inputs, self._global_rows(prompts, local), batch_index)
        weights = t.reward_weights
        zero = zero_variance_groups(group_rewards(rewards, weights, g))
        self._observe(batch_index, prompts, rewards)
        if ds is None:
            return out
        metrics = logged_metrics(t)
        marks = {k: len(v) for k, v in metrics.items()}
        keys = slot_keys(len(zero), g, local)
        sources = [(0, i) for i in range(len(zero))]
        empty = [i for i, z in enumerate(zero) if z]
        rounds, zeros = [out], [zero]
        while empty and len(rounds) <= ds.max_resample:
            k = len(rounds)
            fresh = sampler.fresh_prompts(batch_index, k)
            self._same_on_every_process(batch_index, f"fresh prompts (round {k})", fresh)
            fresh_inputs = [t.train_dataset[i] for i in self._global_rows(fresh, local)]
            if set(fresh_inputs[0]) != set(inputs[0]):
                raise CprError(f"a fresh prompt's dataset row has columns {sorted(fresh_inputs[0])}, the generation "
                               f"batch's {sorted(inputs[0])}")
            out_k, rewards_k = generate(fresh_inputs)
            zeros.append(zero_variance_groups(group_rewards(rewards_k, weights, g)))
            self._observe(batch_index, fresh, rewards_k)
            rounds.append(out_k)
            empty = refill(sources, empty, zeros[-1], k, keys)
        for key in list(metrics):  # TRL's metrics keep the first round's values
            if key not in marks:
                del metrics[key]
            else:
                del metrics[key][marks[key]:]
        dropped, extra = sum(zero), len(rounds) - 1
        trained_zero = [zeros[k][j] for k, j in sources]
        counts = {"dropped_groups": dropped, "extra_rounds": extra, "refilled_groups": dropped - len(empty)}
        for name, v in {**counts, "frac_zero_std_trained": sum(trained_zero) / len(trained_zero)}.items():
            metrics[f"dynamic_sampling/{name}"].append(float(v))
        for name, v in {"generation_batches": 1, "groups": len(zero), **counts}.items():
            self.totals[name] += v
        if extra == 0:
            return out
        start = t.accelerator.process_index * local
        picks = []
        for row in range(start, start + local):
            k, j = sources[row // g]
            picks.append((k, j * g + row % g - start))
        batch = assemble(rounds, picks, t.processing_class.tokenizer.pad_token_id
                         if hasattr(t.processing_class, "tokenizer") else t.processing_class.pad_token_id)
        loss_mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
        batch["num_items_in_batch"] = t.accelerator.gather(loss_mask.sum()).sum()
        return batch
