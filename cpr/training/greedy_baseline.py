"""``baseline: greedy`` in training: each generation round also decodes every prompt greedily with the current
policy, scores that completion with the phase's reward functions and weights, and gives the round's sampled
completions the advantages of :func:`cpr.advantages.greedy_advantages` instead of TRL's group-mean ones
(ReMax, arXiv 2310.10505, section 4). The greedy completions are not trained on and not recorded.

Costs one greedy generation of each prompt a round (``1 / num_generations`` more generated completions, without
sampling; through the phase's vLLM engine when it has one) and one reward call on them. Logged per step: ``baseline/greedy_reward`` (mean total reward of the
greedy completions), ``baseline/above_greedy`` (share of the sampled completions whose reward is above their
greedy completion's) and ``baseline/frac_zero_signal`` (share of the groups whose every advantage is 0: all
samples tie their baseline; TRL's ``frac_reward_zero_std`` measures the samples' spread, which says nothing
about the greedy baseline's signal).
"""

from __future__ import annotations

import math
from typing import Any

from cpr.advantages import greedy_advantages, zero_signal_groups
from cpr.errors import CprError
from cpr.trl_internals import logged_metrics, process_index

#: The share of a round's groups to which the greedy baseline gives no signal (:func:`cpr.advantages.zero_signal_groups`);
#: the ``zero_std`` guard reads it instead of TRL's ``frac_reward_zero_std`` with ``baseline: greedy``.
ZERO_SIGNAL_METRIC = "baseline/frac_zero_signal"


def with_images(prompt: list[dict[str, Any]], images: list[Any] | None) -> list[dict[str, Any]]:
    """A TRL prompt (messages whose image blocks are bare ``{"type": "image"}``) with its row's ``images`` put
    into those blocks in order, for generation outside TRL. Raises :class:`CprError` when the counts differ."""
    pending = list(images or [])
    out = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            blocks = []
            for block in content:
                if isinstance(block, dict) and block.get("type") == "image":
                    if not pending:
                        raise CprError("a prompt has more image blocks than its row has images")
                    block = {**block, "image": pending.pop(0)}
                blocks.append(block)
            content = blocks
        out.append({**message, "content": content})
    if pending:
        raise CprError(f"a prompt has {len(pending)} images more than image blocks")
    return out


def total_rewards(reward_funcs: list[Any], weights: list[float], rows: list[dict[str, Any]], texts: list[str]) -> list[float]:
    """TRL's total reward of each completion ``texts[i]`` of ``rows[i]`` (a dataset row: the reward columns and,
    where it has one, ``prompt``, else the functions get ``prompts=None``): the weighted sum over ``reward_funcs``
    (``None`` or NaN counts 0; NaN when no function scored it, as TRL's unscorable rows), scored with the completion
    recorder paused, without a trainer's logging, and leaving a step-scoring function's ``last_credit`` (the
    sampled completions' step credit, which ``credit: step`` reads after this) as it was."""
    from cpr.rewards import completion_records_paused

    columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
    prompts = [row["prompt"] for row in rows] if "prompt" in rows[0] else None
    totals, scored = [0.0] * len(texts), [False] * len(texts)
    with completion_records_paused():
        for func, weight in zip(reward_funcs, weights, strict=True):
            kept = getattr(func, "last_credit", None)
            try:
                values = func(prompts=prompts, completions=texts, **columns)
            finally:
                if kept is not None:
                    func.last_credit = kept
            for i, value in enumerate(values):
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    totals[i] += weight * float(value)
                    scored[i] = True
    return [t if s else math.nan for t, s in zip(totals, scored, strict=True)]


#: TRL's vLLM sampling settings replaced for greedy decoding (vLLM: temperature 0 is greedy; top-k 0 and top-p 1
#: keep every token; min-p ``None`` is TRL's 0).
GREEDY_SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": None}


def vllm_greedy(generation: Any, prompt_ids: list[list[int]], images: list[Any] | None) -> list[list[int]]:
    """The greedy completion ids of each prompt from TRL's ``VLLMGeneration`` ``generation`` (its ``generate``,
    one completion a prompt): its own settings (``repetition_penalty``, ``max_completion_length``,
    ``generation_kwargs`` such as the placeholder ``bad_words``) with :data:`GREEDY_SAMPLING`, which are
    restored afterwards, also when generation fails. Every process of a server-mode run must call it."""
    saved = {key: getattr(generation, key) for key in GREEDY_SAMPLING}
    for key, value in GREEDY_SAMPLING.items():
        setattr(generation, key, value)
    try:
        _, completion_ids, _, _ = generation.generate(prompts=prompt_ids, images=images, num_generations=1)
    finally:
        for key, value in saved.items():
            setattr(generation, key, value)
    return [list(ids) for ids in completion_ids]


