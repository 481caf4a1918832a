"""Selecting a method merges its YAML group (the keys it sets) and its knobs' defaults (declared in its module) into
the run's config, so both are part of the resolved config; a preset key the user set to another value is refused
naming both keys, and so are the knobs of a method that is not selected (the method: luffy_pool/methods/base.py)."""

from __future__ import annotations

from luffy_pool.config.base_yaml import base_yaml
from luffy_pool.methods import METHODS, Method, get_method
from luffy_pool.methods.base import DEFAULT_METHOD


def method_conflicts(method: Method, config) -> list[str]:
    """One line per problem of ``config`` against ``method``: a preset key set to another value than the
    method's (and than the base YAML default), and a knob group of a method that is not selected."""
    from omegaconf import OmegaConf

    errors = []
    for path, value in method.preset_keys().items():
        current = OmegaConf.select(config, path)
        if current == value or current == OmegaConf.select(base_yaml(), path):
            continue
        errors.append(
            f"algorithm.method={method.name} sets {path}={value!r}, but the config has {path}={current!r}; "
            f"drop that override or choose another algorithm.method"
        )
    algorithm = config.get("algorithm") or {}
    for other in (name for name, m in METHODS.items() if m.knobs is not None and name != method.name):
        if algorithm.get(other) is not None:
            knob = next(iter(algorithm[other]), None)
            key = f"algorithm.{other}" + (f".{knob}" if knob is not None else "")
            errors.append(
                f"{key} is a knob of algorithm.method={other}, but algorithm.method={method.name}; "
                f"drop it or set algorithm.method={other}"
            )
    return errors


ON_POLICY = "grpo"


def resolved_method_name(config) -> str:
    """``algorithm.method``; at its default (LUFFY), a config without LUFFY's off-policy slots (``rollout.n_prefix=0``)
    and without its losses (``use_off_policy_loss`` / ``use_sft_multitask_loss`` off, ``policy_loss`` auto or
    vanilla) is on-policy GRPO, whose one spelling is ``algorithm.method=grpo``: it resolves to it (the same keys, so
    the same run; the resolved config says grpo)."""
    from omegaconf import OmegaConf

    name = str(OmegaConf.select(config, "algorithm.method", default=DEFAULT_METHOD))
    actor = OmegaConf.select(config, "actor_rollout_ref.actor") or {}
    on_policy = (
        OmegaConf.select(config, "actor_rollout_ref.rollout.n_prefix") == 0
        and not actor.get("use_off_policy_loss")
        and not actor.get("use_sft_multitask_loss")
        and actor.get("policy_loss", "auto") in ("auto", "vanilla")
    )
    return ON_POLICY if name == DEFAULT_METHOD and on_policy else name


def apply_method(config) -> Method:
    """Merge ``algorithm.method``'s preset (its YAML group) and its knob defaults (under the user's knob values)
    into ``config`` (in place; idempotent) and return the method. ValueError (one line) for an unknown method,
    a contradicting key or another method's knobs."""
    from omegaconf import OmegaConf, open_dict

    method = get_method(resolved_method_name(config))
    errors = method_conflicts(method, config)
    if errors:
        raise ValueError(errors[0])
    with open_dict(config):
        config.algorithm.method = method.name
        for path, value in method.preset_keys().items():
            if OmegaConf.select(config, path) != value:
                OmegaConf.update(config, path, value, merge=False)
        if method.knobs is not None:
            user = OmegaConf.select(config, f"algorithm.{method.name}")
            knobs = OmegaConf.create(method.knob_defaults())
            if user is not None:
                knobs = OmegaConf.merge(knobs, user)
            config.algorithm[method.name] = knobs
    return method
