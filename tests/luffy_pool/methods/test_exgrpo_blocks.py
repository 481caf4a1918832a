"""ExGRPO blocks against the authors' own functions (tests/data/family_golden/exgrpo_golden.pt: ElliottYan/LUFFY
ExGRPO/ at 01f4ae06) and METHODS_SPEC §10's hand values."""

import math
import os
import random

import numpy as np
import pytest
import torch

from luffy_pool.methods.exgrpo.blocks import (
    BucketManager,
    ExgrpoLossConfig,
    bucket_probabilities,
    bucket_weight,
    collect_group,
    eligible_uids,
    experience_count,
    exgrpo_token_loss,
    retire_group,
    sample_experience_uids,
    sample_from_buckets,
    select_best,
    swap_recorded_log_probs,
    switch_to_mixed,
    trajectory_metric_original,
    trajectory_metric_paper,
)
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

GOLDEN = torch.load(
    os.path.join(os.path.dirname(__file__), "../../data/family_golden/exgrpo_golden.pt"), weights_only=False
)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


def _rngs(seed):
    return np.random.RandomState(seed), random.Random(seed)


@pytest.mark.parametrize("i", range(len(GOLDEN["sampler"])))
def test_bucket_sampler_equals_authors(i):
    case = GOLDEN["sampler"][i]
    got = bucket_probabilities(case["buckets"], 8, case["method"])
    assert list(got) == list(case["probabilities"])  # the buckets, in order
    # float64 np.exp picks its kernel by CPU (AVX-512's rounds apart from libm's): within a few ulps
    assert_float_close(
        torch.tensor(list(got.values()), dtype=torch.float64),
        torch.tensor(list(case["probabilities"].values()), dtype=torch.float64),
        what="probabilities",
    )
    samples = sample_from_buckets(case["buckets"], case["n"], 8, case["method"], *_rngs(case["seed"]))
    if case["error"] is None:
        assert samples == case["samples"]
    else:  # theirs crashes re-assigning excess to zero-weight bucket 0; ours stops short (fixed)
        assert len(samples) < case["n"] and len(set(samples)) == len(samples)


@pytest.mark.parametrize("i", range(len(GOLDEN["sample_uids"])))
def test_sample_experience_uids_equals_authors(i):
    case = GOLDEN["sample_uids"][i]
    manager = BucketManager()
    manager.load_state_dict({"experience_bucket": case["buckets"], "uid_to_bucket": []})
    uids = sample_experience_uids(manager, case["valid"], case["n_exp"], 8, case["method"], *_rngs(case["seed"]))
    assert uids == case["uids"]


def test_bucket_manager_equals_authors_over_300_operations():
    manager = BucketManager()
    pool: dict = {}
    for step in GOLDEN["manager"]:
        op, uid, k = step["op"]
        if op == "update":
            manager.update_bucket(uid, k)
            pool[uid] = True
        elif op == "remove":
            manager.remove_from_bucket(uid)
            pool.pop(uid, None)
        else:
            pool = {u: True for u in uid}
            manager.cleanup_consistency(pool)
        assert [(key, list(v)) for key, v in manager.experience_bucket.items()] == step["buckets"]
        assert manager.uid_to_bucket == step["uid_to_bucket"]
        assert manager.get_bucket_stats() == step["stats"]
    restored = BucketManager()
    restored.load_state_dict(manager.state_dict())
    assert restored.state_dict() == manager.state_dict()


@pytest.mark.parametrize("i", range(len(GOLDEN["metric"])))
def test_trajectory_metric_original_equals_authors(i):
    case = GOLDEN["metric"][i]
    ours = trajectory_metric_original(case["values"], case["responses"], case["pad_token_id"], case["kind"])
    # means of float32 entropies (a reduction): within a few float32 ulps
    assert ours == pytest.approx(case["metrics"], nan_ok=True, rel=1e-6, abs=1e-9)
    assert select_best(ours) == case["argmin"]


