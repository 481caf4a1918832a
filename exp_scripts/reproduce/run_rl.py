"""One RL method of reproduce_tiny.py, in its own process: train through the LUFFY trainer, export the model.

    python exp_scripts/reproduce/run_rl.py --config-name tiny_cpu_luffy --hf-out DIR --result FILE.json [key=value ...]

Composes ``luffy_pool/config/<config-name>.yaml`` with the overrides (checked like the CLI's), trains with
``luffy_pool.run.launcher.build_trainer`` in a private Ray instance, writes the final actor as an HF folder
(``--hf-out``) for the eval pipeline, and writes the last step's metrics and the wall time to ``--result``.
A process per run keeps Ray sessions, vLLM engines and their memory from leaking into the next method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if os.environ.get("LUFFY_DEV_SPEEDUPS") == "1":  # the test harness: import without the collector
        from luffy_pool_dev.startup_gc import pause_for_startup  # dev/luffy_pool_dev/startup_gc.py

        pause_for_startup()


def compose_run_config(config_name: str, overrides: Sequence[str]):
    """The composed, validated and resolved trainer config, as ``python -m luffy_pool.main_mix_ppo`` builds it."""
    from omegaconf import OmegaConf

    from luffy_pool.config.check import check_config, prepare_overrides
    from luffy_pool.config.compose import compose_config

    config = compose_config(prepare_overrides(list(overrides)), config_name)
    check_config(config)
    OmegaConf.resolve(config)
    return config


def train_and_export(config, hf_out: str) -> dict:
    """``fit`` the trainer, then write the final actor weights (with tokenizer) to ``hf_out``."""
    import ray

    from luffy_pool.run.launcher import build_trainer

    start = time.perf_counter()
    trainer, close = build_trainer(config)
    try:
        startup_gc = sys.modules.get("luffy_pool_dev.startup_gc")  # loaded where the harness paused the collector
        if startup_gc is not None:
            startup_gc.end_startup()
        last = trainer.fit()
        trainer.wg.save_hf_model(os.path.abspath(hf_out))
    finally:
        close()
        ray.shutdown()
    return {
        "last_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "wall_s": time.perf_counter() - start,
        "hf_dir": os.path.abspath(hf_out),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python exp_scripts/reproduce/run_rl.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config-name", required=True, help="config in luffy_pool/config, e.g. tiny_cpu_luffy")
    ap.add_argument("--hf-out", required=True, help="folder for the final model (HF layout)")
    ap.add_argument("--result", required=True, help="JSON file for the last metrics and the wall time")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    args = ap.parse_args(argv)
    config = compose_run_config(args.config_name, args.overrides)
    result = {"config_name": args.config_name, **train_and_export(config, args.hf_out)}
    os.makedirs(os.path.dirname(os.path.abspath(args.result)), exist_ok=True)
    with open(args.result, "w") as f:
        json.dump(result, f, indent=1)
    print(f"run_rl: {args.config_name} done in {result['wall_s']:.0f} s; model at {result['hf_dir']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
