"""Translation of the rollout engine config into ``vllm.LLM`` arguments for CPU or GPU.

Kept free of vLLM imports so the CPU/GPU differences are unit-tested without starting an engine. The
engine config (verl/workers/rollout/config.py, shared with the HF rollout) is re-exported here.
"""

from __future__ import annotations

import os
from typing import Any

from verl.workers.rollout.config import RolloutEngineConfig, engine_config

__all__ = ["RolloutEngineConfig", "engine_config", "distributed_world_size", "build_engine_kwargs", "engine_env"]

# vLLM 0.32's TP all-reduce paths that ``disable_custom_all_reduce`` does not turn off (vllm/envs.py defaults both to
# 1; vllm/distributed/device_communicators/cuda_communicator.py reads them next to the custom all-reduce flag). Both
# map peer buffers of every GPU of the TP group (torch symmetric memory; FlashInfer's IPC workspace), but a Ray rank
# sees only its own GPU, and like the custom all-reduce buffers they live outside the sleep-mode pool the colocated
# engine hands back to the trainer. NCCL then does the TP all-reduce, as verl's colocated engine.
CUDA_ENGINE_ENV = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}


def distributed_world_size() -> int:
    """World size of the SPMD worker group this process belongs to (1 outside one)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("WORLD_SIZE", "1"))


def engine_env(device: str) -> dict[str, str]:
    """Environment variables the engine's process must hold before its first ``vllm.LLM`` on ``device``: vLLM reads
    them when the engine builds its TP communicator and caches them once an engine has started (vllm/envs.py
    ``enable_envs_cache``), so they are set before the build, not after."""
    return dict(CUDA_ENGINE_ENV) if device == "cuda" else {}


def build_engine_kwargs(
    cfg: RolloutEngineConfig, model_path: str, device: str, world_size: int, extension_cls: str
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` on ``device`` ('cpu' | 'cuda') inside a group of ``world_size``."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"rollout device must be 'cpu' or 'cuda', got {device!r}")
    tp = cfg.tensor_model_parallel_size
    if world_size % tp != 0:
        raise ValueError(f"rollout.tensor_model_parallel_size={tp} must divide the worker group size {world_size}")
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        seed=cfg.seed,
        max_model_len=cfg.engine_max_model_len,
        max_num_batched_tokens=max(cfg.max_num_batched_tokens, cfg.engine_max_model_len)
        if not cfg.enable_chunked_prefill
        else cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        enable_prefix_caching=cfg.enable_prefix_caching,
        load_format=cfg.load_format,
        logprobs_mode=cfg.logprobs_mode,
        worker_extension_cls=extension_cls,
        disable_log_stats=True,
    )
    if device == "cpu":
        kwargs.update(
            # TP > 1: vLLM-CPU shards over the TP group's ranks of the worker group (external launcher, gloo)
            tensor_parallel_size=tp,
            dtype="float32" if cfg.dtype == "auto" else cfg.dtype,
            kv_cache_memory_bytes=cfg.cpu_kv_cache_bytes,
            # torch.compile on CPU costs minutes of warm-up for no gain at test sizes.
            enforce_eager=True,
        )
    else:
        kwargs.update(
            dtype=cfg.dtype,
            tensor_parallel_size=tp,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            enable_sleep_mode=cfg.free_cache_engine,
            # The colocated engine shares its GPUs with the trainer; vLLM's custom all-reduce buffers do not
            # survive sleep/wake and clash with the trainer's memory (verl sets the same). The other two
            # all-reduce paths are switched off through the environment: engine_env.
            disable_custom_all_reduce=True,
        )
    if world_size > 1:
        # SPMD: every rank of the worker group owns an engine; ranks of one TP group run the same
        # schedule and vLLM reuses the caller's process group (VERL's hybrid engine).
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs
