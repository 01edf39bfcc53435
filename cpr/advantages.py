"""The baseline of a GRPO advantage: TRL's group mean (``baseline: group``) or the reward of the policy's greedy
completion of the same prompt (``baseline: greedy``).

GRPO: DeepSeekMath, arXiv 2402.03300, section 4.1.2; the greedy baseline: ReMax (Li et al., arXiv 2310.10505,
section 4) with TRL's ``scale_rewards`` scaling, the greedy rewards counted in the standard deviation
(docs/method.md section 4, "The greedy baseline").
"""

from __future__ import annotations

from typing import Any

BASELINES: tuple[str, ...] = ("group", "greedy")
SCALES: tuple[str, ...] = ("group", "batch", "none")


def greedy_advantages(rewards: Any, greedy_rewards: Any, group_size: int, scale_rewards: str = "group") -> Any:
    """Advantages with the greedy baseline: ``(r_i - r_greedy) / (std + 1e-4)``, ``std`` the sample standard
    deviation of the group's rewards and its greedy completion's (``scale_rewards: group``; ``batch``: of all of
    them in the batch; ``none``: no division).

    Args:
        rewards: ``(N,)`` float tensor, the total (weighted) reward of every completion of the generation batch,
            all processes, groups consecutive (TRL's order); NaN: unscorable.
        greedy_rewards: ``(N // group_size,)`` each group's greedy completion's reward; NaN: use the group mean.
        group_size: TRL's ``num_generations``; scale_rewards: TRL's ``scale_rewards`` (``group``, ``batch``, ``none``).

    Returns:
        ``(N,)`` advantages; 0 for unscorable completions and where the scale is NaN (a group of one), as TRL.

    Raises:
        ValueError: ``N`` not a multiple of ``group_size``, ``greedy_rewards`` of another length, or an unknown
            ``scale_rewards``.
    """
    import torch
    from trl.trainer.utils import nanstd  # TRL's own: sample std ignoring NaNs, NaN below two values

    if scale_rewards not in SCALES:
        raise ValueError(f"scale_rewards must be one of {SCALES}, got {scale_rewards!r}")
    grouped, greedy, base = _grouped_baseline(rewards, greedy_rewards, group_size)
    advantages = grouped - base.unsqueeze(1)
    with_greedy = torch.cat([grouped, greedy.unsqueeze(1)], dim=1)
    if scale_rewards == "group":
        advantages = advantages / (nanstd(with_greedy, dim=1).unsqueeze(1) + 1e-4)
    elif scale_rewards == "batch":
        advantages = advantages / (nanstd(with_greedy) + 1e-4)
    return torch.nan_to_num(advantages.reshape(-1), nan=0.0)


def zero_signal_groups(rewards: Any, greedy_rewards: Any, group_size: int) -> Any:
    """``(N // group_size,)`` bool: per group, whether every scorable sample's reward equals its greedy
    baseline by ``torch.isclose`` (TRL's ``frac_reward_zero_std`` test), so every advantage is 0; also for a
    group with no scorable sample. Arguments and ``ValueError`` as :func:`greedy_advantages`.
    """
    import torch

    grouped, _, base = _grouped_baseline(rewards, greedy_rewards, group_size)
    tied = torch.isclose(grouped, base.unsqueeze(1).expand_as(grouped)) | torch.isnan(grouped)
    return tied.all(dim=1)


def check_baseline(baseline: Any, *, dynamic_sampling: bool = False, aggregation: str = "sum_then_normalize",
                   field: str = "baseline") -> None:
    """Check a phase's ``baseline`` (the one check, for the config and the trainer).

    Raises:
        ConfigError: an unknown baseline; or ``greedy`` with dynamic sampling (its trained batch mixes groups of
            several generation rounds) or with TRL's ``multi_objective_aggregation: normalize_then_sum`` (no
            group mean to replace). Names the key under ``field``'s parent.
    """
    from cpr.errors import ConfigError, check_choice

    check_choice(baseline, BASELINES, field)
    if baseline != "greedy":
        return
    parent = field.rpartition(".")[0]
    prefix = f"{parent}." if parent else ""
    if dynamic_sampling:
        raise ConfigError("baseline: greedy scores one generation round against its greedy completions; dynamic "
                          "sampling mixes groups of several rounds: turn one of them off",
                          field=f"{prefix}dynamic_sampling.enabled")
    if aggregation != "sum_then_normalize":
        raise ConfigError(f"baseline: greedy replaces the group mean of the summed reward, which "
                          f"multi_objective_aggregation {aggregation!r} does not use", field=f"{prefix}training.multi_objective_aggregation")


def _grouped_baseline(rewards: Any, greedy_rewards: Any, group_size: int) -> tuple[Any, Any, Any]:
    """``rewards`` ``(groups, group_size)``, ``greedy_rewards`` and per-group baselines (NaN: the mean)."""
    import torch

    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not groups of {group_size}")
    grouped = rewards.view(-1, group_size)
    if greedy_rewards.shape != (grouped.shape[0],):
        raise ValueError(f"greedy_rewards must have shape ({grouped.shape[0]},), got {tuple(greedy_rewards.shape)}")
    greedy = greedy_rewards.to(grouped)
    return grouped, greedy, torch.where(torch.isnan(greedy), torch.nanmean(grouped, dim=1), greedy)
