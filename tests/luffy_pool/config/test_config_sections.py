"""luffy_pool/config/sections.py: typed trainer/data sections, in step with mix_ppo_trainer.yaml, loud on typos."""

import dataclasses
import os
import re

import pytest

from luffy_pool.config.check import optional_keys, schema_defaults
from luffy_pool.config.sections import ConfigSections, DataSection, TrainerSection

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _yaml_keys(section: str) -> set:
    return {k.split(".", 1)[1] for k in schema_defaults() if k.startswith(section + ".") and k.count(".") == 1}


def _optional_keys(section: str) -> set:
    return {k.split(".", 1)[1] for k in optional_keys() if k.startswith(section + ".")}


@pytest.mark.parametrize("cls,section", [(TrainerSection, "trainer"), (DataSection, "data")])
def test_every_field_is_a_yaml_key_and_every_yaml_key_a_field(cls, section):
    names = {f.name for f in dataclasses.fields(cls)}
    assert names - _optional_keys(section) == _yaml_keys(section), (
        f"fields not in the YAML: {sorted(names - _optional_keys(section) - _yaml_keys(section))}; "
        f"YAML keys without a field: {sorted(_yaml_keys(section) - names)}"
    )
    # Only the optional `+` keys (absent from the YAML) carry a default in the dataclass; the rest come from the YAML.
    with_default = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    assert with_default == _optional_keys(section)


def test_values_and_defaults_come_from_the_composed_config(compose_config):
    cfg = compose_config(
        [
            "data.train_files=a.parquet",
            "data.val_files=b.parquet",
            "trainer.seed=5",
            "+trainer.val_only=True",
            "trainer.project_name=p",
            "trainer.experiment_name=e",
        ]
    )
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
        ConfigSections.from_config(cfg)
    assert OmegaConf.select(cfg, "trainer.save_freq") == -1


# Readers of config values (not of env vars, state dicts or batches): every YAML key they use comes from a
# typed section. The exceptions read groups with their own typed parsers and documented defaults, used by
# callers that pass partial dicts: the reward group (RewardManager, eval scripts), the batch-size helper (None =
# unset, no default restated), the SFT trainer's own YAML (verl/trainer/config/sft_trainer.yaml) and the method
# groups (luffy_pool/methods/base.py reads a method's YAML group, which holds its preset;
# luffy_pool/config/method_group.py reads the raw algorithm group to refuse another method's knobs before any section
# exists).
_OWN_PARSERS = {
    "verl/workers/reward_manager/reward_manager.py",
    "luffy_pool/config/method_group.py",
    "luffy_pool/methods/base.py",
    "verl/utils/batch_sizes.py",
    "verl/trainer/sft/fsdp_model.py",
    "exp_scripts/bench/report.py",
}  # reads benchmark result JSON, not a config
# wandb: its own settings file; saved: a checkpoint's state dict
_NOT_CONFIG = ("environ", "state", "saved", "meta", "rec", "report", "wandb")


def _config_get_calls(path: str, root: str = ROOT) -> list[str]:
    leaves = {k.rsplit(".", 1)[-1] for k in schema_defaults()}
    found = []
    with open(os.path.join(root, path)) as f:
        for num, line in enumerate(f, 1):
            if "``" in line:  # a docstring quoting the old pattern
                continue
            for m in re.finditer(r"([\w.\])]+)\.get\(\s*[\"'](\w+)[\"']", line):
                receiver, key = m.group(1), m.group(2)
                if key in leaves and not receiver.split(".")[-1].startswith(_NOT_CONFIG):
                    found.append(f"{path}:{num}: {receiver}.get({key!r})")
    return found


def test_no_reader_restates_a_yaml_default_with_get():
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "verl", "luffy_pool", "deepscaler", "data", "exp_scripts", "eval_scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [
        hit for path in files if path.endswith(".py") and path not in _OWN_PARSERS for hit in _config_get_calls(path)
    ]
    assert found == [], "read these through luffy_pool/config/sections.py or verl/workers/config_sections.py"


def test_the_scan_finds_a_restated_default(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('x = config.trainer.get("save_freq", -1)\ny = os.environ.get("seed")\n')
    assert _config_get_calls("bad.py", root=str(tmp_path)) == ["bad.py:1: config.trainer.get('save_freq')"]


def test_driver_sections_hold_the_yaml_groups(compose_config):
    from luffy_pool.config.sections import AlgorithmSection, KLControlSection, RayInitSection, SelfReplaySection

    for cls, group in (
        (AlgorithmSection, "algorithm"),
        (KLControlSection, "algorithm.kl_ctrl"),
        (RayInitSection, "ray_init"),
        (SelfReplaySection, "data.self_replay"),
    ):
        depth = group.count(".") + 1
        keys = {k.split(".")[depth] for k in schema_defaults() if k.startswith(group + ".")}
        assert {f.name for f in dataclasses.fields(cls)} == keys, group
    s = ConfigSections.from_config(
        compose_config(["data.self_replay.enable=True", "algorithm.kl_ctrl.kl_coef=0.5", "ray_init.num_cpus=3"])
    )
    assert (s.data.self_replay.enable, s.data.self_replay.capacity) == (
        True,
        schema_defaults()["data.self_replay.capacity"],
    )
    assert (s.algorithm.kl_ctrl.kl_coef, s.algorithm.adv_estimator, s.ray_init.num_cpus) == (0.5, "grpo", 3)
    assert (
        s.actor.use_kl_loss is True and s.workers.rollout.n_val == schema_defaults()["actor_rollout_ref.rollout.n_val"]
    )


def test_a_required_key_left_unset_stays_unset_without_raising(compose_config):
    s = ConfigSections.from_config(compose_config([]))  # data.train_files / val_files are ??? in the YAML
    assert (s.data.train_files, s.data.val_files) == ("???", "???")


def test_the_loss_section_is_a_subset_of_the_actor_keys_with_the_yaml_values(compose_config):
    from luffy_pool.config.sections import LossSection

    actor_keys = {
        k.rsplit(".", 1)[1] for k in schema_defaults() if k.startswith("actor_rollout_ref.actor.") and k.count(".") == 2
    }
    names = {f.name for f in dataclasses.fields(LossSection)}
    assert names <= actor_keys, sorted(names - actor_keys)
    cfg = compose_config(["data.train_files=a.parquet", "data.val_files=b.parquet"]).actor_rollout_ref.actor
    loss = LossSection.from_actor_config(cfg)
    defaults = schema_defaults()
    assert all(getattr(loss, n) == defaults[f"actor_rollout_ref.actor.{n}"] for n in names)
    # The YAML's values reach the loss (the old .get fallbacks restated 1.0 and None here).
    assert (loss.off_policy_reshape_weight, loss.off_policy_cliprange) == (0.1, 0.2)
    with pytest.raises(AttributeError):
        loss.use_off_policy_prob  # noqa: B018 -- a typo of use_off_policy_probs
