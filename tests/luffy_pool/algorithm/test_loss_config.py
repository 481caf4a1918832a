"""The config-to-loss mapping and the policy-loss registry driving both actors (one dispatch, no if/elif on flags):
every loss is ``fn(PolicyLossInputs, cfg) -> (loss, metrics)``, ``cfg`` its own section."""

import math
import sys
from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from luffy_pool.config.sections import LossSection
from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor
from tests.helpers.float_compare import assert_float_close
from verl.mix_src.mix_core_alg import compute_token_on_off_policy_loss
from verl.trainer.ppo.core_algos import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss,
    policy_loss_config,
    register_policy_loss,
)
from verl.trainer.ppo.loss_inputs import POLICY_LOSS_CONFIGS, registered_loss_keys, resolve_policy_loss
from verl.workers.actor.dp_actor import DataParallelPPOActor

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

A = "actor_rollout_ref.actor"
# LUFFY's train.sh actor keys (docs/METHOD.md §2.1) on top of the YAML defaults.
LUFFY_ACTOR = [
    f"{A}.use_off_policy_loss=True",
    f"{A}.off_policy_reshape=p_div_p_0.1",
    f"{A}.loss_remove_token_mean=True",
    f"{A}.loss_remove_clip=True",
    f"{A}.use_kl_loss=False",
]


def _actor_cfg(compose_config, *overrides):
    cfg = compose_config(["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m", *overrides])
    return cfg.actor_rollout_ref.actor


def _actor(cfg, cls=MIXDataParallelPPOActor):
    module = torch.nn.Linear(1, 1)
    return cls(cfg, module, torch.optim.SGD(module.parameters(), lr=0.0))


def _loss_cfg(actor_cfg, name):
    """The ``cfg`` the actor calls the loss ``name`` with."""
    return policy_loss_config(name, actor_cfg, LossSection.from_actor_config(actor_cfg))


def _micro():
    torch.manual_seed(0)
    rows, width = 3, 4
    return (
        {
            "old_log_probs": -torch.rand(rows, width),
            "advantages": torch.tensor([[1.0] * 4, [-1.0] * 4, [0.5] * 4]),
            "prefix_mask": torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),
            "behaviour_log_probs": torch.tensor(
                [[math.log(0.5)] * 2 + [float("nan")] * 2, [float("nan")] * 4, [math.log(0.25)] + [float("nan")] * 3]
            ),
        },
        -torch.rand(rows, width),
        torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32),
    )


def test_auto_picks_the_loss_luffys_switches_select(compose_config):
    assert resolve_policy_loss(LossSection.from_actor_config(_actor_cfg(compose_config))) == "vanilla"
    assert resolve_policy_loss(LossSection.from_actor_config(_actor_cfg(compose_config, *LUFFY_ACTOR))) == "luffy_token"
    assert (
        resolve_policy_loss(
            LossSection.from_actor_config(_actor_cfg(compose_config, f"{A}.use_sft_multitask_loss=True"))
        )
        == "sft_multitask"
    )
    assert (
        resolve_policy_loss(LossSection.from_actor_config(_actor_cfg(compose_config, f"{A}.policy_loss=my_loss")))
        == "my_loss"
    )
    both = LossSection.from_actor_config(
        _actor_cfg(compose_config, f"{A}.use_off_policy_loss=True", f"{A}.use_sft_multitask_loss=True")
    )
    with pytest.raises(ValueError, match="use_off_policy_loss and actor.use_sft_multitask_loss cannot both be True"):
        resolve_policy_loss(both)


