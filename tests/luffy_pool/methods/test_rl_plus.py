"""RL-PLUS (``algorithm.method=rl_plus``) against the authors' functions and METHODS_SPEC_2026 §6's check values:
the mixture ratio, the exploration weight, the token loss (value, gradient, metrics) on hand-made float64
micro-batches, the advantage of their script, and how the knobs and the launch script reach the run.

Reference values: YihongDong/RL-PLUS at commit eb4aa4d4e2d7ce206056f9d7740138bfc94fad8f, run outside this project
(a scratch script importing their files with their verl 0.2 ``masked_mean``):
``rl_plus/verl/verl/recipe/rlplus_core_alg.py`` line 69 ``compute_token_on_off_policy_loss(...,
off_policy_strategy="RL-PLUS")`` (pg_loss, its gradient w.r.t. ``log_prob`` by autograd, and the returned metrics)
and ``rl_plus/verl/verl/trainer/ppo/core_algos.py`` line 110 ``compute_grpo_outcome_advantage(use_std=False)``.
"""

from __future__ import annotations

import os

import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.rl_plus import (
    RlPlusKnobs,
    exploration_weight,
    mis_ratio,
    mixture_behaviour_prob,
    rl_plus_token_loss,
)
from tests.helpers.float_compare import assert_float_close
from tests.helpers.sections import loss_section

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
D = torch.float64
A = "actor_rollout_ref.actor"

# ---------------------------------------------------------------- ratio and exploration weight (spec §6)
RATIO_CASES = [  # (p, q, 4p/(3q+1), (1-p)^0.5)
    (0.05, 0.0, 0.2, 0.974679),
    (0.2, 0.1, 0.615385, 0.894427),
    (0.5, 0.5, 0.8, 0.707107),
    (0.8, 0.9, 0.864865, 0.447214),
    (1.0, 1.0, 1.0, 0.0),
]


@pytest.mark.golden
@pytest.mark.parametrize("p,q,ratio,weight", RATIO_CASES)
def test_the_ratio_is_the_codes_double_mixture_and_the_weight_one_minus_p_to_the_half(p, q, ratio, weight):
    lp, old = torch.tensor([p], dtype=D).log(), torch.tensor([q], dtype=D).log()
    assert mis_ratio(lp, old).item() == pytest.approx(ratio, abs=5e-7)
    assert exploration_weight(lp).item() == pytest.approx(weight, abs=5e-7)
    # the mixture applied twice: b = (q + (q + 1)/2)/2 = (3q + 1)/4, not the paper's (q + 1)/2
    assert mixture_behaviour_prob(torch.tensor(q, dtype=D)).item() == pytest.approx((3 * q + 1) / 4, rel=1e-15)


def test_at_q_equal_p_the_ratio_is_not_one_and_a_certain_token_has_no_weight():
    half = torch.tensor([0.5], dtype=D).log()
    assert mis_ratio(half, half).item() == pytest.approx(0.8, rel=1e-15)  # paper's 2p/(q+1): 0.666667
    assert exploration_weight(torch.zeros(1, dtype=D)).item() == 0.0
    assert mis_ratio(half, half, expert_prob=0.5).item() == pytest.approx(2 / 2, rel=1e-15)  # 4p/(3q+e)


