"""Methods mixed into every vLLM worker (``worker_extension_cls``) to receive trainer weights.

vLLM instantiates its Worker with this class as an extra base, so ``self`` is the worker. A weight push is one
in-place layer-wise reload, the one path that re-packs the CPU backend's linear weights (plain
``model.load_weights`` fails there, docs/CPU_STACK.md §7.3), opened once, fed bucket by bucket and closed once:
``begin_weight_push`` / ``load_weight_bucket`` / ``finish_weight_push`` are the three steps of vLLM 0.32's
``reload_weights`` (vllm/model_executor/model_loader/reload/inplace.py: ``initialize_layerwise_reload``,
``model.load_weights``, ``finalize_layerwise_reload``, then the runner's cache resets), so the two walks over every
module happen once per push instead of once per bucket.
"""

from __future__ import annotations

from typing import Union

import torch

# A push payload: safetensors bytes when the RPC crosses a process boundary (msgpack turns nested
# tensors into lists), or the (name, tensor) pairs themselves for an in-process engine.
WeightPayload = Union[bytes, list[tuple[str, torch.Tensor]]]

# What vLLM's model runners reset after an in-place reload (V1 and V2 reload_weights alike).
RUNNER_RESETS = ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache")


def decode_weight_payload(payload: WeightPayload) -> list[tuple[str, torch.Tensor]]:
    """Turn a push payload back into (HF name, tensor) pairs."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        from safetensors.torch import load as load_safetensors

        return list(load_safetensors(bytes(payload)).items())
    return list(payload)


def repack_tied_cpu_weights(model: torch.nn.Module) -> int:
    """Re-pack, on the CPU backend, every layer whose weight is tied to another's; returns how many were re-packed.

    vLLM's CPU linear layers compute from a copy of the weight packed when the layer is processed
    (vllm/model_executor/layers/utils.py ``dispatch_cpu_unquantized_gemm``). A tied LM head shares the embedding's
    parameter (``ParallelLMHead.tie_weights``) but is a layer of its own that receives no tensor in a push (the
    trainer sends the shared tensor once, as the embedding), so the layer-wise reload never processes it and its
    packed copy kept the weights it was loaded with: the engine sampled from a stale head after every push
    (Qwen2.5-Math-1.5B and Qwen3-4B tie theirs). GPU layers read the parameter itself, so nothing is needed there.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    by_storage: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and not weight.is_meta and hasattr(module, "cpu_linear"):
            by_storage.setdefault(weight.data_ptr(), []).append(module)
    repacked = 0
    for modules in by_storage.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)
                repacked += 1
    return repacked


class WeightSyncExtension:
    """Worker-side entry points called through ``LLM.collective_rpc``."""

    def update_weights_from_payload(self, payload: WeightPayload) -> int:
        """Reload the given HF-named tensors in place in one reload of its own; returns how many were applied.

        Every vLLM module touched by the payload must receive all of its checkpoint tensors in this one call (e.g.
        q/k/v and their biases for a fused ``qkv_proj``): the reload finalises a module whose inputs arrived only in
        part with its old values for the rest. A bucketed push goes through ``begin_weight_push`` instead.
        """
        named = decode_weight_payload(payload)
        self.reload_weights(weights_iterator=iter(named))
        repack_tied_cpu_weights(self.model_runner.get_model())
        return len(named)

    def begin_weight_push(self) -> None:
        """Open the push's reload: every layer's current tensors are kept (the ones CUDA graphs point at) and its
        weight loaders buffer what arrives until the layer is complete, then process and copy it in place."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def load_weight_bucket(self, payload: WeightPayload) -> int:
        """Feed one bucket of HF-named tensors to the open reload; returns how many were given. A layer may span
        buckets: it is processed once its last tensor arrives (or when the push finishes)."""
        from vllm.config import set_current_vllm_config

        named = decode_weight_payload(payload)
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(iter(named))
        return len(named)

    def finish_weight_push(self) -> None:
        """Close the push's reload: layers left (attention, padded tensors, any not pushed: these keep their
        values) are processed, the loaders unwrapped, and the runner drops state derived from the old weights."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)
        repack_tied_cpu_weights(runner.get_model())
        for reset in RUNNER_RESETS:
            getattr(runner, reset)()

    def weight_sums(self, names: list[str]) -> dict[str, float]:
        """float64 sums of the engine's parameters named ``names`` (vLLM names; on a TP rank, its shard):
        a cheap check that a weight sync arrived (``exp_scripts/gpu_smoke.py``)."""
        params = dict(self.model_runner.model.named_parameters())
        return {n: float(params[n].detach().double().sum()) for n in names if n in params}
