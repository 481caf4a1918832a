"""vLLM 0.32's CUDA-graph pool on one rank when ``rollout.enforce_eager=False`` (an estimate, not a measurement).

What vLLM does (paths under the installed ``vllm/`` package):
- Capture sizes: ``config/vllm.py`` ``VllmConfig._set_cudagraph_sizes``. Without an explicit list the largest
  size is ``min(2 x max_num_seqs, 512, max_num_batched_tokens)`` (512 -> 1024 only on Blackwell B200-class
  GPUs, not modelled), the list is ``[1, 2, 4] + range(8, 256, 8) + range(256, largest + 1, 16)`` cut at that
  size, plus ``max_num_batched_tokens`` and ``max_num_seqs`` when they lie inside it.
- Graph modes: ``config/compilation.py`` defaults ``cudagraph_mode`` to FULL_AND_PIECEWISE: piecewise graphs at
  every capture size and full graphs for pure-decode batches (one token per sequence, so at most
  ``max_num_seqs`` tokens).
- Memory: ``v1/worker/gpu_model_runner.py`` ``profile_cudagraph_memory`` captures the two largest graphs of
  each mode and estimates ``max over modes(first capture) + sum over modes((graphs - 1) x max(second
  capture, 1 MiB))``: the graphs share one pool (captured largest first, later ones reuse its blocks), so
  the pool is the largest batch's working set plus a per-graph remainder. ``v1/worker/gpu_worker.py``
  ``determine_available_memory`` takes that estimate out of the KV cache (``VLLM_MEMORY_PROFILER_ESTIMATE_
  CUDAGRAPHS``, on by default), so the pool lies inside ``gpu_memory_utilization`` while the engine is awake.
- Asleep: the pool is the platform's graph pool (torch's caching allocator), not the cuMem pool that sleep
  releases, unless vLLM's ``sleep_mode_offload_cudagraph`` is set (``config/vllm.py``
  ``use_cumem_cudagraph_pool``; off by default, not set by this project): it stays on the device while the
  actor trains.

Here the first capture is one forward's per-layer working set at the largest capture size (the same terms as
the profile run's activation line of ``engine_budget.vllm_budget``) and the per-graph remainder is vLLM's 1 MiB
floor; the real second-capture figure is only known on a GPU (vLLM logs both at start-up).
"""

from __future__ import annotations

MiB = 2**20
DEFAULT_MAX_CAPTURE = 512  # vllm/config/vllm.py: 1024 on Blackwell (device capability family 100)
PER_GRAPH_FLOOR_BYTES = MiB  # vllm/v1/worker/gpu_model_runner.py profile_cudagraph_memory: "at least 1 MiB per graph"


def default_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, default_max: int = DEFAULT_MAX_CAPTURE
) -> list[int]:
    """The token counts vLLM captures when no list is given (no speculative decoding: one token per decode row)."""
    largest = min(2 * max_num_seqs, default_max)
    decode = [max_num_seqs] if max_num_seqs <= largest else []
    largest = min(max_num_batched_tokens, largest)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in decode if s <= max_num_batched_tokens]
    return sorted(set(sizes))


def graph_pool_bytes(
    *,
    hidden_size: int,
    q_size: int,
    kv_size: int,
    intermediate_size: int,
    dtype_bytes: int,
    tp: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> int:
    """Estimated bytes of the CUDA-graph pool of one engine rank (q_size / kv_size: heads x head_dim, unsharded)."""
    sizes = default_capture_sizes(max_num_seqs, max_num_batched_tokens)
    if not sizes:
        return 0
    largest = sizes[-1]
    first = largest * dtype_bytes * (2 * hidden_size + (q_size + 2 * kv_size) // tp + 2 * intermediate_size // tp)
    piecewise = len(sizes)
    full = sum(1 for s in sizes if s <= max_num_seqs)  # pure-decode batches: one token per sequence
    return first + PER_GRAPH_FLOOR_BYTES * ((piecewise - 1) + max(full - 1, 0))


def engine_graph_pool_bytes(inputs, shape) -> int:
    """``graph_pool_bytes`` for a memory plan's ``PlanInputs`` and ``ModelShape``; 0 when the engine runs eager."""
    if inputs.enforce_eager:
        return 0
    return graph_pool_bytes(
        hidden_size=shape.hidden_size,
        q_size=shape.num_attention_heads * shape.head_dim,
        kv_size=shape.num_key_value_heads * shape.head_dim,
        intermediate_size=shape.intermediate_size,
        dtype_bytes=inputs.rollout_dtype_bytes,
        tp=inputs.tp,
        max_num_seqs=inputs.max_num_seqs,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
    )