# ---------------------------------------------------------------- the token loss against theirs
def _spec_toy():
    """Spec §6's group of 4: row 0 the demonstration (ℓ=[−0.1,−0.5,−1.0], ℓ_old=[−0.2,−0.4,−1.2]), rows 1-3
    on-policy at ratio 1 with 4, 2, 2 tokens, A = [.5, .5, −.5, −.5], width L = 4."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=D)
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5], dtype=D).unsqueeze(-1) * mask
    lp = torch.full((4, 4), -0.3, dtype=D)
    old = lp.clone()
    lp[0] = torch.tensor([-0.1, -0.5, -1.0, 0.0], dtype=D)
    old[0] = torch.tensor([-0.2, -0.4, -1.2, 0.0], dtype=D)
    prefix = torch.zeros(4, 4, dtype=torch.bool)
    prefix[0, :3] = True
    return lp, old, adv, mask, prefix


def _mixed():
    """A demonstration row (4 valid tokens, one certain: ℓ = 0) and two on-policy rows away from ratio 1."""
    lp = [[-0.05, -1.3, 0.0, -2.5, 0.0], [-0.4, -0.9, -1.6, -0.2, -0.7], [-1.1, -0.3, -0.8, 0.0, 0.0]]
    old = [[-0.3, -0.7, -0.02, -3.5, 0.0], [-0.9, -0.6, -1.0, -0.25, -1.4], [-0.6, -0.35, -1.5, 0.0, 0.0]]
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=D)
    adv = torch.tensor([0.75, -0.25, -0.5], dtype=D).unsqueeze(-1) * mask
    prefix = torch.zeros(3, 5, dtype=torch.bool)
    prefix[0, :4] = True
    return torch.tensor(lp, dtype=D), torch.tensor(old, dtype=D), adv, mask, prefix


def _run(case, **loss_keys):
    lp, old, adv, mask, prefix = case
    leaf = lp.clone().requires_grad_(True)
    inputs = FamilyLossInputs(log_prob=leaf, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix)
    loss, metrics = rl_plus_token_loss(inputs, loss_section(**loss_keys))
    loss.backward()
    return loss.detach(), leaf.grad, metrics


# Their compute_token_on_off_policy_loss(off_policy_strategy="RL-PLUS", cliprange=0.2, clip_upper_bound=1.0) on
# _spec_toy() with loss_remove_clip=True (YihongDong/RL-PLUS eb4aa4d4, rlplus_core_alg.py line 69).
TOY = {
    "pg_loss_sum": -0.18038515411510214,  # loss_remove_token_mean=True
    "pg_loss_mean": -0.06559460149640078,  # loss_remove_token_mean=False
    "off_pg_loss": -0.24051353882013618,
    "on_pg_loss": 0.0,
    "ppo_kl": -0.01818181818181818,
    "off_policy_prob": 0.6264158396400118,
    "on_policy_prob": 0.740818220681718,
    "off_ratio_mean": 0.8753321593148057,
    "grad_sum": [
        [-0.04038087928631798, -0.06317906668718509, -0.07682520814159907, 0.0],
        [-0.125, -0.125, -0.125, -0.125],
        [0.125, 0.125, 0.0, 0.0],
        [0.125, 0.125, 0.0, 0.0],
    ],
}


@pytest.mark.golden
def test_spec_toy_equals_theirs_and_the_spec_check_values():
    loss, grad, metrics = _run(_spec_toy(), loss_remove_token_mean=True, loss_remove_clip=True)
    # METHODS_SPEC_2026 §6 (6 decimals)
    assert loss.item() == pytest.approx(-0.180385, abs=5e-7)
    assert metrics["off_pg_loss"].item() == pytest.approx(-0.240514, abs=5e-7)
    assert metrics["off_ratio_mean"].item() == pytest.approx(0.875332, abs=5e-7)
    assert metrics["on_pg_loss"].item() == 0.0
    # theirs, to the last bits
    assert_float_close(loss, torch.tensor(TOY["pg_loss_sum"], dtype=D), what="pg_loss")
    assert_float_close(grad, torch.tensor(TOY["grad_sum"], dtype=D), what="grad")
    for key in ("off_pg_loss", "on_pg_loss", "ppo_kl", "off_policy_prob", "on_policy_prob", "off_ratio_mean"):
        assert_float_close(metrics[key].to(D), torch.tensor(TOY[key], dtype=D), what=key)
    loss, _, _ = _run(_spec_toy(), loss_remove_token_mean=False, loss_remove_clip=True)
    assert loss.item() == pytest.approx(-0.065595, abs=5e-7)  # spec §6: the token-mean variant
    assert_float_close(loss, torch.tensor(TOY["pg_loss_mean"], dtype=D), what="pg_loss (token mean)")


# Their compute_token_on_off_policy_loss(off_policy_strategy="RL-PLUS", cliprange=0.2, clip_upper_bound=1.0) on
# _mixed(), with the options of each case (their names: off_max_clip, off_min_clip, all_max_clip, loss_remove_*)
# (YihongDong/RL-PLUS eb4aa4d4, rlplus_core_alg.py line 69). Columns: pg_loss, off_pg_loss, on_pg_loss,
# on_pg_clipfrac, off_ratio_mean, off_ratio_max_clip_frac, off_ratio_min_clip_frac, then the gradient.
# Every case: ppo_kl -0.1058333333333333, off_policy_prob 0.5764615540396564, on_policy_prob 0.47816104624753114.
ON_GRAD = [
    [0.08243606353500642, 0.0370409110340859, 0.02744058180470132, 0.052563554818801206, 0.10068763537352383],
    [0.06065306597126333, 0.10512710963760241, 0.20137527074704767, 0.0, 0.0],
]
ON_GRAD_CLIPPED = [
    [0.08243606353500642, 0.0, 0.0, 0.052563554818801206, 0.10068763537352383],
    [0.0, 0.10512710963760241, 0.20137527074704767, 0.0, 0.0],
]
OFF_GRAD = [-0.03911367750529202, -0.056016847055966115, 0.0, -0.04326671390901537, 0.0]
MIXED = {
    "sum_unclipped": (
        dict(loss_remove_token_mean=True, loss_remove_clip=True),
        (0.5289269544517585, -0.17299654808784187, 0.41707762057627, 0.0, 0.7336842545540938, 0.0, 0.0),
        [OFF_GRAD, *ON_GRAD],
    ),
    "sum_clipped": (
        dict(loss_remove_token_mean=True, loss_remove_clip=False),
        (0.563792395641708, -0.17299654808784187, 0.43886852131998844, 0.4166666666666667, 0.7336842545540938, 0, 0),
        [OFF_GRAD, *ON_GRAD_CLIPPED],
    ),
    "mean_clipped": (
        dict(loss_remove_token_mean=False, loss_remove_clip=False),
        (0.23491349818404503, -0.17299654808784187, 0.43886852131998844, 0.4166666666666667, 0.7336842545540938, 0, 0),
        [
            [-0.016297365627205008, -0.023340352939985883, 0.0, -0.018027797462089733, 0.0],
            [0.03434835980625267, 0.0, 0.0, 0.0219014811745005, 0.04195318140563493],
            [0.0, 0.043802962349001, 0.08390636281126986, 0.0, 0.0],
        ],
    ),
    "sum_off_clamps": (  # off_max_clip=0.9, off_min_clip=0.5: every demonstration ratio clamped
        dict(loss_remove_token_mean=True, loss_remove_clip=True, off_policy_max_clip=0.9, off_policy_min_clip=0.5),
        (0.5016859897759435, -0.20704775393261077, 0.41707762057627, 0.0, 0.7, 0.5, 0.5),
        [[0.0] * 5, *ON_GRAD],
    ),
    "sum_all_max_clip": (  # all_max_clip=0.9: the tokens with p > 0.9 leave the loss
        dict(loss_remove_token_mean=True, loss_remove_clip=True, all_max_clip=0.9),
        (0.5680406319570506, -0.17299654808784187, 0.41707762057627, 0.0, 0.7336842545540938, 0.0, 0.0),
        [[0.0, -0.056016847055966115, 0.0, -0.04326671390901537, 0.0], *ON_GRAD],
    ),
}
METRICS = ("off_pg_loss", "on_pg_loss", "on_pg_clipfrac", "off_ratio_mean", "off_ratio_max_clip_frac")


@pytest.mark.golden
@pytest.mark.parametrize("case", sorted(MIXED))
def test_mixed_micro_batch_equals_theirs(case):
    keys, values, grad_expected = MIXED[case]
    loss, grad, metrics = _run(_mixed(), **keys)
    assert_float_close(loss, torch.tensor(values[0], dtype=D), what="pg_loss")
    assert_float_close(grad, torch.tensor(grad_expected, dtype=D), what="grad")
    for key, value in zip((*METRICS, "off_ratio_min_clip_frac"), values[1:]):
        assert_float_close(torch.as_tensor(metrics[key]).to(D), torch.tensor(float(value), dtype=D), what=key)
    for key, value in (("ppo_kl", -0.1058333333333333), ("off_policy_prob", 0.5764615540396564)):
        assert_float_close(metrics[key].to(D), torch.tensor(value, dtype=D), what=key)
    assert_float_close(metrics["on_policy_prob"].to(D), torch.tensor(0.47816104624753114, dtype=D))


def test_own_metrics_are_means_over_the_demonstration_tokens():
    lp, old, adv, mask, prefix = _mixed()
    _, _, metrics = _run((lp, old, adv, mask, prefix), loss_remove_token_mean=True, loss_remove_clip=True)
    demo = prefix & mask.bool()
    weight = (1 - lp[demo].exp()).sqrt()
    behaviour = (3 * old[demo].exp() + 1) / 4
    assert metrics["rl_plus/explore_weight"].item() == pytest.approx(weight.mean().item(), rel=1e-12)
    assert metrics["rl_plus/behaviour_prob"].item() == pytest.approx(behaviour.mean().item(), rel=1e-12)


def test_the_loss_refuses_what_it_does_not_read():
    lp, old, adv, mask, prefix = _mixed()
    inputs = FamilyLossInputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match="needs inputs.prefix_mask"):
        rl_plus_token_loss(inputs, loss_section())
    recorded = FamilyLossInputs(
        log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix, behaviour_log_probs=lp
    )
    with pytest.raises(ValueError, match="actor.use_off_policy_probs"):
        rl_plus_token_loss(recorded, loss_section())


# ---------------------------------------------------------------- the advantage of their script
@pytest.mark.golden
def test_the_presets_advantage_is_grpo_without_std_over_the_group_with_the_demonstration():
    """Their script: adv_estimator=grpo, grpo_use_std=False (YihongDong/RL-PLUS eb4aa4d4,
    verl/trainer/ppo/core_algos.py line 110 ``compute_grpo_outcome_advantage``): the demo row counts in the mean."""
    from luffy_pool.methods import get_method
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs

    estimator = get_method("rl_plus").preset_keys()["algorithm.adv_estimator"]
    _, _, _, mask, prefix = _spec_toy()
    rewards = torch.zeros(4, 4, dtype=D)
    rewards[0, 2], rewards[1, 3] = 1.0, 1.0  # the demo row and one rollout solved
    inputs = AdvantageInputs(rewards, mask, ["a"] * 4, on_policy_mask=~prefix.any(-1))
    adv, _ = get_adv_estimator_fn(estimator)(inputs, AdvantageConfig(grpo_use_std=False))
    theirs = [[0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 0.5], [-0.5, -0.5, 0.0, 0.0], [-0.5, -0.5, 0.0, 0.0]]
    assert_float_close(adv, torch.tensor(theirs, dtype=D))
    rewards = torch.zeros(8, 4, dtype=D)
    rewards[[0, 2, 5], 3] = 1.0
    on = torch.ones(8, dtype=torch.bool)
    on[0] = False
    adv, _ = get_adv_estimator_fn(estimator)(
        AdvantageInputs(rewards, torch.ones(8, 4, dtype=D), ["a"] * 8, on_policy_mask=on),
        AdvantageConfig(grpo_use_std=False),
    )
    theirs = [0.625, -0.375, 0.625, -0.375, -0.375, 0.625, -0.375, -0.375]
    assert_float_close(adv[:, 0], torch.tensor(theirs, dtype=D))


# ---------------------------------------------------------------- knobs, preset and launch script
def test_the_knobs_reach_the_loss_through_the_actor():
    """method_policy_loss (the actor's path) calls the registered loss with the selected knobs and the actor's
    loss keys: γ = 0 drops the exploration weight, e = 0.5 changes the mixture."""
    from types import SimpleNamespace

    from luffy_pool.methods import MethodSelection
    from luffy_pool.methods.losses import method_policy_loss
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    lp, old, adv, mask, prefix = _mixed()
    settings = loss_section(loss_remove_token_mean=True, loss_remove_clip=True)

    def actor_loss(knobs):
        actor = SimpleNamespace(
            policy_loss="rl_plus",
            policy_loss_fn=get_policy_loss_fn("rl_plus"),
            policy_loss_cfg=None,
            method_selection=MethodSelection("rl_plus", knobs, 0.125),
            update_config=SimpleNamespace(loss=settings),
            batch_sizes=SimpleNamespace(),
            extra_policy_loss=lambda out, metrics: None,
        )
        micro = {"old_log_probs": old, "advantages": adv, "prefix_mask": prefix}
        return method_policy_loss(actor, micro, lp, torch.zeros_like(lp), mask, 1, None)

    for gamma, expert in ((0.5, 1.0), (0.0, 1.0), (0.5, 0.5)):
        loss, metrics = actor_loss(RlPlusKnobs(explore_gamma=gamma, mis_expert_prob=expert))
        direct, _ = rl_plus_token_loss(
            FamilyLossInputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix),
            settings,
            explore_gamma=gamma,
            expert_prob=expert,
        )
        assert loss.item() == pytest.approx(direct.item(), rel=1e-12)
        demo = lp[prefix & mask.bool()]
        assert metrics["actor/rl_plus/explore_weight"] == pytest.approx(((1 - demo.exp()) ** gamma).mean().item())
    # the default knobs are the authors' constants
    assert RlPlusKnobs() == RlPlusKnobs(explore_gamma=0.5, mis_expert_prob=1.0)


def test_a_mixture_probability_outside_its_bounds_is_refused(compose_config, luffy_overrides, tmp_path):
    from luffy_pool.config.check import prepare_overrides, validate_config
    from luffy_pool.methods import get_method

    base = [o for o in luffy_overrides("m", "d", str(tmp_path), steps=2) if not o.startswith(f"{A}.use_off_policy")]
    preset = [f"{k}={v}" for k, v in get_method("rl_plus").preset_keys().items()]
    config = compose_config(prepare_overrides(base + preset + ["algorithm.rl_plus.mis_expert_prob=0.0"]))
    assert any("algorithm.rl_plus.mis_expert_prob" in e and "[0.001, 1]" in e for e in validate_config(config))


def test_the_launch_script_states_the_authors_values():
    """exp_scripts/train_rl_plus.sh resolves to their train_RL-PLUS.sh's values for every key of the method
    (YihongDong/RL-PLUS eb4aa4d4; the rest of their list is LUFFY's train.sh, which it runs)."""
    from luffy_pool.run.recipe import read_recipe

    script = os.path.join(REPO, "exp_scripts", "train_rl_plus.sh")
    values = read_recipe(script, dict(os.environ, MODEL_PATH="org/model")).values
    expected = {
        "algorithm.method": "rl_plus",
        "algorithm.adv_estimator": "grpo",
        "algorithm.grpo_use_std": "False",
        f"{A}.use_off_policy_loss": "False",
        f"{A}.off_policy_reshape": "no_reshape",
        f"{A}.loss_remove_clip": "True",
        f"{A}.loss_remove_token_mean": "True",
        f"{A}.entropy_coeff": "0.001",
        f"{A}.off_policy_max_clip": "-1",
        f"{A}.optim.lr": "1e-6",
        f"{A}.ppo_mini_batch_size": "64",
        f"{A}.use_kl_loss": "False",
        "actor_rollout_ref.rollout.n": "8",
        "actor_rollout_ref.rollout.n_prefix": "1",
        "actor_rollout_ref.rollout.min_prefix_ratio": "1.0",
        "actor_rollout_ref.rollout.max_prefix_ratio": "1.0",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "data.train_batch_size": "128",
        "data.max_response_length": "8192",
        "data.reward_impl_version": "3",
        "trainer.total_epochs": "30",
        "algorithm.rl_plus.explore_gamma": "0.5",
        "algorithm.rl_plus.mis_expert_prob": "1.0",
    }
    assert {k: values.get(k) for k in expected} == expected


def test_its_metrics_average_over_luffys_token_sets():
    """Under actor.metric_aggregation=token_weighted the off_* metrics and its own are means over the demonstration
    tokens of the step, on_* over the others, as LUFFY's (a micro-batch without a demonstration adds nothing)."""
    import luffy_pool.methods  # noqa: F401 -- registers the methods
    from luffy_pool.algorithm.mix_core_alg import LUFFY_TOKEN_METRIC_TOKENS
    from verl.utils.step_metrics import LOSS_METRIC_TOKENS

    tokens = LOSS_METRIC_TOKENS["rl_plus"]
    assert {k: tokens[k] for k in LUFFY_TOKEN_METRIC_TOKENS} == LUFFY_TOKEN_METRIC_TOKENS
    assert tokens["actor/rl_plus/explore_weight"] == tokens["actor/rl_plus/behaviour_prob"] == "off"
