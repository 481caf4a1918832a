"""LUFFY's entry-point module path, kept as an alias: ``python3 -m verl.mix_src.main_mix_ppo <overrides>``
behaves exactly like ``python -m luffy_pool.main_mix_ppo <overrides>`` (same config, checks and launcher)."""
from luffy_pool.main_mix_ppo import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    main()
