"""Config checks of the actor's parallel layout: Ulysses SP degree and HSDP ``fsdp_size`` against the world
size, the attention kernel and the model's heads. Pure functions of the flattened config (dotted keys), so
``luffy_pool/config/check.py`` reports every problem as one line before any worker starts.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

_A = "actor_rollout_ref.actor"
_REF = "actor_rollout_ref.ref"
SP_KEY = f"{_A}.ulysses_sequence_parallel_size"
FSDP_SIZE_KEY = f"{_A}.fsdp_config.fsdp_size"


def check_heads(num_heads: int, num_kv_heads: int, sp_size: int) -> None:
    """Heads must split over the SP ranks; kv heads must split too, or be fewer and repeat evenly (GQA)."""
    key = SP_KEY
    if num_heads % sp_size:
        raise ValueError(f"'{key}'={sp_size} must divide the model's num_attention_heads={num_heads}")
    if num_kv_heads % sp_size and sp_size % num_kv_heads:
        raise ValueError(f"'{key}'={sp_size} and the model's num_key_value_heads={num_kv_heads}: one must divide "
                         f"the other (kv heads are split over, or repeated across, the SP ranks)")


def _local_model_heads(path: Optional[str], overrides: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """(attention heads, kv heads) from the config.json of a local HF folder or a cached hub id (else None)."""
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
    heads = cfg.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    return heads, int(cfg.get("num_key_value_heads") or heads)


def parallel_config_errors(get) -> list[str]:
    """One line per problem; ``get(key, default)`` reads the flattened config."""
    errors = []
    world = get("trainer.nnodes", 1) * get("trainer.n_gpus_per_node", 1)
    sp = get(SP_KEY, 1)
    ref_sp = get(f"{_REF}.ulysses_sequence_parallel_size", sp)
    if ref_sp != sp:
        errors.append(f"'{_REF}.ulysses_sequence_parallel_size'={ref_sp} must equal '{SP_KEY}'={sp} (actor and "
                      f"reference share one worker and its SP groups)")
    fsdp_size = get(FSDP_SIZE_KEY, -1)
    if isinstance(fsdp_size, int) and fsdp_size > 0 and world % fsdp_size:
        errors.append(f"'{FSDP_SIZE_KEY}'={fsdp_size} must divide the world size {world} (trainer.nnodes * "
                      f"trainer.n_gpus_per_node), or be -1 to shard over all ranks")
    if not isinstance(sp, int) or sp <= 1:
        return errors
    if get("actor_rollout_ref.model.attn_implementation", "auto") == "eager":
        errors.append(f"'{SP_KEY}'={sp} needs sdpa or flash attention; "
                      f"'actor_rollout_ref.model.attn_implementation'=eager is not supported with it")
    heads = _local_model_heads(get("actor_rollout_ref.model.path"), get("actor_rollout_ref.model.override_config", {}))
    if heads is not None:
        try:
            check_heads(heads[0], heads[1], sp)
        except ValueError as exc:
            errors.append(f"{exc} (from {get('actor_rollout_ref.model.path')}/config.json)")
    return errors