def test_both_actors_select_the_loss_through_the_registry(compose_config):
    """One dispatch: verl's actor and LUFFY's resolve, look up and call the loss the same way; the base actor's
    section has no LUFFY switch, so ``auto`` is ``vanilla`` there, as in verl."""
    luffy = _actor(_actor_cfg(compose_config, *LUFFY_ACTOR))
    base = _actor(_actor_cfg(compose_config, *LUFFY_ACTOR), cls=DataParallelPPOActor)
    assert (luffy.policy_loss, base.policy_loss) == ("luffy_token", "vanilla")
    assert (
        luffy.policy_loss_fn is POLICY_LOSS_REGISTRY["luffy_token"]
        and base.policy_loss_fn is POLICY_LOSS_REGISTRY["vanilla"]
    )

    @register_policy_loss("i35_test_prefix_tokens")
    def prefix_tokens(inputs, cfg):
        """A loss of the base keys only that reports the prefix tokens it was handed."""
        return cfg.clip_ratio * inputs.log_prob.sum(), {"prefix_tokens": inputs.prefix_mask.sum().float()}

    try:
        named = _actor(_actor_cfg(compose_config, f"{A}.policy_loss=i35_test_prefix_tokens"), cls=DataParallelPPOActor)
        micro, log_prob, mask = _micro()
        # the base actor hands the loss the micro-batch's prefix_mask as LUFFY's does
        loss, metrics = named.compute_policy_loss(micro, log_prob, None, mask)
        # exact: a count of mask tokens, and the actor logs the loss's own value (a copy): order-free
        assert loss.item() == pytest.approx(0.2 * log_prob.sum().item()) and metrics["actor/prefix_tokens"] == 3.0
        assert metrics["actor/pg_loss"] == loss.item()
    finally:
        POLICY_LOSS_REGISTRY.pop("i35_test_prefix_tokens")
    with pytest.raises(ValueError, match=r"unknown policy loss 'vanila'.*'vanilla'"):
        _actor(_actor_cfg(compose_config, f"{A}.policy_loss=vanila"), cls=DataParallelPPOActor)


def test_a_builtin_loss_reads_the_actor_loss_section_with_luffys_values(compose_config):
    cfg = _loss_cfg(
        _actor_cfg(compose_config, *LUFFY_ACTOR, f"{A}.off_policy_max_clip=10", f"{A}.sft_loss_coef=0.5"), "luffy_token"
    )
    assert isinstance(cfg, LossSection)
    assert (cfg.clip_ratio, cfg.clip_upper_bound, cfg.loss_remove_token_mean, cfg.loss_remove_clip) == (
        0.2,
        1.0,
        True,
        True,
    )
    assert (cfg.off_policy_max_clip, cfg.off_policy_min_clip, cfg.all_max_clip) == (10, -1, -1)  # -1 = no clamp
    assert (cfg.off_policy_reshape, cfg.off_policy_reshape_weight, cfg.off_policy_reshape_pow_exp) == (
        "p_div_p_0.1",
        0.1,
        0.5,
    )
    assert (cfg.on_policy_reshape, cfg.on_policy_reshape_weight, cfg.sft_loss_coef) == ("no_reshape", 0.1, 0.5)
    assert cfg.off_policy_loss_coef == 1.0  # LUFFY's loss
    with pytest.raises(AttributeError):
        cfg.off_max_clip  # noqa: B018 -- a misspelt knob raises instead of keeping a default


def test_the_actor_calls_luffys_token_loss_with_the_mapped_arguments(compose_config):
    cfg = _actor_cfg(compose_config, *LUFFY_ACTOR, f"{A}.use_off_policy_probs=True")
    micro, log_prob, mask = _micro()
    loss, metrics = _actor(cfg).compute_policy_loss(micro, log_prob, None, mask)
    direct = compute_token_on_off_policy_loss(
        old_log_prob=micro["old_log_probs"],
        log_prob=log_prob,
        advantages=micro["advantages"],
        eos_mask=mask,
        cliprange=0.2,
        clip_upper_bound=1.0,
        prefix_mask=micro["prefix_mask"],
        off_cliprange=0.2,
        off_policy_reshape="p_div_p_0.1",
        off_policy_reshape_weight=0.1,
        on_policy_reshape_weight=0.1,
        target_probs=torch.tensor([[0.5, 0.5, 1.0, 1.0], [1.0] * 4, [0.25, 1.0, 1.0, 1.0]]),
        loss_remove_token_mean=True,
        loss_remove_clip=True,
    )
    # two paths: the behaviour log-probs are math.log here, torch's vectorised log of target_probs there
    assert_float_close(loss, direct["pg_loss"], what="pg_loss")
    assert_float_close(torch.tensor(metrics["actor/off_pg_loss"]), direct["off_pg_loss"], what="off_pg_loss")
    assert "actor/ppo_kl_loss" not in metrics


