"""Tests of cpr.training.curriculum: schedule, GRPO structure, determinism across ranks, resume, errors.

Fast tests use only the sampler (and accelerate's real dataloader wrappers to simulate HF
Trainer); the slow test trains a tiny Qwen2 causal LM with CprGRPOTrainer (cpr.training.trainer) and a curriculum on CPU.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard, DataLoaderShard, skip_first_batches
from torch.utils.data import BatchSampler, DataLoader
from transformers import TrainerState
from trl.trainer.utils import RepeatSampler

from cpr.errors import ConfigError, InputError
from cpr.training.curriculum import (
    CurriculumConfig,
    CurriculumSampler,
    CurriculumStateCallback,
    empty_buckets_message,
    total_generation_batches,
)

BUCKETS = ("easy", "medium", "hard")


def _difficulties(n_easy: int, n_medium: int, n_hard: int, seed: int = 0) -> list[str]:
    rows = ["easy"] * n_easy + ["medium"] * n_medium + ["hard"] * n_hard
    random.Random(seed).shuffle(rows)  # buckets interleaved in the dataset, as in real data
    return rows


def _sampler(difficulties, *, batch_size=4, mini=2, repeat=1, total=20, seed=3, **cfg) -> CurriculumSampler:
    return CurriculumSampler(
        difficulties,
        mini_repeat_count=mini,
        batch_size=batch_size,
        repeat_count=repeat,
        total_batches=total,
        config=CurriculumConfig(**cfg),
        seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


def test_config_from_dict_round_trip():
    cfg = CurriculumConfig.from_dict(
        {"schedule": "linear", "linear_start": [2, 1, 0], "linear_end": [0, 0, 1]}
    )
    assert cfg.linear_start == (2, 1, 0) and cfg.linear_end == (0, 0, 1)
    assert cfg.stage_fractions == (0.3, 0.6) and cfg.buckets == BUCKETS
    assert CurriculumConfig.from_dict(cfg.to_dict()) == cfg
    assert CurriculumConfig.from_dict(None) == CurriculumConfig()
    for f in CurriculumConfig.__dataclass_fields__.values():
        assert f.metadata["help"]


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (
            {"schedule": "cosine"},
            "curriculum.schedule",
            "unknown schedule 'cosine'; expected one of staged, linear, mastery, none",
        ),
        (
            {"warmup": 3},
            "curriculum.warmup",
            "unknown key; expected one of schedule, buckets, stage_fractions",
        ),
        (
            {"stage_fractions": [0.6, 0.3]},
            "curriculum.stage_fractions",
            "strictly increasing, got [0.6, 0.3]",
        ),
        (
            {"stage_fractions": [0.3, 0.3]},
            "curriculum.stage_fractions",
            "strictly increasing, got [0.3, 0.3]",
        ),
        ({"stage_fractions": [0.0, 0.5]}, "curriculum.stage_fractions", "a number in (0, 1], got 0.0"),
        ({"stage_fractions": [0.3, 1.2]}, "curriculum.stage_fractions", "a number in (0, 1], got 1.2"),
        (
            {"stage_fractions": [0.3]},
            "curriculum.stage_fractions",
            "needs 2 fractions (one fewer than the 3 buckets)",
        ),
        (
            {"schedule": "linear", "linear_start": [1, -0.5, 0]},
            "curriculum.linear_start",
            "non-negative, got -0.5",
        ),
        (
            {"schedule": "linear", "linear_start": [0, 0, 0]},
            "curriculum.linear_start",
            "must not all be zero",
        ),
        ({"schedule": "linear", "linear_end": "hardest"}, "curriculum.linear_end", "unknown value 'hardest'"),
        ({"schedule": "linear", "linear_end": [1, 1]}, "curriculum.linear_end", "one weight per bucket (3)"),
        ({"buckets": ["easy", "easy", "hard"]}, "curriculum.buckets", "must be unique"),
        ({"buckets": []}, "curriculum.buckets", "at least one bucket"),
        ({"buckets": "easy"}, "curriculum.buckets", "must be a list of bucket names, got 'easy'"),
    ],
)
def test_config_errors_name_the_key(data, field, message):
    with pytest.raises(ConfigError) as info:
        CurriculumConfig.from_dict(data)
    assert info.value.field == field
    assert message in str(info.value)
    assert str(info.value).startswith(f"field '{field}': ")


def test_validate_catches_mutation():
    cfg = CurriculumConfig()
    cfg.schedule = "exponential"
    with pytest.raises(ConfigError, match="unknown schedule 'exponential'"):
        cfg.validate()


# --------------------------------------------------------------------------------------------------
# Step arithmetic
# --------------------------------------------------------------------------------------------------


def test_empty_buckets_message_names_the_phase_and_bucket():
    staged, linear = CurriculumConfig(schedule="staged"), CurriculumConfig(schedule="linear")
    assert empty_buckets_message(staged, ["easy", "hard", "easy"], "cpr") == (
        "phase cpr: curriculum bucket 'medium' has no training records (easy 2, medium 0, hard 1); the staged "
        "schedule trains on the other buckets only (check data.buckets or the data's difficulty)")
    assert empty_buckets_message(linear, ["easy"], "p2").startswith(
        "phase p2: curriculum buckets 'medium', 'hard' have no training records (easy 1, medium 0, hard 0); the linear")
    assert empty_buckets_message(staged, ["easy", "medium", "hard"], "cpr") is None
    assert empty_buckets_message(CurriculumConfig(schedule="none"), ["easy"], "cpr") is None  # buckets unused


def test_total_generation_batches_by_hand():
    # Default GRPO (steps_per_generation == gradient_accumulation_steps, one iteration):
    # one generation batch per optimizer step.
    assert total_generation_batches(10, 2, 2, 100) == 10
    # 4 micro-steps per generation batch (num_iterations=2, steps_per_generation=2), GA=1:
    # 10 optimizer steps = 10 micro-steps = ceil(10 / 4) generation batches.
    assert total_generation_batches(10, 1, 4, 100) == 3
    # Epoch crossing with a short last step: 3 batches/epoch, 1 micro-step each, GA=2 ->
    # 2 optimizer steps per epoch (2 + 1 micro-steps). 5 steps = 2 epochs (6 batches) + 1 step (2).
    assert total_generation_batches(5, 2, 1, 3) == 8
    with pytest.raises(ConfigError, match="field 'max_steps': must be a positive integer"):
        total_generation_batches(-1, 2, 2, 100)


# --------------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------------


def test_staged_unlocks_buckets_at_the_fractions():
    diffs = _difficulties(40, 30, 10)
    s = _sampler(diffs, total=20)  # stages change at 0.3 * 20 = 6 and 0.6 * 20 = 12 batches
    names = [[diffs[i] for i in s.generation_batch(b)] for b in range(20)]
    assert all(set(n) == {"easy"} for n in names[:6])
    assert all(set(n) <= {"easy", "medium"} for n in names[6:12])
    counts2 = Counter(x for n in names[6:12] for x in n)
    counts3 = Counter(x for n in names[12:] for x in n)
    # Stage 2 draws from the 70-prompt easy+medium pool uniformly: 24 slots * 40/70 = 13.7 easy.
    assert abs(counts2["easy"] - 24 * 40 / 70) < 1 and abs(counts2["medium"] - 24 * 30 / 70) < 1
    # Stage 3 is the data's own mix 0.5 / 0.375 / 0.125 over 32 slots.
    assert counts3 == Counter({"easy": 16, "medium": 12, "hard": 4})
    # Stage 1: 24 slots from 40 easy prompts, without replacement within the pass.
    first = [i for b in range(6) for i in s.generation_batch(b)]
    assert len(set(first)) == 24
    assert s.bucket_mix(5) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert s.bucket_mix(6) == pytest.approx({"easy": 40 / 70, "medium": 30 / 70, "hard": 0.0})
    assert s.bucket_mix(12) == pytest.approx({"easy": 0.5, "medium": 0.375, "hard": 0.125})
    assert s.bucket_mix(500) == s.bucket_mix(19)  # past the end: fraction clipped to 1


def test_linear_mix_moves_monotonically_toward_hard():
    diffs = _difficulties(500, 400, 100)
    total, bs, windows = 400, 8, 10
    s = _sampler(diffs, batch_size=bs, total=total, schedule="linear", linear_end="uniform")
    assert s.bucket_mix(0) == {"easy": 1.0, "medium": 0.0, "hard": 0.0}
    assert s.bucket_mix(200) == pytest.approx({"easy": 2 / 3, "medium": 1 / 6, "hard": 1 / 6})
    measured = []
    for w in range(windows):
        batches = range(w * total // windows, (w + 1) * total // windows)
        counts = Counter(diffs[i] for b in batches for i in s.generation_batch(b))
        freq = {k: counts[k] / (len(batches) * bs) for k in BUCKETS}
        # By hand: weight(f) = (1 - f) * (1, 0, 0) + f * (1/3, 1/3, 1/3) with f = b / total.
        mean_f = sum(b / total for b in batches) / len(batches)
        assert freq["easy"] == pytest.approx(1 - 2 * mean_f / 3, abs=0.01)
        assert freq["hard"] == pytest.approx(mean_f / 3, abs=0.01)
        measured.append(freq)
    assert all(a["hard"] < b["hard"] for a, b in zip(measured, measured[1:], strict=False))
    assert all(a["easy"] > b["easy"] for a, b in zip(measured, measured[1:], strict=False))


def test_linear_default_end_is_the_data_mix():
    diffs = _difficulties(50, 40, 10)
    s = _sampler(diffs, total=10, schedule="linear")
    assert s.bucket_mix(5) == pytest.approx({"easy": 0.75, "medium": 0.2, "hard": 0.05})
    assert s.bucket_mix(10) == pytest.approx({"easy": 0.5, "medium": 0.4, "hard": 0.1})


# --------------------------------------------------------------------------------------------------
# GRPO structure and TRL parity
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["staged", "linear", "none"])
def test_grpo_grouping(schedule):
    diffs = _difficulties(12, 9, 6)
    mini, bs, rep = 3, 4, 2
    s = _sampler(diffs, mini=mini, batch_size=bs, repeat=rep, total=6, schedule=schedule)
    s.set_epoch(1)
    out = list(s)
    block = bs * mini * rep
    assert len(out) == len(s) == (27 // bs) * block
    for j in range(len(out) // block):
        expected = [
            i for _ in range(rep) for i in s.generation_batch(s.batches_per_epoch + j) for _ in range(mini)
        ]
        assert out[j * block : (j + 1) * block] == expected
        assert len(set(s.generation_batch(s.batches_per_epoch + j))) == bs  # no duplicate within a batch


@pytest.mark.parametrize(("n", "bs", "mini", "rep"), [(7, 3, 2, 4), (24, 4, 2, 1), (25, 5, 3, 2)])
def test_none_equals_trl_repeat_sampler(n, bs, mini, rep):
    diffs = _difficulties(n - n // 2, n // 2, 0)
    trl_sampler = RepeatSampler(
        list(range(n)), mini_repeat_count=mini, batch_size=bs, repeat_count=rep, seed=42
    )
    ours = _sampler(diffs, mini=mini, batch_size=bs, repeat=rep, total=None, seed=42, schedule="none")
    assert len(ours) == len(trl_sampler)
    for epoch in range(3):  # RepeatSampler's generator advances once per iteration
        ours.set_epoch(epoch)
        assert list(ours) == list(trl_sampler)


@pytest.mark.parametrize("schedule", ["staged", "linear"])
def test_len_equals_repeat_sampler(schedule):
    for n, bs in [(10, 3), (27, 4), (8, 8)]:
        s = _sampler(_difficulties(n - 2, 1, 1), batch_size=bs, mini=2, repeat=3, schedule=schedule)
        assert len(s) == len(RepeatSampler(list(range(n)), 2, bs, 3))


def test_two_ranks_see_one_global_order():
    # GRPO on 2 ranks: per_device_train_batch_size=2, steps_per_generation=2, num_generations=2 ->
    # generation_batch_size = 8, 4 unique prompts per generation batch, repeat_count = 2, and each
    # dataloader batch holds per_device * steps_per_generation = 4 indices.
    diffs = _difficulties(20, 15, 5)
    per_rank = []
    for rank in range(2):
        s = _sampler(diffs, batch_size=4, mini=2, repeat=2, total=15)  # a fresh instance per rank
        s.set_epoch(1)
        shard = BatchSamplerShard(BatchSampler(s, 4, drop_last=False), num_processes=2, process_index=rank)
        per_rank.append((s, list(shard)))
    (s0, b0), (s1, b1) = per_rank
    assert s0.order_for_epoch(1) == s1.order_for_epoch(1)
    assert s0.fingerprint() == s1.fingerprint()
    s0.set_epoch(1)
    global_order = list(s0)
    # Global step t is rank 0's t-th batch followed by rank 1's: one copy of a generation batch.
    assert [i for x, y in zip(b0, b1, strict=True) for i in x + y] == global_order
    assert b0[0] == [i for i in s0.generation_batch(10)[:2] for _ in range(2)]
    assert b1[0] == [i for i in s0.generation_batch(10)[2:] for _ in range(2)]


def test_order_independent_of_global_rng():
    diffs = _difficulties(20, 15, 5)
    torch.manual_seed(0)
    random.seed(0)
    a = _sampler(diffs, total=15).order_for_epoch(0)
    torch.manual_seed(123)
    random.seed(123)
    torch.rand(10)
    assert _sampler(diffs, total=15).order_for_epoch(0) == a
    assert _sampler(diffs, total=15, seed=4).order_for_epoch(0) != a


def test_later_epochs_continue_the_curriculum():
    diffs = _difficulties(8, 8, 8)
    s = _sampler(diffs, batch_size=4, total=20)  # 6 batches per epoch, a run of 3 1/3 epochs
    assert s.batches_per_epoch == 6
    epochs = [[diffs[i] for i in s.order_for_epoch(e)] for e in range(3)]
    assert set(epochs[0]) == {"easy"}  # batches 0-5: fraction < 0.3 (0.3 * 20 = 6)
    assert Counter(epochs[1]) == Counter({"easy": 12, "medium": 12})  # batches 6-11: fraction < 0.6
    assert s.order_for_epoch(1) == [i for b in range(6, 12) for i in s.generation_batch(b)]
    assert Counter(epochs[2]) == Counter({"easy": 8, "medium": 8, "hard": 8})


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


def test_empty_first_bucket_falls_back_with_warning(caplog):
    diffs = _difficulties(0, 10, 10)
    with caplog.at_level(logging.WARNING, logger="cpr.training.curriculum"):
        s = _sampler(diffs, total=10)
    assert (
        "curriculum stage 1 (buckets ['easy']) has no records; using buckets ['easy', 'medium']"
        in caplog.text
    )
    for b in range(6):  # stages 1 and 2 both become "medium only"
        assert {diffs[i] for i in s.generation_batch(b)} == {"medium"}
    assert s.bucket_mix(0) == {"easy": 0.0, "medium": 1.0, "hard": 0.0}
    assert s.bucket_mix(6) == {"easy": 0.0, "medium": 0.5, "hard": 0.5}

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cpr.training.curriculum"):
        lin = _sampler(diffs, total=10, schedule="linear", linear_end=[0.0, 0.0, 1.0])
    assert "bucket 'easy' has no records; its linear_start weight 1 goes to 'medium'" in caplog.text
    assert lin.bucket_mix(0) == {"easy": 0.0, "medium": 1.0, "hard": 0.0}
    assert lin.bucket_mix(5) == pytest.approx({"easy": 0.0, "medium": 0.5, "hard": 0.5})


def test_pool_smaller_than_batch_repeats_prompts():
    diffs = ["easy", "easy"] + ["medium"] * 10 + ["hard"] * 4
    s = _sampler(diffs, batch_size=4, total=10)
    for b in range(3):
        assert Counter(s.generation_batch(b)) == Counter({0: 2, 1: 2})


def test_bad_inputs_name_value_and_row():
    with pytest.raises(InputError) as info:
        CurriculumSampler(
            ["easy", "hard", "expert"], 2, 1, 1, 5, CurriculumConfig(), 0, record_ids=["a", "b", "c"]
        )
    assert str(info.value) == (
        "(id c) field 'difficulty': row 2: difficulty 'expert' is not one of the curriculum buckets "
        "['easy', 'medium', 'hard']"
    )
    with pytest.raises(InputError, match="row 1: difficulty None is not one of"):
        CurriculumSampler(["easy", None], 2, 1, 1, 5, CurriculumConfig(), 0)
    with pytest.raises(ConfigError, match="field 'total_batches': schedule 'staged' needs the number"):
        CurriculumSampler(["easy"] * 4, 2, 2, 1, None, CurriculumConfig(), 0)
    with pytest.raises(
        ConfigError, match="field 'generation_batch_size': the dataset has 3 rows, fewer than the 4"
    ):
        CurriculumSampler(["easy"] * 3, 2, 4, 1, 5, CurriculumConfig(), 0)
    with pytest.raises(ConfigError, match="field 'mini_repeat_count': must be a positive integer, got 0"):
        CurriculumSampler(["easy"] * 3, 0, 1, 1, 5, CurriculumConfig(), 0)


# --------------------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------------------


def _prepared_loader(sampler, n, batch_size):
    return Accelerator(cpu=True).prepare(DataLoader(list(range(n)), sampler=sampler, batch_size=batch_size))


@pytest.mark.parametrize("schedule", ["staged", "linear", "none"])
def test_resume_from_state_dict_continues_identically(schedule):
    diffs = _difficulties(20, 15, 5)
    kw = dict(batch_size=4, mini=2, repeat=2, total=25, schedule=schedule)
    original = _sampler(diffs, **kw)
    # Single process: a dataloader batch is one copy of a generation batch (generation_batch_size = 8).
    loader = _prepared_loader(original, len(diffs), 8)
    loader.set_epoch(1)  # what Trainer._run_epoch does
    uninterrupted = [b.tolist() for b in loader]
    k = 7  # micro-batches trained in epoch 1 before the checkpoint
    state = json.loads(json.dumps(original.state_dict(micro_batches_in_epoch=k)))
    assert state["epoch"] == 1 and state["position"]["generation_batch"] == 10 + 7 // 2

    resumed = _sampler(diffs, **kw)  # rebuilt by get_train_dataloader in the resumed run
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and resumed.resumed_position == state["position"]
    skipped = skip_first_batches(_prepared_loader(resumed, len(diffs), 8), k)
    skipped.set_epoch(1)
    assert [b.tolist() for b in skipped] == uninterrupted[k:]


def test_multi_process_resume_needs_the_restored_epoch():
    # With 2 processes accelerate's skip_first_batches wrapper does not forward set_epoch to the
    # sampler (SkipBatchSampler -> BatchSamplerShard has no `sampler`); the epoch must come from
    # load_state_dict / CurriculumStateCallback.on_epoch_begin.
    diffs = _difficulties(20, 15, 5)
    kw = dict(batch_size=4, mini=2, repeat=2, total=25)

    def rank_loader(sampler, rank):
        shard = BatchSamplerShard(
            BatchSampler(sampler, 4, drop_last=False), num_processes=2, process_index=rank
        )
        return DataLoaderShard(list(range(len(diffs))), batch_sampler=shard)

    for rank in range(2):
        original = _sampler(diffs, **kw)
        loader = rank_loader(original, rank)
        loader.set_epoch(1)
        expected = [b.tolist() for b in loader][3:]

        plain = _sampler(diffs, **kw)
        skipped = skip_first_batches(rank_loader(plain, rank), 3)
        skipped.set_epoch(1)
        assert plain.epoch == 0  # not forwarded: the known accelerate gap
        assert [b.tolist() for b in skipped] != expected

        resumed = _sampler(diffs, **kw)
        resumed.load_state_dict(original.state_dict(micro_batches_in_epoch=3, epoch=1))
        skipped = skip_first_batches(rank_loader(resumed, rank), 3)
        skipped.set_epoch(1)
        assert [b.tolist() for b in skipped] == expected


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(seed=4), "curriculum_state.seed"),
        (dict(total=30), "curriculum_state.total_batches"),
        (dict(batch_size=5), "curriculum_state.batch_size"),
        (dict(stage_fractions=(0.2, 0.6)), "curriculum_state.config"),
    ],
)
def test_load_state_dict_rejects_another_order(change, field):
    diffs = _difficulties(20, 15, 5)
    kw = dict(batch_size=4, mini=2, repeat=2, total=25)
    state = _sampler(diffs, **kw).state_dict()
    with pytest.raises(ConfigError) as info:
        _sampler(diffs, **{**kw, **change}).load_state_dict(state)
    assert info.value.field == field
    assert "resuming would not continue the same prompt order" in str(info.value)


def test_load_state_dict_rejects_other_difficulties_with_same_sizes():
    diffs = _difficulties(20, 15, 5)
    swapped = list(diffs)
    i, j = diffs.index("easy"), diffs.index("hard")
    swapped[i], swapped[j] = swapped[j], swapped[i]
    state = _sampler(diffs, total=25).state_dict()
    with pytest.raises(
        ConfigError, match="field 'curriculum_state.fingerprint': the checkpoint's prompt order"
    ):
        _sampler(swapped, total=25).load_state_dict(state)


def test_callback_tracks_epoch_writes_and_verifies_state(tmp_path: Path):
    diffs = _difficulties(20, 15, 5)
    kw = dict(batch_size=4, mini=2, repeat=2, total=25)
    sampler = _sampler(diffs, **kw)
    loader = _prepared_loader(sampler, len(diffs), 8)  # 10 generation batches x 2 repeats per epoch
    args = SimpleNamespace(gradient_accumulation_steps=4, output_dir=str(tmp_path), should_save=True)
    cb = CurriculumStateCallback(SimpleNamespace(curriculum_sampler=sampler))
    # 20 micro-batches, GA 4 -> 5 optimizer steps per epoch; step 6 is epoch 1 after 1 step (4 micro-batches).
    assert len(loader) == 20
    state = TrainerState(global_step=6)
    cb.on_epoch_begin(args, state, None, train_dataloader=loader)
    assert sampler.epoch == 1
    cb.on_step_end(args, state, None, train_dataloader=loader)
    saved = cb.curriculum_state
    assert saved["position"] == {
        "epoch": 1,
        "micro_batches_in_epoch": 4,
        "generation_batch": 10 + 2,
        "training_fraction": 12 / 25,
        "bucket_mix": sampler.bucket_mix(12),
    }
    # A checkpoint keeps it in trainer_state.json (transformers' ExportableState) and a resumed run gets it back.
    TrainerState(global_step=6, stateful_callbacks=[cb]).save_to_json(str(tmp_path / "trainer_state.json"))
    loaded = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    assert loaded.stateful_callbacks["CurriculumStateCallback"]["attributes"]["curriculum_state"] == saved
    resumed = _sampler(diffs, **kw)
    CurriculumStateCallback(SimpleNamespace(curriculum_sampler=resumed)).on_train_begin(args, loaded, None)
    assert resumed.epoch == 1

    other = _sampler(diffs, **{**kw, "seed": 9})
    with pytest.raises(ConfigError, match="curriculum_state.seed"):
        CurriculumStateCallback(SimpleNamespace(curriculum_sampler=other)).on_train_begin(args, loaded, None)
    empty = TrainerState(global_step=6, stateful_callbacks={})
    with pytest.raises(ConfigError, match="from a checkpoint without curriculum state"):
        CurriculumStateCallback(SimpleNamespace(curriculum_sampler=sampler)).on_train_begin(args, empty, None)


# --------------------------------------------------------------------------------------------------
# Integration: CprGRPOTrainer with a curriculum on a tiny text-only causal LM
# --------------------------------------------------------------------------------------------------


def _tiny_lm_and_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = [f"q{i}" for i in range(12)] + list(BUCKETS) + ["user", "assistant"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [" ".join(words)], trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config), tokenizer


@pytest.mark.slow
def test_trainer_follows_staged_order_and_resumes(tmp_path: Path):
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr.training.trainer import CprGRPOTrainer

    diffs = ["hard", "easy", "medium", "hard", "medium", "easy"]  # 3 generation batches per epoch
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"{d} q{i}"}] for i, d in enumerate(diffs)],
            "difficulty": diffs,
        }
    )

    def run(max_steps: int, resume: str | None, **extra):
        seen: list[list[str]] = []

        def reward(prompts, completions, **kwargs):
            seen.append([p[-1]["content"] for p in prompts])
            return [float(len(c[-1]["content"])) for c in completions]

        model, tokenizer = _tiny_lm_and_tokenizer()
        args = GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=3,
            max_steps=max_steps, save_steps=2, logging_steps=1, report_to=[], use_cpu=True, bf16=False, seed=11,
            learning_rate=1e-3, disable_tqdm=True, **extra,
        )  # fmt: skip
        trainer = CprGRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer,
            curriculum=CurriculumConfig(),
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer, seen

    with pytest.raises(ConfigError, match="field 'max_steps': must be a positive integer to size the curriculum"):
        run(-1, None, num_train_epochs=1)
    with pytest.raises(ConfigError, match="field 'shuffle_dataset': must be True with a curriculum"):
        run(5, None, shuffle_dataset=False)

    trainer, seen = run(5, None)
    s = trainer.curriculum_sampler
    # 2 unique prompts per generation batch, GA = steps_per_generation = 1 -> one batch per step.
    assert (s.batch_size, s.repeat_count, s.total_batches, s.batches_per_epoch) == (2, 1, 5, 3)
    expected = [[f"{diffs[i]} q{i}" for i in s.generation_batch(b) for _ in range(2)] for b in range(5)]
    assert seen == expected
    # Fractions 0, 0.2 < 0.3: easy only; 0.4: easy+medium; 0.6, 0.8: everything.
    assert all(p.startswith("easy") for b in seen[:2] for p in b)
    assert not any(p.startswith("hard") for p in seen[2])
    saved = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    saved = saved["stateful_callbacks"]["CurriculumStateCallback"]["attributes"]["curriculum_state"]
    assert saved["position"]["epoch"] == 1 and saved["position"]["generation_batch"] == 4
    assert saved["fingerprint"] == s.fingerprint()

    # Resume from step 4 (epoch 1, one micro-batch skipped): the last step sees the same prompts.
    resumed, seen_after = run(5, str(tmp_path / "checkpoint-4"))
    assert seen_after == expected[4:]
    assert resumed.curriculum_sampler.resumed_position == saved["position"]
