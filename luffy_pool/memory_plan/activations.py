"""The activation model of the memory plan: bytes per token a decoder layer keeps for backward or needs while it
runs (an HF Llama/Qwen2-style block), and the LM head's peak, chunked (``verl/utils/chunked_logprobs.py``) or as
full logits. The single-process CPU measurement in ``exp_scripts/bench_memory.py`` checks these numbers."""

from __future__ import annotations

from typing import Optional

from luffy_pool.memory_plan.shapes import ModelShape


def layer_saved_bytes(s: ModelShape, a: int) -> int:
    """Bytes per token autograd keeps for one decoder layer (Llama/Qwen2 block, flash/sdpa attention)."""
    h, hd = s.hidden_size, s.head_dim
    q, kv = s.num_attention_heads * hd, s.num_key_value_heads * hd
    norms = 2 * (4 * h + a * h)  # RMSNorm: fp32 input copy + normalised output in compute dtype
    attn = a * ((q + kv) + (q + 2 * kv) + q)  # pre-rotary q/k, q/k/v into attention, attention output
    mlp = 4 * a * s.intermediate_size  # gate, act(gate), up, act*up
    return norms + attn + mlp


def layer_working_bytes(s: ModelShape, a: int) -> int:
    """Bytes per token live inside one layer's forward without autograd (MLP tensors + residual + norm)."""
    return a * (3 * s.intermediate_size + 2 * s.hidden_size) + 4 * s.hidden_size


def head_bytes(
    s: ModelShape,
    tokens: int,
    chunk: int,
    a: int,
    backward: bool,
    positions: Optional[int] = None,
    response_positions: Optional[int] = None,
) -> tuple[int, str]:
    """(peak bytes, description) of the LM head scoring ``tokens`` response tokens of a ``positions``-token
    micro-batch. dp_actor keeps full logits while the micro-batch is no larger than one chunk; full logits
    cover every position (``[positions, V]`` in the compute dtype), then ``response_positions`` of them go
    through fp32 log_softmax, exp and their product (``torch_functional.logprobs_and_entropy_from_logits``)."""
    v, h = s.vocab_size, s.hidden_size
    positions = positions or tokens
    cast = 4 if a != 4 else 0  # the bf16 matmul output is cast to a separate fp32 buffer
    if 0 < chunk < positions:
        if not backward:  # fp32 logits + the softmax of the entropy term ([chunk, V] each), hidden gathered
            return a * tokens * h + 8 * chunk * v, f"LM head in chunks of {chunk} tokens"
        # Three [chunk, V] fp32 buffers (recomputed logits, exp, and a third measured on CPU: the transposed
        # operand of grad_z.t() @ h) + the bf16 copy of grad_z; dW summed in fp32 over several bf16 chunks.
        dw = 4 * v * h if (a != 4 and tokens > chunk) else 0
        return 2 * a * tokens * h + chunk * v * (
            12 + (a if a != 4 else 0)
        ) + dw, f"LM head backward in chunks of {chunk} tokens"
    # Forward's transients (logits, log_softmax, exp, their product) are the head's peak in the update too: its
    # backward holds fewer [r, V] buffers at once (checked by bench_memory.py --predict at 2 x 512 positions).
    r = response_positions or tokens
    return positions * v * a + r * v * (cast + 12), f"full [{positions}, {v}] logits"
