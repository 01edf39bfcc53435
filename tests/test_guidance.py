"""Reference-guided GRPO (cpr.training.guidance): LUFFY's shaped-ratio loss by hand, the reference completions in
their groups and scored by the reward functions themselves, the vLLM correction left out for them, the prefix
hints and their schedule, and the settings refused with the key named."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from cpr.data.prompts import target_prefix, target_text
from cpr.errors import ConfigError, InputError
from cpr.training.config_sections import GuidanceConfig
from cpr.training.guidance import (
    Guidance,
    check_guidance,
    check_reference_steps,
    exclude_from_correction,
    guided_rows,
    hint_steps,
    shaped_token_loss,
    split_guided,
)


def test_the_shaped_ratio_loss_of_two_tokens_by_hand():
    """p = (0.5, 0.2), A = 2, gamma = 0.1: loss -A p / (p + gamma) = (-1.6667, -1.3333); its gradient in log p is
    -A gamma p / (p + gamma)^2 = (-0.27778, -0.44444), whatever the ratio (no clipping)."""
    logps = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    loss = shaped_token_loss(logps, torch.tensor([2.0]), 0.1)
    assert loss.detach().tolist()[0] == pytest.approx([-2 * 0.5 / 0.6, -2 * 0.2 / 0.3], rel=1e-6)
    loss.sum().backward()
    assert logps.grad.tolist()[0] == pytest.approx([-2 * 0.1 * 0.5 / 0.36, -2 * 0.1 * 0.2 / 0.09], rel=1e-5)
    # token advantages (credit: step) are taken token by token
    token = shaped_token_loss(logps.detach(), torch.tensor([[1.0, -1.0]]), 0.1)
    assert token.tolist()[0] == pytest.approx([-0.5 / 0.6, 0.2 / 0.3], rel=1e-6)


def test_the_reference_rows_are_the_last_members_of_each_group_on_every_process():
    one = guided_rows(16, 0, 4, 1)
    assert one == [i % 4 == 3 for i in range(16)]
    # two processes of 8 rows, or 6-row processes that split a group: the same global positions
    assert guided_rows(8, 0, 4, 2) + guided_rows(8, 1, 4, 2) == [i % 4 >= 2 for i in range(16)]
    assert guided_rows(6, 0, 4, 1) + guided_rows(6, 1, 4, 1) == one[:12]


def test_hint_steps_fall_linearly_to_zero_over_the_anneal_share():
    # 40 steps, anneal over the first half: the share 0.5 at step 0, 0.25 at step 10, 0 from step 20
    assert [hint_steps(s, 40, 4, 0.5, 0.5) for s in (0, 5, 10, 15, 19, 20, 39)] == [2, 2, 1, 1, 0, 0, 0]
    assert hint_steps(0, 40, 3, 1.0, 0.5) == 3 and hint_steps(0, 40, 3, 0.5, 0.5) == 2  # round half up: 1.5 -> 2
    assert hint_steps(0, 40, 1, 0.4, 1.0) == 0


def test_the_prefix_is_the_start_of_the_reference_and_hints_end_on_its_token_boundaries():
    from conftest import tiny_model
    from transformers import AutoProcessor

    from cpr.training.guidance import hint_ids

    steps, answer = ["Three green cells.", "Two blue cells, \u00e9"], "B"
    full = target_text(steps, answer)
    assert json.loads(full) == {"reasoning_steps": steps, "answer": "B"}
    assert target_prefix(steps, 0) == "" and full.startswith(target_prefix(steps, 1))
    assert target_prefix(steps, 2) == '{"reasoning_steps": ["Three green cells.", "Two blue cells, \u00e9"'
    tokenizer = AutoProcessor.from_pretrained(tiny_model("qwen2_5_vl")).tokenizer
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    for k in (1, 2):
        hint = hint_ids(tokenizer, steps, answer, k)
        assert hint == ids[: len(hint)] and len(hint) > 0  # the reference's own first tokens
        text = tokenizer.decode(hint)
        assert target_prefix(steps, k).startswith(text) and len(text) >= len(target_prefix(steps, k)) - 4
    assert hint_ids(tokenizer, steps, answer, 0) == []


class _Trainer:
    """A stand-in trainer for :class:`Guidance`: TRL's single-turn generation returns ``sampled`` (token ids, and
    vLLM log-probabilities when ``vllm``); a tokenizer that maps each character to its code point."""

    def __init__(self, rank=0, vllm=False, members=1, mode="reference", step=0):
        self.model = SimpleNamespace(training=True)
        self.num_generations, self.max_completion_length, self.eos_token_ids = 4, 200, [0]
        self.processing_class = lambda text, add_special_tokens=False, return_offsets_mapping=False: {
            "input_ids": [ord(c) for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}
        self.accelerator = SimpleNamespace(process_index=rank, num_processes=1, gather=lambda t: t.unsqueeze(0)
                                           if t.dim() == 0 else t)
        self.state, self.args = SimpleNamespace(global_step=step), SimpleNamespace(max_steps=10)
        self.reward_weights = torch.tensor([1.0, 0.5])
        self._metrics = {"train": defaultdict(list)}
        self.vllm, self.calls = vllm, []
        self.guidance = Guidance(self, GuidanceConfig(mode=mode, members=members))

    def _generate_single_turn(self, prompt_ids, images, fields, num_generations, has_tool_images=False):
        self.calls.append(prompt_ids)
        completions = [[7, 8, 0] for _ in prompt_ids]
        return completions, ([[-0.5, -0.25, -0.1] for _ in prompt_ids] if self.vllm else None)


ROWS = [{"reference_steps": ["a"], "answer": "B"}] * 4 + [{"reference_steps": ["c", "d"], "answer": "A"}] * 4


@pytest.fixture
def trl_single_turn(monkeypatch):
    """TRL's ``_generate_single_turn`` is the stand-in trainer's."""
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *a: type(self)._generate_single_turn(self, *a))


def test_each_groups_reference_is_its_own_records_and_vllm_does_not_correct_it(trl_single_turn):
    """Rows 3 and 7 (the last of each group of 4) become their own record's reference + eos, with NaN vLLM
    log-probabilities; the batch's ``guided`` marks them and their importance-sampling ratio is 1."""
    t = _Trainer(vllm=True)
    with t.guidance.guiding(ROWS):
        completions, logprobs = t.guidance.single_turn([[1]] * 8, None, {}, 4)
    refs = {3: target_text(["a"], "B"), 7: target_text(["c", "d"], "A")}
    for i in range(8):
        if i in refs:
            assert completions[i] == [ord(c) for c in refs[i]] + [0]
            assert all(math.isnan(x) for x in logprobs[i]) and len(logprobs[i]) == len(completions[i])
        else:
            assert completions[i] == [7, 8, 0] and logprobs[i] == [-0.5, -0.25, -0.1]
    ratio = torch.full((8, 5), 0.7)
    batch = {"completion_ids": torch.zeros(8, 5, dtype=torch.long), "advantages": torch.arange(8.0),
             "importance_sampling_ratio": ratio}
    rewards = torch.tensor([[1.0, 0.0]] * 3 + [[1.0, 1.0]] + [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    with t.guidance.guiding(ROWS):
        t.guidance.single_turn([[1]] * 8, None, {}, 4)
        out = t.guidance.mark(batch, rewards)
        t.guidance.log_advantage(out)
    assert out["guided"].tolist() == [i in refs for i in range(8)]
    assert out["importance_sampling_ratio"][[3, 7]].eq(1.0).all() and out["importance_sampling_ratio"][[0, 1, 2, 4, 5, 6]].eq(0.7).all()
    assert ratio.eq(0.7).all()  # the round's own tensor is not written in place
    logged = t._metrics["train"]
    assert logged["guidance/reward"] == [1.5]  # both references: 1 + 0.5 x 1
    assert logged["guidance/advantage"] == [5.0]  # (3 + 7) / 2
    assert logged["guidance/reference_best"] == [1.0]  # group 2 ties its best sample: counted as best


def test_exclude_from_correction_handles_sequence_ratios_and_no_vllm():
    batch = {"importance_sampling_ratio": torch.tensor([[0.25], [3.0]])}
    assert exclude_from_correction(batch, torch.tensor([False, True]))["importance_sampling_ratio"].tolist() == [[0.25], [1.0]]
    assert exclude_from_correction({"x": 1}, torch.tensor([True])) == {"x": 1}


def test_two_processes_mark_the_rows_and_log_what_one_process_does(trl_single_turn):
    """The same 8 rows and reward matrix on one process, or 4 rows on each of two (whose gather concatenates
    their advantages): the same rows are references and the same guidance metrics are logged."""
    rewards = torch.tensor([[0.0, 1.0]] * 3 + [[1.0, 1.0]] + [[1.0, 1.0]] * 4)
    advantages = torch.tensor([0.1, 0.2, 0.3, 1.5, 0.0, 0.0, 0.0, -0.5])

    def run(trainers, slices):
        guided = []
        for t, (lo, hi) in zip(trainers, slices, strict=True):
            batch = {"completion_ids": torch.zeros(hi - lo, 3, dtype=torch.long), "advantages": advantages[lo:hi]}
            with t.guidance.guiding(ROWS[lo:hi]):
                t.guidance.single_turn([[1]] * (hi - lo), None, {}, 4)
                marked = t.guidance.mark(batch, rewards)
                t.guidance.log_advantage(marked)
                guided += marked["guided"].tolist()
        return guided

    one = _Trainer()
    two = [_Trainer(rank=0), _Trainer(rank=1)]
    for t in two:  # gather: both processes' [advantage sum, count]
        t.accelerator = SimpleNamespace(process_index=t.accelerator.process_index, num_processes=2,
                                        gather=lambda x: torch.stack([torch.tensor([1.5, 1.0]), torch.tensor([-0.5, 1.0])]))
    assert run([one], [(0, 8)]) == run(two, [(0, 4), (4, 8)]) == [i % 4 == 3 for i in range(8)]
    for t in two:
        assert dict(t._metrics["train"]) == dict(one._metrics["train"])
    assert one._metrics["train"]["guidance/advantage"] == [0.5]


def test_prefix_hints_start_every_completion_and_are_masked_out_of_the_loss(trl_single_turn):
    """At step 0 with share 0.5: the one-step record gets round(0.5) = 1 step, the two-step one 1 step; the
    prompt handed to generation is prompt + hint, the completion hint + continuation, the hint's vLLM
    log-probabilities NaN, and ``tool_mask`` zero over the hint (``num_items_in_batch`` recounted)."""
    t = _Trainer(vllm=True, mode="prefix")
    hints = {0: target_prefix(["a"], 1), 4: target_prefix(["c", "d"], 1)}
    with t.guidance.guiding(ROWS):
        completions, logprobs = t.guidance.single_turn([[1]] * 8, None, {"mm": [[5]] * 8}, 4)
    for i in (0, 4):
        hint = [ord(c) for c in hints[i]]
        assert t.calls[0][i] == [1, *hint] and completions[i] == [*hint, 7, 8, 0]
        assert all(math.isnan(x) for x in logprobs[i][: len(hint)]) and logprobs[i][len(hint):] == [-0.5, -0.25, -0.1]
    assert t._metrics["train"]["guidance/hint_steps"] == [1.0]
    width = max(len(c) for c in completions)
    lengths = [len(c) for c in completions]
    batch = {"completion_ids": torch.zeros(8, width, dtype=torch.long),
             "completion_mask": torch.tensor([[1] * n + [0] * (width - n) for n in lengths])}
    out = t.guidance.mark(batch, torch.zeros(8, 2))
    hint_len = len(hints[0])
    assert out["tool_mask"][0].tolist() == [0] * hint_len + [1] * (width - hint_len)
    assert int(out["num_items_in_batch"]) == 3 * 4 + 3 * 4  # the continuations only
    # after the anneal share (half of 10 steps) nothing is given
    late = _Trainer(mode="prefix", step=5)
    with late.guidance.guiding(ROWS):
        late.guidance.single_turn([[1]] * 8, None, {}, 4)
    assert late.calls[0] == [[1]] * 8


def test_split_guided_zeroes_their_advantages_for_trls_loss_only():
    inputs = {"guided": torch.tensor([False, True]), "advantages": torch.tensor([1.0, 2.0]), "x": 1}
    rest, guided, advantages = split_guided(inputs)
    assert "guided" not in rest and rest["advantages"].tolist() == [1.0, 0.0] and advantages.tolist() == [1.0, 2.0]
    assert "guided" in inputs  # the buffered micro-batch is kept for the next iteration
    token = split_guided({"guided": torch.tensor([True, False]), "advantages": torch.ones(2, 3)})[0]
    assert token["advantages"].tolist() == [[0.0] * 3, [1.0] * 3]


def test_settings_the_trainer_cannot_run_are_refused_with_the_key():
    ok = dict(num_generations=8, loss_type="dapo", liger=False, off_policy_mask_threshold=None, field="p.guidance")
    check_guidance(GuidanceConfig(mode="reference", members=7), **ok)
    check_guidance(GuidanceConfig(mode="prefix", members=8), **ok)  # members is the reference mode's
    reference = GuidanceConfig(mode="reference")
    for config, change, field, message in [
        (GuidanceConfig(mode="reference", members=8), {}, "p.guidance.members",
         "8 reference completions in groups of 8 leave none sampled"),
        (reference, {"loss_type": "sapo"}, "p.guidance.mode",
         "loss_type 'sapo' is not supported with reference guidance (one of grpo, bnpo, dr_grpo, dapo)"),
        (reference, {"liger": True}, "p.guidance.mode",
         "use_liger_kernel computes TRL's loss without the hook reference guidance adds its term through"),
        (reference, {"off_policy_mask_threshold": 0.5}, "p.guidance.mode",
         "off_policy_mask_threshold is not supported with reference guidance")]:
        with pytest.raises(ConfigError) as e:
            check_guidance(config, **{**ok, **change})
        assert (e.value.field, e.value.message) == (field, message)


def test_a_record_without_reference_steps_is_named():
    from datasets import Dataset

    with pytest.raises(InputError) as e:
        check_reference_steps(Dataset.from_dict({"id": ["r1", "r2"], "reference_steps": [["a"], []]}))
    assert e.value.record_id == "r2" and e.value.field == "reference_steps"
    assert e.value.message == "has no reference steps to guide GRPO with"


@pytest.mark.parametrize("key, value, field", [
    ("mode", "luffy", "phase_settings.cpr.guidance.mode"),
    ("gamma", 0.0, "phase_settings.cpr.guidance.gamma"),
    ("prefix_share", 1.5, "phase_settings.cpr.guidance.prefix_share"),
    ("hint", 1, "phase_settings.cpr.guidance.hint"),
])
def test_guidance_keys_are_checked_at_load(key, value, field):
    from cpr.training.config import load_config

    demo = "recipes/configs/demo.yaml"
    assert load_config(demo, ["phase_settings.cpr.guidance.mode=reference"]).phase_settings["cpr"].guidance.members == 1
    with pytest.raises(ConfigError) as e:
        load_config(demo, [f"phase_settings.cpr.guidance.{key}={json.dumps(value)}"])
    assert e.value.field == field


def test_a_training_round_scores_the_reference_with_the_reward_functions_and_trains_its_shaped_loss(tmp_path,
                                                                                                    one_thread):
    """A real round on the tiny model: the last completion of each group of 4 is its record's reference + eos, its
    reward in TRL's matrix is the reward function's own value on that text, and with the sampled rows' advantages
    0 the micro-batch's loss is the reference rows' -f(p) A aggregated as TRL's ``dapo`` (p from an independent
    forward pass of the model)."""
    from conftest import tiny_model
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr.models import load_model_and_processor
    from cpr.training.trainer import CprGRPOTrainer

    def steps_reward(completions, **kwargs):
        def one(text):
            try:
                return 1.0 + len(json.loads(text)["reasoning_steps"])
            except (ValueError, KeyError, TypeError):
                return 0.0
        return [one(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Add 3 and 4."}]}]
    steps = [["3 + 4 = 7"], ["4 + 3 = 7", "so 7"]]
    data = Dataset.from_dict({"prompt": [prompt] * 2, "answer": ["7", "C"], "reference_steps": steps,
                              "id": ["a", "b"]})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=1,
                      max_completion_length=40, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, seed=0, loss_type="dapo")
    trainer = CprGRPOTrainer(model=model, reward_funcs=[steps_reward], args=args, train_dataset=data,
                             processing_class=processor, guidance=GuidanceConfig(mode="reference", gamma=0.1))
    trainer.model.train()
    inputs = [data[0]] * 4 + [data[1]] * 4
    batch, rewards = trainer.generation_round(inputs)
    assert batch["guided"].tolist() == [False, False, False, True] * 2
    tok = processor.tokenizer
    for row, (record_steps, answer) in ((3, (steps[0], "7")), (7, (steps[1], "C"))):
        n = int(batch["completion_mask"][row].sum())
        assert batch["completion_ids"][row, :n].tolist() == tok(target_text(record_steps, answer),
                                                               add_special_tokens=False)["input_ids"] + [trainer.eos_token_ids[0]]
        assert rewards[row, 0].item() == steps_reward([target_text(record_steps, answer)])[0] == 1 + len(record_steps)
    assert trainer._metrics["train"]["guidance/reward"] == [2.5]

    batch["advantages"] = torch.where(batch["guided"], torch.tensor(0.75), torch.tensor(0.0))
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, batch)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -batch["completion_ids"].size(1) - 1:-1]
    logps = logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = batch["completion_mask"] * batch["guided"].unsqueeze(1)
    p = logps.exp()
    expected = (-(p / (p + 0.1)) * 0.75 * mask).sum() / batch["num_items_in_batch"]
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)
    assert trainer._metrics["train"]["guidance/ratio"] == [pytest.approx(float((p * mask).sum() / mask.sum()), rel=1e-4)]
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


