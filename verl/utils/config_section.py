"""Declare config keys once, as fields of frozen dataclasses ("sections"), and build them from an OmegaConf group.

A section class mirrors one group of the trainer YAML. Each field is one key: its annotation is the type, and
``key(...)`` adds what the checker needs (allowed values, from the module that owns them; bounds; whether a LUFFY key
acts, is accepted at its YAML default only, or refuses some values and why). The checkers walk these declarations
(``declarations``); the YAML gives every key its default and its documentation, and a test keeps the two in step.
``nested(cls)`` is a sub-group, ``view(cls)`` a sub-view read from the same flat group (the actor's loss keys); a
plain field with a default is an optional key absent from the YAML (``+key``). A rule between keys is a
``validate(self) -> list[str]`` method of the smallest section holding them, one line per problem naming the keys.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Iterator, Optional

from verl.utils.config_schema import NONE_TYPE, enum_error, value_error


@dataclass(frozen=True)
class Bound:
    """A named bound: ``ok(value)`` and the words of its error line (``template``)."""

    ok: Callable[[Any], bool]
    message: str
    template: str = "'{key}'={value!r} {message}"

    def error(self, key: str, value: Any) -> str:
        return self.template.format(key=key, value=value, message=self.message)


AT_LEAST_ONE = Bound(lambda v: v >= 1, "must be >= 1")
POSITIVE = Bound(lambda v: v > 0, "must be > 0")
NON_NEGATIVE = Bound(lambda v: v >= 0, "must be >= 0")
UNIT = Bound(lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")
OPEN_UNIT = Bound(lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")
OFF_OR_POSITIVE = Bound(lambda v: v == -1 or v > 0, "must be -1 (off) or > 0")  # LUFFY's -1 switches these off

ACTS, DEFAULT_ONLY = "acts", "default_only"


def values_of(module: str, name: str, *registering: str) -> Callable[[], tuple]:
    """The allowed values of a key: ``module.name`` (a registry's names for a dict; a function's result), imported when
    a config is checked, after the ``registering`` modules whose import adds entries to it."""

    def values():
        import importlib

        for extra in registering:
            importlib.import_module(extra)
        found = getattr(importlib.import_module(module), name)
        return tuple(found() if callable(found) else found)

    return values


@dataclass(frozen=True)
class Declaration:
    """A leaf key as the checker sees it (``key()``'s arguments; ``declarations`` adds the key, types and default)."""

    key: str = ""
    types: tuple = ()
    choices: Any = None
    bounds: Optional[Bound] = None
    luffy: str = ACTS
    why: Optional[str] = None
    refuse: dict = field(default_factory=dict)
    optional: bool = False  # absent from the YAML, added with `+`
    open_dict: bool = False
    default: Any = field(
        default_factory=lambda: MISSING
    )  # an optional key's default (the field's); the YAML gives every other key its own
    doc: Optional[str] = None  # where the key's YAML comment is not its documentation (a method's knob)

    def allowed(self) -> Optional[tuple]:
        """The allowed values (the owner's list, less the refused ones), or None when any value of the type goes."""
        if self.choices is None:
            return None
        values = self.choices() if callable(self.choices) else self.choices
        return tuple(v for v in values if v not in self.refuse)


def key(
    *,
    choices: Any = None,
    bounds: Optional[Bound] = None,
    luffy: str = ACTS,
    why: Optional[str] = None,
    refuse: Optional[dict] = None,
    types: tuple = (),
    default: Any = MISSING,
    open_dict: bool = False,
    doc: Optional[str] = None,
):
    """One config key's declaration (a dataclass field).

    ``choices``: the allowed values, or a callable returning them from the registry or module that owns them
    (list values are checked element by element). ``bounds``: a ``Bound``. ``luffy=DEFAULT_ONLY`` with ``why``:
    LUFFY parses the key but nothing acts on it here, so only its YAML default is accepted. ``refuse``: value ->
    reason for values LUFFY has that are not shipped. ``types``: the accepted types where the annotation cannot
    say them (``Any``). ``default``: only for optional ``+`` keys absent from the YAML. ``open_dict``: a dict
    whose sub-keys are free-form (``+key.field=...``). ``doc``: the key's documentation where no YAML file
    carries it (a method's knobs: luffy_pool/methods/).
    """
    if luffy not in (ACTS, DEFAULT_ONLY) or (luffy == DEFAULT_ONLY) != (why is not None):
        raise ValueError("key(): luffy is 'acts' or 'default_only', and default_only needs its why")
    declared = Declaration("", types, choices, bounds, luffy, why, dict(refuse or {}), open_dict=open_dict, doc=doc)
    return field(default=default, metadata={"declaration": declared})


def nested(cls, refused: Optional[str] = None) -> Any:
    """A field holding the sub-group of type ``cls``; ``refused``: unknown keys under it get this reason."""
    return field(metadata={"section": cls, "refused_group": refused})


def view(cls) -> Any:
    """A field holding ``cls`` built from the same group as its parent (its keys sit in the parent's YAML group)."""
    return field(metadata={"section": cls, "flat": True})


def not_shipped(why: str) -> Any:
    """A group LUFFY's YAML has and this project does not ship (no keys here): every key under it is refused."""
    return field(default=None, metadata={"refused_group": why, "absent": True})


def _types_of(annotation) -> tuple:
    """Accepted Python types of an annotation (``Optional[int]`` -> (int, NoneType))."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return tuple(t for a in typing.get_args(annotation) for t in _types_of(a))
    if origin is not None:  # list[str], dict[str, Any]
        return (origin,)
    if annotation is None:
        return (NONE_TYPE,)
    if annotation in (bool, int, float, str, list, dict, NONE_TYPE):
        return (annotation,)
    raise TypeError(f"no config type for annotation {annotation!r}; declare types=(...)")


def _sub_prefix(f, prefix: str) -> str:
    return prefix if f.metadata.get("flat") else f"{prefix}{f.name}."


def declarations(cls, prefix: str = "") -> Iterator[Declaration]:
    """Every leaf key declared by section ``cls`` and its sub-sections, as dotted keys under ``prefix``."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("section") is not None:
            yield from declarations(f.metadata["section"], _sub_prefix(f, prefix))
        elif not f.metadata.get("absent"):
            d = f.metadata.get("declaration", Declaration())
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            types = d.types or _types_of(hints[f.name])
            yield dataclasses.replace(
                d, key=f"{prefix}{f.name}", types=types, optional=default is not MISSING, default=default
            )


def value_errors(d: Declaration, value: Any, default: Any) -> list[str]:
    """The lines for one key's (well-typed) value against its declaration: a LUFFY-inert key away from its YAML
    ``default``, a refused value, a value outside the allowed ones, a bound not met."""
    if d.luffy == DEFAULT_ONLY and value != default:
        return [f"'{d.key}'={value!r} is not supported ({d.why}); only {default!r} is accepted"]
    errors, allowed = [], d.allowed()
    for item in value if isinstance(value, list) and allowed is not None else [value]:
        refused = [why for v, why in d.refuse.items() if type(v) is type(item) and v == item]
        if refused:
            errors.append(f"'{d.key}'={item!r} is not supported: {refused[0]}")
        elif allowed is not None and item not in allowed:
            errors.append(enum_error(d.key, item, allowed))
    if d.bounds is not None and value is not None and not d.bounds.ok(value):
        errors.append(d.bounds.error(d.key, value))
    return errors


def structure_errors(values: dict, declared: dict[str, Declaration], known, unknown, yaml_name: str) -> list[str]:
    """The lines of a flattened config (dotted key -> value) against its declarations: keys ``known`` refuses
    (``unknown(key)`` names them), declared YAML keys that are missing, wrong types."""
    errors = [unknown(k) for k in values if not known(k)]
    errors += [
        f"Missing config key '{k}' (it is in {yaml_name})"
        for k, d in declared.items()
        if not d.optional and k not in values
    ]
    return errors + [e for k, v in values.items() if k in declared for e in [value_error(k, v, declared[k].types)] if e]


def range_errors(values: dict, declared: dict[str, Declaration], defaults: dict) -> list[str]:
    """Each well-typed value against its declaration (``defaults``: the YAML's, for keys accepted at it only)."""
    return [e for k, d in declared.items() if k in values for e in value_errors(d, values[k], defaults.get(k))]


def refused_groups(cls, prefix: str = "") -> dict[str, str]:
    """Dotted group -> reason, for the groups declared as not shipped (``not_shipped``, ``nested(refused=...)``)."""
    found = {}
    for f in fields(cls):
        if f.metadata.get("refused_group"):
            found[f"{prefix}{f.name}"] = f.metadata["refused_group"]
        if f.metadata.get("section") is not None:
            found.update(refused_groups(f.metadata["section"], _sub_prefix(f, prefix)))
    return found


def rule_errors(section) -> list[str]:
    """The lines of every ``validate()`` of ``section`` and its sub-sections (sub-sections first)."""
    errors = []
    for f in fields(section):
        if f.metadata.get("section") is not None and getattr(section, f.name) is not None:
            errors += rule_errors(getattr(section, f.name))
    if hasattr(type(section), "validate"):  # the class's own rules (not a view's, reached through __getattr__)
        errors += section.validate()
    return errors


def _missing(path: str) -> KeyError:
    return KeyError(
        f"{path} is missing from the config (compose it from its YAML, which gives every key its default: "
        "verl/trainer/config/ppo_worker.yaml for the workers' groups, composed by the trainer's own YAML)"
    )


def build_section(cls, section, name: str):
    """``cls(**values)`` from the mapping ``section`` (an OmegaConf group); ``name`` is its dotted path for
    error messages. A required field missing from the group raises a KeyError naming the key."""
    from omegaconf import DictConfig, OmegaConf

    if section is None:
        raise _missing(name)
    values = {}
    for f in fields(cls):
        sub, path = f.metadata.get("section"), f"{name}.{f.name}" if name else f.name
        if sub is not None and f.metadata.get("flat"):
            values[f.name] = build_section(sub, section, name)
        elif f.metadata.get("absent"):
            continue
        elif f.name not in section.keys():
            if f.default is MISSING and f.default_factory is MISSING:
                raise _missing(path)
        elif sub is not None:
            values[f.name] = build_section(sub, section[f.name], path)
        elif isinstance(section, DictConfig) and OmegaConf.is_missing(section, f.name):
            # A required key left unset (``???``, e.g. data.train_files in a driver-only test config) stays
            # ``???``: config_check refuses it before a run, and reading it eagerly here must not raise.
            values[f.name] = "???"
        else:
            value = section[f.name]
            # Plain containers, not OmegaConf nodes: sections are handed to workers and compared in tests.
            values[f.name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return cls(**values)
