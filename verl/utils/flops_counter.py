"""Model FLOPs of an actor update and the device's peak, for LUFFY's ``mfu/actor`` metric.

The estimate is the usual dense-transformer count that LUFFY's verl uses: forward + backward of the weight
matmuls cost ``6 * N * tokens`` with ``N`` the matmul parameters (attention projections, the gated MLP's
three matrices, embedding and LM head), and attention scores ``12 * sum(seqlen^2) * head_dim * heads *
layers``. It reads a Hugging Face decoder config (``hidden_size``, ``intermediate_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size``);
a config without those fields gives 0 (LUFFY: 0 for anything but Qwen2 / Llama). The peak is bf16 dense
tensor-core throughput by device name; an unknown device (every CPU) has no peak, so ``mfu`` is 0 there as
in LUFFY, while the achieved TFLOP/s is still reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

# bf16 dense peak FLOP/s by CUDA device-name fragment (first match wins: more specific names first).
DEVICE_PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40", 181.05e12),
    ("L20", 119.5e12),
    ("A6000", 154.8e12),
    ("910B", 354e12),
)
_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def device_peak_flops(device_name: Optional[str]) -> Optional[float]:
    """Peak FLOP/s of a device by its name (``torch.cuda.get_device_name()``), None when unknown."""
    if not device_name:
        return None
    for fragment, flops in DEVICE_PEAK_FLOPS:
        if fragment in device_name:
            return flops
    return None


def current_device_peak_flops() -> Optional[float]:
    """Peak of this process's CUDA device, None on CPU or an unknown GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return device_peak_flops(torch.cuda.get_device_name())


class FlopsCounter:
    """``estimate_flops(seqlens, seconds) -> (achieved FLOP/s, peak FLOP/s or None)`` for one model config."""

    def __init__(self, config: Any, peak_flops: Optional[float] = None):
        self.config = config
        self.peak_flops = peak_flops

    def supported(self) -> bool:
        return all(isinstance(getattr(self.config, f, None), int) for f in _FIELDS)

    def step_flops(self, seqlens: Sequence[int]) -> float:
        """FLOPs of one forward + backward over sequences of these lengths (0 for an unsupported config)."""
        if not self.supported():
            return 0.0
        c = self.config
        heads = c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        attn_params = c.hidden_size * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
        mlp_params = 3 * c.hidden_size * c.intermediate_size  # gate, up, down
        dense = (attn_params + mlp_params) * c.num_hidden_layers + 2 * c.vocab_size * c.hidden_size
        tokens = sum(int(n) for n in seqlens)
        attention = 12 * sum(int(n) ** 2 for n in seqlens) * head_dim * heads * c.num_hidden_layers
        return float(6 * dense * tokens + attention)

    def estimate_flops(self, seqlens: Sequence[int], seconds: float) -> tuple[float, Optional[float]]:
        return self.step_flops(seqlens) / max(float(seconds), 1e-9), self.peak_flops


def update_flops_metrics(
    counter: FlopsCounter, seqlens: Sequence[int], seconds: float, passes: int = 1, share: float = 1.0
) -> dict[str, float]:
    """``mfu/actor`` (LUFFY's name: achieved / peak, 0 without a known peak) and ``perf/actor_tflops``
    (achieved TFLOP/s of this device) of an update that ran ``passes`` epochs over ``seqlens`` in
    ``seconds``; ``share`` is this device's part of the work (1 / sequence-parallel size)."""
    achieved, peak = counter.estimate_flops(seqlens, seconds)
    achieved *= passes * share
    return {"mfu/actor": achieved / peak if peak else 0.0, "perf/actor_tflops": achieved / 1e12}
