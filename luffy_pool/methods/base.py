"""What a training method is: a named composition of the pool's blocks, and how selecting it sets the config.

A method (``algorithm.method``) declares, in one small module registered here:

- ``requires``: config keys it needs at a fixed value (its policy loss, its advantage estimator, its slot plan).
  Selecting it sets them; a value that differs from both the method's and the base YAML default
  (luffy_pool/config/mix_ppo_trainer.yaml) is a user's choice that contradicts the method: refused, one line
  naming both keys.
- ``replaces``: LUFFY's own selection keys (its loss switch ``use_off_policy_loss``, its off-policy slots for
  ``grpo``) that the method supersedes. They belong to the ``luffy`` method, so another method sets them whatever
  a LUFFY recipe (tiny_cpu_luffy.yaml, train.sh) put there; the change is logged.
- ``knobs``: the name of its YAML group ``algorithm.<knobs>`` (declared in luffy_pool/config/sections.py), sent
  to the actor with the step index so the loss can build its knob dataclass (luffy_pool/methods/losses.py).
- ``before_update``: an optional driver stage after the advantage, ``fn(batch, sections) -> metrics``, that adds
  per-row tensors the loss reads (HPT's per-group switch ``loss_row_mask``, SRFT's ``row_scores``).
- ``needs_demonstration``: every train row needs its ``data.target_key`` (luffy_pool/run/preflight.py).
- ``ratio_sampler``: an optional slot plan of its own, ``fn(sections, seed=, total_steps=, tokenizer=) -> sampler``
  replacing LUFFY's ``PrefixRatioSampler``; ``sampler.draw_batch(batch, global_step) -> (ratios [B, n], metrics)``
  may rewrite the batch's per-prompt traces ``tgt_input_ids`` (UFT's hints), and its ``state_dict`` is saved
  with the trainer's (Prefix-RFT's cosine prefix ratio, UFT's hint draws).
- ``check_train_file``: an optional input check ``fn(path, sections) -> error line or None`` run on every train
  file before Ray starts (UFT's hint column).
- ``stage``: an optional driver stage with state across steps, ``fn(trainer) -> stage`` built once by the trainer;
  the stage has ``before_rollout(batch)`` (the step's prompts, before the rollout takes their targets),
  ``after_update(batch, timing) -> metrics`` and ``state_dict`` / ``load_state_dict`` (saved in the checkpoint's
  ``data.pt``; ReLIFT's hard-question buffer and interleaved SFT step).
- ``driver``: an optional class built with the trainer, ``driver(trainer)``, for a method with state across steps
  and stages around the rollout (ExGRPO's experience pool: luffy_pool/methods/exgrpo.py lists its calls); its
  ``state_dict`` is saved with every checkpoint.
- ``needs_question_ids``: the method keys state by question id (the dataset's ``index``), so the train files'
  ids must be unique (luffy_pool/run/preflight.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

logger = logging.getLogger(__name__)

METHODS: dict[str, "Method"] = {}


@dataclass(frozen=True)
class Method:
    """One training method: the config it needs and the driver hooks it adds (see the module docstring)."""

    name: str
    mechanism: str
    requires: Mapping[str, Any] = field(default_factory=dict)
    replaces: Mapping[str, Any] = field(default_factory=dict)
    knobs: Optional[str] = None
    before_update: Optional[Callable[..., dict]] = None
    # every train row must carry a demonstration (data.target_key not null), checked before Ray starts
    needs_demonstration: bool = False
    ratio_sampler: Optional[Callable[..., Any]] = None
    check_train_file: Optional[Callable[..., Optional[str]]] = None
    stage: Optional[Callable[..., Any]] = None
    # stateful driver stages (see the module docstring), built as driver(trainer)
    driver: Optional[Callable[..., Any]] = None
    # state keyed by question id: train rows need unique ids (extra_info.index or the row position)
    needs_question_ids: bool = False


def register_method(method: Method) -> Method:
    """Add ``method`` under its name (a second, different method under the same name is a bug)."""
    previous = METHODS.get(method.name)
    if previous is not None and previous != method:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The method registered as ``name``; ValueError listing the registered ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"algorithm.method={name!r} is not implemented; valid: {sorted(METHODS)}")
    return METHODS[name]


@lru_cache(maxsize=1)
def _base_defaults():
    from omegaconf import OmegaConf

    from luffy_pool.config.check import BASE_CONFIG_NAME, CONFIG_DIR

    return OmegaConf.load(f"{CONFIG_DIR}/{BASE_CONFIG_NAME}.yaml")


def method_conflicts(method: Method, config) -> list[str]:
    """One line per ``requires`` key whose value contradicts ``method`` (differs from the method's value and
    from the base YAML default)."""
    from omegaconf import OmegaConf

    errors = []
    for path, value in method.requires.items():
        current = OmegaConf.select(config, path)
        if current == value or current == OmegaConf.select(_base_defaults(), path):
            continue
        errors.append(
            f"algorithm.method={method.name} sets {path}={value!r}, but the config has {path}={current!r}; "
            f"drop that override or choose another algorithm.method"
        )
    return errors


def apply_method(config) -> Method:
    """Set the keys ``algorithm.method`` needs on ``config`` (in place; idempotent) and return the method.
    ValueError (one line) for an unknown method or a contradicting key."""
    from omegaconf import OmegaConf, open_dict

    import luffy_pool.methods  # noqa: F401 -- registers the shipped methods

    method = get_method(str(OmegaConf.select(config, "algorithm.method", default="luffy")))
    errors = method_conflicts(method, config)
    if errors:
        raise ValueError(errors[0])
    with open_dict(config):
        for path, value in {**method.replaces, **method.requires}.items():
            current = OmegaConf.select(config, path)
            if current != value:
                if path in method.replaces:
                    logger.info("algorithm.method=%s: %s %r -> %r", method.name, path, current, value)
                OmegaConf.update(config, path, value, merge=False)
    return method
