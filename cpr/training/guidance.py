"""Reference-guided GRPO (``phase_settings.<name>.guidance``, :class:`cpr.training.config_sections.GuidanceConfig`):
the records' reference steps as off-policy guidance, for the steps the policy never samples.

* ``reference`` (LUFFY, arXiv 2504.14945, section 3): in each group of ``num_generations`` completions the last
  ``members`` are the record's reference completion (:func:`cpr.data.prompts.target_text`, the warm start's target,
  which the phase's reward functions parse), scored by the same reward functions and part of the group's advantage.
  Its behaviour probability is taken as 1, so its token ratio is pi_theta(o_t), and its tokens' loss is
  -f(pi_theta(o_t)) A_t with f(p) = p / (p + gamma), not clipped (:func:`shaped_token_loss`, the paper's policy
  shaping, eq. 6); the sampled completions keep TRL's loss. Under vLLM its sampling log-probabilities are NaN
  (TRL's mark of a token vLLM did not score) and its importance-sampling ratio 1 (:func:`exclude_from_correction`).
* ``prefix`` (QuestA, arXiv 2507.13266; UFT, arXiv 2505.16984): every completion of a group starts from the first k
  reference steps (:func:`cpr.data.prompts.target_prefix`), k from :func:`hint_steps`; the hint is part of the
  completion the reward functions score and is left out of the loss (TRL's ``tool_mask``); the policy writes up to
  ``max_completion_length`` tokens after it.

With ``beta`` above 0, TRL's KL term applies to the reference completions' tokens as to the others'.

Logged per step: ``guidance/reward`` and ``guidance/advantage`` (mean total reward and trained advantage of the
reference completions), ``guidance/reference_best`` (share of groups whose reference reward is at least every
sampled completion's), ``guidance/ratio`` (the reference tokens' mean pi_theta(o_t)); with ``prefix``,
``guidance/hint_steps`` (mean k of a round's rows)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from cpr.data.prompts import target_prefix, target_text
from cpr.errors import ConfigError, InputError
from cpr.training.dynamic_sampling import group_rewards
from cpr.trl_internals import aggregate_token_loss, generate_single_turn, logged_metrics, process_index

#: TRL loss types whose aggregation :func:`cpr.trl_internals.aggregate_token_loss` reproduces for the reference term.
GUIDED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def guided_rows(local_rows: int, rank: int, group_size: int, members: int) -> list[bool]:
    """Which of this process's ``local_rows`` rows are reference completions: global row ``rank x local_rows + i``
    (TRL's gathered order, groups of ``group_size`` consecutive rows) is one when it is among its group's last
    ``members``."""
    return [(rank * local_rows + i) % group_size >= group_size - members for i in range(local_rows)]


def hint_steps(step: int, max_steps: int, num_steps: int, prefix_share: float, anneal_share: float) -> int:
    """k, the reference steps given at training step ``step`` (0-based) of ``max_steps``, for a record of
    ``num_steps``: round(share x num_steps), the share falling linearly from ``prefix_share`` at step 0 to 0 at
    ``anneal_share x max_steps`` (QuestA's partial-solution hint, annealed as UFT does)."""
    share = prefix_share * max(0.0, 1.0 - step / max(anneal_share * max_steps, 1e-9))
    return min(num_steps, math.floor(share * num_steps + 0.5))


def hint_ids(tokenizer: Any, steps: list[str], answer: str, k: int) -> list[int]:
    """The hint's token ids: the first tokens of the reference completion (:func:`cpr.data.prompts.target_text`
    tokenized whole, so that the continuation starts at one of its own token boundaries) that end within
    :func:`cpr.data.prompts.target_prefix` of ``k`` steps; ``[]`` for ``k`` 0."""
    if k <= 0:
        return []
    end = len(target_prefix(steps, k))
    encoded = tokenizer(target_text(steps, answer), add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (_, stop) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True) if stop <= end]


def shaped_token_loss(logps: torch.Tensor, advantages: torch.Tensor, gamma: float) -> torch.Tensor:
    """The per-token loss ``(B, T)`` of reference completions: -f(pi_theta(o_t)) A_t, not clipped, with
    f(p) = p / (p + gamma), LUFFY's policy shaping of an off-policy token whose behaviour probability is 1
    (arXiv 2504.14945, eq. 6). ``logps``: ``(B, T)`` log pi_theta(o_t); ``advantages``: ``(B,)`` or ``(B, T)``."""
    p = logps.exp()
    return -(p / (p + gamma)) * (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages)


def exclude_from_correction(batch: dict[str, Any], guided: torch.Tensor) -> dict[str, Any]:
    """``batch`` (a generation batch dict) with the vLLM importance-sampling ratio (``(B, T)`` or ``(B, 1)``) of the
    ``guided`` rows (``(B,)`` bool) set to 1: the reference completion was not sampled, so no correction applies."""
    ratio = batch.get("importance_sampling_ratio")
    if ratio is not None:
        ratio = ratio.clone()
        ratio[guided] = 1.0
        batch["importance_sampling_ratio"] = ratio
    return batch


def check_guidance(config: Any, *, num_generations: int, loss_type: str, liger: bool,
                   off_policy_mask_threshold: float | None, field: str = "guidance") -> None:
    """Raise :class:`ConfigError` for a guidance ``config`` the trainer cannot run: ``reference`` with ``members``
    not below ``num_generations``, a ``loss_type`` outside :data:`GUIDED_LOSS_TYPES`, the Liger loss or TRL's
    off-policy mask (which would read the reference's NaN sampling log-probabilities)."""
    if config is None or config.mode != "reference":
        return
    if config.members >= num_generations:
        raise ConfigError(f"{config.members} reference completions in groups of {num_generations} leave none sampled",
                          field=f"{field}.members")
    if loss_type not in GUIDED_LOSS_TYPES:
        raise ConfigError(f"loss_type {loss_type!r} is not supported with reference guidance "
                          f"(one of {', '.join(GUIDED_LOSS_TYPES)})", field=f"{field}.mode")
    if liger:
        raise ConfigError("use_liger_kernel computes TRL's loss without the hook reference guidance adds its "
                          "term through", field=f"{field}.mode")
    if off_policy_mask_threshold is not None:
        raise ConfigError("off_policy_mask_threshold is not supported with reference guidance", field=f"{field}.mode")


def check_reference_steps(dataset: Any) -> None:
    """Raise :class:`InputError` naming the first record of ``dataset`` (a GRPO dataset) without reference steps."""
    ids = dataset["id"] if "id" in dataset.column_names else range(len(dataset))
    for rid, steps in zip(ids, dataset["reference_steps"], strict=True):
        if not steps:
            raise InputError("has no reference steps to guide GRPO with", record_id=str(rid), field="reference_steps")


class Guidance:
    """A trainer's guidance (:class:`cpr.training.config_sections.GuidanceConfig` or ``None``: off): a generation
    round is run inside :meth:`guiding`, which has :meth:`single_turn` (the trainer's ``_generate_single_turn``)
    put in the references or hints; :meth:`mark` then edits the round's batch; :meth:`loss_term` is the reference
    completions' loss."""

    def __init__(self, trainer: Any, config: Any) -> None:
        self.trainer = trainer
        self.config = config if config is not None and config.mode != "none" else None
        self.mode = self.config.mode if self.config is not None else "none"
        self._plan: list[list[int]] | None = None  # per local row: token ids of its reference or hint
        self._guided: list[bool] | None = None
        self._hints: list[int] = []  # prefix: the hint's token count per local row of the last round

    @contextlib.contextmanager
    def guiding(self, inputs: list[dict[str, Any]]) -> Iterator[None]:
        """Within it, a training generation round of ``inputs`` (this process's rows) is guided."""
        t = self.trainer
        if self.config is None or not t.model.training:
            yield
            return
        tokenizer = getattr(t.processing_class, "tokenizer", t.processing_class)
        if self.mode == "reference":
            self._guided = guided_rows(len(inputs), process_index(t), t.num_generations, self.config.members)
            eos = [t.eos_token_ids[0]]
            self._plan = [tokenizer(target_text(x["reference_steps"], x["answer"]), add_special_tokens=False)
                          ["input_ids"][: t.max_completion_length - 1] + eos if guided else []
                          for x, guided in zip(inputs, self._guided, strict=True)]
        else:
            c = self.config
            ks = [hint_steps(t.state.global_step, t.args.max_steps, len(x["reference_steps"]), c.prefix_share,
                             c.anneal_share) for x in inputs]
            self._plan = [hint_ids(tokenizer, x["reference_steps"], x["answer"], k) for x, k in zip(inputs, ks, strict=True)]
            logged_metrics(t)["guidance/hint_steps"].append(sum(ks) / max(len(ks), 1))
        try:
            yield
        finally:
            self._plan = None

    def single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: dict[str, Any],
                    num_generations: int, has_tool_images: bool = False) -> tuple[list[list[int]], Any]:
        """TRL's ``_generate_single_turn`` (completion token ids and vLLM log-probabilities, ``None`` without vLLM)
        with the plan of :meth:`guiding`: ``reference`` replaces the guided rows' completions (log-probabilities
        NaN); ``prefix`` generates each row from its prompt and hint and returns hint + continuation (NaN for the
        hint's log-probabilities)."""
        t, plan = self.trainer, self._plan
        if plan is None:
            return generate_single_turn(t, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if self.mode == "reference":
            completions, logprobs = generate_single_turn(t, prompt_ids, images, multimodal_fields, num_generations,
                                                         has_tool_images)
            completions = [ids if not ref else list(ref) for ids, ref in zip(completions, plan, strict=True)]
            if logprobs is not None:
                logprobs = [lp if not ref else [math.nan] * len(ref) for lp, ref in zip(logprobs, plan, strict=True)]
            return completions, logprobs
        extended = [list(p) + h for p, h in zip(prompt_ids, plan, strict=True)]
        fields = {k: [list(v[i]) + [0] * len(plan[i]) for i in range(len(v))]
                  if isinstance(v, list) and v and isinstance(v[0], list) else v for k, v in multimodal_fields.items()}
        completions, logprobs = generate_single_turn(t, extended, images, fields, num_generations, has_tool_images)
        completions = [h + list(ids) for h, ids in zip(plan, completions, strict=True)]
        if logprobs is not None:
            logprobs = [[math.nan] * len(h) + list(lp) for h, lp in zip(plan, logprobs, strict=True)]
        self._hints = [len(h) for h in plan]
        return completions, logprobs

    def mark(self, batch: dict[str, Any], rewards: torch.Tensor) -> dict[str, Any]:
        """A guided training round's ``batch`` (TRL's dict, this process's rows) and gathered ``rewards``
        ``(processes x rows, functions)``: ``reference`` adds ``guided`` ``(B,)`` (read by the trainer's
        ``compute_loss``), sets their importance-sampling ratio to 1 and logs their reward metrics; ``prefix``
        masks the hints out of the loss (``tool_mask``) and recounts ``num_items_in_batch``."""
        t = self.trainer
        if self.config is None or not t.model.training:
            return batch
        device = batch["completion_ids"].device
        if self.mode == "prefix":
            hints = torch.tensor(self._hints, device=device)
            positions = torch.arange(batch["completion_ids"].size(1), device=device)
            tool_mask = (positions.unsqueeze(0) >= hints.unsqueeze(1)).to(batch["completion_mask"].dtype)
            if batch.get("tool_mask") is not None:
                tool_mask = tool_mask * batch["tool_mask"]
            batch["tool_mask"] = tool_mask
            batch["num_items_in_batch"] = t.accelerator.gather((batch["completion_mask"] * tool_mask).sum()).sum()
            return batch
        batch["guided"] = torch.tensor(self._guided, dtype=torch.bool, device=device)
        exclude_from_correction(batch, batch["guided"])
        g = t.num_generations
        totals = group_rewards(rewards, t.reward_weights, g)  # a row without any reward NaN, as TRL counts it
        ref = torch.arange(g, device=totals.device) >= g - self.config.members
        best = totals[:, ref].nan_to_num(-math.inf).min(dim=1).values >= totals[:, ~ref].nan_to_num(-math.inf).max(dim=1).values
        metrics = logged_metrics(t)
        metrics["guidance/reward"].append(totals[:, ref].nanmean().item())
        metrics["guidance/reference_best"].append(best.float().mean().item())
        return batch

    def log_advantage(self, batch: dict[str, Any]) -> None:
        """Log ``guidance/advantage``, the mean advantage of the ``guided`` rows of a training batch as trained (after
        the greedy baseline, before step credit), over the processes."""
        if "guided" not in batch:
            return
        guided, advantages = batch["guided"], batch["advantages"]
        local = torch.stack([(advantages * guided).sum(), guided.sum()]).float()
        adv_sum, count = self.trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        logged_metrics(self.trainer)["guidance/advantage"].append(adv_sum / max(count, 1.0))

    def loss_term(self, logps: torch.Tensor, inputs: dict[str, Any], advantages: torch.Tensor,
                  guided: torch.Tensor) -> torch.Tensor:
        """The reference completions' share of a micro-batch's loss: :func:`shaped_token_loss` of their tokens
        (``logps`` ``(B, T)``, the policy's, with gradient; ``advantages`` as trained), aggregated as TRL aggregates
        the sampled completions' loss (:func:`cpr.trl_internals.aggregate_token_loss`); logs ``guidance/ratio``."""
        t = self.trainer
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        rows = guided.to(logps.dtype).unsqueeze(1)
        per_token = shaped_token_loss(logps, advantages, self.config.gamma) * rows
        term = aggregate_token_loss(t, per_token, mask, inputs.get("num_items_in_batch"))
        weight = mask * rows
        local = torch.stack([(logps.detach().exp() * weight).sum(), weight.sum()]).float()
        total, count = t.accelerator.reduce(local, reduction="sum").tolist()
        if count > 0:
            logged_metrics(t, "train" if t.model.training else "eval")["guidance/ratio"].append(total / count)
        return term


def split_guided(inputs: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """A micro-batch with ``guided`` rows -> (the micro-batch for TRL's loss, without ``guided`` and with those rows'
    advantages 0, so that their TRL loss is 0 while they stay in its normalisation; ``guided`` ``(B,)``; the
    advantages as given)."""
    guided, advantages = inputs["guided"], inputs["advantages"]
    keep = (~guided).to(advantages.dtype)
    rest = {k: v for k, v in inputs.items() if k != "guided"}
    rest["advantages"] = advantages * (keep if advantages.dim() == 1 else keep.unsqueeze(1))
    return rest, guided, advantages

