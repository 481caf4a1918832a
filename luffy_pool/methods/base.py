"""What a training method is: one registered object, selected by ``algorithm.method``.

A method declares, in its own module (luffy_pool/methods/<name>.py) and its YAML group
(luffy_pool/config/method/<name>.yaml), everything the framework needs from it:

- its **preset** (the YAML group): the keys it sets outside its own group (its policy loss, advantage estimator and
  slot plan), and its **knobs** ``algorithm.<name>``: the frozen dataclass ``knobs``, whose fields declare each knob
  once (type, bounds, default and doc: ``verl.utils.config_section.key``), checked like every other key.
  Selecting the method merges the group into the config (luffy_pool/config/method_group.py ``apply_method``): the preset and the knob defaults
  appear in the resolved config; a preset key the user set to another value is refused, naming both keys; knobs of
  a method that is not selected are refused (luffy_pool/config/check.py).
- its **loss** ``loss(inputs, knobs, step) -> (loss, metrics)`` (``inputs``: :class:`MethodLossInputs`), which
  the actor calls with the knobs it received once at init and the update's step.
- its **hooks** (luffy_pool/methods/hooks.py): the driver stages of the step, built once per run from a narrow
  :class:`~luffy_pool.methods.hooks.StepContext`.
- its **declarations**, read by pre-flight, the memory plan, the recipe and the rehearsal, which name no method:
  ``needs_demonstration``, ``needs_question_ids``, ``check_train_file``, ``batch_keys`` (per-row tensors its hooks
  add for the update), ``memory`` (extra device and host memory), ``scaled_keys`` (batch keys a rehearsal shrinks),
  ``rehearsal_data`` (a train-file transform the rehearsal applies), ``stateful`` (state the next batch is
  drawn from: a one-step-off pipeline is refused) and ``regularise_prefix_tokens`` (the actor's entropy bonus and
  KL-to-reference loss cover the response's prefix tokens, or only the tokens after them).

Every module of this package is imported by ``luffy_pool.methods`` and registers its method: adding a method adds
its module, its YAML group and its launch script, and changes no other file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Optional

METHODS: dict[str, "Method"] = {}
PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "method")
DEFAULT_METHOD = "luffy"


@dataclass(frozen=True)
class Method:
    """One training method (see the module docstring)."""

    name: str
    mechanism: str
    knobs: Optional[type] = None
    loss: Optional[Callable[..., Any]] = None
    hooks: Optional[Callable[..., Any]] = None
    needs_demonstration: bool = False
    needs_question_ids: bool = False
    check_train_file: Optional[Callable[..., Optional[str]]] = None
    batch_keys: tuple[str, ...] = ()
    memory: Optional[Callable[..., Any]] = None
    scaled_keys: tuple[str, ...] = ()
    rehearsal_data: Optional[Callable[..., Any]] = None
    stateful: bool = False
    # False: the entropy bonus and the KL loss average over the response tokens outside prefix_mask only (a method
    # whose prefix stands for prompt text, as UFT's hint); True: over every response token (LUFFY's traces)
    regularise_prefix_tokens: bool = True

    @property
    def preset(self) -> dict:
        """The YAML group as a plain nested dict (the keys the method sets)."""
        return method_group(self.name)

    def preset_keys(self) -> dict[str, Any]:
        """Dotted key -> value of every preset leaf outside the method's knob group."""
        own = f"algorithm.{self.name}"
        return {k: v for k, v in _leaves(self.preset) if k != own and not k.startswith(own + ".")}

    def knob_defaults(self) -> dict:
        """The knob group's defaults, from the knob dataclass (empty for a method without knobs)."""
        if self.knobs is None:
            return {}
        return {f.name: f.default for f in fields(self.knobs)}


def register_method(method: Method) -> Method:
    """Add ``method`` under its name (a second, different method under the same name is a bug)."""
    previous = METHODS.get(method.name)
    if previous is not None and previous != method:
        raise ValueError(f"method {method.name!r} is already registered")
    undeclared = [f.name for f in fields(method.knobs) if f.default is MISSING] if method.knobs is not None else []
    if undeclared:  # a knob is declared once, with its default and doc, in the method's module
        raise ValueError(f"method {method.name!r}: knob {undeclared[0]!r} has no default")
    if method.knobs is not None and method_group(method.name).get("algorithm", {}).get(method.name):
        raise ValueError(
            f"method {method.name!r}: its YAML group restates algorithm.{method.name}; knobs live in its module"
        )
    if method.loss is not None:  # the one loss table: verl's registry, under the method's name
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

        if method.name not in POLICY_LOSS_REGISTRY:
            register_policy_loss(method.name)(registry_entry(method))
    METHODS[method.name] = method
    return method


def registry_entry(method):
    """``method.loss`` in verl's call shape ``fn(inputs, cfg)`` (its knobs and step travel in ``inputs``)."""

    def entry(inputs, cfg=None):  # inputs: loss_inputs.FamilyLossInputs
        return method.loss(inputs, inputs.knobs, inputs.step)

    entry.__name__ = entry.__qualname__ = f"{method.name}_loss"
    entry.__module__ = method.loss.__module__
    return entry


def get_method(name: str) -> Method:
    """The method registered as ``name`` (``import luffy_pool.methods`` registers the shipped ones); ValueError
    listing the registered ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"algorithm.method={name!r} is not implemented; valid: {sorted(METHODS)}")
    return METHODS[name]


@functools.lru_cache(maxsize=None)
def _group_file(name: str) -> dict:
    import yaml

    path = os.path.join(PRESET_DIR, f"{name}.yaml")
    if not os.path.isfile(path):
        raise ValueError(f"algorithm.method={name}: its YAML group {path} is missing")
    with open(path) as f:
        return yaml.safe_load(f) or {}


def method_group(name: str) -> dict:
    """A copy of luffy_pool/config/method/<name>.yaml as a nested dict."""
    import copy

    return copy.deepcopy(_group_file(name))


def _leaves(node: Mapping, prefix: str = ""):
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, dotted + ".")
        else:
            yield dotted, value


@dataclass(frozen=True)
class MethodSelection:
    """What the workers receive once, at init: the method's name and its frozen knob section."""

    name: str
    knobs: Any = None
    # the share of each group's rows that are expert (demonstration) rows in the slot plan: n_prefix / n
    expert_share: float = 0.0


def select_method(config) -> MethodSelection:
    """The selected method and its knob section, built from ``config`` (after :func:`apply_method`)."""
    from omegaconf import OmegaConf

    from verl.utils.config_section import build_section

    method = get_method(str(OmegaConf.select(config, "algorithm.method", default=DEFAULT_METHOD)))
    n = int(OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=1) or 1)
    share = max(int(OmegaConf.select(config, "actor_rollout_ref.rollout.n_prefix", default=0) or 0), 0) / n
    if method.knobs is None:
        return MethodSelection(method.name, None, share)
    # the YAML group's defaults under the config's values (a config composed without apply_method has none)
    group = OmegaConf.create(method.knob_defaults())
    given = OmegaConf.select(config, f"algorithm.{method.name}")
    if given is not None:
        group = OmegaConf.merge(group, given)
    return MethodSelection(method.name, build_section(method.knobs, group, f"algorithm.{method.name}"), share)
