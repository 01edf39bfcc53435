"""Every read or write of TRL's private ``GRPOTrainer`` state, in one place, checked against TRL
:data:`TRL_CHECKED` (tests/test_trl_internals.py has one test per access that fails when TRL changes it).

* ``_metrics[mode]``: the per-step logged values ``GRPOTrainer.log`` averages; the divergence guards read them.
* ``_step`` and ``_buffered_inputs``: the micro-step counter and buffered generation batch; checkpoints keep both.
* ``_get_train_sampler(dataset)``: the sampler hook (:func:`repeat_sampler_shape`, :func:`train_sampler_hook`).
* ``Trainer.log``: the base class's, so the eval hook's rows neither merge nor clear TRL's training metrics.
* ``_generate_and_score_completions(inputs)``: one generation round, routed to the trainer's
  ``generation_batch`` (:func:`generation_batch_hook`); its batch dict has ``completion_ids``,
  ``completion_mask`` (``(B, T)``) and ``advantages`` (``(B,)``; a ``(B, T)`` one is taken token by token by
  ``_compute_loss``).
* ``_calculate_rewards(...)``: a round's gathered reward matrix (:func:`reward_matrix_hook`).
* ``_generate_single_turn(...)``: a round's completion ids (and vLLM's log-probabilities), routed to the trainer's
  ``generate_completions`` (:func:`single_turn_hook`), where :mod:`cpr.training.guidance` puts in references or hints.
* ``_get_per_token_logps_and_entropies(model, ...)``: the policy's ``(B, T)`` log-probabilities, kept from TRL's
  loss forward pass by :func:`captured_logps` (:func:`logps_hook`); ``_compute_loss``'s aggregation by
  ``loss_type`` (:func:`aggregate_token_loss`).
* ``_tokenize_prompts(prompts)``: the token ids and images TRL hands vLLM (:func:`tokenize_prompts`).
* ``trl.trainer.utils.split_pixel_values_by_grid`` / ``unsplit_pixel_values_by_grid`` (:func:`rows_of`,
  :func:`batch_of`).
* TRL's model card text for an unnamed base model, :data:`UNNAMED_BASE_MODEL` (:func:`name_base_model`).

:class:`cpr.training.trainer.CprGRPOTrainer` binds the ``*_hook`` functions as its overrides of the private hooks;
they call TRL's own as ``GRPOTrainer.<hook>(trainer, ...)``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The TRL version these accesses were read from and tested against.
TRL_CHECKED = "1.16.0"


def logged_metrics(trainer: Any, mode: str = "train") -> dict[str, list[float]]:
    """``trainer._metrics[mode]``: name -> values logged since TRL's last ``log`` ({} without a trainer)."""
    return trainer._metrics[mode] if trainer is not None else {}


def micro_step(trainer: Any) -> int:
    """``trainer._step``: micro-steps trained so far (TRL generates when it is a multiple of
    ``steps_per_generation x num_iterations``)."""
    return int(trainer._step)


def set_micro_step(trainer: Any, step: int) -> None:
    """Set ``trainer._step`` (a resumed checkpoint's)."""
    trainer._step = int(step)


def generation_buffer(trainer: Any) -> Any:
    """``trainer._buffered_inputs``: the current generation batch's slices (``None`` before the first)."""
    return trainer._buffered_inputs


def set_generation_buffer(trainer: Any, buffer: Any) -> None:
    """Set ``trainer._buffered_inputs`` (a resumed checkpoint's)."""
    trainer._buffered_inputs = buffer


def repeat_sampler_shape(trainer: Any) -> tuple[int, int, int]:
    """``(mini_repeat_count, batch_size, repeat_count)`` of the ``RepeatSampler`` that
    ``GRPOTrainer._get_train_sampler`` builds: ``num_generations``, unique prompts per generation batch
    (``generation_batch_size // num_generations``) and ``num_iterations x steps_per_generation``."""
    g = trainer.num_generations
    return g, trainer.args.generation_batch_size // g, trainer.num_iterations * trainer.args.steps_per_generation


def train_sampler_hook(trainer: Any, dataset: Any = None) -> Any:
    """The ``_get_train_sampler(dataset)`` override: ``trainer.train_sampler(dataset)``, or TRL's
    ``RepeatSampler`` when that is ``None``."""
    from trl import GRPOTrainer

    sampler = trainer.train_sampler(dataset)
    return sampler if sampler is not None else GRPOTrainer._get_train_sampler(trainer, dataset)


def generation_batch_hook(trainer: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``_generate_and_score_completions(inputs)`` override (``_prepare_inputs`` calls it once a generation
    batch in training, once a batch in evaluation): ``trainer.generation_batch(inputs)``."""
    return trainer.generation_batch(inputs)


def reward_matrix_hook(trainer: Any, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
    """The ``_calculate_rewards`` override: TRL's reward matrix ``(processes x local rows, reward functions)``
    (NaN: no reward), gathered over the processes, kept for :func:`generate_and_score`."""
    from trl import GRPOTrainer

    trainer._cpr_rewards = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids_list)
    return trainer._cpr_rewards


def generate_and_score(trainer: Any, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """TRL's generation round of ``inputs`` (this process's rows): ``(batch, rewards)``, the batch dict of
    ``GRPOTrainer._generate_and_score_completions`` and its gathered reward matrix (:func:`reward_matrix_hook`)."""
    from trl import GRPOTrainer

    return GRPOTrainer._generate_and_score_completions(trainer, inputs), trainer._cpr_rewards


def single_turn_hook(trainer: Any, prompt_ids: list[list[int]], images: Any, multimodal_fields: dict[str, Any],
                     num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], Any]:
    """The ``_generate_single_turn`` override: ``trainer.generate_completions(...)`` with the same arguments."""
    return trainer.generate_completions(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)


def generate_single_turn(trainer: Any, prompt_ids: list[list[int]], images: Any, multimodal_fields: dict[str, Any],
                         num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], Any]:
    """TRL's ``_generate_single_turn``: per prompt (token ids; one row per completion, a group's rows alike), the
    completion's token ids (ending at the first eos token) and, under vLLM, the sampled tokens' log-probabilities
    (``None`` otherwise)."""
    from trl import GRPOTrainer

    return GRPOTrainer._generate_single_turn(trainer, prompt_ids, images, multimodal_fields, num_generations,
                                             has_tool_images)


def logps_hook(trainer: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``_get_per_token_logps_and_entropies`` override: TRL's ``(logps (B, T), entropies, aux_loss)``; inside
    :func:`captured_logps` the log-probabilities are also kept."""
    from trl import GRPOTrainer

    out = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, *args, **kwargs)
    if getattr(trainer, "_cpr_captured", None) is not None:
        trainer._cpr_captured.append(out[0])
    return out