def test_trajectory_metric_paper_differs_from_original_as_q1_says():
    # 3 candidates, T=6, pad=0: lengths 2, 5, 3 (trajectory ids right-padded); entropies right-aligned for
    # `original` (the actor's frame), left-aligned on the trajectory for `paper`.
    lengths = [2, 5, 3]
    responses = torch.zeros(3, 6, dtype=torch.long)
    for r, n in enumerate(lengths):
        responses[r, :n] = 7
    own = torch.tensor([[0.2, 0.4, 0, 0, 0, 0], [1.0, 1.0, 1.0, 1.0, 1.0, 0], [0.5, 0.6, 0.7, 0, 0, 0]])
    paper = trajectory_metric_paper(own, (responses != 0).float())
    assert paper == pytest.approx([0.3, 1.0, 0.6])
    # original: row i averages positions >= len(i mod 8) of the actor's window; here all rows sit in one batch
    window = torch.arange(18, dtype=torch.float).reshape(3, 6)
    assert trajectory_metric_original(window, responses, 0) == pytest.approx(
        [window[0, 2:].mean().item(), window[1, 5:].mean().item(), window[2, 3:].mean().item()]
    )


def test_swap_recorded_log_probs_equals_authors():
    case = GOLDEN["swap"][0]
    # a row copy: order-free, exact
    assert torch.equal(swap_recorded_log_probs(case["old"], case["recorded"], case["off_rows"]), case["swapped"])


@pytest.mark.parametrize("i", range(len(GOLDEN["loss"])))
def test_loss_equals_authors(i):
    case = GOLDEN["loss"][i]
    cfg = ExgrpoLossConfig(**case["cfg"])
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, metrics = exgrpo_token_loss(
        FamilyLossInputs(
            log_prob=log_prob,
            old_log_prob=case["old_log_prob"],
            advantages=case["advantages"],
            response_mask=case["mask"],
            prefix_mask=case["prefix_mask"],
        ),
        cfg,
    )
    loss.backward()
    assert_float_close(loss.detach(), case["ret"]["pg_loss"], what="pg_loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")
    # every diagnostic the authors' function returns, under its name
    assert set(metrics) == set(case["ret"]) - {"pg_loss"}
    for key in sorted(metrics):
        assert_float_close(torch.as_tensor(metrics[key]).float(), case["ret"][key].float(), what=key)


# The authors' compute_token_on_off_policy_loss (ElliottYan/LUFFY @ 01f4ae066249e6965ce0d5512ccdf99a12895c74,
# ExGRPO/exgrpo/verl/verl/mix_src/mix_core_alg.py lines 36-238, with their verl/utils/torch_functional.py) run
# outside the project on the float64 input of test_loss_diagnostics_equal_authors_on_a_hand_made_input.
HAND_AUTHORS = {
    "mixed": {
        "pg_loss": -0.4414029572846608,
        "off_pg_loss": -0.45697141275080916,
        "on_pg_loss": -0.056385370126602205,
        "off_pg_clipfrac": 0.0,
        "on_pg_clipfrac": 0.0,
        "ppo_kl": -0.029999999999999992,
        "off_policy_prob": 0.6264158396400118,
        "on_policy_prob": 0.6311212680693682,
        "off_ratio_mean": 0.9139428255016183,
        "on_ratio_mean": 1.0190114770646015,
        "off_ratio_max_clip_frac": 0.0,
        "off_ratio_min_clip_frac": 0.0,
        "off_ratio_var_m": 0.00014922471439516314,
        "on_ratio_var_m": 0.020198472016964522,
        "off_ratio_max_m": 0.9243228460191553,
        "on_ratio_max_m": 1.1240586929598593,
    },
    # PPO clip on, off ratio clamped to [0.905, 0.91] (their off_min_clip / off_max_clip)
    "clamped": {
        "pg_loss": -0.43929939772155385,
        "off_pg_loss": -0.45416666666666666,
        "on_pg_loss": -0.056385370126602205,
        "off_pg_clipfrac": 0.0,
        "on_pg_clipfrac": 0.1,
        "ppo_kl": -0.029999999999999992,
        "off_policy_prob": 0.6264158396400118,
        "on_policy_prob": 0.6311212680693682,
        "off_ratio_mean": 0.9083333333333333,
        "on_ratio_mean": 1.0190114770646015,
        "off_ratio_max_clip_frac": 0.6666666666666666,
        "off_ratio_min_clip_frac": 0.3333333333333333,
        "off_ratio_var_m": 8.333333333333349e-06,
        "on_ratio_var_m": 0.020198472016964522,
        "off_ratio_max_m": 0.91,
        "on_ratio_max_m": 1.1240586929598593,
    },
}


