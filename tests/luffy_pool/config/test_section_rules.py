"""The rules between keys live on the sections that own the keys (``validate()``) and run in the checker: each
rule unit-tested on a built section, each refusal one line naming the keys, and every shipped recipe and tiny
config passes the whole check."""

import dataclasses
import os

import pytest

from luffy_pool.config.check import ConfigError, check_config, prepare_overrides, validate_config
from luffy_pool.config.compose import compose_config as _compose
from luffy_pool.config.sections import ConfigSections
from verl.utils.config_section import POSITIVE, key, rule_errors

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
A, R, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
BASE = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]


def _errors(*overrides):
    return validate_config(_compose(prepare_overrides(BASE + list(overrides))))


@pytest.fixture(scope="module")
def sections():
    return ConfigSections.from_config(_compose(prepare_overrides(BASE)))


def _with(sections, where: str, **changes):
    """``sections`` with the section at dotted ``where`` (attribute names) replaced by a copy with ``changes``."""
    head, _, rest = where.partition(".")
    sub = getattr(sections, head)
    new = _with(sub, rest, **changes) if rest else dataclasses.replace(sub, **changes)
    return dataclasses.replace(sections, **{head: new})


# ------------------------------------------------------------------------- each section's rules, unit
def test_the_yaml_defaults_break_no_rule(sections):
    assert rule_errors(sections) == []


@pytest.mark.parametrize(
    "path, changes, expected",
    [
        (
            "actor_rollout_ref.rollout",
            {"prefix_strategy": "fixed", "prefix_share_across_samples": True},
            f"'{R}.prefix_strategy'=fixed cannot be combined with '{R}.prefix_share_across_samples'=True",
        ),
        (
            "actor_rollout_ref.rollout",
            {"prefix_strategy": "linear", "prefix_share_across_samples": False},
            f"'{R}.prefix_strategy'=linear needs '{R}.prefix_share_across_samples'=True",
        ),
        (
            "actor_rollout_ref.rollout",
            {"n_prefix": -2},
            f"'{R}.n_prefix'=-2 must be -1 (all slots) or in [0, rollout.n=1]",
        ),
        (
            "actor_rollout_ref.rollout",
            {"min_prefix_ratio": 0.9, "max_prefix_ratio": 0.2},
            f"'{R}.min_prefix_ratio'=0.9 exceeds '{R}.max_prefix_ratio'=0.2",
        ),
        (
            "actor_rollout_ref.actor.loss",
            {"use_off_policy_probs": True, "use_off_policy_loss": False},
            f"'{A}.use_off_policy_probs'=True needs '{A}.use_off_policy_loss'=True",
        ),
        (
            "actor_rollout_ref.actor.loss",
            {"use_adaptive_temperature_fixed": True, "use_adaptive_temperature": False},
            f"'{A}.use_adaptive_temperature_fixed'=True needs '{A}.use_adaptive_temperature'=True",
        ),
        (
            "actor_rollout_ref.actor.loss",
            {"policy_loss": "vanilla", "use_off_policy_loss": True},
            f"'{A}.policy_loss'='vanilla' conflicts with LUFFY's loss switches",
        ),
        ("algorithm.kl_ctrl", {"type": "adaptive", "horizon": 0}, "'algorithm.kl_ctrl.horizon' must be > 0"),
        (
            "reward.orm",
            {"enable": True, "base_url": None, "model": "m"},
            "'reward.orm.enable'=True needs reward.orm.base_url",
        ),
        (
            "trainer",
            {"resume_mode": "resume_path", "resume_from_path": None},
            "'trainer.resume_mode'=resume_path needs 'trainer.resume_from_path'",
        ),
        ("data", {"max_response_length": 1 << 21}, "'data.max_response_length'=2097152 is beyond any model context"),
        (
            "actor_rollout_ref.ref",
            {"ulysses_sequence_parallel_size": 2},
            f"'{REF}.ulysses_sequence_parallel_size'=2 must equal '{A}.ulysses_sequence_parallel_size'=1",
        ),
        ("trainer", {"n_gpus_per_node": 3}, "data.train_batch_size * actor_rollout_ref.rollout.n = "),
    ],
)
def test_a_rule_on_its_section_is_one_line_naming_the_keys(sections, path, changes, expected):
    errors = rule_errors(_with(sections, path, **changes))
    assert errors and errors[0].startswith(expected) and all("\n" not in e for e in errors), errors


