"""One test per access of cpr.trl_internals to TRL's private GRPOTrainer state: each reads TRL's own code
(its source or its behaviour on a stand-in trainer), so a TRL release that renames or changes what cpr
relies on fails here, by name, rather than in a training run."""

from __future__ import annotations

import inspect
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import trl
from transformers import Trainer
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from cpr import trl_internals as T


def _source(name: str) -> str:
    return inspect.getsource(getattr(GRPOTrainer, name))


def test_the_checked_version_is_named_and_installed():
    """The accesses were read from TRL_CHECKED; the tests below hold for the installed TRL."""
    assert T.TRL_CHECKED == "1.16.0"
    assert tuple(map(int, trl.__version__.split(".")[:2])) >= (1, 16)


def test_metrics_are_per_mode_lists_that_log_averages_and_clears():
    init, log = _source("__init__"), _source("log")
    assert 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}' in init
    assert "self._metrics[mode]" in log and "self._metrics[mode].clear()" in log
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list, kl=[0.5]), "eval": defaultdict(list)})
    assert T.logged_metrics(trainer) == {"kl": [0.5]} and T.logged_metrics(None) == {}


def test_step_and_buffered_inputs_are_the_generation_batch_state_of_prepare_inputs():
    prepare = _source("_prepare_inputs")
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in prepare
    assert "if self._step % generate_every == 0 or self._buffered_inputs is None:" in prepare
    assert "self._buffered_inputs = [unsplit_pixel_values_by_grid(batch) for batch in generation_batches]" in prepare
    assert "self._buffered_inputs[self._step % self.args.steps_per_generation]" in prepare
    assert "self._step = 0" in _source("__init__") and "self._step += 1" in _source("training_step")
    trainer = SimpleNamespace(_step=3, _buffered_inputs=None)
    T.set_micro_step(trainer, 7)
    T.set_generation_buffer(trainer, ["slice"])
    assert (T.micro_step(trainer), T.generation_buffer(trainer)) == (7, ["slice"])


def test_the_train_sampler_hook_and_its_batch_arithmetic_are_trls():
    """GRPOTrainer._get_train_sampler(dataset) builds a RepeatSampler whose shape repeat_sampler_shape
    reproduces; the hook falls back to it."""
    assert list(inspect.signature(GRPOTrainer._get_train_sampler).parameters) == ["self", "dataset"]
    args = SimpleNamespace(generation_batch_size=12, steps_per_generation=3, seed=0)
    stand_in = SimpleNamespace(args=args, num_generations=4, num_iterations=2, shuffle_dataset=True,
                               train_dataset=list(range(9)))
    sampler = GRPOTrainer._get_train_sampler(stand_in)
    assert isinstance(sampler, RepeatSampler)
    assert (sampler.mini_repeat_count, sampler.batch_size, sampler.repeat_count) == T.repeat_sampler_shape(stand_in)
    assert T.repeat_sampler_shape(stand_in) == (4, 3, 6)

    stand_in.train_sampler = lambda dataset: None
    assert isinstance(T.train_sampler_hook(stand_in), RepeatSampler)
    stand_in.train_sampler = lambda dataset: ("ours", dataset)
    assert T.train_sampler_hook(stand_in, "rows") == ("ours", "rows")


def test_trainer_log_is_the_base_log_that_grpo_overrides():
    """GRPOTrainer.log adds and clears the training metrics; the eval hook calls transformers' own."""
    assert GRPOTrainer.log is not Trainer.log
    assert list(inspect.signature(Trainer.log).parameters)[:2] == ["self", "logs"]
    calls = []
    trainer = SimpleNamespace(state=SimpleNamespace(epoch=None, num_input_tokens_seen=0, global_step=4, log_history=[]),
                              args=SimpleNamespace(include_num_input_tokens_seen="no"),
                              control="control", callback_handler=SimpleNamespace(
                                  on_log=lambda args, state, control, logs: calls.append(logs) or control))
    T.log_as_trainer(trainer, {"eval_crystal/match_f1": 0.5})
    assert trainer.state.log_history == [{"eval_crystal/match_f1": 0.5, "step": 4}]
    assert calls == [{"eval_crystal/match_f1": 0.5}]


