"""The GRPO trainer of every phase, :class:`CprGRPOTrainer`; the features it combines live in their own modules,
as functions and small helper objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from trl import GRPOTrainer

from cpr import trl_internals
from cpr.advantages import check_baseline
from cpr.credit import batch_token_advantages, check_credit, combine
from cpr.errors import ConfigError, InputError
from cpr.training.config_sections import GuardsConfig, GuidanceConfig
from cpr.training.curriculum import (
    CurriculumConfig,
    CurriculumSampler,
    CurriculumStateCallback,
    observation_lag,
    total_generation_batches,
)
from cpr.training.divergence import DivergenceGuard
from cpr.training.dynamic_sampling import DynamicSampling
from cpr.training.greedy_baseline import greedy_baseline_advantages
from cpr.training.guidance import Guidance, check_guidance, check_reference_steps, split_guided


class CprGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with the phase's features, each off by default; TRL's private state only through
    :mod:`cpr.trl_internals`. A generation batch reads top to bottom in :meth:`generation_batch`.

    * ``curriculum``: its train sampler is a :class:`~cpr.training.curriculum.CurriculumSampler`
      (``self.curriculum_sampler``, seeded with ``args.seed``); ``None``: TRL's ``RepeatSampler``.
    * ``dynamic_sampling`` (:class:`cpr.training.config_sections.DynamicSamplingConfig`, named in errors by
      ``dynamic_sampling_field``): :class:`~cpr.training.dynamic_sampling.DynamicSampling` (``self.sampling``).
    * ``baseline``: ``"group"`` (TRL's group mean) or ``"greedy"`` (:mod:`cpr.training.greedy_baseline`).
    * ``credit``: ``"completion"`` (TRL's advantages) or ``"step"`` with weight ``credit_weight`` (:mod:`cpr.credit`).
    * ``guidance`` (:class:`cpr.training.config_sections.GuidanceConfig`, named in errors by ``guidance_field``):
      :class:`~cpr.training.guidance.Guidance` (``self.guidance``); the reference completions' loss is added in
      :meth:`compute_loss`.
    * ``guards``: ``self.guard``, a :class:`~cpr.training.divergence.DivergenceGuard` (``None`` when disabled;
      events to ``guard_events_path``).

    Raises:
        ConfigError: ``skip_step`` under DeepSpeed or fp16 loss scaling; what :func:`cpr.credit.check_credit` and
            :func:`cpr.advantages.check_baseline` raise; dynamic sampling without a curriculum; with a curriculum,
            ``shuffle_dataset`` False, what :func:`cpr.training.guidance.check_guidance` raises, a train dataset that is not a map-style ``datasets.Dataset`` or (when
            training starts) ``max_steps`` not positive with ``staged`` / ``linear`` / ``mastery``, a
            ``mastery_reward`` that is not one of the reward functions.
        InputError: with a curriculum, no ``difficulty`` column, or an unknown difficulty; with guidance, a
            training record without reference steps.
    """

    # TRL's private hooks, each overridden in cpr.trl_internals and routed to the public methods below
    _get_train_sampler = trl_internals.train_sampler_hook
    _generate_and_score_completions = trl_internals.generation_batch_hook
    _calculate_rewards = trl_internals.reward_matrix_hook
    _generate_single_turn = trl_internals.single_turn_hook
    _get_per_token_logps_and_entropies = trl_internals.logps_hook

    def __init__(self, *args: Any, reward_funcs: Any, curriculum: CurriculumConfig | None = None,
                 dynamic_sampling: Any = None, dynamic_sampling_field: str = "dynamic_sampling",
                 guards: GuardsConfig | None = None, guard_events_path: str | Path | None = None,
                 credit: str = "completion", credit_weight: float = 1.0, baseline: str = "group",
                 guidance: GuidanceConfig | None = None, guidance_field: str = "guidance", **kwargs: Any) -> None:
        reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]  # TRL takes one alone
        grpo, sampling = kwargs.get("args"), bool(getattr(dynamic_sampling, "enabled", False))
        check_credit(credit, credit_weight, reward_funcs, loss_type=getattr(grpo, "loss_type", "grpo"),
                     off_policy_mask_threshold=getattr(grpo, "off_policy_mask_threshold", None),
                     dynamic_sampling=sampling)
        check_baseline(baseline, dynamic_sampling=sampling,
                       aggregation=getattr(grpo, "multi_objective_aggregation", "sum_then_normalize"))
        if sampling and curriculum is None:  # a phase resumed from a checkpoint saved before schedule none used it
            raise ConfigError("dynamic sampling draws its fresh prompts from the curriculum sampler, which this phase "
                              "does not use (its checkpoint predates it); resume without dynamic sampling",
                              field=dynamic_sampling_field)
        self.curriculum, self.curriculum_sampler = curriculum, None
        self.mastery_reward, self.mastery_pass = -1, 0.5
        self.credit, self.credit_weight = credit, float(credit_weight)
        self.baseline, self.baseline_reward_funcs = baseline, list(reward_funcs)
        self._credit_funcs = [(i, f) for i, f in enumerate(reward_funcs) if getattr(f, "scores_steps", False)]
        self.guard = (DivergenceGuard(guards, events_path=guard_events_path, baseline=baseline)
                      if guards and guards.enabled else None)
        if self.guard is not None:
            reward_funcs = self.guard.watch(reward_funcs)
        super().__init__(*args, reward_funcs=reward_funcs, **kwargs)
        check_guidance(guidance, num_generations=self.num_generations, loss_type=self.loss_type,
                       liger=bool(self.args.use_liger_kernel), off_policy_mask_threshold=self.off_policy_mask_threshold,
                       field=guidance_field)
        self.guidance = Guidance(self, guidance)
        if self.guidance.config is not None:
            check_reference_steps(self.train_dataset)
        self.sampling = DynamicSampling(self, dynamic_sampling)
        if self.sampling.config is not None:
            self.add_callback(self.sampling)
        if curriculum is not None:
            if not self.args.shuffle_dataset:
                raise ConfigError("must be True with a curriculum (the curriculum always shuffles within buckets)",
                                  field="shuffle_dataset")
            if not hasattr(self.train_dataset, "column_names"):
                raise ConfigError("a curriculum needs a map-style datasets.Dataset as train_dataset",
                                  field="train_dataset")
            self.add_callback(CurriculumStateCallback(self))
        if self.guard is not None:
            self.guard.bind(self).check_supported(deepspeed=self.is_deepspeed_enabled,
                                                  fp16_scaler=self.accelerator.scaler is not None)
            self.add_callback(self.guard)

    def generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch dict of one generation batch (``inputs``: this process's rows; TRL's ``advantages``
        ``(B,)``, or ``(B, T)`` with step credit), in this order: TRL's generation round (generate, score,
        group-mean advantages; in training guided, :meth:`generation_round`); in training, the curriculum's checks and pass rates and dynamic sampling's extra
        rounds (:meth:`cpr.training.dynamic_sampling.DynamicSampling.rounds`), then the greedy baseline's
        advantages; with ``credit: step``, the token-level advantages (:meth:`token_advantages`)."""
        batch, rewards = self.generation_round(inputs)
        if self.model.training:
            batch = self.sampling.rounds(inputs, batch, rewards, self.generation_round)
            if self.baseline == "greedy":  # no dynamic sampling with it: the batch is the first round's
                advantages = greedy_baseline_advantages(self, inputs, rewards, self.baseline_reward_funcs)
                batch["advantages"] = advantages.to(batch["advantages"])
        self.guidance.log_advantage(batch)
        if self.credit == "step":
            batch["advantages"] = self.token_advantages(batch)
        return batch

    def generation_round(self, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], torch.Tensor]:
        """TRL's generation round of ``inputs`` (:func:`cpr.trl_internals.generate_and_score`: the batch dict and the
        gathered reward matrix), guided in training (:class:`~cpr.training.guidance.Guidance`)."""
        with self.guidance.guiding(inputs):
            batch, rewards = trl_internals.generate_and_score(self, inputs)
        return self.guidance.mark(batch, rewards), rewards

    def generate_completions(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: dict[str, Any],
                             num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], Any]:
        """A round's completions (TRL's ``_generate_single_turn``, :func:`cpr.trl_internals.single_turn_hook`), with
        guidance's references or hints (:meth:`cpr.training.guidance.Guidance.single_turn`)."""
        return self.guidance.single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's loss of a micro-batch (transformers' subclass hook); with reference guidance (a ``guided`` ``(B,)``
        in ``inputs``), TRL's loss with the reference rows' advantages 0 plus their shaped-ratio loss
        (:meth:`cpr.training.guidance.Guidance.loss_term`) on the same forward pass."""
        if "guided" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        rest, guided, advantages = split_guided(inputs)
        with trl_internals.captured_logps(self) as captured:
            loss = super().compute_loss(model, rest, return_outputs, num_items_in_batch)
        return loss + self.guidance.loss_term(captured[-1], rest, advantages, guided)

    def token_advantages(self, batch: dict[str, Any]) -> Any:
        """With ``credit: step``, the ``(B, T)`` advantages of ``batch`` (``completion_ids``, ``completion_mask``,
        ``advantages``): :func:`cpr.credit.batch_token_advantages` of the step credit the reward functions that
        score steps kept (``last_credit``), its metrics logged under the trainer's mode; else ``None``."""
        if self.credit != "step":
            return None
        from accelerate.utils import gather_object

        weights = self.reward_weights.tolist()
        per_func = [f.last_credit for _, f in self._credit_funcs]
        credits = [combine(row, [weights[i] for i, _ in self._credit_funcs]) for row in zip(*per_func, strict=True)]
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        advantages, metrics = batch_token_advantages(
            credits, batch["completion_ids"], batch["completion_mask"], batch["advantages"], tokenizer,
            group_size=self.num_generations if self.model.training else self.num_generations_eval,
            weight=self.credit_weight, gather=gather_object if self.accelerator.num_processes > 1 else None,
            process_index=trl_internals.process_index(self))
        logged = trl_internals.logged_metrics(self, "train" if self.model.training else "eval")
        for name, value in metrics.items():
            logged[name].append(value)
        return advantages

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
        _, batch_size, repeat_count = trl_internals.repeat_sampler_shape(self)
        total = None if self.curriculum.schedule == "none" else total_generation_batches(
            self.args.max_steps, self.args.gradient_accumulation_steps, repeat_count,
            max(len(source) // batch_size, 1))  # fewer rows than batch_size: the sampler says so
        if self.curriculum.schedule == "mastery":
            name = self.curriculum.mastery_reward or self.reward_func_names[-1]
            if name not in self.reward_func_names:
                raise ConfigError(f"{name!r} is not one of the phase's reward functions {self.reward_func_names}",
                                  field="curriculum.mastery_reward")
            self.mastery_reward, self.mastery_pass = self.reward_func_names.index(name), self.curriculum.mastery_pass
        fresh = self.sampling.config.max_resample if self.sampling.config is not None else 0
        self.curriculum_sampler = CurriculumSampler(
            source["difficulty"], self.num_generations, batch_size, repeat_count, total, self.curriculum,
            self.args.seed, record_ids=source["id"] if "id" in source.column_names else None, fresh_rounds=fresh,
            observation_lag=observation_lag(self.args.gradient_accumulation_steps, repeat_count),
        )
        return self.curriculum_sampler

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # noqa: D102
        loss = super().training_step(*args, **kwargs)
        if self.guard is not None:
            self.guard.observe_loss(loss)
        return loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self.guard is not None and "loss" in logs:
            logs.update(self.guard.log_values())
        super().log(logs, *args, **kwargs)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        super().create_model_card(*args, **kwargs)
        trl_internals.name_base_model(self)
