"""vLLM's memory outside ``gpu_memory_utilization`` and the split engine's weight-receive transient.

vLLM's own TP communicator (paths under the installed ``vllm/`` package, 0.32.0):
- ``v1/worker/gpu_worker.py`` ``init_device`` calls ``init_worker_distributed_environment`` *before* it takes the
  ``MemorySnapshot`` that ``request_memory`` and ``determine_available_memory`` measure from ("Initialize the
  distributed environment BEFORE taking memory snapshot ... NCCL buffers are allocated before we measure").
  ``request_memory`` takes ``ceil(util x total)`` regardless, so memory allocated before the snapshot is on top of
  that request: the communicator lies outside ``gpu_memory_utilization``, not inside it.
- ``distributed/parallel_state.py``: only the ``tp`` group of size > 1 gets a device communicator in this
  project's layouts (PP, DP, DCP, PCP are 1; the world group has none): ``distributed/device_communicators/
  cuda_communicator.py`` builds a ``PyNcclCommunicator`` (an NCCL communicator of its own, priced like the
  trainer's, ``estimate.nccl_bytes_per_communicator``) and, with ``VLLM_ALLREDUCE_USE_SYMM_MEM`` (on by default), a
  ``SymmMemCommunicator`` whose buffer is ``SYMM_MEM_ALL_REDUCE_MAX_SIZES[capability][tp]`` bytes
  (``distributed/device_communicators/all_reduce_utils.py``; Hopper's sizes below, the cards the recipes name; an
  A100 has no entry and allocates none). Custom all-reduce is off here (``vllm_rollout/config.py`` passes
  ``disable_custom_all_reduce=True``); FlashInfer's all-reduce workspace is created lazily inside the profile run,
  so vLLM's profile already counts it.
- The communicator is never released by sleep (sleep frees the cuMem pool: weights, KV cache), so with the hybrid
  engine it is on the device in every phase, the trainer's included.

The split engine's receive (``verl/workers/sharding_manager/collective_sync.py`` ``WeightGroup.receive``, an engine
that never sleeps, so its KV cache is allocated throughout): each bucket arrives as one flat uint8 buffer (a bucket
holds at most ``weight_sync_bucket_mb``, a larger tensor travels alone), every tensor is cloned out of it, and
``verl/workers/rollout/vllm_rollout/weight_groups.py`` holds a unit's clones (the embedding, a decoder layer, the
head) until the next unit's first tensor arrives; vLLM's layerwise reload then materialises each module it reloads
(``model_executor/model_loader/reload/layerwise.py`` ``materialize_layer``: the module's TP shard, freshly allocated)
before copying it into place. The peak is the largest of three moments, all computed below:
1. the largest tensor's flat buffer and its clone, and the next bucket's buffer allocated while both are alive
   (``buf = broadcast(torch.empty(...))`` evaluates the new buffer before the old one is released);
2. that tensor pushed one bucket later: its clone, the materialised module shard, the next bucket's buffer and clones;
3. a decoder layer pushed: its clones (it spans buckets), the current bucket's buffer and clones, its largest
   module's shard (the fused gate/up projection, or the experts of an MoE layer).
For a 152k-vocabulary 7B model with TP 2 and 256 MiB buckets moment 1 wins: 2 x 1.09 GB + 0.27 GB.
"""

from __future__ import annotations

import os
from luffy_pool.memory_plan.shapes import ModelShape

MiB = 2**20
# vllm/distributed/device_communicators/all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES["9.0"] (H100 / H200)
SYMM_MEM_BYTES_HOPPER = {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB}
_R = "actor_rollout_ref.rollout"


def symm_mem_bytes(tp: int, environ=None) -> int:
    """vLLM's symmetric-memory all-reduce buffer of a TP group on Hopper (0 when ``VLLM_ALLREDUCE_USE_SYMM_MEM=0``
    or the TP size has no entry)."""
    env = os.environ if environ is None else environ
    if tp <= 1 or env.get("VLLM_ALLREDUCE_USE_SYMM_MEM", "1") == "0":
        return 0
    return SYMM_MEM_BYTES_HOPPER.get(tp, 0)


def vllm_tp_communicator_bytes(tp: int, nccl_bytes: int, environ=None) -> int:
    """NCCL communicator + symmetric-memory buffer vLLM builds for its TP group before its memory snapshot."""
    return nccl_bytes + symm_mem_bytes(tp, environ) if tp > 1 else 0


def vllm_tp_communicator_what(tp: int, nccl_bytes: int, environ=None) -> str:
    symm = symm_mem_bytes(tp, environ)
    extra = f" + {symm // MiB} MiB symmetric memory" if symm else ""
    return f"NCCL, vLLM's TP communicator{extra}: outside gpu_memory_utilization (estimate)"


def _largest_layer_module(s: ModelShape) -> int:
    """Parameters of the largest module vLLM reloads at once inside one decoder layer (full, before TP)."""
    h, hd = s.hidden_size, s.head_dim
    qkv = h * (s.num_attention_heads + 2 * s.num_key_value_heads) * hd
    if s.moe_layers:  # FusedMoE: every expert's gate/up (w13) of the layer
        mlp = s.num_experts * 2 * h * s.moe_intermediate_size
    else:
        mlp = 2 * h * s.intermediate_size  # gate_up_proj
    return max(qkv, mlp)


def _largest_layer_tensor(s: ModelShape) -> int:
    """Parameters of the largest single checkpoint tensor of a decoder layer (HF names: one expert's matrices)."""
    h = s.hidden_size
    width = s.moe_intermediate_size if s.moe_layers else s.intermediate_size
    return max(h * width, h * s.num_attention_heads * s.head_dim)


def receive_transient(s: ModelShape, wire_bytes: int, engine_bytes: int, tp: int, bucket_bytes: int) -> tuple[int, str]:
    """(bytes, description) of a split engine's receive peak (module docstring): ``wire_bytes`` per parameter on
    the wire (the actor's param dtype), ``engine_bytes`` per parameter in the engine, ``bucket_bytes`` the bucket."""
    big = s.embed_params * wire_bytes  # the largest tensor: the embedding (or the head)
    big_shard = s.embed_params * engine_bytes // tp  # its materialised vocab-parallel shard
    bucket = bucket_bytes
    layer = s.layer_params * wire_bytes
    layer_buf = max(bucket, _largest_layer_tensor(s) * wire_bytes)
    moments = {
        "largest tensor's buffer + clone + next bucket": 2 * big + bucket,
        "largest tensor's clone + vLLM shard + 2 buckets": big + big_shard + 2 * bucket,
        "a layer's clones + 2 buckets + vLLM module shard": layer
        + 2 * layer_buf
        + _largest_layer_module(s) * engine_bytes // tp,
    }
    what, nbytes = max(moments.items(), key=lambda kv: kv[1])
    return nbytes, f"weight receive (split engine): {what}"
