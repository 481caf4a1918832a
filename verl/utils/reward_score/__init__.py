"""LUFFY's ``verl.utils.reward_score`` (``from verl.utils.reward_score import gsm8k, math``): verl's two
data-source scorers under their module names, as thin aliases of ``deepscaler.rewards.verl_scorers``."""

from verl.utils.reward_score import gsm8k, math

__all__ = ["gsm8k", "math"]