def test_use_ppo_kl_loss_also_applies_to_the_plain_ppo_loss(compose_config):
    """The |ppo_kl| term used to be added only in the mixed-loss path."""
    cfg = _actor_cfg(compose_config, f"{A}.use_ppo_kl_loss=True", f"{A}.ppo_kl_loss_coef=0.5")
    micro, log_prob, mask = _micro()
    loss, metrics = _actor(cfg).compute_policy_loss(micro, log_prob, None, mask)
    pg, clipfrac, ppo_kl = compute_policy_loss(micro["old_log_probs"], log_prob, micro["advantages"], mask, 0.2)
    assert loss.item() == pytest.approx((pg + 0.5 * ppo_kl.abs()).item(), abs=1e-7)
    # exact: the actor's vanilla loss and compute_policy_loss call the same ppo_clip_loss on the same tensors
    assert metrics["actor/pg_clipfrac"] == clipfrac.item() and metrics["actor/ppo_kl_loss"] == abs(ppo_kl.item())


def test_a_new_loss_is_one_function_and_one_decorator(compose_config):
    @register_policy_loss("i15_test_mean_neg_logp")
    def mean_negative_log_prob(inputs, cfg):
        """-mean over valid tokens of A·logp (a plain policy gradient), plus a metric of our own."""
        mask = inputs.response_mask
        pg = -(inputs.advantages * inputs.log_prob * mask).sum() / mask.sum()
        return pg, {"valid_tokens": mask.sum()}

    try:
        cfg = _actor_cfg(compose_config, f"{A}.policy_loss=i15_test_mean_neg_logp")
        micro = {"old_log_probs": torch.zeros(1, 2), "advantages": torch.tensor([[2.0, 2.0]])}
        log_prob = torch.tensor([[math.log(0.5), math.log(0.25)]])
        loss, metrics = _actor(cfg).compute_policy_loss(micro, log_prob, None, torch.tensor([[1.0, 1.0]]))
        # -(2·ln .5 + 2·ln .25) / 2 = 3·ln 2
        # exact: a count of mask tokens, and the actor logs the loss's own value (a copy): order-free
        assert loss.item() == pytest.approx(3 * math.log(2)) and metrics["actor/valid_tokens"] == 2.0
        assert metrics["actor/pg_loss"] == loss.item()
    finally:
        POLICY_LOSS_REGISTRY.pop("i15_test_mean_neg_logp")


@dataclass(frozen=True)
class _ScaledKnobs:
    clip_ratio: float  # an actor key of the YAML: read from the group
    i26_scale: float = 1.0  # the loss's own knob: absent from the YAML, set with +actor_rollout_ref.actor.i26_scale


def test_a_loss_with_its_own_knob_gets_its_dataclass_built_from_the_actor_group(compose_config):
    @register_policy_loss("i26_test_scaled", config=_ScaledKnobs)
    def scaled(inputs, cfg):
        return cfg.i26_scale * inputs.log_prob.sum(), {"clip_ratio": torch.tensor(cfg.clip_ratio)}

    try:
        assert "i26_scale" in registered_loss_keys()
        loss_cfg = _loss_cfg(
            _actor_cfg(
                compose_config, f"{A}.policy_loss=i26_test_scaled", f"+{A}.i26_scale=3.0", f"{A}.clip_ratio=0.3"
            ),
            "i26_test_scaled",
        )
        assert loss_cfg == _ScaledKnobs(clip_ratio=0.3, i26_scale=3.0)
        assert _loss_cfg(_actor_cfg(compose_config), "i26_test_scaled").i26_scale == 1.0  # its default
    finally:
        POLICY_LOSS_REGISTRY.pop("i26_test_scaled")
        POLICY_LOSS_CONFIGS.pop("i26_test_scaled")
    assert "i26_scale" not in registered_loss_keys()


