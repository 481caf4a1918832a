"""``python -m luffy_pool.main_mix_ppo``: the training entry point (LUFFY's command line), kept at this path;
the code lives in luffy_pool/run/main_mix_ppo.py."""

if __name__ == "__main__":  # the trainer's own process: it imports without the collector (verl/utils/startup_gc.py)
    from verl.utils.startup_gc import pause_for_startup

    pause_for_startup()
from luffy_pool.run.main_mix_ppo import main  # noqa: F401

if __name__ == "__main__":
    main()
