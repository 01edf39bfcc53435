"""Dynamic sampling (cpr.training.dynamic_sampling) and the mastery curriculum (CurriculumSampler, schedule
``mastery``): zero-variance groups replaced by fresh prompts' groups, ``max_resample`` as the bound,
the trained batch put together row by row; buckets opening on the online pass rate, p (1 - p) weights,
an exactly resumable state, the same draws on every process."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from cpr.errors import ConfigError, CprError
from cpr.training.config_sections import DynamicSamplingConfig
from cpr.training.curriculum import CurriculumConfig, CurriculumSampler, observation_lag
from cpr.training.dynamic_sampling import (
    DynamicSampling,
    assemble,
    refill,
    slot_keys,
    zero_variance_groups,
)

G = 4  # generations a prompt


def test_zero_variance_is_trls_test_of_the_weighted_rewards():
    totals = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.5, 0.5, float("nan"), 0.5],
                           [2.0, float("nan"), float("nan"), float("nan")]])
    # all equal; spread; equal where scored; one reward only (no deviation, as in TRL: not zero)
    assert zero_variance_groups(totals) == [True, False, True, False]


def test_slot_keys_keep_groups_on_their_process():
    # 4 groups of 4 rows, 8 rows a process: groups 0-1 on process 0, 2-3 on process 1
    assert slot_keys(4, 4, 8) == [("process", 0), ("process", 0), ("process", 1), ("process", 1)]
    # 6 rows a process: group 1 (rows 4-7) is split between processes 0 and 1
    assert slot_keys(3, 4, 6) == [("process", 0), ("slot", 1), ("process", 1)]


def test_refill_takes_informative_groups_of_the_same_key_in_order():
    sources = [(0, i) for i in range(4)]
    keys = [("process", 0), ("process", 0), ("process", 1), ("slot", 3)]
    empty = refill(sources, [0, 2, 3], [True, False, True, False], 1, keys)
    # slot 0 takes round 1's slot 1 (same process); slot 2 finds none on process 1; slot 3 its own position
    assert sources == [(1, 1), (0, 1), (0, 2), (1, 3)] and empty == [2]


class _Sampler:
    """A sampler with a fixed generation batch and fixed fresh rounds (prompt rows)."""

    observes = False

    def __init__(self, batch, fresh):
        self.batch, self.fresh, self.calls = batch, fresh, []

    def generation_batch(self, b):
        return list(self.batch)

    def fresh_prompts(self, b, k):
        self.calls.append(k)
        return list(self.fresh[k - 1])


class _Trainer:
    """The dynamic-sampling loop on a stand-in trainer: ``generate`` gives each row its prompt row as its
    prompt token and the round as its completion width; the reward of prompt ``r`` is ``REWARDS[r]``."""

    def __init__(self, sampler, max_resample, rewards):
        self.curriculum_sampler, self.num_generations, self.rewards = sampler, G, rewards
        self.accelerator = SimpleNamespace(process_index=0, num_processes=1, gather=lambda t: t)
        self.args = SimpleNamespace(generation_batch_size=len(sampler.batch) * G, steps_per_generation=1)
        self.num_iterations, self._step, self.reward_weights = 1, 0, torch.tensor([1.0])
        self.train_dataset = Dataset.from_dict({"id": [f"r{i}" for i in range(12)], "row": list(range(12))})
        self.processing_class = SimpleNamespace(pad_token_id=-1)
        self._metrics = {"train": defaultdict(list)}
        self.mastery_reward, self.mastery_pass = -1, 0.5
        self.sampling = DynamicSampling(self, DynamicSamplingConfig(enabled=True, max_resample=max_resample))
        self.rounds = 0

    def generate(self, inputs):
        self.rounds += 1
        rows = [x["row"] for x in inputs]
        rewards = torch.tensor([[self.rewards[r][i % G]] for i, r in enumerate(rows)])
        self._metrics["train"]["reward"].append(float(self.rounds))
        width = self.rounds  # completions get wider each round: the batch is padded to the widest
        return {"prompt_ids": torch.tensor([[r] for r in rows]), "prompt_mask": torch.ones(len(rows), 1, dtype=torch.long),
                "completion_ids": torch.full((len(rows), width), 7), "completion_mask": torch.ones(len(rows), width),
                "advantages": torch.arange(len(rows), dtype=torch.float32) + 100 * self.rounds,
                "num_items_in_batch": torch.tensor(len(rows) * width)}, rewards

    def generation_batch(self, inputs):
        """CprGRPOTrainer.generation_batch's first two steps: TRL's round, then DynamicSampling.rounds."""
        return self.sampling.rounds(inputs, *self.generate(inputs), self.generate)


FLAT, SPREAD = [1.0] * G, [0.0, 1.0, 0.0, 1.0]
REWARDS = {r: (FLAT if r in (0, 1, 4, 5, 8, 9) else SPREAD) for r in range(12)}


def _run(batch, fresh, max_resample):
    trainer = _Trainer(_Sampler(batch, fresh), max_resample, REWARDS)
    inputs = [trainer.train_dataset[r] for r in batch for _ in range(G)]
    out = trainer.generation_batch(inputs)
    logged = {k.split("/")[1]: v for k, v in trainer._metrics["train"].items() if k.startswith("dynamic_sampling/")}
    trained = out["prompt_ids"][::G, 0].tolist()
    return trainer, out, logged, trained


def test_zero_variance_groups_are_replaced_by_fresh_informative_groups():
    # batch [0, 1, 2, 3]: groups of prompts 0 and 1 have equal rewards; round 1 offers 6 and 7
    trainer, out, logged, trained = _run([0, 1, 2, 3], [[4, 5, 6, 7], [8, 9, 10, 11]], max_resample=2)
    assert trained == [6, 7, 2, 3]  # slot 0 <- 6, slot 1 <- 7, each with all its rows
    assert out["prompt_ids"][:, 0].tolist() == [p for p in (6, 7, 2, 3) for _ in range(G)]
    assert logged == {"dropped_groups": [2.0], "extra_rounds": [1.0], "refilled_groups": [2.0],
                      "frac_zero_std_trained": [0.0]}
    assert trainer.rounds == 2 and trainer.curriculum_sampler.calls == [1]  # no second round needed
    assert trainer._metrics["train"]["reward"] == [1.0]  # TRL's metrics: the first round's
    # widths 1 (round 0) and 2 (round 1): round 0's rows padded on the right with the pad id / mask 0
    assert out["completion_ids"].shape == (16, 2)
    assert out["completion_ids"][8].tolist() == [7, -1] and out["completion_mask"][8].tolist() == [1.0, 0.0]
    assert out["completion_ids"][0].tolist() == [7, 7]
    # advantages come with their rows: round 1's rows 8-15 (prompts 6, 7), round 0's rows 8-15 (prompts 2, 3)
    assert out["advantages"].tolist() == [200.0 + i for i in range(8, 16)] + [100.0 + i for i in range(8, 16)]
    assert int(out["num_items_in_batch"]) == 8 * 2 + 8 * 1
    assert trainer.sampling.totals == {"generation_batches": 1, "groups": 4, "dropped_groups": 2,
                                               "extra_rounds": 1, "refilled_groups": 2}


def test_max_resample_bounds_the_extra_rounds():
    # round 1 offers one informative group (6), round 2 another (7)
    fresh = [[4, 5, 8, 6], [9, 7, 10, 11]]
    trainer, _, logged, trained = _run([0, 1, 2, 3], fresh, max_resample=2)
    assert trained == [6, 7, 2, 3] and logged["extra_rounds"] == [2.0] and logged["refilled_groups"] == [2.0]
    trainer, _, logged, trained = _run([0, 1, 2, 3], fresh, max_resample=1)
    # one round only: prompt 1's zero-variance group stays, the batch keeps its size
    assert trained == [6, 1, 2, 3] and trainer.rounds == 2
    assert logged == {"dropped_groups": [2.0], "extra_rounds": [1.0], "refilled_groups": [1.0],
                      "frac_zero_std_trained": [0.25]}
    trainer, out, logged, trained = _run([0, 1, 2, 3], fresh, max_resample=0)
    assert trained == [0, 1, 2, 3] and trainer.rounds == 1 and logged["extra_rounds"] == [0.0]


def test_a_batch_without_zero_variance_groups_is_trained_as_generated():
    trainer, out, logged, trained = _run([2, 3, 6, 7], [[0, 1, 4, 5]], max_resample=3)
    assert trained == [2, 3, 6, 7] and trainer.rounds == 1 and logged["dropped_groups"] == [0.0]


def test_the_batch_must_be_the_samplers():
    trainer = _Trainer(_Sampler([0, 1, 2, 3], [[4, 5, 6, 7]]), 1, REWARDS)
    inputs = [trainer.train_dataset[r] for r in (0, 1, 2, 4) for _ in range(G)]
    with pytest.raises(CprError, match="not the curriculum sampler's"):
        trainer.generation_batch(inputs)


def test_processes_whose_samplers_differ_stop(monkeypatch):
    import accelerate.utils

    trainer = _Trainer(_Sampler([0, 1, 2, 3], [[4, 5, 6, 7]]), 1, REWARDS)
    trainer.accelerator.num_processes = 2
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda x: [x[0], [0, 1, 2, 5]])
    with pytest.raises(CprError, match="drew different prompts"):
        trainer.sampling._same_on_every_process(0, "prompts", [0, 1, 2, 3])
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda x: [x[0], x[0]])
    trainer.sampling._same_on_every_process(0, "prompts", [0, 1, 2, 3])


def test_assemble_pads_prompts_on_the_left_and_splits_token_type_ids():
    a = {"prompt_ids": torch.tensor([[5, 6], [4, 4]]), "prompt_mask": torch.tensor([[1, 1], [1, 1]]),
         "completion_ids": torch.tensor([[9], [9]]), "token_type_ids": torch.tensor([[1, 1, 0], [1, 1, 0]]),
         "num_images": [1, 1]}
    b = {"prompt_ids": torch.tensor([[3, 3, 3, 3], [0, 5, 6, 7]]), "prompt_mask": torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]),
         "completion_ids": torch.tensor([[1, 1, 1], [8, 8, 8]]),
         "token_type_ids": torch.tensor([[1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0]]), "num_images": [3, 2]}
    out = assemble([a, b], [(0, 0), (1, 1)], pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[0, 0, 5, 6], [0, 5, 6, 7]]
    assert out["prompt_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert out["completion_ids"].tolist() == [[9, 0, 0], [8, 8, 8]]
    assert out["token_type_ids"].tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0]]
    assert out["num_images"] == [1, 2]
    with pytest.raises(CprError, match="cannot split"):
        assemble([{"prompt_ids": torch.zeros(2, 1), "weird": torch.zeros(3)}], [(0, 0), (0, 1)], 0)


def test_dynamic_sampling_settings_are_checked():
    assert DynamicSamplingConfig().enabled is False
    with pytest.raises(ValueError):
        DynamicSamplingConfig(max_resample=-1)
    with pytest.raises(ValueError):
        DynamicSamplingConfig(resample=2)


# ----------------------------------------------------------------------------- mastery curriculum

DIFF = ["easy"] * 6 + ["medium"] * 6 + ["hard"] * 6


def _mastery(lag=1, fresh_rounds=0, **cfg):
    config = CurriculumConfig(schedule="mastery", **{"mastery_window": 4, "mastery_threshold": 0.75, **cfg})
    return CurriculumSampler(DIFF, G, 2, 1, 30, config, seed=11, fresh_rounds=fresh_rounds, observation_lag=lag)


def test_observation_lag_covers_the_trainers_prefetch():
    # one micro-batch a step: batch b is drawn while batch b - 1 is trained; steps_per_generation 3: the next step
    assert observation_lag(1, 1) == 2 and observation_lag(4, 4) == 2 and observation_lag(1, 3) == 1
    assert observation_lag(8, 2) == 8


def test_mastery_opens_the_next_bucket_at_the_threshold():
    s = _mastery()
    assert s.open_buckets == ["easy"]
    b0 = s.generation_batch(0)
    assert all(DIFF[i] == "easy" for i in b0) and len(set(b0)) == 2
    s.observe(0, b0, [1.0, 0.5])  # window of 4 not full: nothing opens
    b1 = s.generation_batch(1)
    assert all(DIFF[i] == "easy" for i in b1) and s.open_buckets == ["easy"]
    s.observe(1, b1, [0.5, 0.75])  # easy's last 4 groups: mean 0.6875 < 0.75
    s.generation_batch(2)
    assert s.open_buckets == ["easy"] and s.online_pass_rates()["easy"] == pytest.approx(0.6875)
    s.observe(2, s.generation_batch(2), [1.0, 1.0])  # last 4: 0.5, 0.75, 1, 1 -> 0.8125
    b3 = s.generation_batch(3)
    assert s.open_buckets == ["easy", "medium"] and s.opened_at == {"easy": 0, "medium": 3}
    assert all(DIFF[i] in ("easy", "medium") for i in b3)
    assert s.bucket_mix(3)["hard"] == 0.0 and s.bucket_mix(3)["medium"] > 0


def test_mastery_weights_prompts_by_p_times_1_minus_p_with_a_floor():
    s = _mastery(mastery_floor=0.001, mastery_window=6, mastery_threshold=1.0)
    s.generation_batch(0)
    s.observe(0, [0, 1, 2, 3, 4, 5], [1.0, 0.0, 1.0, 0.5, 1.0, 0.5])
    # easy prompts: 3 and 5 weigh 0.25, the others 0.001: P(batch 1 = {3, 5}) = 0.25/0.254 x 0.25/0.251
    assert sorted(s.generation_batch(1)) == [3, 5]
    weights = s._mastery_weights()
    assert weights[:6].tolist() == [0.001, 0.001, 0.001, 0.25, 0.001, 0.25]
    assert weights[6:].tolist() == [0.0] * 12
    assert s.bucket_mix(1) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}


def test_mastery_refuses_a_batch_drawn_before_its_rewards_were_seen():
    s = _mastery(lag=1)
    s.generation_batch(0)
    with pytest.raises(RuntimeError, match="drawn before the rewards of batch 0"):
        s.generation_batch(1)


def _drive(s, start, stop, rates):
    """Draw and observe batches ``start..stop-1`` with pass rates ``rates(row)``; their prompts and fresh ones."""
    out = []
    for b in range(start, stop):
        batch = s.generation_batch(b)
        fresh = [s.fresh_prompts(b, k) for k in range(1, s.fresh_rounds + 1)]
        s.observe(b, batch, [rates(i) for i in batch])
        for f in fresh:
            s.observe(b, f, [rates(i) for i in f])
        out.append((batch, fresh))
    return out


def test_mastery_resumes_exactly_from_its_state():
    import json

    rates = lambda i: [1.0, 0.75, 0.5, 0.25][i % 4]  # noqa: E731
    full = _mastery(lag=2, fresh_rounds=1, mastery_window=2, mastery_threshold=0.6)
    order = _drive(full, 0, 12, rates)
    assert full.open_buckets == ["easy", "medium", "hard"]  # the run moves through all buckets

    first = _mastery(lag=2, fresh_rounds=1, mastery_window=2, mastery_threshold=0.6)
    assert _drive(first, 0, 5, rates) == order[:5]
    first.generation_batch(5)  # drawn ahead by the dataloader before the checkpoint
    state = json.loads(json.dumps(first.state_dict(micro_batches_in_epoch=5)))  # through trainer_state.json
    resumed = _mastery(lag=2, fresh_rounds=1, mastery_window=2, mastery_threshold=0.6)
    resumed.load_state_dict(state)
    assert resumed.generation_batch(0) == [0, 1]  # skipped by the Trainer: a stand-in
    assert _drive(resumed, 5, 12, rates) == order[5:]
    assert resumed.opened_at == full.opened_at
    changed = _mastery(lag=2, fresh_rounds=1, mastery_window=3, mastery_threshold=0.6)
    with pytest.raises(ConfigError, match="curriculum_state.config"):
        changed.load_state_dict(state)


def test_two_processes_draw_the_same_prompts():
    """Each process has its own sampler; fed the same (gathered) rewards, they draw the same batches and fresh
    prompts, whatever the timing of their draws."""
    rates = lambda i: (i % 5) / 4  # noqa: E731
    a, b = (_mastery(lag=2, fresh_rounds=2, mastery_window=2, mastery_threshold=0.5) for _ in range(2))
    a.generation_batch(1)  # process 0 draws ahead
    assert _drive(a, 0, 10, rates) == _drive(b, 0, 10, rates)


def test_fresh_prompts_of_the_fixed_schedules_avoid_the_batch_and_follow_its_buckets():
    config = CurriculumConfig(schedule="staged", stage_fractions=(0.5, 0.9))
    s = CurriculumSampler(DIFF, G, 2, 1, 10, config, seed=3, fresh_rounds=2)
    batch = s.generation_batch(0)
    f1, f2 = s.fresh_prompts(0, 1), s.fresh_prompts(0, 2)
    assert all(DIFF[i] == "easy" for i in batch + f1 + f2)
    assert len(set(batch + f1 + f2)) == 6  # six easy prompts: none repeats
    again = CurriculumSampler(DIFF, G, 2, 1, 10, config, seed=3, fresh_rounds=2)
    assert again.fresh_prompts(0, 2) == f2  # fixed by (seed, batch, round)
    assert all(DIFF[i] != "hard" for i in s.fresh_prompts(6, 1))
    with pytest.raises(ValueError, match="outside 1..2"):
        s.fresh_prompts(0, 3)


@pytest.mark.parametrize(("data", "field"), [
    ({"schedule": "mastery", "mastery_threshold": 0}, "curriculum.mastery_threshold"),
    ({"schedule": "mastery", "mastery_window": 0}, "curriculum.mastery_window"),
    ({"schedule": "mastery", "mastery_floor": 0.3}, "curriculum.mastery_floor"),
    ({"schedule": "mastery", "mastery_reward": ""}, "curriculum.mastery_reward"),
])
def test_mastery_settings_are_checked(data, field):
    with pytest.raises(ConfigError) as info:
        CurriculumConfig.from_dict(data)
    assert info.value.field == field