def test_the_checker_knows_the_keys_registered_losses_declare():
    from luffy_pool.config.check import ConfigError, prepare_overrides

    with pytest.raises(ConfigError, match="i26_scale"):
        prepare_overrides([f"+{A}.i26_scale=2.0"])
    register_policy_loss("i26_test_knob_key", config=_ScaledKnobs)(lambda inputs, cfg: None)
    try:
        assert prepare_overrides([f"+{A}.i26_scale=2.0"]) == [f"++{A}.i26_scale=2.0"]
    finally:
        POLICY_LOSS_REGISTRY.pop("i26_test_knob_key")
        POLICY_LOSS_CONFIGS.pop("i26_test_knob_key")


def test_an_unknown_loss_name_fails_when_the_actor_is_built(compose_config):
    with pytest.raises(ValueError, match=r"unknown policy loss 'no_such_loss'.*'luffy_token'"):
        _actor(_actor_cfg(compose_config, f"{A}.policy_loss=no_such_loss"))


def test_policy_loss_with_luffys_switches_is_refused(compose_config):
    from luffy_pool.config.check import validate_config

    cfg = compose_config(
        [
            "data.train_files=x",
            "data.val_files=null",
            "actor_rollout_ref.model.path=m",
            f"{A}.policy_loss=vanilla",
            f"{A}.use_off_policy_loss=True",
        ]
    )
    assert any("'actor_rollout_ref.actor.policy_loss'='vanilla' conflicts" in e for e in validate_config(cfg))
    assert OmegaConf.select(cfg, f"{A}.policy_loss") == "vanilla"


def test_a_loss_in_model_external_lib_declares_its_knobs_before_the_overrides_are_checked(
    tmp_path, monkeypatch, compose_config
):
    """``python -m luffy_pool.main_mix_ppo actor_rollout_ref.model.external_lib=my_losses +...my_knob=...``: the
    checker imports the module first, so the knob its loss declares is a known key."""
    from luffy_pool.config.check import ConfigError, prepare_overrides, validate_config

    (tmp_path / "i26_user_losses.py").write_text(
        "from dataclasses import dataclass\n"
        "from verl.trainer.ppo.core_algos import register_policy_loss\n\n\n"
        "@dataclass(frozen=True)\nclass Knobs:\n    i26_user_knob: float = 1.0\n\n\n"
        "@register_policy_loss('i26_user_loss', config=Knobs)\n"
        "def user_loss(inputs, cfg):\n    return cfg.i26_user_knob * inputs.log_prob.sum(), {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = "actor_rollout_ref.model.external_lib"
    try:
        with pytest.raises(ConfigError, match="i26_user_knob"):  # without the module the key is unknown
            prepare_overrides([f"+{A}.i26_user_knob=2.0"])
        overrides = [f"{lib}=i26_user_losses", f"{A}.policy_loss=i26_user_loss", f"+{A}.i26_user_knob=2.0"]
        assert prepare_overrides(overrides)[-1] == f"++{A}.i26_user_knob=2.0"
        cfg = compose_config(
            ["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m", *overrides]
        )
        assert not [e for e in validate_config(cfg) if "i26_user_knob" in e]
        assert _loss_cfg(cfg.actor_rollout_ref.actor, "i26_user_loss").i26_user_knob == 2.0
        with pytest.raises(ConfigError, match="could not be imported"):
            prepare_overrides([f"{lib}=no_such_module_i26"])
    finally:
        POLICY_LOSS_REGISTRY.pop("i26_user_loss", None)
        POLICY_LOSS_CONFIGS.pop("i26_user_loss", None)
        sys.modules.pop("i26_user_losses", None)
