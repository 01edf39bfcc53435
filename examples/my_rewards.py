"""A reward function of your own: 1 for a short completion, falling to 0 (docs/rewards.md, "Writing your own reward
function"). A config names this file in ``reward_modules`` (examples/my_rewards.yaml)."""

from cpr.rewards import RewardFunction, register_reward_function
from cpr.steps import completion_text


@register_reward_function
class BrevityReward(RewardFunction):
    """1 for a completion of at most max_chars characters, falling linearly to 0 at twice that."""

    name = "brevity"  # what a config's rewards list names; TRL logs rewards/brevity/mean

    def __init__(self, max_chars: int = 400, **_):
        self.max_chars = max_chars

    def score(self, completions, kwargs):
        return [max(0.0, min(1.0, 2 - len(completion_text(c)) / self.max_chars)) for c in completions]