def test_prefetching_dataloader_workers_are_refused_only_when_the_run_saves(sections):
    workers = _with(sections, "data", dataloader_num_workers=2)
    assert workers.validate() == []  # save_freq=-1: nothing is saved, prefetching is fine
    assert _with(workers, "trainer", save_freq=5).validate() == [
        "'data.dataloader_num_workers'=2 with 'trainer.save_freq'=5: the saved sampler position would be ahead of "
        "training; use dataloader_num_workers=0 to checkpoint"
    ]


def test_prompt_and_response_must_fit_a_local_models_positions(sections, tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 600}))
    local = _with(sections, "actor_rollout_ref.model", path=str(tmp_path))
    assert local.validate() == [
        f"data.max_prompt_length (512) + data.max_response_length (512) = 1024 exceeds "
        f"max_position_embeddings (600) of {tmp_path}; use a long-context model (e.g. "
        "Elliott/Qwen2.5-Math-7B-16k-think) or shorter lengths"
    ]
    longer = _with(local, "actor_rollout_ref.model", override_config={"max_position_embeddings": 2048})
    assert longer.validate() == []
    assert sections.validate() == []  # no config.json on disk (/m): the launcher's pre-flight checks it later


def test_the_rules_between_groups_sit_on_their_parent(sections):
    # actor x ref: on the worker sections; actor x algorithm and rollout x data: on the run's sections
    kl = _with(sections, "actor_rollout_ref.actor", use_kl_loss=True)
    kl = _with(kl, "actor_rollout_ref.ref", use_ref=False)
    assert kl.workers.validate() == [
        f"'{A}.use_kl_loss'=True needs '{REF}.use_ref'=True (the KL is to the reference "
        f"policy; LUFFY's actor fails reading ref_log_prob); add {A}.use_kl_loss=False "
        "to train without one"
    ]
    sft = _with(sections, "actor_rollout_ref.actor.loss", use_sft_multitask_loss=True, use_off_policy_loss=False)
    assert sft.validate()[0].startswith(f"'{A}.use_sft_multitask_loss'=True needs 'algorithm.adv_estimator'=grpo_split")
    assert sft.actor.loss.validate() == []
    short = _with(sections, "actor_rollout_ref.rollout", prompt_length=7)
    assert short.validate() == [
        f"'{R}.prompt_length'=7 must equal 'data.max_prompt_length'=512 (leave it as the "
        "${data.max_prompt_length} interpolation)"
    ]


