"""The baseline of a GRPO advantage: TRL's group mean (``baseline: group``) or the reward of the policy's greedy
completion of the same prompt (``baseline: greedy``).

GRPO (DeepSeekMath, arXiv 2402.03300, section 4.1.2) subtracts the mean reward of a prompt's group of sampled
completions, so the update raises whatever is above that mean; when the greedy completion is better than most
samples it is itself above the mean, and the update mostly makes the sampled policy more like the greedy one.
ReMax (Li et al., arXiv 2310.10505, section 4) subtracts instead the reward of the greedy completion: a sample
then has a positive advantage only where it beats what greedy decoding writes, zero where it ties, and a
negative one where it is worse. Here the greedy baseline keeps TRL's scaling (``scale_rewards``: the group's
or the batch's standard deviation, or none, plus TRL's 1e-4), with the greedy completions' rewards counted in
that standard deviation: a group whose samples all tie but differ from their greedy completion then gets
advantages of the order of one, not a difference divided by 1e-4.
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
            all processes, a group's ``group_size`` completions consecutive (TRL's order); NaN: unscorable.
        greedy_rewards: ``(N // group_size,)`` the total reward of each group's greedy completion; NaN: it could
            not be scored, and that group falls back to its mean (TRL's baseline).
        group_size: completions per prompt (TRL's ``num_generations``).
        scale_rewards: TRL's ``scale_rewards``: ``group`` (the group's standard deviation), ``batch`` (the whole
            batch's) or ``none``.

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
    """Per group, whether the greedy baseline gives it no signal: every scorable sample's reward equals its
    baseline (the greedy completion's reward; the group mean where that is NaN, as :func:`greedy_advantages`)
    by ``torch.isclose`` (TRL's test for ``frac_reward_zero_std``), so every advantage of the group is 0. A
    group of tied samples whose greedy completion differs has a signal; TRL's ``frac_reward_zero_std``, which
    looks at the samples only, counts it as none. A group with no scorable sample has none.

    Args:
        rewards: ``(N,)`` as :func:`greedy_advantages`.
        greedy_rewards: ``(N // group_size,)`` as :func:`greedy_advantages`.
        group_size: completions per prompt.

    Returns:
        ``(N // group_size,)`` bool tensor.

    Raises:
        ValueError: as :func:`greedy_advantages`.
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
