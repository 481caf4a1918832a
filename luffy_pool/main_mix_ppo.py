"""``python -m luffy_pool.main_mix_ppo``: the training entry point (LUFFY's command line), kept at this path;
the code lives in luffy_pool/run/main_mix_ppo.py."""

from luffy_pool.run.main_mix_ppo import main  # noqa: F401

if __name__ == "__main__":
    main()
