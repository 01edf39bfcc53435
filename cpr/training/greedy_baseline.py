"""``baseline: greedy`` in training: the greedy completion of every prompt, scored with the phase's rewards, is the
baseline of :func:`cpr.advantages.greedy_advantages` (ReMax, arXiv 2310.10505, section 4; docs/method.md section 4,
"The greedy baseline")."""

from __future__ import annotations

import math
from typing import Any

from cpr.advantages import greedy_advantages, zero_signal_groups
from cpr.errors import CprError
from cpr.training.dynamic_sampling import group_rewards
from cpr.trl_internals import logged_metrics, process_index, tokenize_prompts

#: The share of a round's groups to which the greedy baseline gives no signal (read by the ``zero_std`` guard).
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
    """TRL's total reward of each completion ``texts[i]`` of dataset row ``rows[i]``: the weighted sum (``None`` or
    NaN counts 0; NaN when no function scored it), with the completion recorder paused and each function's
    ``last_credit`` (the sampled completions', which ``credit: step`` reads after this) left as it was."""
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


def greedy_completions(trainer: Any, rows: list[dict[str, Any]]) -> list[str]:
    """The current policy's greedy completion of each row's prompt (every process calls this once a round): in the
    phase's vLLM engine with ``use_vllm``, else transformers' ``generate`` with the ZeRO-3 parameters gathered."""
    from trl.models.utils import unwrap_model_for_generation

    from cpr.evaluation.generation import TransformersGenerator

    conversations = [with_images(row["prompt"], row.get("images")) for row in rows]
    if getattr(trainer, "use_vllm", False):
        return vllm_greedy_completions(trainer, conversations)
    accelerator = trainer.accelerator
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    synced = accelerator.num_processes > 1 and plugin is not None and plugin.zero_stage == 3
    with unwrap_model_for_generation(trainer.model_wrapped, accelerator, gather_deepspeed3_params=True,
                                     gradient_checkpointing_kwargs=getattr(trainer.args, "gradient_checkpointing_kwargs",
                                                                           None)) as unwrapped:
        generator = TransformersGenerator(unwrapped, trainer.processing_class, trainer.max_completion_length,
                                          synced_gpus=synced, repetition_penalty=trainer.repetition_penalty)
        return [g.text for g in generator(conversations)]


def vllm_greedy_completions(trainer: Any, conversations: list[list[dict[str, Any]]]) -> list[str]:
    """Greedy completions of ``conversations`` from the phase's vLLM engine (TRL's ``trainer.vllm_generation``,
    colocate or server, its weights synced by this step's round), tokenized and decoded as TRL does, with the
    engine's settings but :data:`GREEDY_SAMPLING` (restored afterwards). Every process sends as many prompts as
    the one with most (its last repeated): TRL's server mode hands each process its slice by that count."""
    from accelerate.utils import gather_object

    prompt_ids, images = tokenize_prompts(trainer, conversations)
    n = len(prompt_ids)
    most = max(gather_object([n])) if trainer.accelerator.num_processes > 1 else n
    prompt_ids = prompt_ids + [prompt_ids[-1]] * (most - n)
    images = None if images is None else images + [images[-1]] * (most - n)
    engine = trainer.vllm_generation
    saved = {key: getattr(engine, key) for key in GREEDY_SAMPLING}
    for key, value in GREEDY_SAMPLING.items():
        setattr(engine, key, value)
    try:
        _, completion_ids, _, _ = engine.generate(prompts=prompt_ids, images=images, num_generations=1)
    finally:
        for key, value in saved.items():
            setattr(engine, key, value)
    return trainer.processing_class.batch_decode([list(ids) for ids in completion_ids[:n]], skip_special_tokens=True)


def greedy_baseline_advantages(trainer: Any, inputs: list[dict[str, Any]], matrix: Any, reward_funcs: list[Any]) -> Any:
    """This process's ``(B,)`` advantages of a training generation round of ``trainer`` with the greedy baseline:
    :func:`cpr.advantages.greedy_advantages` of ``matrix`` (the round's gathered ``(processes x B, reward
    functions)`` rewards) and the greedy completions' rewards under ``reward_funcs`` (the phase's, unwrapped), one
    a group (exchanged between processes); logs ``baseline/greedy_reward``, ``baseline/above_greedy`` and
    :data:`ZERO_SIGNAL_METRIC`."""
    import torch
    from accelerate.utils import gather_object

    group = trainer.num_generations
    rewards = group_rewards(matrix, trainer.reward_weights, group).view(-1)
    start = process_index(trainer) * len(inputs)
    first: dict[int, int] = {}  # group -> its first row on this process
    for j in range(len(inputs)):
        first.setdefault((start + j) // group, j)
    rows = [inputs[j] for j in first.values()]
    scored = total_rewards(reward_funcs, trainer.reward_weights.tolist(), rows, greedy_completions(trainer, rows))
    local = list(zip(first, scored, strict=True))
    by_group = dict(gather_object(local) if trainer.accelerator.num_processes > 1 else local)
    greedy = torch.tensor([by_group.get(g, math.nan) for g in range(rewards.numel() // group)]).to(rewards)
    advantages = greedy_advantages(rewards, greedy, group, trainer.scale_rewards)
    logged = logged_metrics(trainer, "train")
    logged[ZERO_SIGNAL_METRIC].append(zero_signal_groups(rewards, greedy, group).float().mean().item())
    known = ~torch.isnan(greedy)
    if known.any():
        logged["baseline/greedy_reward"].append(torch.nanmean(greedy).item())
        above = rewards.view(-1, group)[known] > greedy[known].unsqueeze(1) + 1e-6
        logged["baseline/above_greedy"].append(above.float().mean().item())
    return advantages[start:start + len(inputs)]
