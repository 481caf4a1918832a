"""Test support for multi-rank code on one machine.

``run_gloo_ranks`` lives in the development package (``luffy_pool_dev.gloo_ranks``, dev/; a benchmark uses it too)
and is re-exported here for the tests; ``load_fully_sharded`` is the tests' own.
"""

from __future__ import annotations

import torch

from luffy_pool_dev.gloo_ranks import run_gloo_ranks

__all__ = ["load_fully_sharded", "run_gloo_ranks"]


def load_fully_sharded(model_dir: str, mesh):
    """An HF causal LM from ``model_dir`` (fp32, sdpa) under plain ``fully_shard``: each decoder layer, then the
    root, with torch's defaults (the root stays unsharded after forward). Tests that need exactly that layout
    use it; the workers' own layout (mixed precision, offload, wrap policy) is ``verl.utils.fsdp_utils.apply_fsdp2``.
    """
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
