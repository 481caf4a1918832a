"""luffy_pool/config_sections.py: typed trainer/data sections, in step with mix_ppo_trainer.yaml, loud on typos."""
import dataclasses
import os
import re

import pytest

from luffy_pool.config_check import OPTIONAL_KEYS, schema_defaults
from luffy_pool.config_sections import ConfigSections, DataSection, TrainerSection

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _yaml_keys(section: str) -> set:
    return {k.split(".", 1)[1] for k in schema_defaults() if k.startswith(section + ".") and k.count(".") == 1}


def _optional_keys(section: str) -> set:
    return {k.split(".", 1)[1] for k in OPTIONAL_KEYS if k.startswith(section + ".")}


@pytest.mark.parametrize("cls,section", [(TrainerSection, "trainer"), (DataSection, "data")])
def test_every_field_is_a_yaml_key_and_every_yaml_key_a_field(cls, section):
    names = {f.name for f in dataclasses.fields(cls)}
    assert names - _optional_keys(section) == _yaml_keys(section), (
        f"fields not in the YAML: {sorted(names - _optional_keys(section) - _yaml_keys(section))}; "
        f"YAML keys without a field: {sorted(_yaml_keys(section) - names)}")
    # Only the optional `+` keys (absent from the YAML) carry a default in the dataclass; the rest come from the YAML.
    with_default = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    assert with_default == _optional_keys(section)


def test_values_and_defaults_come_from_the_composed_config(compose_config):
    cfg = compose_config(["data.train_files=a.parquet", "data.val_files=b.parquet", "trainer.seed=5",
                          "+trainer.val_only=True", "trainer.project_name=p", "trainer.experiment_name=e"])
    s = ConfigSections.from_config(cfg)
    assert (s.trainer.seed, s.trainer.val_only, s.trainer.val_before_train) == (5, True, True)
    assert s.trainer.default_local_dir == "checkpoints/p/e"  # interpolation resolved
    defaults = schema_defaults()
    assert s.data.val_batch_size == defaults["data.val_batch_size"] == 1312
    assert s.trainer.max_optim_to_keep == defaults["trainer.max_optim_to_keep"]
    assert (s.data.train_files, s.data.self_replay.enable) == ("a.parquet", False)


def test_a_misspelt_name_fails_loudly_and_sections_are_read_only(compose_config):
    s = ConfigSections.from_config(compose_config(["data.train_files=a.parquet", "data.val_files=b.parquet"]))
    with pytest.raises(AttributeError):
        s.trainer.sead  # noqa: B018 -- a typo of seed
    with pytest.raises(AttributeError):
        s.data.val_batchsize  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.trainer.seed = 3


def test_a_missing_key_is_named(compose_config):
    from omegaconf import OmegaConf, open_dict

    cfg = compose_config(["data.train_files=a.parquet", "data.val_files=b.parquet"])
    with open_dict(cfg):
        del cfg.trainer["seed"]
    with pytest.raises(KeyError, match="trainer.seed is missing"):
        TrainerSection.from_config(cfg)
    assert OmegaConf.select(cfg, "trainer.save_freq") == -1


@pytest.mark.parametrize("path", ["luffy_pool/mix_trainer.py", "luffy_pool/launcher.py", "luffy_pool/checkpointing.py"])
def test_switched_readers_have_no_restated_trainer_or_data_defaults(path):
    with open(os.path.join(ROOT, path)) as f:
        src = f.read()
    assert not re.findall(r"(?:config\.trainer|config\.data|\bt|\bd)\.get\(", src), path


def test_a_required_key_left_unset_stays_unset_without_raising(compose_config):
    s = ConfigSections.from_config(compose_config([]))  # data.train_files / val_files are ??? in the YAML
    assert (s.data.train_files, s.data.val_files) == ("???", "???")


def test_the_loss_section_is_a_subset_of_the_actor_keys_with_the_yaml_values(compose_config):
    from luffy_pool.config_sections import LossSection
    from luffy_pool.loss_config import policy_loss_kwargs

    actor_keys = {k.rsplit(".", 1)[1] for k in schema_defaults() if k.startswith("actor_rollout_ref.actor.")
                  and k.count(".") == 2}
    names = {f.name for f in dataclasses.fields(LossSection)}
    assert names <= actor_keys, sorted(names - actor_keys)
    cfg = compose_config(["data.train_files=a.parquet", "data.val_files=b.parquet"]).actor_rollout_ref.actor
    loss = LossSection.from_actor_config(cfg)
    defaults = schema_defaults()
    assert all(getattr(loss, n) == defaults[f"actor_rollout_ref.actor.{n}"] for n in names)
    # The YAML's values reach the loss (the old .get fallbacks restated 1.0 and None here).
    kw = policy_loss_kwargs(cfg)
    assert (kw["off_policy_reshape_weight"], kw["off_cliprange"]) == (0.1, 0.2)
    with pytest.raises(AttributeError):
        loss.use_off_policy_prob  # noqa: B018 -- a typo of use_off_policy_probs
