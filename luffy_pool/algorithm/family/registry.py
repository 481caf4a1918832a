"""Registries of the family's building blocks, and the inputs their losses read.

Three kinds, one call shape each (METHODS_SPEC §0 "framework building blocks"):

- ``loss``: ``fn(inputs: FamilyLossInputs, cfg) -> (loss, metrics)``, the call shape of
  ``verl.trainer.ppo.core_algos.register_policy_loss`` (``cfg`` read by attribute, ``metrics`` scalar tensors
  or floats). :class:`FamilyLossInputs` extends ``PolicyLossInputs`` with the tensors the family needs
  (token entropies, expert/correct-row masks, the recorded log-probs of a replayed trace), so a family loss
  can later be registered into ``POLICY_LOSS_REGISTRY`` with its knob dataclass unchanged. They are kept in
  this registry for now because registering knob dataclasses there adds keys to the config checker, which
  is the trainer integration's decision.
- ``schedule``: ``fn(step: int, cfg) -> float`` (CHORD's μ, UFT's hint probability).
- ``gate``: ``fn(success_count: int, cfg) -> decision`` (HPT's per-prompt switch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from verl.trainer.ppo.loss_inputs import PolicyLossInputs

KINDS = ("loss", "schedule", "gate")
_REGISTRIES: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}
# name -> knob dataclass of a registered block (the YAML group it will read)
BLOCK_CONFIGS: dict[tuple[str, str], type] = {}


@dataclass(frozen=True)
class FamilyLossInputs(PolicyLossInputs):
    """``PolicyLossInputs`` plus the family's tensors, each ``[rows, response_length]`` unless noted.

    ``entropy``: token entropies of the current policy (SRFT's weights, ReLIFT's bonus); ``expert_mask``
    ``[rows]`` bool: CHORD's expert (SFT) rows; ``correct_mask`` ``[rows]`` bool: rows whose sequence score is
    exactly 1 (SRFT's sign rule); ``step``: the global step (CHORD's μ). A loss that needs an absent field
    raises ValueError naming it.
    """

    entropy: Optional[Any] = None
    expert_mask: Optional[Any] = None
    correct_mask: Optional[Any] = None
    step: Optional[int] = None


def require(inputs: FamilyLossInputs, field: str, loss: str) -> Any:
    """``inputs.<field>``, or ValueError naming the loss and the missing field."""
    value = getattr(inputs, field)
    if value is None:
        raise ValueError(f"the {loss} loss needs inputs.{field}")
    return value


def register(kind: str, name: str, config: Optional[type] = None) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn`` as the ``kind`` block ``name`` (``config``: its knob dataclass)."""
    if kind not in _REGISTRIES:
        raise ValueError(f"unknown block kind {kind!r}; valid: {list(KINDS)}")
    registry = _REGISTRIES[kind]

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        previous = registry.get(name)
        # A module reload re-registers the same function; another function under the name is a bug.
        if previous is not None and (previous.__module__, previous.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered to {previous.__module__}.{previous.__qualname__}")
        registry[name] = fn
        if config is not None:
            BLOCK_CONFIGS[(kind, name)] = config
        return fn

    return decorator


def get(kind: str, name: str) -> Callable[..., Any]:
    """The ``kind`` block registered as ``name``; ValueError listing the valid names otherwise."""
    if kind not in _REGISTRIES:
        raise ValueError(f"unknown block kind {kind!r}; valid: {list(KINDS)}")
    if name not in _REGISTRIES[kind]:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(_REGISTRIES[kind])}")
    return _REGISTRIES[kind][name]


def names(kind: str) -> list[str]:
    """Sorted names registered under ``kind``."""
    return sorted(_REGISTRIES[kind])


def config_of(kind: str, name: str) -> Optional[type]:
    """The knob dataclass ``name`` was registered with (None: it has none)."""
    return BLOCK_CONFIGS.get((kind, name))