@pytest.mark.parametrize("case", sorted(HAND_AUTHORS))
def test_loss_diagnostics_equal_authors_on_a_hand_made_input(case):
    # row 0: a replayed trajectory (3 tokens, recorded log-probs as old); rows 1-3: fresh rollouts of 4, 2, 1 tokens
    f64 = torch.float64
    log_prob = torch.tensor(
        [[-0.1, -0.5, -1.0, 0.0], [-0.3, -0.2, -0.6, -0.4], [-0.7, -0.2, 0.0, 0.0], [-0.9, 0.0, 0.0, 0.0]], dtype=f64
    )
    old = torch.tensor(
        [[-0.2, -0.4, -1.2, 0.0], [-0.25, -0.3, -0.5, -0.4], [-0.6, -0.35, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]], dtype=f64
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=f64)
    prefix = torch.zeros(4, 4, dtype=torch.bool)
    prefix[0, :3] = True
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5], dtype=f64).unsqueeze(-1).expand(4, 4)
    cfg = ExgrpoLossConfig()
    if case == "clamped":
        cfg = ExgrpoLossConfig(loss_remove_clip=False, off_policy_max_clip=0.91, off_policy_min_clip=0.905)
    inputs = FamilyLossInputs(
        log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix
    )
    loss, metrics = exgrpo_token_loss(inputs, cfg)
    expected = HAND_AUTHORS[case]
    assert set(metrics) | {"pg_loss"} == set(expected)
    assert float(loss) == pytest.approx(expected["pg_loss"], rel=1e-12, abs=1e-15)
    for key, value in metrics.items():
        assert float(value) == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    # by hand: the replayed row's f(w) = w/(w+0.1), w = exp(l - l_recorded)
    w = torch.exp(log_prob[0, :3] - old[0, :3])
    f = w / (w + 0.1)
    if case == "mixed":
        assert float(metrics["off_ratio_max_m"]) == pytest.approx(float(f.max()), rel=1e-12)
        assert float(metrics["off_ratio_var_m"]) == pytest.approx(float(f.var()), rel=1e-12)
    else:  # clamped to [0.905, 0.91]: 2 of 3 at the upper bound, 1 at the lower
        assert float(metrics["off_ratio_var_m"]) == pytest.approx(
            float(torch.tensor([0.91, 0.905, 0.91], dtype=f64).var()), rel=1e-9
        )
    on_ratio = torch.exp(log_prob - old)
    # on rows with >= 2 tokens (rows 1, 2) give a variance; every on row (1, 2, 3) a maximum
    on_var = (on_ratio[1, :4].var() + on_ratio[2, :2].var()) / 2
    on_max = (on_ratio[1, :4].max() + on_ratio[2, :2].max() + on_ratio[3, 0]) / 3
    assert float(metrics["on_ratio_var_m"]) == pytest.approx(float(on_var), rel=1e-12)
    assert float(metrics["on_ratio_max_m"]) == pytest.approx(float(on_max), rel=1e-12)
    assert float(metrics["off_policy_prob"]) == pytest.approx(float(torch.exp(log_prob[0, :3]).mean()), rel=1e-12)


def test_loss_diagnostics_over_no_token_are_zero():
    inputs = FamilyLossInputs(
        log_prob=torch.full((2, 3), -0.5),
        old_log_prob=torch.full((2, 3), -0.4),
        advantages=torch.ones(2, 3),
        response_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        prefix_mask=torch.zeros(2, 3, dtype=torch.bool),  # warm-up: no replayed row
    )
    _, metrics = exgrpo_token_loss(inputs, ExgrpoLossConfig(off_policy_max_clip=0.9, off_policy_min_clip=0.1))
    for key in (
        "off_pg_loss",
        "off_policy_prob",
        "off_ratio_mean",
        "off_ratio_max_clip_frac",
        "off_ratio_min_clip_frac",
    ):
        assert float(metrics[key]) == 0.0, key
    assert float(metrics["off_ratio_var_m"]) == float(metrics["off_ratio_max_m"]) == 0.0
    assert float(metrics["on_ratio_max_m"]) == pytest.approx(math.exp(-0.1))
    assert float(metrics["on_ratio_var_m"]) == pytest.approx(
        0.0, abs=1e-12
    )  # row 0: two equal ratios; row 1: one token


