"""LUFFY's module path ``verl.mix_src.main_ppo_new_reward``: its reward names, the same objects as
``verl.mix_src.main_mix_ppo``'s. (LUFFY's ``main`` here launched verl's plain PPO trainer; the same run is
``python -m verl.mix_src.main_mix_ppo`` with exp_scripts/train_on_policy.sh's settings.)"""

from verl.mix_src.main_mix_ppo import RewardManager, deepscaler_reward_fn_nothink

__all__ = ["RewardManager", "deepscaler_reward_fn_nothink"]
