"""Validation of the trainer config: keys, value types, enum values, bounds and the rules between keys.

It runs twice: on the command-line overrides before Hydra composes them (an unknown key is reported with
the closest valid key instead of Hydra's struct error) and on the composed config before any worker
starts. Every problem is one line that names the key. The key set, types, allowed values, bounds and refusals
come from the declarations in luffy_pool/config/sections.py (and the knob dataclasses of registered losses);
the defaults from luffy_pool/config/mix_ppo_trainer.yaml and verl's worker YAML it composes
(verl/trainer/config/ppo_worker.yaml). The rules between keys are the sections' ``validate()``
methods; nothing here restates one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import MISSING
from typing import Any, Iterator, Optional

from omegaconf import DictConfig

from luffy_pool.config.sections import ConfigSections
from verl.utils import config_schema
from verl.trainer.ppo.loss_inputs import registered_loss_keys
from verl.utils.config_section import Declaration, declarations, refused_groups, rule_errors, value_errors
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


def _walk(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted path, value) of a nested dict, dict nodes included, depth first."""
    return config_schema.walk(node, prefix, sections=True, open_keys=open_dict_keys())


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default for every key of mix_ppo_trainer.yaml and the verl worker YAML it composes (dict
    nodes included)."""
    from omegaconf import OmegaConf

    return dict(_walk(OmegaConf.to_container(base_yaml(), resolve=True, throw_on_missing=False)))


def schema_leaf_keys() -> list[str]:
    """Dotted keys of the YAML's values (not groups), as declared; open dicts count as values."""
    return [k for k, d in declared().items() if not d.optional]


@functools.lru_cache(maxsize=1)
def _groups() -> frozenset[str]:
    """Dotted groups of the declared keys (``actor_rollout_ref.actor``, ...)."""
    return frozenset(k.rsplit(".", i)[0] for k in declared() for i in range(1, k.count(".") + 1))


def expected_types(key: str) -> tuple[type, ...]:
    """Accepted Python types of a key's value (bool, int, float, str, list, dict, NoneType)."""
    return declared()[key].types


def _under_open_dict(key: str) -> bool:
    return any(key.startswith(k + ".") for k in open_dict_keys())


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
    parts = key.split(".")
    if len(parts) >= 2 and parts[0] == "algorithm":
        owners = {name for name, _ in method_knobs().values()}
        return parts[1] if parts[1] in owners else None
    return None


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
    if _under_open_dict(key):
        return "open"
    if key.startswith(f"{_A}.") and key[len(_A) + 1 :] in registered_loss_keys():
        return (
            "loss"  # a knob a registered loss declares (register_policy_loss(name, config=...)); its dataclass types it
        )
    return None


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


