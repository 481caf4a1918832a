"""Methods mixed into every vLLM worker (``worker_extension_cls``) to receive trainer weights.

vLLM instantiates its Worker with this class as an extra base, so ``self`` is the worker and
``self.reload_weights`` is vLLM's in-place layerwise reload, the one path that re-packs the CPU
backend's linear weights (plain ``model.load_weights`` fails there, docs/CPU_STACK.md §7.3).
"""
from __future__ import annotations

from typing import Union

import torch

# A push payload: safetensors bytes when the RPC crosses a process boundary (msgpack turns nested
# tensors into lists), or the (name, tensor) pairs themselves for an in-process engine.
WeightPayload = Union[bytes, list[tuple[str, torch.Tensor]]]


def decode_weight_payload(payload: WeightPayload) -> list[tuple[str, torch.Tensor]]:
    """Turn a push payload back into (HF name, tensor) pairs."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        from safetensors.torch import load as load_safetensors

        return list(load_safetensors(bytes(payload)).items())
    return list(payload)


class WeightSyncExtension:
    """Worker-side entry points called through ``LLM.collective_rpc``."""

    def update_weights_from_payload(self, payload: WeightPayload) -> int:
        """Reload the given HF-named tensors in place; returns how many tensors were applied.

        Every vLLM module touched by the payload must receive all of its checkpoint tensors in this
        one call (e.g. q/k/v and their biases for a fused ``qkv_proj``): the layerwise reload
        processes a module whose inputs arrived only in part with uninitialised values for the rest.
        The rollout side groups tensors by decoder layer to guarantee that.
        """
        named = decode_weight_payload(payload)
        self.reload_weights(weights_iterator=iter(named))
        return len(named)

    def weight_sums(self, names: list[str]) -> dict[str, float]:
        """float64 sums of the engine's parameters named ``names`` (vLLM names; on a TP rank, its shard):
        a cheap check that a weight sync arrived (``exp_scripts/gpu_smoke.py``)."""
        params = dict(self.model_runner.model.named_parameters())
        return {n: float(params[n].detach().double().sum()) for n in names if n in params}
