"""exp_scripts/bench_memory_tp.py (``bench_memory.py --tp``): the byte and collective counters, and on 2 gloo ranks
(tp 2) one rank's share of the parameters, gradients and AdamW moments and one decoder layer's all-reduces, against
the memory plan's layout (luffy_pool/memory_plan/layout.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

EXP = os.path.join(os.path.dirname(__file__), "..", "..", "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

import bench_memory  # noqa: E402
import bench_memory_tp  # noqa: E402


def test_local_bytes_and_per_layer_difference():
    a, b = torch.zeros(3, 4), torch.zeros(5, dtype=torch.float64)
    assert bench_memory_tp.local_bytes([a, None, b]) == 3 * 4 * 4 + 5 * 8
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    assert bench_memory_tp.state_bytes(model, opt) == {"params": 40, "grads": 40, "adam": 80}
    one, two = {"all_reduce": 3, "all_gather_into_tensor": 1}, {"all_reduce": 5, "all_gather_into_tensor": 1}
    assert bench_memory_tp.per_layer(one, two) == {"all_reduce": 2}


def test_count_collectives_without_a_collective_is_empty():
    assert bench_memory_tp.count_collectives(lambda: torch.ones(2).sum()) == {}


def test_tp_argument_must_split_the_heads():
    assert bench_memory.parse_args(["--tp", "2"]).tp == 2
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--tp", "7"])  # 14 attention heads but 2 kv heads


@pytest.mark.slow  # 2 forked gloo ranks (~30 s)
def test_tp2_rank_holds_the_planned_share_and_a_layer_all_reduces_as_planned():
    from luffy_pool.memory_plan.layout import tp_allreduces_per_layer
    from luffy_pool_dev.gloo_ranks import run_gloo_ranks

    vocab = 512
    ref = bench_memory_tp.measure_rank(0, 1, 1, 2, vocab)["state"]
    ranks = run_gloo_ranks(bench_memory_tp._gloo_rank, 2, 2, 2, vocab, timeout_s=600)
    plan = bench_memory_tp.planned_ratio(2, 1, 2, vocab)
    for r in ranks:
        for kind in ("params", "grads", "adam"):  # replicated norms: just above 1/2
            assert r["state"][kind] / ref[kind] == pytest.approx(plan, rel=1e-3), kind
        counts = r["counts"]
        layer = {p: bench_memory_tp.per_layer(counts["1"][p], counts["2"][p]) for p in ("forward", "backward")}
        expected = tp_allreduces_per_layer()
        assert layer == {
            "forward": {"all_reduce": expected["forward"]},
            "backward": {"all_reduce": expected["backward"]},
        }
    assert 0.5 < plan < 0.501


@pytest.mark.slow  # 2 + 8 forked gloo ranks
@pytest.mark.parametrize("pp,dp,tp", [(2, 1, 1), (2, 2, 2)], ids=["pp2", "pp2_dp2_tp2"])
def test_pipeline_ranks_hold_the_planned_share(pp, dp, tp):
    """Per-rank params, grads and AdamW moments after one 1F1B step: the memory plan's share of the largest stage
    (1/(pp x tp x dp) up to the norms, which every tp rank keeps whole)."""
    from luffy_pool_dev.gloo_ranks import run_gloo_ranks

    vocab = 512
    ref = bench_memory_tp.measure_rank(0, 1, 1, 2, vocab)["state"]
    ranks = run_gloo_ranks(bench_memory_tp._gloo_rank, pp * dp * tp, tp, 2, vocab, pp, timeout_s=600)
    plan = bench_memory_tp.planned_ratio(tp, dp, 2, vocab, pp)
    worst = max(ranks, key=lambda r: r["state"]["params"])["state"]
    for kind in ("params", "grads", "adam"):
        assert worst[kind] / ref[kind] == pytest.approx(plan, rel=1e-3), kind
    assert 1 / (pp * dp * tp) <= plan < 1.01 / (pp * dp * tp)