# ------------------------------------------------------------------------- the checker refuses, before any worker
@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            [f"{R}.prefix_strategy=fixed", f"{R}.prefix_share_across_samples=True"],
            f"'{R}.prefix_strategy'=fixed cannot be combined with '{R}.prefix_share_across_samples'=True",
        ),
        (
            [f"{R}.prefix_strategy=linear", f"{R}.prefix_share_across_samples=False"],
            f"'{R}.prefix_strategy'=linear needs '{R}.prefix_share_across_samples'=True",
        ),
        ([f"{R}.n=8", f"{R}.n_prefix=9"], f"'{R}.n_prefix'=9 must be -1 (all slots) or in [0, rollout.n=8]"),
        ([f"{R}.n=8", f"{R}.n_prefix=-2"], f"'{R}.n_prefix'=-2 must be -1 (all slots) or in [0, rollout.n=8]"),
        (
            [f"{R}.prefix_strategy=cosine"],
            f"'{R}.prefix_strategy'='cosine' is not one of: random, fixed, linear, linear_max, reverse_linear",
        ),
        ([f"{R}.prefix_steps=0"], f"'{R}.prefix_steps'=0 must be >= 1"),
        ([f"{R}.max_prefix_ratio=1.5"], f"'{R}.max_prefix_ratio'=1.5 must be in [0, 1]"),
        ([f"{R}.prefix_linear_max_ratio=-0.1"], f"'{R}.prefix_linear_max_ratio'=-0.1 must be in [0, 1]"),
        ([f"{R}.n=0"], f"'{R}.n'=0 must be >= 1"),
        ([f"{A}.policy_loss=vanila"], f"'{A}.policy_loss'='vanila' is not one of: auto, "),
        (
            [f"{A}.optim.total_training_steps=500"],
            f"'{A}.optim.total_training_steps'=500 is not supported (a run passes its own step count to the workers; set "
            "trainer.total_training_steps or trainer.total_epochs); only -1 is accepted",
        ),
    ],
)
def test_the_checker_refuses_in_one_line_naming_the_key(overrides, expected):
    errors = _errors(*overrides)
    assert errors and errors[0].startswith(expected) and all("\n" not in e for e in errors), errors


