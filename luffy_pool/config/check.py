"""Validation of the trainer config: keys, value types, enum values, bounds and the rules between keys.

It runs on the command-line overrides before Hydra composes them (an unknown key is named with the closest valid
key instead of Hydra's struct error) and on the composed config before any worker starts, one line per problem. Keys,
types, values, bounds and refusals come from the declarations (luffy_pool/config/sections.py, the methods' knob
dataclasses, the knob dataclasses of registered losses), defaults from the YAML, the rules from ``validate()``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import MISSING
from typing import Any, Optional

from omegaconf import DictConfig

from luffy_pool.config.sections import ConfigSections
from verl.utils import config_schema
from verl.trainer.ppo.loss_inputs import registered_loss_keys
from verl.utils.config_section import (
    Declaration,
    declarations,
    range_errors,
    refused_groups,
    rule_errors,
    structure_errors,
    value_errors,
)
from luffy_pool.config.base_yaml import BASE_CONFIG_NAME, CONFIG_DIR, base_yaml  # noqa: F401 -- re-exported
from verl.workers.worker_config import register_worker_config

# mix_ppo_trainer.yaml lists verl's worker YAML (verl/trainer/config/ppo_worker.yaml) first in its defaults; every
# composer of this folder imports this module first, so the name is in Hydra's config store before it composes.
register_worker_config()

_A = "actor_rollout_ref.actor"


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Declaration]:
    """Dotted key -> its declaration, for every key of luffy_pool/config_sections.ConfigSections."""
    return {d.key: d for d in declarations(ConfigSections)}


def optional_keys() -> list[str]:
    """Keys absent from the YAML that may be added with `+` (LUFFY reads them with a default)."""
    return [k for k, d in declared().items() if d.optional]


def open_dict_keys() -> tuple[str, ...]:
    """Dict keys whose sub-keys are free-form (added with `+`)."""
    return tuple(k for k, d in declared().items() if d.open_dict)


class ConfigError(config_schema.SchemaConfigError):
    """One or more config problems; ``errors`` holds one line per problem."""


def _flatten(tree: dict) -> dict[str, Any]:
    """Dotted key -> value of a nested dict, dict nodes included (an open dict is one value)."""
    return dict(config_schema.walk(tree, sections=True, open_keys=open_dict_keys()))


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default for every key of mix_ppo_trainer.yaml and the verl worker YAML it composes (dict
    nodes included)."""
    from omegaconf import OmegaConf

    return _flatten(OmegaConf.to_container(base_yaml(), resolve=True, throw_on_missing=False))


def schema_leaf_keys() -> list[str]:
    """Dotted keys of the YAML's values (not groups), as declared; open dicts count as values."""
    return [k for k, d in declared().items() if not d.optional]


@functools.lru_cache(maxsize=1)
def _groups() -> frozenset[str]:
    """Dotted groups of the declared keys (``actor_rollout_ref.actor``, ...)."""
    return frozenset(k.rsplit(".", i)[0] for k in declared() for i in range(1, k.count(".") + 1))


def suggest_key(key: str) -> Optional[str]:
    """The closest valid key: same last segment in another section first, then the whole dotted path,
    then the last segment alone."""
    return config_schema.suggest_key(key, list(declared()) + list(method_knobs()), leaf_cutoff=0.75)


def unknown_key_message(key: str, plus: bool = False) -> str:
    """One line for a key the schema does not have, naming the closest valid key."""
    for group, why in refused_groups(ConfigSections).items():
        if key.startswith(group + ".") and classify_key(key) is None:
            return f"Unknown config key '{key}': {why}"
    msg = config_schema.unknown_key_message(key, suggest_key(key))
    if plus:
        msg += f" ('+' only adds {', '.join(optional_keys())} and {open_dict_keys()[0]}.<field>)"
    return msg


@functools.lru_cache(maxsize=1)
def method_knobs() -> dict[str, tuple[str, Declaration]]:
    """``algorithm.<method>.<knob>`` -> (method, declaration) for the knob section of every registered method
    (luffy_pool/methods/), declared there with their defaults and merged into the config when it is selected."""
    from luffy_pool.methods import METHODS

    out = {}
    for name, method in METHODS.items():
        if isinstance(method.knobs, type):
            out.update({d.key: (name, d) for d in declarations(method.knobs, f"algorithm.{name}.")})
    return out


def _knob_owner(key: str) -> Optional[str]:
    """The method whose knob group ``key`` is or lies in, None otherwise."""
    parts, owners = key.split("."), {name for name, _ in method_knobs().values()}
    return parts[1] if len(parts) >= 2 and parts[0] == "algorithm" and parts[1] in owners else None


def classify_key(key: str) -> Optional[str]:
    """'schema', 'optional' (+-addable), 'open' (inside an open dict or a method's knob group, which selecting
    the method adds) or None (unknown)."""
    d = declared().get(key)
    if d is not None:
        return "optional" if d.optional else "schema"
    if key in _groups():
        return "schema"
    if key in method_knobs() or (key.count(".") == 1 and _knob_owner(key)):
        return "open"
    if any(key.startswith(k + ".") for k in open_dict_keys()):
        return "open"
    # a knob a registered loss declares (register_policy_loss(name, config=...)); its dataclass types it
    return "loss" if key.startswith(f"{_A}.") and key[len(_A) + 1 :] in registered_loss_keys() else None


