"""algorithm.rollout_correction and actor_rollout_ref.rollout.calculate_log_probs: verl's keys with verl's
defaults; a correction without the engine's sampling log-probs is refused naming both keys."""

import pytest
from omegaconf import OmegaConf

from luffy_pool.config.check import validate_config
from luffy_pool.config.sections import ConfigSections
from verl.trainer.ppo.rollout_corr import config_errors

RC = "algorithm.rollout_correction"
CALC = "actor_rollout_ref.rollout.calculate_log_probs"
PATHS = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]


def _getter(cfg):
    return lambda key: OmegaConf.select(cfg, key)


def test_defaults_are_verls_and_pass_the_cross_key_rule(compose_config):
    cfg = compose_config(PATHS)
    sections = ConfigSections.from_config(cfg)
    rc = sections.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold) == (None, 2.0, None, None)
    assert sections.actor_rollout_ref.rollout.calculate_log_probs is False
    assert validate_config(cfg) == []
    assert config_errors(_getter(cfg)) == []


@pytest.mark.parametrize(
    "override, words",
    [
        (f"{RC}.rollout_is=token", f"'{RC}.rollout_is'='token' needs '{CALC}'=True"),
        (f"{RC}.rollout_is=sequence", f"'{RC}.rollout_is'='sequence' needs '{CALC}'=True"),
        (f"{RC}.rollout_is=tokens {CALC}=True", f"'{RC}.rollout_is'='tokens' must be null, token or sequence"),
        (
            f"{RC}.rollout_rs=token_k1 {RC}.rollout_rs_threshold=2.0",
            f"'{RC}.rollout_rs'='token_k1' needs '{CALC}'=True",
        ),
        (f"{RC}.rollout_is_threshold=0.0", f"'{RC}.rollout_is_threshold'=0.0 must be > 0"),
    ],
)
def test_a_bad_correction_is_refused_naming_the_keys(compose_config, override, words):
    errors = validate_config(compose_config(PATHS + override.split()))
    assert len(errors) == 1 and errors[0].startswith(words), errors


@pytest.mark.parametrize(
    "overrides",
    [
        [f"{CALC}=True"],
        [f"{CALC}=True", f"{RC}.rollout_is=token"],
        [f"{CALC}=True", f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=5.0"],
        [f"{CALC}=True", f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='2.0,0.01'"],
    ],
)
def test_a_correction_with_the_engine_log_probs_is_accepted(compose_config, overrides):
    assert validate_config(compose_config(PATHS + overrides)) == []


def test_raw_engine_log_probs_are_refused_away_from_temperature_one(compose_config):
    on = [f"{CALC}=True", f"{RC}.rollout_is=token", "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs"]
    assert validate_config(compose_config(PATHS + on + ["actor_rollout_ref.rollout.temperature=1.0"])) == []
    errors = validate_config(compose_config(PATHS + on + ["actor_rollout_ref.rollout.temperature=0.7"]))
    assert errors == [
        f"'{RC}' needs 'actor_rollout_ref.rollout.logprobs_mode'=processed_logprobs at "
        "'actor_rollout_ref.rollout.temperature'=0.7 (raw log-probs ignore the temperature the actor's "
        "old log-probs divide by)"
    ]


def test_rejection_without_its_threshold_is_refused(compose_config):
    errors = validate_config(compose_config(PATHS + [f"{CALC}=True", f"{RC}.rollout_rs=seq_mean_k3"]))
    assert errors == [f"'{RC}.rollout_rs'='seq_mean_k3': rollout_rs_threshold must be set when rollout_rs is"]


def test_the_cross_key_rule_reads_the_composed_config(compose_config):
    errors = config_errors(_getter(compose_config(PATHS + [f"{RC}.rollout_is=token"])))
    assert errors == [
        f"'{RC}.rollout_is'='token' needs '{CALC}'=True (the weights compare the engine's sampling "
        "log-probs with the actor's); set it or set the correction to null"
    ]
    cfg = compose_config(PATHS + [f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold='0.5_2'", f"{CALC}=True"])
    assert OmegaConf.select(cfg, f"{RC}.rollout_rs_threshold") == "0.5_2"  # quoted: a string, not 0.52
    assert config_errors(_getter(cfg)) == []


BYPASS = f"{RC}.bypass_mode=True"


def test_batch_normalize_and_bypass_are_verls_keys_off_by_default(compose_config):
    rc = ConfigSections.from_config(compose_config(PATHS)).algorithm.rollout_correction
    assert rc.rollout_is_batch_normalize is False and rc.bypass_mode is False
    on = [f"{CALC}=True", f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_batch_normalize=True"]
    assert validate_config(compose_config(PATHS + on)) == []
    errors = validate_config(compose_config(PATHS + [f"{RC}.rollout_is_batch_normalize=True"]))
    assert errors == [
        f"'{RC}.rollout_is_batch_normalize'=True needs '{RC}.rollout_is' (token or sequence): it "
        "normalises the IS weights"
    ]


def test_bypass_mode_with_the_engine_log_probs_and_luffys_loss_is_accepted(compose_config):
    cfg = compose_config(PATHS + [f"{CALC}=True", BYPASS])
    assert validate_config(cfg) == []
    assert validate_config(compose_config(PATHS + [f"{CALC}=True", BYPASS, "algorithm.method=grpo"])) == []


@pytest.mark.parametrize(
    "overrides, words",
    [
        ([BYPASS], f"'{RC}.bypass_mode'=True needs '{CALC}'=True (the engine's log-probs become the old log-probs)"),
        (
            [BYPASS, f"{CALC}=True", f"{RC}.rollout_is=token"],
            f"'{RC}.bypass_mode'=True cannot be combined with '{RC}.rollout_is'='token'",
        ),
        (
            [BYPASS, f"{CALC}=True", f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2.0"],
            f"'{RC}.bypass_mode'=True cannot be combined with '{RC}.rollout_rs'='token_k1'",
        ),
        (
            [BYPASS, f"{CALC}=True", "actor_rollout_ref.actor.policy_loss=srft"],
            f"'{RC}.bypass_mode'=True needs a policy loss of luffy_token, sft_multitask, vanilla, not 'srft'",
        ),
        (
            [BYPASS, f"{CALC}=True", "actor_rollout_ref.ref.use_ref=True", "actor_rollout_ref.actor.use_kl_loss=False"],
            f"'{RC}.bypass_mode'=True cannot be combined with the KL-in-reward penalty",
        ),
    ],
)
def test_bypass_mode_is_refused_where_the_old_log_prob_pass_is_still_needed(compose_config, overrides, words):
    errors = config_errors(_getter(compose_config(PATHS + overrides)))
    assert len(errors) == 1 and errors[0].startswith(words), errors
