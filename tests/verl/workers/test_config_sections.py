"""verl/workers/config_sections.py: the worker's typed sections hold the YAML's keys and values, loud on typos."""

import dataclasses

import pytest

from luffy_pool.config.check import schema_defaults
from luffy_pool.config.sections import LuffyActorSection, LuffyRolloutSection
from verl.utils.config_section import build_section, declarations
from verl.workers.config_sections import (
    ActorSection,
    FSDPSection,
    ModelSection,
    OptimSection,
    RefSection,
    RolloutSection,
    ShardingSection,
    WorkerSections,
)

ARR = "actor_rollout_ref"


def _yaml_keys(group: str) -> set:
    """Direct children of ``group`` in mix_ppo_trainer.yaml (nested groups by their own name)."""
    depth = group.count(".") + 1
    return {k.split(".")[depth] for k in schema_defaults() if k.startswith(group + ".")}


@pytest.mark.parametrize(
    "cls,group",
    [
        (ModelSection, f"{ARR}.model"),
        (RefSection, f"{ARR}.ref"),
        (LuffyRolloutSection, f"{ARR}.rollout"),
        (OptimSection, f"{ARR}.actor.optim"),
        (FSDPSection, f"{ARR}.actor.fsdp_config"),
        (ShardingSection, f"{ARR}.ref.fsdp_config"),
    ],
)
def test_full_sections_have_exactly_the_yaml_keys_and_no_restated_defaults(cls, group):
    names = {f.name for f in dataclasses.fields(cls)}
    assert names == _yaml_keys(group), (
        f"fields not in the YAML: {sorted(names - _yaml_keys(group))}; "
        f"YAML keys without a field: {sorted(_yaml_keys(group) - names)}"
    )
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))


def test_the_actor_group_is_one_section_and_verl_declares_a_subset_of_it():
    """verl's ActorSection (with its loss view) declares the keys the base worker reads; LUFFY's subclass adds the
    method's keys, and together they are exactly the YAML's actor group, each declared once."""
    actor = f"{ARR}.actor"
    yaml_keys = {
        k for k in schema_defaults() if k.startswith(actor + ".") and not isinstance(schema_defaults()[k], dict)
    }
    base = [d.key for d in declarations(ActorSection, actor + ".")]
    full = [d.key for d in declarations(LuffyActorSection, actor + ".")]
    assert set(base) < set(full) and len(full) == len(set(full)) and set(full) == yaml_keys
    assert {f.name for f in dataclasses.fields(RolloutSection)} < {
        f.name for f in dataclasses.fields(LuffyRolloutSection)
    }


def test_loss_keys_read_on_the_actor_come_from_its_loss_view(compose_config):
    s = LuffyActorSection.from_actor_config(compose_config([f"{ARR}.actor.clip_ratio=0.3"]).actor_rollout_ref.actor)
    assert s.clip_ratio == s.loss.clip_ratio == 0.3
    assert s.use_off_policy_probs is s.loss.use_off_policy_probs is False
    with pytest.raises(AttributeError):
        s.clip_ration  # noqa: B018 -- a typo of clip_ratio


def test_values_come_from_the_composed_config_with_overrides_and_interpolations(compose_config):
    cfg = compose_config(
        [
            f"{ARR}.actor.fsdp_config.param_dtype=bf16",
            f"{ARR}.rollout.seed=9",
            f"{ARR}.actor.ppo_max_token_len_per_gpu=777",
            f"{ARR}.model.path=/m",
        ]
    )
    s = WorkerSections.from_config(cfg.actor_rollout_ref)
    defaults = schema_defaults()
    assert s.rollout.seed == 9 and s.model.path == "/m"
    assert s.actor.fsdp_config.param_dtype == "bf16"
    assert s.ref.fsdp_config.param_dtype == "bf16"  # the reference follows the actor (YAML interpolation)
    assert s.ref.log_prob_max_token_len_per_gpu == s.rollout.log_prob_max_token_len_per_gpu == 777
    assert s.actor.use_kl_loss is defaults[f"{ARR}.actor.use_kl_loss"] is True  # LUFFY's default, not a fallback
    assert s.actor.optim.betas == [0.9, 0.999] and s.actor.checkpoint.contents == ["model", "optimizer", "extra"]
    assert s.actor.fsdp_config.wrap_policy.min_num_params == 0
    assert s.rollout.engine_ranks == defaults[f"{ARR}.rollout.tensor_model_parallel_size"]
    with pytest.raises(AttributeError):
        s.rollout.sed  # noqa: B018 -- a typo of seed
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rollout.seed = 3


def test_the_hf_engine_is_one_rank_whatever_the_tp_key(compose_config):
    cfg = compose_config([f"{ARR}.rollout.name=hf", f"{ARR}.rollout.tensor_model_parallel_size=4"])
    assert RolloutSection.from_rollout_config(cfg.actor_rollout_ref.rollout).engine_ranks == 1


def test_a_partial_group_names_the_missing_key():
    from omegaconf import OmegaConf

    partial = OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 2})
    with pytest.raises(KeyError, match=r"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is missing"):
        ActorSection.from_actor_config(partial)
    with pytest.raises(KeyError, match=r"x.y is missing"):
        build_section(ModelSection, None, "x.y")


def test_actor_config_gives_a_full_group_and_refuses_unknown_names():
    from luffy_pool.config.compose import actor_config

    group = actor_config(clip_ratio=0.3, optim__lr=0.5)
    s = ActorSection.from_actor_config(group)
    assert (s.clip_ratio, s.optim.lr, s.on_nonfinite) == (0.3, 0.5, schema_defaults()[f"{ARR}.actor.on_nonfinite"])
    with pytest.raises(KeyError, match="actor_rollout_ref.actor.clip_ration is not a key"):
        actor_config(clip_ration=0.3)