class GreedyBaselineMixin:
    """Mixin before :class:`cpr.training.curriculum.CurriculumGRPOTrainer` (its ``score_generation_batch`` hook,
    :class:`cpr.trl_internals.GenerationHook`): with ``baseline="greedy"`` each training generation round's
    ``advantages`` (``(B,)``, this process's rows) become :func:`cpr.advantages.greedy_advantages` of the round's
    gathered rewards and the greedy completions' rewards. ``baseline_reward_funcs``: the phase's reward
    functions before any wrapping (the divergence guard's monitors are not fed the greedy completions)."""

    baseline: str = "group"
    baseline_reward_funcs: list[Any] = []

    def score_generation_batch(self, inputs: list[dict[str, Any]], generate: Any) -> dict[str, Any]:
        batch = super().score_generation_batch(inputs, generate)
        if self.baseline == "greedy":
            batch["advantages"] = self.greedy_baseline_advantages(inputs).to(batch["advantages"])
        return batch

    def greedy_completions(self, rows: list[dict[str, Any]]) -> list[str]:
        """The current policy's greedy completion of each row's prompt (``max_completion_length`` new tokens,
        TRL's ``repetition_penalty``, as its sampling; every process calls this once a round). With
        ``use_vllm``: through the phase's vLLM engine (:meth:`vllm_greedy_completions`); else transformers'
        ``generate`` with the ZeRO-3 parameters gathered and, with several ZeRO-3 processes, lock-step
        ``synced_gpus``."""
        from trl.models.utils import unwrap_model_for_generation

        from cpr.evaluation.generation import TransformersGenerator

        conversations = [with_images(row["prompt"], row.get("images")) for row in rows]
        if getattr(self, "use_vllm", False):
            return self.vllm_greedy_completions(conversations)
        accelerator = self.accelerator
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        synced = accelerator.num_processes > 1 and plugin is not None and plugin.zero_stage == 3
        with unwrap_model_for_generation(self.model_wrapped, accelerator, gather_deepspeed3_params=True,
                                         gradient_checkpointing_kwargs=getattr(self.args, "gradient_checkpointing_kwargs",
                                                                               None)) as unwrapped:
            generator = TransformersGenerator(unwrapped, self.processing_class, self.max_completion_length,
                                              synced_gpus=synced, repetition_penalty=self.repetition_penalty)
            return [g.text for g in generator(conversations)]

    def vllm_greedy_completions(self, conversations: list[list[dict[str, Any]]]) -> list[str]:
        """Greedy completions of ``conversations`` (messages with their images) from the phase's vLLM engine,
        colocate or server (TRL's ``vllm_generation``, its weights synced by this step's generation round):
        the prompts tokenized as TRL tokenizes them (:func:`cpr.trl_internals.tokenize_prompts`) and decoded as
        TRL decodes completions, TRL's sampling settings with :data:`GREEDY_SAMPLING` (:func:`vllm_greedy`).
        Every process sends as many prompts as the one with most (its last repeated): TRL's server mode
        hands each process its slice of the gathered prompts by that count."""
        from accelerate.utils import gather_object

        from cpr.trl_internals import tokenize_prompts

        prompt_ids, images = tokenize_prompts(self, conversations)
        n = len(prompt_ids)
        most = max(gather_object([n])) if self.accelerator.num_processes > 1 else n
        prompt_ids = prompt_ids + [prompt_ids[-1]] * (most - n)
        images = None if images is None else images + [images[-1]] * (most - n)
        completion_ids = vllm_greedy(self.vllm_generation, prompt_ids, images)[:n]
        return self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)

    def greedy_baseline_advantages(self, inputs: list[dict[str, Any]]) -> Any:
        """This process's ``(B,)`` advantages with the greedy baseline, from ``gathered_rewards`` (the round's
        ``(processes x B, reward functions)`` reward matrix) and the greedy completions of the groups its rows
        belong to (the greedy rewards are exchanged between processes, so a group split over processes gets one
        baseline); logs ``baseline/greedy_reward``, ``baseline/above_greedy`` and :data:`ZERO_SIGNAL_METRIC`."""
        import torch
        from accelerate.utils import gather_object

        group = self.num_generations
        matrix = self.gathered_rewards
        rewards = (matrix * self.reward_weights.to(matrix.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(matrix).all(dim=1)] = math.nan
        start = process_index(self) * len(inputs)
        first: dict[int, int] = {}  # group -> its first row on this process
        for j in range(len(inputs)):
            first.setdefault((start + j) // group, j)
        rows = [inputs[j] for j in first.values()]
        scored = total_rewards(self.baseline_reward_funcs, self.reward_weights.tolist(), rows, self.greedy_completions(rows))
        local = list(zip(first, scored, strict=True))
        pairs = gather_object(local) if self.accelerator.num_processes > 1 else local
        greedy = torch.full((rewards.numel() // group,), math.nan)
        for g, value in pairs:
            greedy[g] = value
        greedy = greedy.to(rewards)
        advantages = greedy_advantages(rewards, greedy, group, self.scale_rewards)
        logged = logged_metrics(self, "train")
        logged[ZERO_SIGNAL_METRIC].append(zero_signal_groups(rewards, greedy, group).float().mean().item())
        known = ~torch.isnan(greedy)
        if known.any():
            logged["baseline/greedy_reward"].append(torch.nanmean(greedy).item())
            grouped = rewards.view(-1, group)[known]
            above = (grouped > greedy[known].unsqueeze(1) + 1e-6).float()
            logged["baseline/above_greedy"].append(above.mean().item())
        return advantages[start:start + len(inputs)]
