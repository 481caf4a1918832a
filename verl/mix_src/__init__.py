"""LUFFY-compatible package path: LUFFY launched its trainer as ``python3 -m verl.mix_src.main_mix_ppo``, and its
scripts import from ``verl.mix_src.*`` (mix_trainer, mix_core_alg, mix_actor, mix_fsdp_worker,
rl_dataset_with_target, reward_with_format, math_verify_reward, main_ppo_new_reward). Each module here is a thin
alias of this project's code under LUFFY's names (tests/verl/mix_src/test_luffy_module_paths.py)."""