class _Checker:
    """Collects one-line errors of the resolved config (dotted key -> value) and of its sections' rules."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.errors: list[str] = []

    def fail(self, msg: str) -> None:
        if msg not in self.errors:  # a knob a loss and the sections both declare is checked by both
            self.errors.append(msg)

    def structure(self) -> None:
        """Unknown keys, missing keys, required values and types."""
        for key, value in self.values.items():
            kind = classify_key(key)
            if kind is None:
                self.fail(unknown_key_message(key))
            elif key in declared():
                problem = config_schema.value_error(key, value, expected_types(key))
                if problem:
                    self.fail(problem)
        for key in schema_leaf_keys():
            if key not in self.values:
                self.fail(f"Missing config key '{key}' (it is in {BASE_CONFIG_NAME}.yaml)")

    def knob_groups(self) -> None:
        """Knobs of the selected method against its knob section; a knob of another method is refused."""
        method = self.values.get("algorithm.method")
        knobs = method_knobs()
        for key, value in self.values.items():
            owner = _knob_owner(key)
            if owner is None or key.count(".") == 1 and owner == method:
                continue
            if owner != method:
                if key.count(".") == 1 and isinstance(value, dict) and value:
                    continue  # the group node: its leaves are reported
                self.fail(
                    f"'{key}' is a knob of algorithm.method={owner}, but algorithm.method={method}; "
                    f"drop it or set algorithm.method={owner}"
                )
                continue
            if key not in knobs:
                self.fail(unknown_key_message(key))
                continue
            d = knobs[key][1]
            problem = config_schema.value_error(key, value, d.types)
            if problem:
                self.fail(problem)
                continue
            for line in value_errors(d, value, value):
                self.fail(line)
        for key, (owner, _) in knobs.items():
            if owner == method and key not in self.values:
                self.fail(f"Missing config key '{key}' (algorithm.method={owner} declares it with its default)")

    def values_and_ranges(self) -> None:
        """Each key against its declaration: LUFFY-inert keys at their default, refused values, choices, bounds."""
        schema = schema_defaults()
        for key, d in declared().items():
            if key in self.values:
                for line in value_errors(d, self.values[key], schema.get(key)):
                    self.fail(line)

    def finite_numbers(self) -> None:
        """No number of the config may be NaN or infinite (``rollout.temperature=inf`` once passed the
        range check and failed 71 s later in three vLLM workers)."""
        for key, value in self.values.items():
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(f"'{key}'={value!r} must be a finite number")

    def loss_knobs(self) -> None:
        """The knobs of registered losses (``register_policy_loss(name, config=<dataclass>)``) against their
        dataclass's declarations; a knob the selected loss does not read is refused away from its default (the
        YAML's, else the dataclass's), so it cannot look set while nothing reads it. A loss without a knob
        dataclass reads the actor's loss section (``LossSection``): its keys stay free then."""
        from luffy_pool.config.sections import LossSection
        from verl.trainer.ppo.core_algos import get_policy_loss_config

        schema, selected = schema_defaults(), _selected_loss(self.sections.actor.loss)
        if selected is None:  # two loss switches on: LossSection.validate has said so
            return
        owners = loss_knob_owners()
        read = set() if get_policy_loss_config(selected) else {d.key for d in declarations(LossSection, f"{_A}.")}
        for key, knobs in owners.items():
            if key not in self.values:
                if any(name == selected and d.default is MISSING for name, d in knobs):
                    self.fail(f"Missing config key '{key}': the policy loss {selected!r} reads it; add +{key}=...")
                continue
            value, d = self.values[key], knobs[0][1]
            problem = config_schema.value_error(key, value, d.types)
            if problem:
                self.fail(problem)
                continue
            default = schema.get(key, d.default)
            for line in value_errors(d, value, default):
                self.fail(line)
            if key in read or selected in (name for name, _ in knobs):
                continue
            if value != default:
                names = " / ".join(name for name, _ in knobs)
                self.fail(
                    f"'{key}'={value!r} is a knob of the policy loss {names}, but "
                    f"'{_A}.policy_loss' selects {selected!r}; remove it or select that loss"
                )

    def rules(self, cfg: DictConfig) -> None:
        """The rules between keys: each section's ``validate()`` (luffy_pool/config/sections.py,
        verl/workers/config_sections.py)."""
        self.sections = ConfigSections.from_config(cfg)
        for line in rule_errors(self.sections):
            self.fail(line)


def _selected_loss(loss) -> Optional[str]:
    """The loss the actor will run (``policy_loss``, or under ``auto`` the one LUFFY's switches select); None when
    two switches are on."""
    from verl.trainer.ppo.loss_inputs import resolve_policy_loss

    try:
        return resolve_policy_loss(loss)
    except ValueError:
        return None


def loss_knob_owners() -> dict[str, list[tuple[str, Declaration]]]:
    """Dotted actor key -> (loss name, its declaration) for every knob a registered loss's dataclass declares."""
    from verl.trainer.ppo.loss_inputs import POLICY_LOSS_CONFIGS

    owners: dict[str, list] = {}
    for name, knobs in POLICY_LOSS_CONFIGS.items():
        for d in declarations(knobs, f"{_A}."):
            owners.setdefault(d.key, []).append((name, d))
    return owners


def _flatten(cfg: DictConfig) -> dict[str, Any]:
    """Dotted key -> resolved value; interpolation failures become ConfigError lines naming the key."""
    return dict(_walk(config_schema.resolved_tree(cfg, ConfigError)))


def validate_config(cfg: DictConfig) -> list[str]:
    """All problems of a composed config, one line each naming the key (empty list = valid). The selected
    method's YAML group is merged into a copy first (``apply_method``), so a contradicting key is one line too."""
    from omegaconf import OmegaConf

    from luffy_pool.config.method_group import apply_method

    cfg = OmegaConf.create(OmegaConf.to_container(cfg)) if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    try:
        apply_method(cfg)
    except ValueError as exc:
        return [str(exc)]
    checker = _Checker(_flatten(cfg))
    problem = import_loss_modules(checker.values.get(_EXTERNAL_LIB))
    if problem:
        return [problem]
    checker.structure()
    checker.knob_groups()
    if checker.errors:  # the value rules below assume every key is present with its type
        return checker.errors
    checker.finite_numbers()
    checker.values_and_ranges()
    checker.rules(cfg)
    checker.loss_knobs()
    return checker.errors


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every problem of the composed config."""
    errors = validate_config(cfg)
    if errors:
        raise ConfigError(errors)