def test_spec_hand_values_bucket_probabilities():
    weights = [bucket_weight(k, 8, "normal") for k in range(1, 8)]
    assert weights == pytest.approx([0.004432, 0.053991, 0.241971, 0.398942, 0.241971, 0.053991, 0.004432], abs=1e-6)
    probs = bucket_probabilities({k: [k] for k in range(1, 8)}, 8, "normal")
    assert list(probs.values()) == pytest.approx(
        [0.004433, 0.054006, 0.242036, 0.399050, 0.242036, 0.054006, 0.004433], abs=1e-6
    )
    probs = bucket_probabilities({1: [1], 2: [2], 3: [3], 5: []}, 8, "normal")
    assert list(probs.values()) == pytest.approx([0.014753, 0.179734, 0.805512], abs=1e-6)


def test_spec_hand_values_toy_loss_exgrpo_vs_luffy_base():
    # group of 4: replay row + 3 on rows, A = [.5, .5, -.5, -.5], L = 4
    log_prob = torch.tensor([[-0.1, -0.5, -1.0, 0.0], [-0.3, -0.3, -0.3, -0.3], [-0.7, -0.2, 0, 0], [-0.4, -0.6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.float)
    prefix = torch.zeros(4, 4, dtype=torch.bool)
    prefix[0, :3] = True
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5]).unsqueeze(-1).expand(4, 4)
    recorded = torch.tensor([[-0.2, -0.4, -1.2, 0.0]])
    old = torch.cat([recorded, log_prob[1:]])  # on rows at ratio 1
    inputs = FamilyLossInputs(
        log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix
    )
    loss, _ = exgrpo_token_loss(inputs, ExgrpoLossConfig())
    assert float(loss) == pytest.approx(-0.342729, abs=1e-6)
    # LUFFY's base π_θ alone = ExGRPO's formula with a recorded log-prob of 0 (behaviour prob 1)
    luffy_old = torch.cat([torch.zeros(1, 4), log_prob[1:]])
    loss, metrics = exgrpo_token_loss(
        FamilyLossInputs(
            log_prob=log_prob, old_log_prob=luffy_old, advantages=adv, response_mask=mask, prefix_mask=prefix
        ),
        ExgrpoLossConfig(),
    )
    assert float(loss) == pytest.approx(-0.318152, abs=1e-6)
    w = [math.exp(-0.1 + 0.2), math.exp(-0.5 + 0.4), math.exp(-1.0 + 1.2)]
    assert [x / (x + 0.1) for x in w] == pytest.approx([0.917024, 0.900481, 0.924323], abs=1e-6)


def test_refuses_unknown_reshape():
    with pytest.raises(ValueError, match="off_policy_reshape"):
        exgrpo_token_loss(
            FamilyLossInputs(
                log_prob=torch.zeros(1, 1),
                old_log_prob=torch.zeros(1, 1),
                advantages=torch.zeros(1, 1),
                response_mask=torch.ones(1, 1),
                prefix_mask=torch.ones(1, 1),
            ),
            ExgrpoLossConfig(off_policy_reshape="logp"),
        )


def test_batch_mixing_and_bookkeeping_rules_by_hand():
    pool = {4: ["t"], 9: [], 2: ["t", "u"], 7: ["t"], 5: ["t"], 3: ["t"]}
    assert eligible_uids(pool, {7}) == [4, 2, 5, 3]
    assert eligible_uids(pool, {7}, "first_half") == [4, 2]
    assert eligible_uids(pool, {7}, "last_half") == [5, 3]
    with pytest.raises(ValueError, match="exp_sample_range"):
        eligible_uids(pool, set(), "middle")
    assert experience_count(128, 0.5, 1000) == 64 and experience_count(128, 0.5, 10) == 10
    assert experience_count(5, 0.5, 9) == 2  # int(2.5)
    assert [collect_group(k, 8) for k in range(9)] == [False] + [True] * 7 + [False]
    assert [retire_group(k, 8) for k in (7, 8)] == [False, True]
    assert not switch_to_mixed(False, 0.35) and switch_to_mixed(False, 0.36) and switch_to_mixed(True, 0.0)


def test_spec_hand_values_shaping():
    from luffy_pool.methods.loss_helpers import shaped

    got = shaped(torch.tensor([0.01, 0.1, 0.5, 1.0, 2.0], dtype=torch.float64)).tolist()
    assert got == pytest.approx([0.090909, 0.5, 0.833333, 0.909091, 0.952381], abs=1e-6)
