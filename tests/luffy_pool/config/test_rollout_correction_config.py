"""algorithm.rollout_correction and actor_rollout_ref.rollout.calculate_log_probs: verl's keys with verl's
defaults, refused away from off until the engines return sampling log-probs and the loss takes the weights."""
import pytest
from hydra import compose, initialize_config_dir

from luffy_pool.config.check import CONFIG_DIR, prepare_overrides, validate_config
from luffy_pool.config.sections import ConfigSections
from verl.trainer.ppo.rollout_corr import config_errors

RC = "algorithm.rollout_correction"
CALC = "actor_rollout_ref.rollout.calculate_log_probs"


def _compose(*overrides):
    base = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("mix_ppo_trainer", overrides=prepare_overrides(base + list(overrides)))


def test_defaults_are_verls_and_pass_the_cross_key_rule():
    cfg = _compose()
    rc = ConfigSections.from_config(cfg).algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold) == (None, 2.0, None, None)
    assert ConfigSections.from_config(cfg).actor_rollout_ref.rollout.calculate_log_probs is False
    assert validate_config(cfg) == []
    assert config_errors(lambda key: _select(cfg, key)) == []


def _select(cfg, key):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)


@pytest.mark.parametrize("override, words", [
    (f"{RC}.rollout_is=token", f"'{RC}.rollout_is'='token' is not supported: the training rollouts do not return"),
    (f"{RC}.rollout_is=sequence", f"'{RC}.rollout_is'='sequence' is not supported"),
    (f"{RC}.rollout_rs=token_k1", f"'{RC}.rollout_rs'='token_k1' is not supported"),
    (f"{CALC}=True", f"'{CALC}'=True is not supported: the training rollouts do not request"),
    (f"{RC}.rollout_is_threshold=0.0", f"'{RC}.rollout_is_threshold'=0.0 must be > 0"),
])
def test_a_correction_is_refused_until_it_is_wired_with_the_missing_piece_named(override, words):
    errors = validate_config(_compose(override))
    assert len(errors) == 1 and errors[0].startswith(words), errors


def test_the_cross_key_rule_reads_the_composed_config():
    cfg = _compose(f"{RC}.rollout_is=token")
    errors = config_errors(lambda key: _select(cfg, key))
    assert errors == [f"'{RC}.rollout_is'='token' needs '{CALC}'=True (the weights compare the engine's sampling "
                      "log-probs with the actor's); set it or set the correction to null"]
    cfg = _compose(f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.5_1.5", f"{CALC}=True")
    assert config_errors(lambda key: _select(cfg, key)) == []
