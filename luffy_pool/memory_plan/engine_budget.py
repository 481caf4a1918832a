"""vLLM's memory inside ``gpu_memory_utilization``: how vLLM 0.32 splits its request (weights, the profile run's
activation peak, non-torch memory and CUDA graphs, the KV cache that is left), the KV cache in tokens, and the CPU
build's KV cache size. What vLLM holds outside that request is ``engine_side.py``."""

from __future__ import annotations

import math

from luffy_pool.memory_plan.graph_pool import engine_graph_pool_bytes
from luffy_pool.memory_plan.inputs import PlanInputs
from luffy_pool.memory_plan.shapes import ModelShape

GiB = 2**30
# vLLM's non-torch memory during its profile run (its CUDA-graph pool: memory_plan/graph_pool.py).
VLLM_NON_TORCH_BYTES = GiB // 2


def vllm_budget(i: PlanInputs, s: ModelShape, total: int) -> dict:
    """vLLM 0.32's split of ``ceil(util x total)`` (vllm/v1/worker/utils.py request_memory)."""
    requested = math.ceil(total * i.gpu_memory_utilization)
    weights = s.params * i.rollout_dtype_bytes // i.tp
    h, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    # profile_run: one forward of max_num_batched_tokens (per-layer working set) + the sampler on max_num_seqs rows.
    act = (
        i.max_num_batched_tokens
        * i.rollout_dtype_bytes
        * (2 * h + (q + 2 * kv) // i.tp + 2 * s.intermediate_size // i.tp)
    )
    act += min(i.max_num_seqs, i.max_num_batched_tokens) * s.vocab_size * 4 * 2
    graphs = engine_graph_pool_bytes(i, s)  # 0 with enforce_eager (memory_plan/graph_pool.py)
    non_torch = VLLM_NON_TORCH_BYTES + graphs
    kv_bytes = requested - weights - act - non_torch
    return dict(
        requested=requested,
        weights=weights,
        activation=act,
        non_torch=non_torch,
        graphs=graphs,
        kv=kv_bytes,
        kv_tokens=kv_cache_tokens(s, kv_bytes, i.rollout_dtype_bytes, i.tp),
    )


def kv_cache_tokens(s: ModelShape, kv_bytes: int, dtype_bytes: int, tp: int = 1, block_size: int = 16) -> int:
    """Tokens a vLLM KV cache of ``kv_bytes`` holds: whole blocks of ``block_size`` tokens, each block holding K
    and V of every layer (vllm/v1/core/kv_cache_utils.py: num_blocks = available // (page size x layers))."""
    per_block = block_size * s.kv_bytes_per_token(dtype_bytes, tp)
    return max(0, kv_bytes) // per_block * block_size


def cpu_kv_cache_bytes(cpu_kv_cache_bytes_key: int, environ=None) -> int:
    """The CPU build's KV cache size: ``rollout.cpu_kv_cache_bytes`` (passed as ``kv_cache_memory_bytes``), unless
    the legacy ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is set (vllm/platforms/cpu.py overrides it then)."""
    import os

    env = os.environ if environ is None else environ
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    return int(space) * GiB if space != "" else int(cpu_kv_cache_bytes_key)
