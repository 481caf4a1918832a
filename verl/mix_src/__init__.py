"""LUFFY-compatible package path: LUFFY launched its trainer as ``python3 -m verl.mix_src.main_mix_ppo``."""
