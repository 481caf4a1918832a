"""exp_scripts/gpu_smoke_checks.py: the gap measures and bounds of the GPU smoke's numeric checks, on hand-made
tensors (the checks on real steps run in tests/exp_scripts/test_gpu_smoke.py)."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from exp_scripts import gpu_smoke_checks as checks  # noqa: E402


def test_masked_gap_counts_only_the_masked_tokens():
    a = torch.tensor([[0.0, -1.0, -2.0], [-3.0, -4.0, 7.0]])
    b = torch.tensor([[0.0, -1.5, -2.0], [-3.0, -3.9, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 7-point gap sits on a padding position
    gap = checks.masked_gap(a, b, mask)
    assert gap["tokens"] == 5 and gap["max_abs"] == pytest.approx(0.5)
    assert gap["mean_abs"] == pytest.approx((0.5 + 0.1) / 5)


def test_engine_actor_gap_by_hand():
    # token 1: p_actor 0.5, p_engine 0.25 -> d = ln 2; token 2: both 0.25 -> d = 0; token 3 masked out
    actor = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    engine = torch.log(torch.tensor([[0.25, 0.25, 0.1]]))
    gap = checks.engine_actor_gap(actor, engine, torch.tensor([[1, 1, 0]]))
    ln2 = math.log(2)
    assert gap["tokens"] == 2 and gap["mean_actor_minus_engine"] == pytest.approx(ln2 / 2)
    assert gap["kl_k3"] == pytest.approx((2 - 1 - ln2) / 2)  # r - 1 - log r with r = 2, then r = 1
    assert gap["max_abs"] == pytest.approx(ln2) and gap["prob_diff_mean"] == pytest.approx(0.25 / 2)


def test_a_gap_whose_signs_cancel_fails_on_k3_and_no_token_is_a_failure():
    d = torch.tensor([[0.5, -0.5]])
    gap = checks.engine_actor_gap(d, torch.zeros_like(d), torch.ones_like(d))
    assert gap["mean_actor_minus_engine"] == pytest.approx(0.0)
    assert gap["kl_k3"] == pytest.approx((math.exp(0.5) - 1.5 + math.exp(-0.5) - 0.5) / 2)  # 0.1276
    assert not checks.gap_within(gap, checks.KL_BOUNDS["bf16"])
    small = checks.engine_actor_gap(d * 0.01, torch.zeros_like(d), torch.ones_like(d))  # k3 = 1.25e-5
    assert checks.gap_within(small, checks.KL_BOUNDS["bf16"]) and checks.gap_within(small, checks.KL_BOUNDS["fp32"])
    empty = checks.engine_actor_gap(d, d, torch.zeros_like(d))
    assert empty["tokens"] == 0 and not checks.gap_within(empty, 1.0)


def test_packed_bounds_need_every_variant_within_both_bounds():
    b = checks.PACKED_BOUNDS["bf16"]
    ok = {"max_abs": 0.05, "mean_abs": 0.005, "tokens": 10}
    assert checks.packed_within({"packed": ok, "packed_chunked_head": ok}, b)
    assert not checks.packed_within({"packed": ok, "packed_chunked_head": dict(ok, max_abs=0.2)}, b)
    assert not checks.packed_within({"packed": dict(ok, mean_abs=0.02)}, b)
    assert not checks.packed_within({"packed": dict(ok, max_abs=float("nan"))}, b)
    assert not checks.packed_within({"packed": dict(ok, tokens=0)}, b) and not checks.packed_within({}, b)


def test_precision_of_the_compute_dtype():
    assert [checks.precision(d) for d in (torch.bfloat16, torch.float16, "bfloat16", torch.float32, "float32")] == [
        "bf16",
        "bf16",
        "bf16",
        "fp32",
        "fp32",
    ]


def test_actor_forward_switches_and_restores_even_on_error():
    class Actor:
        use_remove_padding, logprob_chunk_size, shared_prompt_forward = False, 1024, True

    actor = Actor()
    with pytest.raises(RuntimeError):
        with checks.actor_forward(actor, packed=True, chunk_size=7):
            assert (actor.use_remove_padding, actor.logprob_chunk_size, actor.shared_prompt_forward) == (True, 7, False)
            raise RuntimeError("forward failed")
    assert (actor.use_remove_padding, actor.logprob_chunk_size, actor.shared_prompt_forward) == (False, 1024, True)


def test_micro_batch_spreads_its_rows_over_the_groups():
    from verl.protocol import DataProto

    rows = torch.arange(16).unsqueeze(-1)
    batch = DataProto.from_dict(tensors={k: rows.clone() for k in checks.LOG_PROB_KEYS + ["advantages"]})
    micro = checks.micro_batch(batch)
    assert micro.batch["input_ids"].squeeze(-1).tolist() == [0, 5, 10, 15]  # 4 prompts of n = 4
    assert set(micro.batch.keys()) == set(checks.LOG_PROB_KEYS)
    assert micro.meta_info == {"temperature": 1.0, "micro_batch_size": 4, "use_dynamic_bsz": False}


@pytest.mark.parametrize(
    "choice,device,gpus,recipe,runs",
    [
        ("auto", "cpu", 0, None, True),
        ("auto", "cuda", 2, None, True),
        ("auto", "cuda", 1, None, False),
        ("auto", "cpu", 0, "exp_scripts/train.sh", False),
        ("on", "cuda", 1, "exp_scripts/train.sh", True),
        ("off", "cpu", 0, None, False),
    ],
)
def test_split_runs_where_an_actor_rank_and_an_engine_rank_fit(choice, device, gpus, recipe, runs):
    why = checks.split_skip_reason(choice, device, gpus, recipe)
    assert (why is None) == runs
    if choice == "auto" and device == "cuda" and not runs:
        assert why == "split engines need 2 GPUs (1 actor rank + 1 engine rank), 1 seen"
