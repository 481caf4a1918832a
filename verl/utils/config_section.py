"""Build a frozen dataclass ("typed section") from one group of an OmegaConf config.

A section class names the keys a component reads and their types; the values, defaults included, come
from the composed config (the YAML gives every key its default). Readers then use attributes
(``sections.rollout.seed``) instead of ``cfg.get("seed", 0)``, so a misspelt name raises instead of
silently taking a restated default (review C2), and a YAML default is written in one place only.

A field whose ``metadata`` carries ``section=<class>`` is a nested group (``actor.fsdp_config``) built the
same way. A field with a dataclass default is optional: absent from the YAML (a ``+key`` override) or
absent from the group a partial caller passes.
"""
from __future__ import annotations

from dataclasses import MISSING, field, fields
from typing import Any


def nested(cls) -> Any:
    """Declare a field that holds a nested section of type ``cls`` (built from the sub-group)."""
    return field(metadata={"section": cls})


def build_section(cls, section, name: str):
    """``cls(**values)`` from the mapping ``section`` (an OmegaConf group); ``name`` is its dotted path for
    error messages. A required field missing from the group raises a KeyError naming the key."""
    from omegaconf import DictConfig, OmegaConf

    if section is None:
        raise KeyError(f"{name} is missing from the config (compose it from luffy_pool/config/mix_ppo_trainer.yaml, "
                       f"which gives every key its default)")
    present = set(section.keys())
    values = {}
    for f in fields(cls):
        if f.name not in present:
            if f.default is MISSING and f.default_factory is MISSING:
                raise KeyError(f"{name}.{f.name} is missing from the config (compose it from "
                               f"luffy_pool/config/mix_ppo_trainer.yaml, which gives every key its default)")
            continue
        sub = f.metadata.get("section")
        if sub is not None:
            values[f.name] = build_section(sub, section[f.name], f"{name}.{f.name}")
        elif isinstance(section, DictConfig) and OmegaConf.is_missing(section, f.name):
            # A required key left unset (``???``, e.g. data.train_files in a driver-only test config) stays
            # ``???``: config_check refuses it before a run, and reading it eagerly here must not raise.
            values[f.name] = "???"
        else:
            value = section[f.name]
            # Plain containers, not OmegaConf nodes: sections are handed to workers and compared in tests.
            values[f.name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return cls(**values)


def field_names(cls) -> set:
    """Top-level key names of a section class (nested groups included by their own name)."""
    return {f.name for f in fields(cls)}
