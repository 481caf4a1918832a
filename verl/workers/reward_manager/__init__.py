"""Reward managers: turn a batch of rollouts into token-level scores (graded in a timed process pool).

``RewardManager`` is what the trainer calls each step; ``ScoringPool`` is the reusable pool with a
per-item CPU-time timeout (and a wall-clock backstop), also usable by evaluation scripts for bulk
grading of model output.
"""

from verl.workers.reward_manager.reward_manager import RewardManager
from verl.workers.reward_manager.scoring_pool import CallableScorer, PoolStats, ScoringPool

__all__ = ["CallableScorer", "PoolStats", "RewardManager", "ScoringPool"]