def test_generation_rounds_and_their_gathered_rewards_are_trls(monkeypatch):
    """_prepare_inputs generates a training batch through _generate_and_score_completions(inputs), which
    scores it with _calculate_rewards(inputs, prompts, completions, completion_ids_list), gathered over the
    processes; the hooks route each round to the trainer's generation_batch, where TRL's round returns the
    batch with its matrix."""
    prepare, score = _source("_prepare_inputs"), _source("_generate_and_score_completions")
    assert "generation_batch = self._generate_and_score_completions(generation_batch)" in prepare
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    assert "rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in score
    assert list(inspect.signature(GRPOTrainer._calculate_rewards).parameters) == [
        "self", "inputs", "prompts", "completions", "completion_ids_list"]
    rewards = _source("_calculate_rewards")
    assert "rewards_per_func = gather(rewards_per_func)" in rewards and rewards.rstrip().endswith("return rewards_per_func")
    # the advantages of a round are computed from that matrix within each group of num_generations rows
    assert "rewards.view(-1, num_generations)" in score and 'output = {\n            "prompt_ids": prompt_ids,' in score

    class Hooked(GRPOTrainer):  # TRL's methods below are stand-ins; the hooks are cpr's
        _generate_and_score_completions = T.generation_batch_hook
        _calculate_rewards = T.reward_matrix_hook

        def generation_batch(self, inputs):
            return {"routed": T.generate_and_score(self, inputs)}

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions",
                        lambda self, inputs: {"rows": inputs, "rewards": self._calculate_rewards(inputs, 2, 3, 4)})
    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", lambda self, *args: ("matrix", args))
    matrix = ("matrix", ([1], 2, 3, 4))
    assert object.__new__(Hooked)._generate_and_score_completions([1]) == {"routed": ({"rows": [1], "rewards": matrix},
                                                                                      matrix)}


def test_rows_of_and_batch_of_split_images_by_row():
    import torch

    batch = {"pixel_values": torch.arange(10.0).view(5, 2), "image_grid_thw": torch.tensor([[1, 1, 2], [1, 1, 3]]),
             "num_images": [1, 1], "prompt_ids": torch.zeros(2, 3)}
    rows = T.rows_of(batch)
    assert [p.shape[0] for p in rows["pixel_values"]] == [2, 3] and len(rows["image_grid_thw"]) == 2
    back = T.batch_of({**rows, "pixel_values": rows["pixel_values"][::-1],
                       "image_grid_thw": rows["image_grid_thw"][::-1]})
    assert back["pixel_values"].tolist() == batch["pixel_values"][[2, 3, 4, 0, 1]].tolist()
    assert back["image_grid_thw"].tolist() == [[1, 1, 3], [1, 1, 2]]


PRIVATE = ("_metrics", "_step", "_buffered_inputs", "_get_train_sampler", "_generate_and_score_completions",
           "_compute_loss", "_calculate_rewards", "_tokenize_prompts", "_generate_single_turn",
           "_get_per_token_logps_and_entropies")
LIBRARY = Path(T.__file__).resolve().parent


