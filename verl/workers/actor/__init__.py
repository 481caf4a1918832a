"""Actors: the data-parallel policy (log-probs, entropy and the PPO/GRPO update) on an FSDP module."""
