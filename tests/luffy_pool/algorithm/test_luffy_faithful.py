"""Where a LUFFY run differs from LUFFY's own code, and the switches that close it (docs/DESIGN.md §1 items 3-5).

Item 3: behaviour probabilities that are missing, 0 or LUFFY's -1 padding are unknown (NaN) here, weighted by the
configured shaping f(p), and counted per step. Item 4: ``use_ref=False`` with LUFFY's YAML ``kl_coef`` trains as in
LUFFY (no KL term); ``prefix_strategy=linear`` needs shared prefixes, refused by the config checker. Item 5:
``clip_upper_bound`` acts only in LUFFY's off-policy token loss, as in LUFFY.
"""

from __future__ import annotations

import pytest
import torch

from luffy_pool.algorithm import mix_core_alg as mca
from luffy_pool.config.check import validate_config
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import LossSection
from luffy_pool.rollout.off_policy_pool import logprobs_from_target_probs, unknown_behaviour_metrics
from verl.mix_src.mix_core_alg import compute_token_on_off_policy_loss
from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.kl import apply_kl_penalty, get_kl_controller
from verl.trainer.ppo.loss_inputs import PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
PATHS = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]


def _loss_cfg(*overrides) -> LossSection:
    """The actor's loss section of the YAML with ``overrides``: what a registered loss reads."""
    return LossSection.from_actor_config(compose_config(PATHS + list(overrides)).actor_rollout_ref.actor)


# ---------------------------------------------------------------------------------------------- item 3
def test_missing_zero_and_padding_probabilities_are_counted_per_row_and_token():
    probs = torch.tensor([[0.5, 0.0, 0.9, -1.0], [0.7, 0.8, -1.0, -1.0], [0.2, 0.3, 0.4, 0.5]])
    behaviour = logprobs_from_target_probs(probs).float()
    prefix = torch.tensor([[True, True, True, False], [True, True, True, True], [True, True, False, False]])
    # row 0: the 0.0 (prefix); its -1 is outside the prefix. Row 1: two -1 paddings in the prefix. Row 2: none.
    batch = {"behaviour_log_probs": behaviour, "prefix_mask": prefix}
    assert unknown_behaviour_metrics(batch, use_off_policy_probs=True) == {
        "batch/behaviour_prob_unknown_rows": 2,
        "batch/behaviour_prob_unknown_tokens": 3,
    }
    # no probability column at all: with use_off_policy_probs every off-policy token is unknown; off: nothing logged
    assert unknown_behaviour_metrics({"prefix_mask": prefix}, use_off_policy_probs=True) == {
        "batch/behaviour_prob_unknown_rows": 3,
        "batch/behaviour_prob_unknown_tokens": 9,
    }
    assert unknown_behaviour_metrics({"prefix_mask": prefix}, use_off_policy_probs=False) == {}


def test_unknown_probability_gets_the_shaping_where_luffy_gives_minus_p_or_p_over_1e6():
    log_prob = torch.log(torch.tensor([[0.4, 0.4, 0.4]])).requires_grad_()
    old, adv, mask = log_prob.detach().clone(), torch.ones(1, 3), torch.ones(1, 3)
    prefix = torch.ones(1, 3, dtype=torch.bool)
    behaviour = logprobs_from_target_probs(torch.tensor([[0.5, 0.0, -1.0]]))  # LUFFY's column at the edge
    pg_loss, _ = mca.luffy_token_loss(
        PolicyLossInputs(
            log_prob=log_prob,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            prefix_mask=prefix,
            behaviour_log_probs=behaviour,
        ),
        _loss_cfg(f"{A}.off_policy_reshape=p_div_p_0.1"),
    )
    p = 0.4
    shaped = p / (p + 0.1)
    expected_here = -(p / (0.5 + 1e-6) + shaped + shaped) / 3
    luffy = -(p / (0.5 + 1e-6) + p / (0.0 + 1e-6) + p / (-1.0 + 1e-6)) / 3  # LUFFY's formula on the raw column
    assert pg_loss.item() == pytest.approx(expected_here, rel=1e-5)
    assert abs(luffy - expected_here) > 1e4  # the difference docs/user_guide.md states


