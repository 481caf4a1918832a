"""Reward functions for math RL (LUFFY's ``deepscaler`` package, re-implemented and hardened).

``deepscaler.rewards`` holds the graders (rule-based, math-verify, format, LLM judge) and the
verl-style ``compute_score``; ``deepscaler.system_prompts`` the judge's prompt template.
"""
