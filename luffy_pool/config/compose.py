"""Compose the trainer config outside Hydra's app (scripts, benchmarks, tests): ``compose_config(overrides)`` is what
``python -m luffy_pool.main_mix_ppo <overrides>`` builds before validation; ``actor_config`` and ``rollout_section``
are one group of the YAML with some values set, so a standalone actor, engine or sampler reads every other key at its
YAML default, as a run would.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Sequence

from luffy_pool.config.check import BASE_CONFIG_NAME, CONFIG_DIR, base_yaml


def compose_config(overrides: Sequence[str] = (), config_name: str = BASE_CONFIG_NAME):
    """The composed (not yet validated) config for ``overrides`` (Hydra override strings)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=[_knob_override(o) for o in overrides])


def _knob_override(override: str) -> str:
    """A method knob ``algorithm.<method>.<knob>=v`` as ``++`` (its group is added when the method is selected,
    luffy_pool/methods/base.py), as the command line's ``prepare_overrides`` writes it."""
    from luffy_pool.config.check import _knob_owner

    key = override.split("=", 1)[0]
    if "=" in override and not key.startswith(("+", "~")) and _knob_owner(key) is not None:
        return "++" + override
    return override


@functools.lru_cache(maxsize=None)
def _base_group(name: str) -> dict:
    """``actor_rollout_ref.<name>`` of the YAML, resolved."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(base_yaml().actor_rollout_ref[name], resolve=True)


def actor_config(**values: Any):
    """The ``actor_rollout_ref.actor`` group of the YAML with ``values`` set (dotted names through ``__``:
    ``optim__lr=1e-3``); an unknown name raises, naming it."""
    from omegaconf import OmegaConf

    group = OmegaConf.create(copy.deepcopy(_base_group("actor")))
    for name, value in values.items():
        key = name.replace("__", ".")
        if OmegaConf.select(group, key, default=KeyError) is KeyError:
            raise KeyError(f"actor_rollout_ref.actor.{key} is not a key of {BASE_CONFIG_NAME}.yaml")
        OmegaConf.update(group, key, value, merge=False)
    return group


def rollout_section(**values: Any):
    """The ``actor_rollout_ref.rollout`` section (``LuffyRolloutSection``) of the YAML with ``values`` set: the
    config of a rollout engine, prefix sampler or planner built on its own (tests, scripts, benchmarks). Every
    other key keeps its YAML default, as in a run; each value set is checked against its declaration (type,
    allowed values, bounds) and an unknown name raises, naming it."""
    from luffy_pool.config.sections import LuffyRolloutSection
    from verl.workers.worker_config import section_with_values

    return section_with_values(
        LuffyRolloutSection, _base_group("rollout"), "actor_rollout_ref.rollout", values, f"{BASE_CONFIG_NAME}.yaml"
    )
