"""The config keys are declared once (luffy_pool/config/sections.py, verl/workers/config_sections.py) and the
YAML keeps LUFFY's layout and defaults: both in step, every default valid under its own declaration."""

import collections
import os

import pytest

from luffy_pool.config.check import CONFIG_DIR, declared, open_dict_keys, schema_defaults, validate_config
from luffy_pool.config.sections import ConfigSections
from verl.utils.config_schema import type_ok
from verl.utils.config_section import DEFAULT_ONLY, declarations


def _yaml_leaves() -> set:
    return {k for k, v in schema_defaults().items() if not isinstance(v, dict) or k in open_dict_keys()}


def test_every_yaml_key_has_exactly_one_declaration_and_every_declaration_a_yaml_key():
    keys = [d.key for d in declarations(ConfigSections) if not d.optional]
    twice = [k for k, n in collections.Counter(keys).items() if n > 1]
    assert not twice, f"declared more than once: {twice}"
    assert set(keys) == _yaml_leaves(), (
        f"declared, not in the YAML: {sorted(set(keys) - _yaml_leaves())}; "
        f"in the YAML, not declared: {sorted(_yaml_leaves() - set(keys))}"
    )
    optional = [d.key for d in declarations(ConfigSections) if d.optional]
    assert optional == ["trainer.val_before_train", "trainer.val_only"]
    assert not set(optional) & set(schema_defaults())  # `+key` must stay addable


@pytest.mark.parametrize("key", sorted(_yaml_leaves()))
def test_the_yaml_default_has_the_declared_type_and_satisfies_the_declaration(key):
    d, default = declared()[key], schema_defaults()[key]
    if default == "???":  # required, no default (data.train_files, model.path)
        return
    assert type_ok(default, d.types), (key, default, d.types)
    if d.luffy == DEFAULT_ONLY:
        assert d.why and not d.refuse and d.bounds is None, key
    allowed = d.allowed()
    for item in default if isinstance(default, list) and allowed is not None else [default]:
        assert not any(type(v) is type(item) and v == item for v in d.refuse), key
        assert allowed is None or item in allowed, (key, item, allowed)
    assert d.bounds is None or default is None or d.bounds.ok(default), (key, default, d.bounds.message)


def test_value_lists_come_from_their_owners():
    from luffy_pool.algorithm import mix_core_alg
    from luffy_pool.rollout.off_policy_pool import PREFIX_STRATEGIES
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.kl import KL_PENALTY_TYPES
    from verl.utils.tracking import SUPPORTED_BACKENDS

    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    adv = declared()["algorithm.adv_estimator"]
    assert set(adv.allowed()) | set(adv.refuse) == set(ADV_ESTIMATOR_REGISTRY) and "gae" in adv.refuse
    assert declared()[f"{a}.off_policy_reshape"].allowed() == mix_core_alg.OFF_POLICY_RESHAPES
    assert declared()[f"{a}.on_policy_reshape"].allowed() == mix_core_alg.ON_POLICY_RESHAPES
    assert declared()[f"{r}.prefix_strategy"].allowed() == PREFIX_STRATEGIES
    assert declared()[f"{a}.kl_loss_type"].allowed() == declared()["algorithm.kl_penalty"].allowed() == KL_PENALTY_TYPES
    assert declared()["trainer.logger"].allowed() == SUPPORTED_BACKENDS


def test_verl_declares_no_luffy_only_key():
    """The LUFFY method's keys (prefix plan, off-policy loss, inert LUFFY keys) are declared under luffy_pool/."""
    from verl.workers.config_sections import WorkerSections

    verl_keys = {d.key for d in declarations(WorkerSections, "actor_rollout_ref.")}
    luffy_only = {
        "actor_rollout_ref.actor.off_policy_max_clip",
        "actor_rollout_ref.actor.use_off_policy_loss",
        "actor_rollout_ref.rollout.prefix_strategy",
        "actor_rollout_ref.rollout.n_prefix",
        "actor_rollout_ref.actor.clip_upper_bound",
        "actor_rollout_ref.actor.debug",
    }
    assert not verl_keys & luffy_only


def _rl_configs() -> list:
    """The tiny_cpu_*.yaml configs of this trainer (tiny_cpu_sft.yaml composes the SFT trainer's YAML)."""
    return sorted(
        f[:-5]
        for f in os.listdir(CONFIG_DIR)
        if f.startswith("tiny_cpu_") and "sft_trainer" not in open(os.path.join(CONFIG_DIR, f)).read()
    )


@pytest.mark.parametrize("name", _rl_configs())
def test_tiny_cpu_configs_validate(name):
    from luffy_pool.config.compose import compose_config

    assert validate_config(compose_config(["trainer.total_training_steps=3"], config_name=name)) == []
