"""No inert key: every key of mix_ppo_trainer.yaml is read by shipped code or refused with a reason."""

import os
import re
import subprocess

import pytest
from hydra import compose, initialize_config_dir

from luffy_pool.config.check import (
    CONFIG_DIR,
    declared,
    method_knobs,
    prepare_overrides,
    schema_defaults,
    schema_leaf_keys,
    validate_config,
)
from verl.utils.config_section import DEFAULT_ONLY

# The keys accepted at their YAML default only, with their reason (declared with luffy=DEFAULT_ONLY).
INERT_KEYS = {k: d.why for k, d in declared().items() if d.luffy == DEFAULT_ONLY}

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# Keys acted on by a sibling branch (i14b-parallel implements FSDP optimizer offload and HSDP); remove once merged.
def _validate(*overrides):
    base = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return validate_config(compose("mix_ppo_trainer", overrides=prepare_overrides(base + list(overrides))))


def test_every_key_is_read_by_shipped_code_or_refused():
    """The same test as the project's before-stop hook: a key's leaf name must appear in shipped code outside
    the config checker and the declarations, and a refused key must be declared as refused."""
    files = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True, cwd=REPO).stdout.split()
    code = "".join(
        open(os.path.join(REPO, f), encoding="utf-8").read()
        for f in files
        if not f.startswith("tests/") and "config_check" not in f and "config_sections" not in f
    )
    refused = set(INERT_KEYS) | {k for k, d in declared().items() if d.refuse}
    unread = [
        k
        for k in schema_leaf_keys()
        if k not in refused and not re.search(r"[\"'.]" + re.escape(k.rsplit(".", 1)[-1]) + r"\b", code)
    ]
    assert not unread, f"keys neither read nor refused: {unread}"


def test_every_method_knob_is_read_by_shipped_code():
    """A method's knobs live in its module's knob dataclass, not in the base schema: each must
    be read as an attribute of its knob section (``knobs.<k>``, ``self.knobs.<k>``, ``k.<k>``) in luffy_pool code
    outside the config package; a docstring's ``algorithm.<m>.<k>`` does not count."""
    files = subprocess.run(["git", "ls-files", "luffy_pool/*.py"], capture_output=True, text=True, cwd=REPO).stdout
    code = "".join(
        open(os.path.join(REPO, f), encoding="utf-8").read()
        for f in files.split()
        if not f.startswith("luffy_pool/config/") and os.path.exists(os.path.join(REPO, f))
    )
    knobs = method_knobs()
    assert {method for method, _ in knobs.values()} >= {
        "ampo",
        "chord",
        "exgrpo",
        "hpt",
        "prefix_rft",
        "questa",
        "relift",
        "rl_plus",
        "sdft",
        "sdpo",
        "srft",
        "uft",
    }
    unread = [
        key
        for key, (method, _) in knobs.items()
        if not any(
            receiver != method for receiver in re.findall(r"(\w+)\." + re.escape(key.rsplit(".", 1)[-1]) + r"\b", code)
        )
    ]
    assert not unread, f"method knobs read by no shipped code: {unread}"


@pytest.mark.parametrize("key", sorted(INERT_KEYS))
def test_an_inert_key_away_from_its_default_is_refused_with_the_reason(key):
    default = schema_defaults()[key]
    other = {bool: lambda: not default, float: lambda: default + 0.25, int: lambda: default + 1, str: lambda: "other"}[
        type(default)
    ]()
    errors = _validate(f"{key}={other}")
    assert any(e.startswith(f"'{key}'=") and INERT_KEYS[key] in e for e in errors), errors


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "critic.strategy=fsdp",
            "'critic.strategy': the critic (value model) is not shipped; adv_estimator=gae is unsupported, use grpo",
        ),
        (
            "reward_model.model.path=/rm",
            "'reward_model.model.path': model-based reward workers are not shipped; use reward.*",
        ),
        ("reward_model.enable=True", "'reward_model.enable'=True is not supported: model-based reward workers"),
        ("algorithm.lam=0.95", "'algorithm.lam'=0.95 is not supported (only GAE reads it"),
        (
            "actor_rollout_ref.hybrid_engine=False",
            "'actor_rollout_ref.hybrid_engine'=False needs 'actor_rollout_ref.rollout.n_gpus_per_node' >= 1",
        ),
        ("trainer.resume_from_path=True", "'trainer.resume_from_path'=True is not supported: give a checkpoint path"),
    ],
)
def test_not_shipped_parts_are_refused_by_name(override, expected):
    from luffy_pool.config.check import ConfigError

    try:
        errors = _validate(override)
    except ConfigError as exc:  # unknown sections are refused before composition
        errors = exc.errors
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize("value", ["False", "null", "/ckpt/global_step_5"])
def test_resume_from_path_false_means_none(value):
    assert _validate(f"trainer.resume_from_path={value}") == []


def test_use_off_policy_probs_needs_the_off_policy_loss_only():
    assert (
        _validate(
            "actor_rollout_ref.actor.use_off_policy_loss=True", "actor_rollout_ref.actor.use_off_policy_probs=True"
        )
        == []
    )
    errors = _validate("actor_rollout_ref.actor.use_off_policy_probs=True")
    assert errors == [
        "'actor_rollout_ref.actor.use_off_policy_probs'=True needs 'actor_rollout_ref.actor.use_off_policy_loss'"
        "=True (the behaviour probabilities only enter the off-policy loss)"
    ]


# LUFFY keys that no shipped code path acts on: each is declared refused (luffy=DEFAULT_ONLY or refuse={...}) in
# luffy_pool/config/sections.py or verl/workers/config_sections.py, so a value that would ask for the missing
# feature stops the run with its reason instead of being ignored.
UNREAD_LUFFY_KEYS = {
    "data.return_raw_input_ids": "True",
    "data.return_raw_chat": "True",
    "data.filter_targets": "True",
    "data.filter_accuracy": "True",
    "data.accuracy_lower_bound": "0.3",
    "data.accuracy_upper_bound": "0.5",
    "data.add_tgt_with_acc": "True",
    "data.add_tgt_acc_upper_bound": "0.3",
    "actor_rollout_ref.actor.fsdp_config.grad_offload": "True",
    "actor_rollout_ref.actor.off_policy_loss_impl": "seq",
    "actor_rollout_ref.actor.use_sft_reward": "True",
    "actor_rollout_ref.actor.off_policy_cliprange": "0.5",
    "actor_rollout_ref.actor.use_off_policy_clip": "True",
    "actor_rollout_ref.actor.debug": "True",
}


@pytest.mark.parametrize("key", sorted(UNREAD_LUFFY_KEYS))
def test_a_luffy_key_no_code_acts_on_is_refused_away_from_its_default(key):
    errors = _validate(f"{key}={UNREAD_LUFFY_KEYS[key]}")
    assert any(f"'{key}'=" in e and "is not supported" in e for e in errors), errors


def test_the_yaml_defaults_of_those_keys_are_accepted():
    errors = _validate()
    assert not [e for e in errors if any(key in e for key in UNREAD_LUFFY_KEYS)], errors