def test_under_vllm_trls_batch_leaves_the_reference_out_of_the_importance_sampling_correction(tmp_path, one_thread):
    """TRL's round with a stand-in vLLM engine (token-level truncated correction): the sampled rows' ratio is TRL's
    clamp(exp(old - sampling), max 2) of the engine's log-probabilities; the reference rows' sampling
    log-probabilities are NaN and their ratio exactly 1."""
    from conftest import tiny_model
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr.models import load_model_and_processor
    from cpr.training.trainer import CprGRPOTrainer

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    tok = processor.tokenizer
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Add 3 and 4."}]}]
    data = Dataset.from_dict({"prompt": [prompt] * 4, "answer": ["7"] * 4, "reference_steps": [["3 + 4 = 7"]] * 4})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=40, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, seed=0)
    trainer = CprGRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"]))
                                                                                 for c in completions]],
                             args=args, train_dataset=data, processing_class=processor,
                             guidance=GuidanceConfig(mode="reference"))
    sampled = tok("The answer is 7.", add_special_tokens=False).input_ids + [tok.eos_token_id]

    class Engine:  # TRL's VLLMGeneration.generate: (prompt ids, completion ids, top-k log-probabilities, extra)
        def generate(self, prompts, images, num_generations, profiler=None):
            return prompts, [sampled] * len(prompts), [[[-0.5]] * len(sampled)] * len(prompts), None

    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, Engine(), trainer.state.global_step
    trainer.vllm_importance_sampling_correction, trainer.vllm_importance_sampling_mode = True, "token_truncate"
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = None, 2.0
    trainer.model.train()
    batch, _ = trainer.generation_round([data[0]] * 4)
    ratio, mask = batch["importance_sampling_ratio"], batch["completion_mask"].bool()
    assert batch["guided"].tolist() == [False, False, False, True]
    assert ratio[3][mask[3]].eq(1.0).all() and batch["sampling_per_token_logps"][3][mask[3]].isnan().all()
    expected = torch.exp(batch["old_per_token_logps"][:3] + 0.5).clamp(max=2.0)
    assert torch.allclose(ratio[:3][mask[:3]], expected[mask[:3]])
    assert not torch.allclose(ratio[:3][mask[:3]], torch.ones_like(expected[mask[:3]]))


def test_reference_guidance_the_phase_cannot_run_is_refused_at_load():
    from cpr.training.config import load_config

    with pytest.raises(ConfigError) as e:
        load_config("recipes/configs/demo.yaml", ["phase_settings.cpr.guidance.mode=reference",
                                                  "phase_settings.cpr.guidance.members=8"])
    assert e.value.field == "phase_settings.cpr.guidance.members"
    with pytest.raises(ConfigError) as e:
        load_config("recipes/configs/demo.yaml", ["phase_settings.cpr.guidance.mode=reference",
                                                  "training.loss_type=sapo"])
    assert e.value.field == "phase_settings.cpr.guidance.mode"
