"""Declare config keys once, as fields of frozen dataclasses ("sections"), and build them from an OmegaConf group.

A section class mirrors one group of the trainer YAML. Each field is one key: its annotation is the type, and
``key(...)`` adds what the checker needs (allowed values, taken from the module that owns them; bounds; whether
a LUFFY key acts, is accepted at its YAML default only, or refuses some values and why). The checker
(luffy_pool/config/check.py) walks these declarations (``declarations``); nothing restates them in a table.
The values, defaults included, come from the composed config: the YAML gives every key its default and its
comment (the key's documentation for users); a test keeps YAML and declarations in step.

``nested(cls)`` is a sub-group (``actor.fsdp_config``), ``view(cls)`` a sub-view read from the same flat group
(the actor's loss keys). A plain field with a default is an optional key absent from the YAML (``+key``).

A rule between keys is a ``validate(self) -> list[str]`` method of the section that owns all its keys (the
smallest group holding them; a rule between groups sits on their parent), one line per problem naming the
keys; ``rule_errors(sections)`` runs every section's rules, and the checker calls it before any worker starts.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Iterator, Optional

from verl.utils.config_schema import NONE_TYPE, enum_error


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


def key(
    *,
    choices: Any = None,
    bounds: Optional[Bound] = None,
    luffy: str = ACTS,
    why: Optional[str] = None,
    refuse: Optional[dict] = None,
    types: Optional[tuple] = None,
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
    meta = {
        "choices": choices,
        "bounds": bounds,
        "luffy": luffy,
        "why": why,
        "refuse": dict(refuse or {}),
        "types": types,
        "open_dict": open_dict,
        "doc": doc,
    }
    return field(default=default, metadata=meta)


def nested(cls, refused: Optional[str] = None) -> Any:
    """A field holding the sub-group of type ``cls``; ``refused``: unknown keys under it get this reason."""
    return field(metadata={"section": cls, "refused_group": refused})


def view(cls) -> Any:
    """A field holding ``cls`` built from the same group as its parent (its keys sit in the parent's YAML group)."""
    return field(metadata={"section": cls, "flat": True})


def not_shipped(why: str) -> Any:
    """A group LUFFY's YAML has and this project does not ship (no keys here): every key under it is refused."""
    return field(default=None, metadata={"refused_group": why, "absent": True})


@dataclass(frozen=True)
class Declaration:
    """A leaf key as the checker sees it."""

    key: str
    types: tuple
    choices: Any
    bounds: Optional[Bound]
    luffy: str
    why: Optional[str]
    refuse: dict
    optional: bool  # absent from the YAML, added with `+`
    open_dict: bool
    default: Any = MISSING  # an optional key's default (the field's); the YAML gives every other key its own
    doc: Optional[str] = None  # where the key's YAML comment is not its documentation (a method's knob)

    def allowed(self) -> Optional[tuple]:
        """The allowed values (the owner's list, less the refused ones), or None when any value of the type goes."""
        if self.choices is None:
            return None
        values = self.choices() if callable(self.choices) else self.choices
        return tuple(v for v in values if v not in self.refuse)


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


def declarations(cls, prefix: str = "") -> Iterator[Declaration]:
    """Every leaf key declared by section ``cls`` and its sub-sections, as dotted keys under ``prefix``."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        sub = f.metadata.get("section")
        if sub is not None:
            yield from declarations(sub, prefix if f.metadata.get("flat") else f"{prefix}{f.name}.")
            continue
        if f.metadata.get("absent"):
            continue
        meta = f.metadata
        types = meta.get("types") or _types_of(hints[f.name])
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        yield Declaration(
            key=f"{prefix}{f.name}",
            types=types,
            choices=meta.get("choices"),
            bounds=meta.get("bounds"),
            luffy=meta.get("luffy", ACTS),
            why=meta.get("why"),
            refuse=meta.get("refuse") or {},
            optional=default is not MISSING,
            open_dict=bool(meta.get("open_dict")),
            default=default,
            doc=meta.get("doc"),
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


def refused_groups(cls, prefix: str = "") -> dict[str, str]:
    """Dotted group -> reason, for the groups declared as not shipped (``not_shipped``, ``nested(refused=...)``)."""
    found = {}
    for f in fields(cls):
        why = f.metadata.get("refused_group")
        if why:
            found[f"{prefix}{f.name}"] = why
        sub = f.metadata.get("section")
        if sub is not None:
            found.update(refused_groups(sub, prefix if f.metadata.get("flat") else f"{prefix}{f.name}."))
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


_YAML_HINT = "verl/trainer/config/ppo_worker.yaml for the workers' groups, composed by the trainer's own YAML"


def build_section(cls, section, name: str):
    """``cls(**values)`` from the mapping ``section`` (an OmegaConf group); ``name`` is its dotted path for
    error messages. A required field missing from the group raises a KeyError naming the key."""
    from omegaconf import DictConfig, OmegaConf

    if section is None:
        raise KeyError(
            f"{name} is missing from the config (compose it from its YAML, which gives every key its default: "
            f"{_YAML_HINT})"
        )
    present = set(section.keys())
    values = {}
    for f in fields(cls):
        sub = f.metadata.get("section")
        if sub is not None and f.metadata.get("flat"):
            values[f.name] = build_section(sub, section, name)
            continue
        if f.metadata.get("absent"):
            continue
        if f.name not in present:
            if f.default is MISSING and f.default_factory is MISSING:
                raise KeyError(
                    f"{name + '.' if name else ''}{f.name} is missing from the config (compose it from its YAML, "
                    f"which gives every key its default: {_YAML_HINT})"
                )
            continue
        if sub is not None:
            values[f.name] = build_section(sub, section[f.name], f"{name}.{f.name}" if name else f.name)
        elif isinstance(section, DictConfig) and OmegaConf.is_missing(section, f.name):
            # A required key left unset (``???``, e.g. data.train_files in a driver-only test config) stays
            # ``???``: config_check refuses it before a run, and reading it eagerly here must not raise.
            values[f.name] = "???"
        else:
            value = section[f.name]
            # Plain containers, not OmegaConf nodes: sections are handed to workers and compared in tests.
            values[f.name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return cls(**values)
