"""The model's attention heads against the Ulysses SP degree, the actor's and vLLM's TP degrees: the worker's check
(``check_heads``) and the config checker's (``WorkerSections.validate`` and ``ConfigSections`` read a local
model's heads with ``local_model_heads``), so a layout whose heads do not split is one line naming the key before
any worker starts. ``local_model_config`` also gives the checker the model's position limit
(``ConfigSections.validate``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

SP_KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


def sp_heads_error(num_heads: int, num_kv_heads: int, sp_size: int) -> Optional[str]:
    """Heads must split over the SP ranks; kv heads must split too, or be fewer and repeat evenly (GQA)."""
    if num_heads % sp_size:
        return f"'{SP_KEY}'={sp_size} must divide the model's num_attention_heads={num_heads}"
    if num_kv_heads % sp_size and sp_size % num_kv_heads:
        return (
            f"'{SP_KEY}'={sp_size} and the model's num_key_value_heads={num_kv_heads}: one must divide "
            f"the other (kv heads are split over, or repeated across, the SP ranks)"
        )
    return None


TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def tp_heads_error(num_heads: int, num_kv_heads: int, tp_size: int) -> Optional[str]:
    """vLLM splits query heads over its TP ranks and kv heads too, or replicates them when there are fewer kv heads
    than ranks (vllm/model_executor/layers/linear.py QKVParallelLinear): both must divide evenly."""
    if num_heads % tp_size:
        return f"'{TP_KEY}'={tp_size} must divide the model's num_attention_heads={num_heads}"
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        return (
            f"'{TP_KEY}'={tp_size} and the model's num_key_value_heads={num_kv_heads}: one must divide the other "
            "(vLLM splits kv heads over its TP ranks, or replicates them)"
        )
    return None


ACTOR_TP_KEY = "actor_rollout_ref.actor.tensor_model_parallel_size"


def actor_tp_heads_error(num_heads: int, num_kv_heads: int, tp_size: int) -> Optional[str]:
    """The actor's tensor parallelism (verl/utils/tensor_parallel.py) splits query and kv heads over its tp ranks
    and never replicates kv heads (transformers' plan has no such style): tp must divide both."""
    for what, n in (("num_attention_heads", num_heads), ("num_key_value_heads", num_kv_heads)):
        if n % tp_size:
            return f"'{ACTOR_TP_KEY}'={tp_size} must divide the model's {what}={n} (heads are split over tp ranks)"
    return None


def check_heads(num_heads: int, num_kv_heads: int, sp_size: int) -> None:
    """``sp_heads_error`` as a ValueError (the worker's check when it builds the SP model)."""
    problem = sp_heads_error(num_heads, num_kv_heads, sp_size)
    if problem:
        raise ValueError(problem)


def local_model_config(path: Optional[str], overrides: Optional[Mapping[str, Any]] = None) -> Optional[dict]:
    """The config.json of a local HF folder or a cached hub id, with ``model.override_config`` applied (None when
    neither is on disk: the launcher's pre-flight reads it once the model is resolved)."""
    if not isinstance(path, str):
        return None
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        from verl.utils.model_source import cached_snapshot, is_local_path

        snap = None if is_local_path(path) else cached_snapshot(path)  # a hub id already in the cache
        if snap is None or not os.path.isfile(os.path.join(snap, "config.json")):
            return None
        config = os.path.join(snap, "config.json")
    with open(config) as f:
        cfg = json.load(f)
    cfg.update(overrides or {})
    return cfg


def local_model_heads(path: Optional[str], overrides: Optional[Mapping[str, Any]] = None) -> Optional[tuple[int, int]]:
    """(attention heads, kv heads) from ``local_model_config`` (None when it is not on disk or names none)."""
    cfg = local_model_config(path, overrides)
    heads = None if cfg is None else cfg.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    return heads, int(cfg.get("num_key_value_heads") or heads)
