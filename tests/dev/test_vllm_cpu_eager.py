"""The CPU engine unwraps vLLM's module-level torch.compile helpers (dev/luffy_pool_dev/cpu_eager.py)."""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from luffy_pool_dev import cpu_eager


def _fake_module(monkeypatch, name, helper):
    module = types.ModuleType(name)
    module.helper = helper
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_a_compiled_helper_is_replaced_by_the_function_it_wraps_and_an_eager_one_is_left(monkeypatch):
    def plain(x):
        return x * 2

    compiled = torch.compile(plain, backend="eager")
    assert compiled._torchdynamo_orig_callable is plain  # the attribute the unwrap reads (torch 2.13)
    a = _fake_module(monkeypatch, "fake_vllm_a", compiled)
    b = _fake_module(monkeypatch, "fake_vllm_b", plain)
    monkeypatch.setattr(
        cpu_eager,
        "COMPILED_HELPERS",
        (
            ("fake_vllm_a", "helper"),
            ("fake_vllm_b", "helper"),
            ("no_such_vllm_module", "helper"),
            ("fake_vllm_b", "gone"),
        ),
    )
    assert cpu_eager.run_compiled_helpers_eager() == ["fake_vllm_a.helper"]
    assert a.helper is plain and b.helper is plain
    assert cpu_eager.run_compiled_helpers_eager() == []  # a second engine: nothing left to unwrap


@pytest.mark.vllm
def test_vllms_masking_helper_runs_unwrapped_and_gives_the_hand_computed_masks():
    from torch._dynamo.utils import counters

    vpe = importlib.import_module("vllm.model_executor.layers.vocab_parallel_embedding")
    found = vpe.get_masked_input_and_mask
    # vLLM's decorated helper (an engine built earlier in this process may have unwrapped it already)
    original = getattr(found, "_torchdynamo_orig_callable", found)
    try:
        vpe.get_masked_input_and_mask = torch.compile(original, dynamic=True)
        assert (
            "vllm.model_executor.layers.vocab_parallel_embedding.get_masked_input_and_mask"
            in cpu_eager.run_compiled_helpers_eager()
        )
        assert vpe.get_masked_input_and_mask is original
        frames = counters["frames"]["total"]
        # TP rank 1 of 2 over a vocabulary of 10 (no padding, no added vocabulary): it owns ids 5..9
        ids = torch.tensor([0, 4, 5, 7, 9])
        masked, mask = vpe.get_masked_input_and_mask(ids, 5, 10, 0, 0, 0)
        assert masked.tolist() == [0, 0, 0, 2, 4] and mask.tolist() == [True, True, False, False, False]
        assert counters["frames"]["total"] == frames  # ran as plain torch: dynamo traced nothing
    finally:
        vpe.get_masked_input_and_mask = found


@pytest.mark.vllm
def test_the_sampled_tokens_rank_counter_runs_unwrapped_where_the_sampler_calls_it():
    """Rollout correction asks the engine for log-probs; vLLM's sampler then ranks the sampled tokens with a
    compiled helper it imported by name, so both bindings are replaced."""
    from torch._dynamo.utils import counters

    logprobs_ops = importlib.import_module("vllm.v1.sample.ops.logprobs")
    sampler = importlib.import_module("vllm.v1.sample.sampler")
    found = {m: m.batched_count_greater_than for m in (logprobs_ops, sampler)}
    original = getattr(found[sampler], "_torchdynamo_orig_callable", found[sampler])
    try:
        compiled = torch.compile(original)
        logprobs_ops.batched_count_greater_than = sampler.batched_count_greater_than = compiled
        replaced = cpu_eager.run_compiled_helpers_eager()
        assert {
            "vllm.v1.sample.ops.logprobs.batched_count_greater_than",
            "vllm.v1.sample.sampler.batched_count_greater_than",
        } <= set(replaced)
        assert sampler.batched_count_greater_than is original and logprobs_ops.batched_count_greater_than is original
        frames = counters["frames"]["total"]
        x = torch.tensor([[0.1, 0.5, 0.3], [1.0, 2.0, 3.0]])
        assert sampler.batched_count_greater_than(x, torch.tensor([[0.3], [3.0]])).tolist() == [2, 1]
        assert counters["frames"]["total"] == frames
    finally:
        for module, helper in found.items():
            module.batched_count_greater_than = helper
