"""Schema checks shared by the trainers' Hydra configs: a YAML file's defaults are the schema.

The RL trainer (luffy_pool/config/check.py) and the SFT trainer (verl/trainer/sft/config.py) both
flatten their config to dotted keys, check each value's type, name the closest valid key for a typo and
check command-line overrides before Hydra composes them. The functions here do that for any schema; the
keys and their types come from each trainer's declarations (verl/utils/config_section.py).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

NONE_TYPE = type(None)


class SchemaConfigError(ValueError):
    """One or more config problems; ``errors`` holds one line per problem."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def walk(
    node: Mapping[str, Any], prefix: str = "", *, sections: bool = False, open_keys: Iterable[str] = ()
) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of a nested dict, depth first; lists are values.

    ``sections=False``: only values (an empty dict counts as a value). ``sections=True``: dict nodes are
    yielded too, before their children. A key in ``open_keys`` is a value whose sub-keys are not walked.
    """
    open_keys = tuple(open_keys)
    for key, value in node.items():
        path = f"{prefix}{key}"
        # An empty dict has nothing to descend into; leaf-only walks must still report it.
        is_section = isinstance(value, dict) and path not in open_keys and (sections or bool(value))
        if sections or not is_section:
            yield path, value
        if is_section:
            yield from walk(value, path + ".", sections=sections, open_keys=open_keys)


def load_yaml_tree(path: str, *, resolve: bool) -> dict:
    """The YAML as a plain dict, without Hydra's own ``hydra`` node and ``defaults`` list."""
    cfg = OmegaConf.load(path)
    cfg.pop("hydra", None)
    cfg.pop("defaults", None)
    return OmegaConf.to_container(cfg, resolve=resolve, throw_on_missing=False)


def resolved_tree(config: DictConfig | Mapping, error_cls: type[SchemaConfigError]) -> dict:
    """Resolved plain dict of a config (Hydra's own node dropped); a failed interpolation raises
    ``error_cls`` naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = config if isinstance(config, DictConfig) else OmegaConf.create(config)
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)  # present only with return_hydra_config
    try:
        return OmegaConf.to_container(OmegaConf.create(container), resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise error_cls([f"Cannot resolve config key '{key}': {str(exc).splitlines()[0]}"]) from exc


def type_ok(value: Any, types: tuple[type, ...]) -> bool:
    """Whether ``value`` has one of ``types``; an int is a float, a bool is neither."""
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, (int, float)):
        return float in types or (int in types and isinstance(value, int))
    return (value is None and NONE_TYPE in types) or any(t in (str, list, dict) and isinstance(value, t) for t in types)


def type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is NONE_TYPE else t.__name__ for t in types)


def value_error(key: str, value: Any, types: tuple[type, ...]) -> Optional[str]:
    """The line for a required (``???``) or wrongly typed value; None when the value is fine."""
    if value == "???":
        return f"'{key}' is required (no default); pass {key}=..."
    if not type_ok(value, types):
        return f"'{key}' must be {type_names(types)}, got {value!r}"
    return None


def enum_error(key: str, value: Any, choices: Sequence[str]) -> Optional[str]:
    """The line for a value outside ``choices`` (with the closest choice when one is close)."""
    if value in choices:
        return None
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"'{key}'={value!r} is not one of: {', '.join(choices)}{hint}"


def suggest_key(key: str, candidates: Sequence[str], *, leaf_cutoff: float) -> Optional[str]:
    """The closest of ``candidates``: same last segment in another section first, then the whole dotted
    path (difflib cutoff 0.6), then the last segment alone (``leaf_cutoff``; the first key of a segment)."""
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return max(same_leaf, key=lambda c: difflib.SequenceMatcher(None, key, c).ratio())
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    by_leaf: dict[str, str] = {}
    for cand in candidates:
        by_leaf.setdefault(cand.rsplit(".", 1)[-1], cand)
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=leaf_cutoff)
    return by_leaf[close[0]] if close else None


def unknown_key_message(key: str, suggestion: Optional[str]) -> str:
    return f"Unknown config key '{key}'" + (f"; did you mean '{suggestion}'?" if suggestion else "")


def prepare_overrides(
    overrides: Iterable[str],
    *,
    classify: Callable[[str], Optional[str]],
    unknown_message: Callable[[str, bool], str],
    error_cls: type[SchemaConfigError],
    allow_delete_and_package: bool = False,
) -> list[str]:
    """Check Hydra command-line overrides against a schema and return them ready for Hydra.

    ``classify(key)`` is 'schema' (a YAML key), another kind (a key Hydra must add) or None (unknown:
    ``unknown_message(key, plus)`` names it, ``plus`` saying it was written with ``+``). YAML keys lose
    any ``+``/``++``; added keys get ``++``. Hydra's own keys pass through. Raises ``error_cls`` with every
    problem; deletions and package overrides are problems unless ``allow_delete_and_package``.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise error_cls([f"Cannot parse override: {exc}".splitlines()[0]]) from exc
    errors, prepared = [], []
    for ov in parsed:
        key, line = ov.key_or_group, ov.input_line
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            prepared.append(line)
            continue
        if not allow_delete_and_package:
            if ov.package is not None:
                errors.append(f"Package overrides are not supported: '{line}'")
                continue
            if ov.type == OverrideType.DEL:
                errors.append(f"Deleting config keys is not supported: '{line}'")
                continue
        kind = classify(key)
        if kind is None:
            errors.append(unknown_message(key, ov.type != OverrideType.CHANGE))
            continue
        body = line.lstrip("+")
        prepared.append(body if kind == "schema" else "++" + body)
    if errors:
        raise error_cls(errors)
    return prepared