# ---------------------------------------------------------------------------------------------- item 4
def test_use_ref_false_with_luffys_default_kl_coef_is_accepted():
    # KL-in-reward (use_kl_loss=False) with LUFFY's YAML kl_coef; the KL *loss* still needs a reference, as in
    # LUFFY, whose actor reads ref_log_prob for it.
    cfg = compose_config([*PATHS, "actor_rollout_ref.ref.use_ref=False", f"{A}.use_kl_loss=False"])
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.001
    assert validate_config(cfg) == []
    alone = validate_config(compose_config([*PATHS, "actor_rollout_ref.ref.use_ref=False"]))  # YAML use_kl_loss=True
    assert any(f"add {A}.use_kl_loss=False" in e for e in alone), alone


def test_without_a_reference_the_kl_term_is_absent_as_in_luffy():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    rewards, metrics = apply_kl_penalty(scores, old, None, torch.ones(2, 2), get_kl_controller({"kl_coef": 0.001}))
    # exact: without a reference the scores pass through untouched and the metrics are constants
    assert torch.equal(rewards, scores) and metrics == {"critic/kl": 0.0, "critic/kl_coeff": 0.0}


def test_linear_prefix_strategy_without_shared_prefixes_is_refused_by_the_checker():
    errors = validate_config(compose_config([*PATHS, f"{R}.prefix_strategy=linear"]))
    assert any(f"'{R}.prefix_strategy'=linear needs '{R}.prefix_share_across_samples'=True" in e for e in errors)
    shared = compose_config([*PATHS, f"{R}.prefix_strategy=linear", f"{R}.prefix_share_across_samples=True"])
    assert validate_config(shared) == []


# ---------------------------------------------------------------------------------------------- item 5
def _case():
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.3, 0.1, -0.3], [0.4, 0.0, 0.2]])  # ratios e^0.3 = 1.35, e^0.4 = 1.49 > 1.2
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    return old, log_prob, adv, torch.ones(2, 3)


@pytest.mark.parametrize("loss", ["vanilla", "sft_multitask"])
def test_plain_and_sft_multitask_losses_ignore_clip_upper_bound_as_luffy(loss):
    old, log_prob, adv, mask = _case()
    prefix = torch.tensor([[True, True, True], [False, False, False]])
    fn = ca.get_policy_loss_fn(loss)
    inputs = PolicyLossInputs(
        log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix
    )
    wide, _ = fn(inputs, _loss_cfg(f"{A}.clip_upper_bound=1.5"))
    narrow, narrow_metrics = fn(inputs, _loss_cfg(f"{A}.clip_upper_bound=1.0"))
    assert wide.item() == narrow.item()  # exact: clip_upper_bound unread, the very same arithmetic twice
    # LUFFY's compute_policy_loss: clamp(ratio, 1 - eps, 1 + eps) on the rows the loss covers.
    rows = slice(None) if loss == "vanilla" else slice(1, 2)
    ratio = torch.exp(log_prob - old)[rows]
    luffy_pg = torch.max(-adv[rows] * ratio, -adv[rows] * ratio.clamp(0.8, 1.2)).mean()
    pg = narrow if loss == "vanilla" else narrow_metrics["on_pg_loss"]
    assert pg.item() == pytest.approx(luffy_pg.item(), rel=1e-6)


def test_luffy_token_loss_reads_clip_upper_bound_as_luffy():
    old, log_prob, adv, mask = _case()
    prefix = torch.zeros(2, 3, dtype=torch.bool)
    kw = dict(cliprange=0.2, prefix_mask=prefix, off_cliprange=0.2)
    wide = compute_token_on_off_policy_loss(old, log_prob, adv, mask, clip_upper_bound=1.5, **kw)["pg_loss"]
    narrow = compute_token_on_off_policy_loss(old, log_prob, adv, mask, clip_upper_bound=1.0, **kw)["pg_loss"]
    assert wide.item() < narrow.item()  # ratios 1.35 / 1.49 clipped at 1.5 instead of 1.2
