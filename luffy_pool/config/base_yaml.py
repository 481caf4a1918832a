"""Where the trainer's YAML lies and its defaults read without Hydra (a leaf module: the checker, the method groups
and the composer all read it)."""

from __future__ import annotations

import functools
import os

from verl.workers.worker_config import WORKER_CONFIG_NAME, load_worker_yaml

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))  # the YAML files sit next to this module
BASE_CONFIG_NAME = "mix_ppo_trainer"


@functools.lru_cache(maxsize=1)
def base_yaml():
    """The YAML defaults of mix_ppo_trainer.yaml as Hydra composes them without overrides (an unresolved, read-only
    DictConfig): the files of its defaults list merged in that order (verl's worker YAML, then this folder's file),
    read without Hydra so the checker runs inside a Hydra app too."""
    from omegaconf import OmegaConf

    own = OmegaConf.load(os.path.join(CONFIG_DIR, f"{BASE_CONFIG_NAME}.yaml"))
    parts = []
    for entry in own.pop("defaults", ["_self_"]):
        if entry == "_self_":
            parts.append(own)
        elif entry == WORKER_CONFIG_NAME:
            parts.append(load_worker_yaml())
        else:
            raise ValueError(f"{BASE_CONFIG_NAME}.yaml defaults: {entry!r} is not read by luffy_pool.config.check")
    merged = OmegaConf.merge(*parts)
    merged.pop("hydra", None)
    OmegaConf.set_readonly(merged, True)
    return merged