def prepare_overrides(overrides: list[str]) -> list[str]:
    """Check command-line overrides against the schema and return them normalised for Hydra.

    Unknown keys raise ConfigError (all of them, one line each, with the closest key). Accepted forms are
    rewritten so Hydra never refuses them: `+key` / `++key` of a YAML key become `key` (LUFFY scripts
    `+`-add keys that our YAML now declares), optional and open-dict keys become `++key`. Hydra's own
    keys (`hydra.*`, `hydra/...`) pass through untouched.
    """
    import yaml

    libs = [yaml.safe_load(o.split("=", 1)[1]) for o in overrides if o.lstrip("+").startswith(f"{_EXTERNAL_LIB}=")]
    problem = next(filter(None, map(import_loss_modules, libs)), None)
    if problem:
        raise ConfigError([problem])
    return config_schema.prepare_overrides(
        overrides, classify=classify_key, unknown_message=unknown_key_message, error_cls=ConfigError
    )


_EXTERNAL_LIB = "actor_rollout_ref.model.external_lib"


def import_loss_modules(external_lib) -> Optional[str]:
    """Import ``model.external_lib`` before keys are checked: a loss it registers declares its knobs on import
    (``registered_loss_keys``). Returns the import problem as one line, None when it imported."""
    from verl.utils.import_utils import import_external_libs

    try:
        import_external_libs(external_lib)
    except ImportError as err:
        return str(err)
    return None


def _loss_knob_errors(values: dict[str, Any], loss) -> list[str]:
    """The knobs of registered losses (``register_policy_loss(name, config=<dataclass>)``) against their dataclass's
    declarations; a knob the selected loss does not read is refused away from its default (the YAML's, else the
    dataclass's), so it cannot look set while nothing reads it. A loss without a knob dataclass reads the actor's
    loss section (``LossSection``): its keys stay free then."""
    from luffy_pool.config.sections import LossSection
    from verl.trainer.ppo.core_algos import get_policy_loss_config
    from verl.trainer.ppo.loss_inputs import POLICY_LOSS_CONFIGS, resolve_policy_loss

    try:
        selected = resolve_policy_loss(loss)  # policy_loss, or under auto the one LUFFY's switches select
    except ValueError:  # two loss switches on: LossSection.validate has said so
        return []
    owners: dict[str, list[tuple[str, Declaration]]] = {}  # actor key -> (loss, its declaration)
    for name, cls in POLICY_LOSS_CONFIGS.items():
        for d in declarations(cls, f"{_A}."):
            owners.setdefault(d.key, []).append((name, d))
    schema, errors = schema_defaults(), []
    read = set() if get_policy_loss_config(selected) else {d.key for d in declarations(LossSection, f"{_A}.")}
    for key, knobs in owners.items():
        names, d = [name for name, _ in knobs], knobs[0][1]
        if key not in values:
            if any(name == selected and k.default is MISSING for name, k in knobs):
                errors.append(f"Missing config key '{key}': the policy loss {selected!r} reads it; add +{key}=...")
            continue
        value, default = values[key], schema.get(key, d.default)
        problem = config_schema.value_error(key, value, d.types)
        errors += [problem] if problem else value_errors(d, value, default)
        if not problem and key not in read and selected not in names and value != default:
            errors.append(
                f"'{key}'={value!r} is a knob of the policy loss {' / '.join(names)}, but "
                f"'{_A}.policy_loss' selects {selected!r}; remove it or select that loss"
            )
    return errors


def validate_config(cfg: DictConfig) -> list[str]:
    """All problems of a composed config, one line each naming the key (empty list = valid). The selected
    method's YAML group is merged into a copy first (``apply_method``), so a contradicting key is one line too, and
    its knob group is checked against its declarations like any key."""
    from omegaconf import OmegaConf

    from luffy_pool.config.method_group import apply_method

    cfg = OmegaConf.create(OmegaConf.to_container(cfg)) if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    try:
        method = apply_method(cfg).name
    except ValueError as exc:
        return [str(exc)]
    values = _flatten(config_schema.resolved_tree(cfg, ConfigError))
    problem = import_loss_modules(values.get(_EXTERNAL_LIB))
    if problem:
        return [problem]
    knobs = {k: d for k, (owner, d) in method_knobs().items() if owner == method}
    schema = {**declared(), **knobs}
    known = lambda k: classify_key(k) is not None  # noqa: E731
    errors = structure_errors(values, schema, known, unknown_key_message, f"{BASE_CONFIG_NAME}.yaml")
    if errors:  # the value rules below assume every key is present with its type
        return errors
    # rollout.temperature=inf once passed the range check and failed 71 s later in three vLLM workers
    errors = [
        f"'{k}'={v!r} must be a finite number"
        for k, v in values.items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    errors += range_errors(values, schema, {**schema_defaults(), **{k: d.default for k, d in knobs.items()}})
    sections = ConfigSections.from_config(cfg)
    errors += rule_errors(sections) + _loss_knob_errors(values, sections.actor.loss)
    return list(dict.fromkeys(errors))  # a knob a loss and the sections both declare is checked by both


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every problem of the composed config."""
    errors = validate_config(cfg)
    if errors:
        raise ConfigError(errors)