def _private_uses(path: Path) -> list[str]:
    """The TRL-private names the code (not the docstrings) of the file ``path`` reads, writes or overrides with
    a ``def``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append(node.attr)
        if isinstance(node, ast.FunctionDef) and node.name in PRIVATE:
            found.append(f"def {node.name}")
        if (isinstance(node, ast.Attribute) and node.attr == "log" and isinstance(node.value, ast.Name)
                and node.value.id == "Trainer"):
            found.append("Trainer.log")
    return found


def test_tokenize_prompts_is_what_trls_generation_hands_vllm():
    """``_tokenize_prompts`` on a stand-in trainer with the tiny model's processor: the chat template's prompt ids
    with the image placeholders, and the images taken out of the messages; ``_generate`` passes both to
    ``vllm_generation.generate``."""
    from conftest import tiny_model
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model("qwen2_5_vl"))
    image = Image.new("RGB", (56, 56), (0, 90, 200))
    prompt = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Add 3 and 4."}]}]
    trainer = SimpleNamespace(_is_vlm=True, environment_factories=None, processing_class=processor, tools=None,
                              chat_template=None, chat_template_kwargs={})
    trainer._tokenize_prompts = lambda prompts: GRPOTrainer._tokenize_prompts(trainer, prompts)  # TRL's own
    ids, images = T.tokenize_prompts(trainer, [prompt, prompt])
    expected = processor.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert ids == [list(expected["input_ids"][0])] * 2 and images == [[image], [image]]
    assert ids[0].count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")) > 0
    assert "prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)" in _source("_generate")
    single = _source("_generate_single_turn")
    assert "self.vllm_generation.generate(" in single and "prompts=prompt_ids" in single and "images=images" in single


@pytest.mark.parametrize("module", sorted(str(p.relative_to(LIBRARY)) for p in LIBRARY.rglob("*.py")
                                           if p.name != "trl_internals.py"))
def test_no_other_module_touches_trls_private_state(module):
    """Every module of the library but cpr/trl_internals.py (its trainer binds the hooks defined there)."""
    assert _private_uses(LIBRARY / module) == [], f"{module}: go through cpr.trl_internals"
    assert sorted(set(_private_uses(LIBRARY / "trl_internals.py"))) == [
        "Trainer.log", "_buffered_inputs", "_calculate_rewards", "_generate_and_score_completions",
        "_generate_single_turn", "_get_per_token_logps_and_entropies", "_get_train_sampler", "_metrics", "_step",
        "_tokenize_prompts"]


def test_generate_and_score_returns_the_batch_that_step_credit_reads():
    """The batch dict holds (B, T) completion ids and mask, this process's (B,) advantages, completions decoded
    without special tokens (the text the reward functions score)."""
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    src = _source("_generate_and_score_completions")
    for line in ('"completion_ids": completion_ids,', '"completion_mask": completion_mask,', '"advantages": advantages,',
                 "advantages = advantages[process_slice]", "self.accelerator.process_index * len(prompts)",
                 "rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
                 "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)"):
        assert line in src, line
    assert "batch_decode(completion_ids, skip_special_tokens=True)" in _source("_generate")
    assert "generation_batch = self._generate_and_score_completions(generation_batch)" in _source("_prepare_inputs")


def test_compute_loss_takes_token_advantages_and_prepare_inputs_keeps_their_rows():
    """_compute_loss unsqueezes only a 1-D advantage (a (B, T) one is used token by token); _prepare_inputs
    shuffles and splits the batch with helpers that move a (B, T) tensor's rows with the other tensors'."""
    import torch
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    src = _source("_compute_loss")
    assert 'advantages = inputs["advantages"]' in src
    assert "if advantages.dim() == 1:\n            advantages = advantages.unsqueeze(1)" in src
    assert "per_token_loss1 = coef_1 * advantages" in src
    prepare = _source("_prepare_inputs")
    assert "shuffle_sequence_dict(generation_batch)" in prepare and "split_tensor_dict(generation_batch" in prepare
    ids = torch.arange(12).reshape(4, 3)
    batch = shuffle_sequence_dict({"completion_ids": ids, "advantages": ids.float() * 10, "n": torch.tensor(4)})
    assert torch.equal(batch["advantages"], batch["completion_ids"].float() * 10)
    for part in split_tensor_dict(batch, 2):
        assert part["advantages"].shape == (2, 3)
        assert torch.equal(part["advantages"], part["completion_ids"].float() * 10)


def test_the_process_index_is_accelerates():
    assert T.process_index(SimpleNamespace(accelerator=SimpleNamespace(process_index=2))) == 2


def test_trls_model_card_leaves_a_local_base_unnamed_and_the_mixin_names_it(tmp_path):
    """TRL's create_model_card (its own code, on a stand-in trainer) writes UNNAMED_BASE_MODEL for a model loaded
    from a local folder and names a hub id; name_base_model names the folder instead."""
    folder = tmp_path / "models" / "base"
    folder.mkdir(parents=True)

    class StandIn:
        _tag_names, _name, _paper, _template_file = GRPOTrainer._tag_names, "GRPO", GRPOTrainer._paper, None
        hub_model_id = None
        create_model_card = GRPOTrainer.create_model_card

        def __init__(self, out, base):
            self.args = SimpleNamespace(output_dir=str(out))
            self.model = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(base)))

        def is_world_process_zero(self):
            return True

    class Named(StandIn):
        def create_model_card(self, *args, **kwargs):
            super().create_model_card(*args, **kwargs)
            T.name_base_model(self)

    for i, (cls, base, line) in enumerate([
        (StandIn, folder, f"fine-tuned version of {T.UNNAMED_BASE_MODEL}."),
        (StandIn, "org/hub-model", "fine-tuned version of [org/hub-model](https://huggingface.co/org/hub-model)."),
        (Named, folder, f"fine-tuned version of `{folder}`."),
        (Named, "org/hub-model", "fine-tuned version of [org/hub-model](https://huggingface.co/org/hub-model)."),
    ]):
        out = tmp_path / f"card{i}"
        out.mkdir()
        cls(out, base).create_model_card(model_name="cpr")
        card = (out / "README.md").read_text(encoding="utf-8")
        assert line in card, (cls, base)
        assert (T.UNNAMED_BASE_MODEL in card) == (cls is StandIn and base == folder)


def test_single_turn_generation_is_trls_and_the_hook_routes_it(monkeypatch):
    """``_generate`` gets a round's completions from ``_generate_single_turn(prompt_ids, images, multimodal_fields,
    num_generations)`` (prompt token ids, one row a completion), which returns ``(completion_ids, logprobs)``; the
    hook routes it to the trainer's ``generate_completions`` and :func:`generate_single_turn` calls TRL's."""
    assert list(inspect.signature(GRPOTrainer._generate_single_turn).parameters) == [
        "self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]
    generate = _source("_generate")
    assert "completion_ids, logprobs = self._generate_single_turn(\n                prompt_ids, images, multimodal_fields, num_generations\n            )" in generate
    assert "contents = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)" in generate
    single = _source("_generate_single_turn")
    assert single.rstrip().endswith("return completion_ids, logprobs")
    # vLLM's log-probabilities of a token it did not score are NaN, which TRL neutralises in the correction
    score = _source("_generate_and_score_completions")
    assert "per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)" in score
    assert 'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio' in score

    class Hooked(GRPOTrainer):
        _generate_single_turn = T.single_turn_hook

        def generate_completions(self, *args):
            return ("routed", T.generate_single_turn(self, *args))

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *args: ("trl", args))
    got = object.__new__(Hooked)._generate_single_turn([[1, 2]], None, {}, 4)
    assert got == ("routed", ("trl", ([[1, 2]], None, {}, 4, False)))


def test_the_loss_forward_passes_through_the_logps_method_and_is_captured(monkeypatch):
    """``_compute_loss`` takes the policy's ``(B, T)`` log-probabilities from
    ``_get_per_token_logps_and_entropies`` (first of three values); :func:`captured_logps` keeps them only inside
    its block."""
    src = _source("_compute_loss")
    assert "per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(" in src

    class Hooked(GRPOTrainer):
        _get_per_token_logps_and_entropies = T.logps_hook

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", lambda self, model, *a, **k: ("lp", "e", 0))
    trainer = object.__new__(Hooked)
    assert trainer._get_per_token_logps_and_entropies("m") == ("lp", "e", 0)
    with T.captured_logps(trainer) as captured:
        trainer._get_per_token_logps_and_entropies("m", 1, x=2)
    trainer._get_per_token_logps_and_entropies("m")
    assert captured == ["lp"]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_aggregate_token_loss_is_trls_aggregation(loss_type, tmp_path, one_thread):
    """TRL's ``_compute_loss`` on a tiny model, without old log-probabilities (ratio 1, KL off): each token's
    loss is -A of its row, so TRL's loss equals :func:`aggregate_token_loss` of -A over the mask, per loss type,
    in training (2 accumulation steps, 4 steps a generation) and in evaluation."""
    import torch
    from conftest import tiny_model
    from datasets import Dataset
    from trl import GRPOConfig

    from cpr.models import load_model_and_processor

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Add 3 and 4."}]}]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=6, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      beta=0.0, loss_type=loss_type, gradient_accumulation_steps=2, steps_per_generation=4)
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                          args=args, train_dataset=Dataset.from_dict({"prompt": [prompt] * 8}),
                          processing_class=processor)
    trainer.current_gradient_accumulation_steps = 2
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    advantages = torch.tensor([0.5, -1.0, 2.0, 0.25])
    inputs = {"prompt_ids": torch.randint(10, 100, (4, 5)), "prompt_mask": torch.ones(4, 5, dtype=torch.long),
              "completion_ids": torch.randint(10, 100, (4, 6)), "completion_mask": mask,
              "advantages": advantages, "num_items_in_batch": torch.tensor(29)}
    per_token = -advantages.unsqueeze(1).expand(4, 6)
    for training in (True, False):
        trainer.model.train(training)
        with torch.no_grad():
            trls = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
        ours = T.aggregate_token_loss(trainer, per_token, mask.float(), inputs["num_items_in_batch"])
        assert float(ours) == pytest.approx(float(trls), rel=1e-6, abs=1e-7), (loss_type, training)
