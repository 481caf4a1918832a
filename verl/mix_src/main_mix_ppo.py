"""LUFFY's entry-point module path, kept as an alias: ``python3 -m verl.mix_src.main_mix_ppo <overrides>``
behaves exactly like ``python -m luffy_pool.main_mix_ppo <overrides>`` (same config, checks and launcher).

LUFFY's other names here: ``main_task(config)`` (= ``luffy_pool.main_mix_ppo.run``), ``RewardManager``
(LUFFY's constructor ``(tokenizer, num_examine, reward_impl_version)``; calling it returns the token-level
reward tensor, as LUFFY's) and ``deepscaler_reward_fn_nothink`` (reward version 2).
"""

from typing import List, Union

from deepscaler.globals import THOUGHT_DELIMITER_END, THOUGHT_DELIMITER_START
from deepscaler.rewards.math_reward import deepscaler_reward_fn
from luffy_pool.run.main_mix_ppo import main, run
from verl.workers.reward_manager.reward_manager import RewardManager as _RewardManager

__all__ = ["RewardManager", "deepscaler_reward_fn_nothink", "main", "main_task", "run"]

main_task = run


def deepscaler_reward_fn_nothink(
    solution_str: str, ground_truth: Union[str, List[str]], enable_llm: bool = False
) -> bool:
    """Reward version 2: the rule grader on ``"<think>\\n</think>\\n" + solution_str``."""
    return deepscaler_reward_fn(
        f"{THOUGHT_DELIMITER_START}\n{THOUGHT_DELIMITER_END}\n{solution_str}", ground_truth, enable_llm
    )


class RewardManager(_RewardManager):
    """LUFFY's reward manager signature on this package's one (bounded, process-pool) reward manager."""

    def __init__(self, tokenizer, num_examine: int = 0, reward_impl_version: int = 3, **kwargs):
        super().__init__(tokenizer, reward_impl_version=reward_impl_version, **kwargs)
        self.num_examine = num_examine  # LUFFY: responses to print per data source (its printing was disabled)

    def __call__(self, data):
        scores, self.last_metrics = super().__call__(data)
        return scores


if __name__ == "__main__":
    main()