def test_a_misspelt_policy_loss_names_the_closest_registered_loss():
    errors = _errors(f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=vanila")
    assert len(errors) == 1 and errors[0].endswith("(did you mean 'vanilla'?)"), errors
    assert "luffy_token" in errors[0] and "sft_multitask" in errors[0]  # LUFFY's losses are registered names too
    assert _errors(f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=vanilla") == []


def test_check_config_raises_before_any_worker_for_fixed_and_shared_prefixes():
    cfg = _compose(prepare_overrides(BASE + [f"{R}.prefix_strategy=fixed", f"{R}.prefix_share_across_samples=True"]))
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert len(err.value.errors) == 1


# ------------------------------------------------------------------------- knobs of registered losses
@dataclasses.dataclass(frozen=True)
class _A1Knobs:
    a1_scale: float = key(bounds=POSITIVE, default=1.0)
    a1_steps: int = 3


def _a1_loss(inputs, cfg):
    raise AssertionError("the checker never calls a loss")


def _register():
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

    if "a1_test_knob_loss" not in POLICY_LOSS_REGISTRY:
        register_policy_loss("a1_test_knob_loss", config=_A1Knobs)(_a1_loss)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([f"+{A}.a1_scale=-2.0"], f"'{A}.a1_scale'=-2.0 must be > 0"),
        ([f"+{A}.a1_steps=many"], f"'{A}.a1_steps' must be int, got 'many'"),
    ],
)
def test_a_loss_knob_goes_through_its_declaration(overrides, expected):
    _register()
    errors = _errors(f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=a1_test_knob_loss", *overrides)
    assert errors == [expected] or (errors and errors[0].startswith(expected)), errors


def test_a_knob_of_another_loss_is_refused_away_from_its_default_only():
    _register()
    selected = [f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=a1_test_knob_loss", f"+{A}.a1_scale=2.0"]
    assert _errors(*selected) == []
    # LUFFY's switches select luffy_token: the knob is not read, so a value away from its default is refused ...
    assert _errors(f"{A}.use_off_policy_loss=True", f"+{A}.a1_scale=2.0") == [
        f"'{A}.a1_scale'=2.0 is a knob of the policy loss a1_test_knob_loss, but '{A}.policy_loss' selects "
        "'luffy_token'; remove it or select that loss"
    ]
    # ... while its default changes nothing and passes
    assert _errors(f"+{A}.a1_scale=1.0") == []


@pytest.fixture
def yaml_key_knob_loss():
    """A loss whose knob dataclass declares a YAML key (off_policy_max_clip), registered for one test only."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
    from verl.trainer.ppo.loss_inputs import POLICY_LOSS_CONFIGS

    @dataclasses.dataclass(frozen=True)
    class Knobs:
        off_policy_max_clip: float

    register_policy_loss("a1_test_yaml_knob_loss", config=Knobs)(_a1_loss)
    yield "a1_test_yaml_knob_loss"
    POLICY_LOSS_REGISTRY.pop("a1_test_yaml_knob_loss")
    POLICY_LOSS_CONFIGS.pop("a1_test_yaml_knob_loss")


def test_a_yaml_key_that_only_another_losss_knobs_read_is_refused_away_from_the_yaml_default(yaml_key_knob_loss):
    _register()
    knob = f"{A}.off_policy_max_clip"
    # the selected loss (a1_test_knob_loss) reads only its own dataclass: the YAML default passes, another value not
    selected = [f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=a1_test_knob_loss"]
    assert _errors(*selected) == []
    assert _errors(*selected, f"{knob}=2.0") == [
        f"'{knob}'=2.0 is a knob of the policy loss {yaml_key_knob_loss}, but '{A}.policy_loss' selects "
        "'a1_test_knob_loss'; remove it or select that loss"
    ]
    # LUFFY's luffy_token has no knob dataclass: it reads the loss section, which holds the key
    assert _errors(f"{A}.use_off_policy_loss=True", f"{knob}=2.0") == []
    assert _errors(f"{A}.use_off_policy_loss=False", f"{A}.policy_loss={yaml_key_knob_loss}", f"{knob}=2.0") == []


def test_a_required_knob_of_the_selected_loss_must_be_set():
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
    from verl.trainer.ppo.loss_inputs import POLICY_LOSS_CONFIGS

    @dataclasses.dataclass(frozen=True)
    class Knobs:
        a1_required_knob: float

    register_policy_loss("a1_test_required_knob_loss", config=Knobs)(_a1_loss)
    try:
        selected = [f"{A}.use_off_policy_loss=False", f"{A}.policy_loss=a1_test_required_knob_loss"]
        assert _errors(*selected) == [
            f"Missing config key '{A}.a1_required_knob': the policy loss "
            f"'a1_test_required_knob_loss' reads it; add +{A}.a1_required_knob=..."
        ]
        assert _errors(*selected, f"+{A}.a1_required_knob=0.5") == []
    finally:
        POLICY_LOSS_REGISTRY.pop("a1_test_required_knob_loss")
        POLICY_LOSS_CONFIGS.pop("a1_test_required_knob_loss")


# ------------------------------------------------------------------------- every shipped config passes
def _recipes():
    from luffy_pool.run.recipe import discover_launch_scripts

    return [os.path.basename(s) for s in discover_launch_scripts(os.path.join(REPO, "exp_scripts"))]


@pytest.mark.parametrize("script", _recipes())
def test_every_shipped_rl_recipe_passes_the_checker(script):
    from luffy_pool.run.recipe import read_recipe

    env = dict(os.environ, MODEL_PATH="Elliott/Qwen2.5-Math-7B-16k-think")  # train_sft_rl.sh needs an SFT model
    recipe = read_recipe(os.path.join(REPO, "exp_scripts", script), env)
    if recipe.kind != "rl":
        assert recipe.module == "verl.trainer.fsdp_sft_trainer"  # the SFT trainer has its own checker
        return
    overrides = [a for a in recipe.overrides if "=" in a and not a.startswith("-")]
    check_config(_compose(prepare_overrides(overrides)))


TINY = sorted(
    f[:-5]
    for f in os.listdir(os.path.join(REPO, "luffy_pool", "config"))
    if f.startswith("tiny_cpu_") and f.endswith(".yaml") and f != "tiny_cpu_sft.yaml"
)


@pytest.mark.parametrize("name", TINY)
def test_every_tiny_config_passes_the_checker(name):
    check_config(_compose([], name))
