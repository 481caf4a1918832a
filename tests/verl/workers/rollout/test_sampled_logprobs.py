"""The engine's sampled-token log-probs as one tensor per request: read from vLLM's flat containers (no object per
token) and equal to the per-token dict walk they replace."""

import pytest
import torch

pytest.importorskip("vllm")


def _containers(ids, lps, flat, top=0):
    """vLLM's container of one completion, filled per position as its output processor does; ``top`` extra top-k
    entries per position after the sampled one (the sampler's order)."""
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    container = create_sample_logprobs(flat)
    for tok, lp in zip(ids, lps):
        others = [(tok + 1 + j, lp - 1.0 - j) for j in range(top)]
        append_logprobs_for_next_position(
            container, [tok] + [t for t, _ in others], [lp] + [v for _, v in others], (None,) * (1 + top), 1, top
        )
    return container


def test_flat_log_probs_become_one_float32_tensor_equal_to_the_dict_walk():
    from verl.workers.rollout.vllm_rollout.vllm_rollout import sampled_logprobs

    ids, lps = [5, 9, 5, 7], [-0.25, -1.5, -0.125, -3.0]  # 5 twice: a dict per position, not per token
    flat = sampled_logprobs(_containers(ids, lps, flat=True), ids)
    walked = sampled_logprobs(_containers(ids, lps, flat=False), ids)
    assert flat.dtype == torch.float32 and flat.tolist() == lps  # exact: binary fractions
    assert walked.tolist() == lps


def test_flat_log_probs_with_top_k_entries_take_each_positions_first_entry():
    from verl.workers.rollout.vllm_rollout.vllm_rollout import sampled_logprobs

    ids, lps = [4, 8, 6], [-0.5, -2.0, -0.75]
    container = _containers(ids, lps, flat=True, top=2)
    assert len(container.logprobs) == 9  # the sampled token and two others per position
    assert sampled_logprobs(container, ids).tolist() == lps


def test_an_empty_completion_gives_an_empty_tensor():
    from verl.workers.rollout.vllm_rollout.vllm_rollout import sampled_logprobs

    out = sampled_logprobs(_containers([], [], flat=True), [])
    assert out.shape == (0,) and out.dtype == torch.float32
