"""H11: the actor's KL-to-reference loss (``use_kl_loss``, ``kl_loss_type``, ``kl_loss_coef``) on hand-computed values.

The YAML's defaults (use_kl_loss True, low_var_kl, coefficient 0.001) are what a run without LUFFY's train.sh
overrides trains with. Tokens (policy log-prob - reference log-prob = d), one padded position left out:
row 0: d = 0.5, 0.0, -0.3; row 1: d = 0.0, -1.0, (padding). Per-token estimators:
kl = d; abs = |d|; mse = d^2 / 2; low_var_kl (k3) = exp(-d) + d - 1, clamped to [-10, 10].
"""

import math

import pytest
import torch
from luffy_pool.config.compose import actor_config

from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor
from verl.workers.actor.dp_actor import DataParallelPPOActor

LOG_PROB = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]]
REF = [[-1.5, -2.0, -0.2], [-0.3, -0.2, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
D = [0.5, 0.0, -0.3, 0.0, -1.0]  # the five unmasked tokens
# means over the 5 response tokens, by hand
K3 = [math.exp(-d) + d - 1 for d in D]  # 0.1065307, 0, 0.0498588, 0, 0.7182818
EXPECTED = {"kl": -0.8 / 5, "abs": 1.8 / 5, "mse": 0.5 * 1.34 / 5, "low_var_kl": sum(K3) / 5}


def _actor(cls=DataParallelPPOActor, **kw):
    cfg = actor_config(**{"entropy_coeff": 0.0, **kw})  # every other key at its YAML default
    module = torch.nn.Linear(1, 1)
    return cls(cfg, module, actor_optimizer=torch.optim.SGD(module.parameters(), lr=0.1))


def _inputs():
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    return log_prob, {"ref_log_prob": torch.tensor(REF)}, torch.zeros(2, 3), torch.tensor(MASK)


def test_yaml_default_is_the_k3_kl_loss_with_coefficient_0_001():
    actor = _actor()
    cfg = actor.update_config
    assert (cfg.use_kl_loss, cfg.kl_loss_type, cfg.kl_loss_coef) == (True, "low_var_kl", 0.001)
    assert "ref_log_prob" in actor.loss_input_keys()
    log_prob, micro, entropy, mask = _inputs()
    metrics = {}
    loss = actor._regularisers(micro, log_prob, entropy, mask, metrics)
    assert metrics["actor/kl_loss"] == pytest.approx(0.1749343, abs=1e-6)  # (0.1065307 + 0.0498588 + 0.7182818) / 5
    assert metrics["actor/kl_coef"] == 0.001
    assert loss.item() == pytest.approx(0.001 * 0.1749343, abs=1e-9)
    # d loss / d log_prob = coef * (1 - exp(-d)) / 5 on response tokens, 0 on padding
    loss.backward()
    grad = [0.001 * (1 - math.exp(-d)) / 5 for d in D]
    assert torch.allclose(log_prob.grad[mask.bool()], torch.tensor(grad), atol=1e-9)
    assert log_prob.grad[1, 2].item() == 0.0


@pytest.mark.parametrize("kl_type", sorted(EXPECTED))
def test_each_kl_loss_type_by_hand(kl_type):
    actor = _actor(kl_loss_type=kl_type, kl_loss_coef=0.5)
    log_prob, micro, entropy, mask = _inputs()
    metrics = {}
    loss = actor._regularisers(micro, log_prob, entropy, mask, metrics)
    assert metrics["actor/kl_loss"] == pytest.approx(EXPECTED[kl_type], abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * EXPECTED[kl_type], abs=1e-6)


def test_low_var_kl_is_clamped_at_10():
    actor = _actor(kl_loss_coef=1.0)
    metrics = {}
    actor._regularisers(
        {"ref_log_prob": torch.tensor([[0.0]])}, torch.tensor([[-20.0]]), torch.zeros(1, 1), torch.ones(1, 1), metrics
    )
    assert metrics["actor/kl_loss"] == 10.0  # exp(20) - 21 without the clamp


def test_entropy_bonus_and_kl_loss_add_up_and_kl_off_leaves_no_kl_term():
    log_prob, micro, _, mask = _inputs()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])  # masked mean 3.0
    metrics = {}
    loss = _actor(entropy_coeff=0.01)._regularisers(micro, log_prob, entropy, mask, metrics)
    assert loss.item() == pytest.approx(-0.01 * 3.0 + 0.001 * 0.1749343, abs=1e-8)
    metrics = {}
    off = _actor(entropy_coeff=0.01, use_kl_loss=False)
    assert off._regularisers(micro, log_prob, entropy, mask, metrics).item() == pytest.approx(-0.03, abs=1e-8)
    assert "actor/kl_loss" not in metrics and "ref_log_prob" not in off.loss_input_keys()


def test_luffys_actor_adds_the_same_kl_loss():
    log_prob, micro, entropy, mask = _inputs()
    metrics = {}
    loss = _actor(MIXDataParallelPPOActor)._regularisers(micro, log_prob, entropy, mask, metrics)
    assert metrics["actor/kl_loss"] == pytest.approx(0.1749343, abs=1e-6)
    assert loss.item() == pytest.approx(0.001 * 0.1749343, abs=1e-9)
