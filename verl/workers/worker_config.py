"""verl's worker defaults: verl/trainer/config/ppo_worker.yaml, the one place each worker key gets its default.

A trainer's config composes it first in its Hydra defaults list (``defaults: [ppo_worker, _self_]``);
:func:`register_worker_config` makes the name composable from any config folder. A rollout engine or generator built
on its own takes :func:`rollout_section`: the YAML's rollout section with some values set and checked.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

WORKER_CONFIG_NAME = "ppo_worker"
WORKER_CONFIG_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer", "config", f"{WORKER_CONFIG_NAME}.yaml"
)


def register_worker_config() -> None:
    """Store the worker YAML in Hydra's config store as ``ppo_worker``, so a config in another folder (a trainer's
    primary config, or a config that lists that one in its defaults) composes it by name. Idempotent."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name=WORKER_CONFIG_NAME, node=OmegaConf.load(WORKER_CONFIG_PATH))


def load_worker_yaml():
    """The worker YAML as an unresolved DictConfig (to merge under a trainer's YAML without Hydra)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(WORKER_CONFIG_PATH)


@functools.lru_cache(maxsize=1)
def _worker_defaults() -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(load_worker_yaml(), resolve=True, throw_on_missing=False)


def section_with_values(cls: type, group: dict, prefix: str, values: dict[str, Any], source: str):
    """``cls`` (a declared section) built from the plain dict ``group`` (the YAML's group at ``prefix``) with
    ``values`` set: each value is checked against its declaration (type, allowed values, bounds) and an unknown
    name raises KeyError naming it and ``source``; every other key keeps its YAML default."""
    from omegaconf import OmegaConf

    from verl.utils.config_schema import value_error
    from verl.utils.config_section import build_section, declarations, value_errors

    declared = {d.key: d for d in declarations(cls, f"{prefix}.")}
    group = copy.deepcopy(group)
    errors = []
    for name, value in values.items():
        d = declared.get(f"{prefix}.{name}")
        if d is None or name not in group:
            raise KeyError(f"{prefix}.{name} is not a key of {source}")
        wrong_type = value_error(d.key, value, d.types)  # the checker's type rule (an int is a float, a bool neither)
        errors.extend([wrong_type] if wrong_type else value_errors(d, value, group[name]))
        group[name] = value
    if errors:
        raise ValueError("; ".join(errors))
    return build_section(cls, OmegaConf.create(group), prefix)


def rollout_section(**values: Any):
    """The worker YAML's ``actor_rollout_ref.rollout`` section (``RolloutSection``) with ``values`` set: the config of
    a rollout engine built on its own. Every other key keeps its YAML default, as in a run."""
    from verl.workers.config_sections import RolloutSection

    group = _worker_defaults()["actor_rollout_ref"]["rollout"]
    return section_with_values(RolloutSection, group, "actor_rollout_ref.rollout", values, WORKER_CONFIG_PATH)