@contextlib.contextmanager
def captured_logps(trainer: Any) -> Iterator[list[Any]]:
    """A list that receives the ``(B, T)`` log-probabilities (with gradient) of every policy forward pass TRL runs
    inside the block (the loss's: one)."""
    trainer._cpr_captured = []
    try:
        yield trainer._cpr_captured
    finally:
        trainer._cpr_captured = None


def aggregate_token_loss(trainer: Any, per_token_loss: Any, mask: Any, num_items_in_batch: Any = None) -> Any:
    """A micro-batch's scalar loss from its ``(B, T)`` ``per_token_loss`` and loss ``mask``, aggregated as
    ``GRPOTrainer._compute_loss`` aggregates its own for ``trainer.loss_type`` (``grpo``: mean over rows of each row's
    token mean; ``bnpo``: token mean; ``dr_grpo``: sum / (B x max_completion_length); those three divided by the
    gradient accumulation steps in training; ``dapo``: sum / the generation batch's ``num_items_in_batch`` per
    process, times accumulation steps / ``steps_per_generation`` in training). Raises ``ValueError`` for another."""
    training = trainer.model.training
    accumulation = trainer.current_gradient_accumulation_steps if training else 1.0
    loss_type, masked = trainer.loss_type, per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token_loss.size(0) * trainer.max_completion_length) / accumulation
    if loss_type == "dapo":
        normalizer = num_items_in_batch.clamp(min=1.0) / trainer.accelerator.num_processes
        if training:
            normalizer = normalizer * accumulation / trainer.args.steps_per_generation
        return masked.sum() / normalizer
    raise ValueError(f"no aggregation for loss_type {loss_type!r}")


def rows_of(batch: dict[str, Any]) -> dict[str, Any]:
    """``trl.trainer.utils.split_pixel_values_by_grid``: a generation batch whose image tensors
    (``pixel_values``, ``image_grid_thw``, ...) are lists with one entry per row."""
    from trl.trainer.utils import split_pixel_values_by_grid

    return split_pixel_values_by_grid(batch)


def batch_of(rows: dict[str, Any]) -> dict[str, Any]:
    """``trl.trainer.utils.unsplit_pixel_values_by_grid``: the inverse of :func:`rows_of`."""
    from trl.trainer.utils import unsplit_pixel_values_by_grid

    return unsplit_pixel_values_by_grid(rows)


def log_as_trainer(trainer: Any, logs: dict[str, float]) -> None:
    """Log ``logs`` through the base ``transformers.Trainer.log`` (history, callbacks' ``on_log``), not
    ``GRPOTrainer.log``, which would add and then clear the training metrics of ``_metrics["train"]``."""
    from transformers import Trainer

    Trainer.log(trainer, logs)


def tokenize_prompts(trainer: Any, prompts: list[Any]) -> tuple[list[list[int]], list[Any] | None]:
    """``GRPOTrainer._tokenize_prompts``: per conversational prompt (messages whose image blocks hold their
    images), the prompt's token ids as TRL passes them to vLLM, and its images (``None``: no prompt has any)."""
    prompt_ids, images, _ = trainer._tokenize_prompts(prompts)
    return [[int(i) for i in ids] for ids in prompt_ids], images


def process_index(trainer: Any) -> int:
    """This process's index: its rows of the generation batch are ``[index * B, (index + 1) * B)`` of the
    gathered batch (``process_slice`` of ``_generate_and_score_completions``)."""
    return int(trainer.accelerator.process_index)


#: What TRL's model card says of the base model when it names none: TRL takes the name from the model's config
#: (``_name_or_path``) and passes ``base_model=None`` for a local folder (``BaseTrainer.create_model_card``;
#: trl/templates/lm_model_card.md).
UNNAMED_BASE_MODEL = "[None](https://huggingface.co/None)"


def name_base_model(trainer: Any) -> None:
    """After ``create_model_card`` (TRL's public hook, called with every checkpoint): the card TRL wrote into
    ``args.output_dir`` names the base model the trainer's model was loaded from (``model.config._name_or_path``,
    e.g. a local folder) where TRL wrote :data:`UNNAMED_BASE_MODEL`; the main process rewrites it."""
    base = getattr(trainer.model.config, "_name_or_path", "")
    card = Path(trainer.args.output_dir) / "README.md"
    if base and trainer.is_world_process_zero() and card.is_file():
        text = card.read_text(encoding="utf-8")
        if UNNAMED_BASE_MODEL in text:
            card.write_text(text.replace(UNNAMED_BASE_MODEL, f"`{base}`"), encoding="utf-8")
