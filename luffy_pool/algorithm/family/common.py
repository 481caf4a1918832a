"""Small tensor helpers the family's modules share: the authors' masked means (which differ in their
empty-mask behaviour and ε) and the policy-shaping function.

Each authors' codebase carries its own ``masked_mean``: the LUFFY-lineage forks (ExGRPO, HPT/SRFT, ReLIFT) use
``Σ v·m / Σ m`` (NaN on an empty mask, which their actors then test for), Trinity-RFT (CHORD) adds 1e-8 to the
denominator (0 on an empty mask). Golden tests compare bit for bit, so each module uses the one its authors use.
"""
from __future__ import annotations

import torch


def masked_mean_plain(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ v·m / Σ m`` (verl 0.2's ``masked_mean``, as in LUFFY, ExGRPO, HPT and ReLIFT): NaN when empty."""
    if axis is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim=axis) / mask.sum(dim=axis)


def masked_mean_eps(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ v·m / (Σ m + 1e-8)`` (Trinity-RFT's ``trinity.algorithm.utils.masked_mean``): 0 when empty."""
    if axis is None:
        return (values * mask).sum() / (mask.sum() + 1e-8)
    return (values * mask).sum(dim=axis) / (mask.sum(dim=axis) + 1e-8)


def shaped(weight: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """Policy shaping ``f(w) = w / (w + γ)`` (LUFFY's ``p_div_p_γ``; ExGRPO applies it to π_θ/π_recorded)."""
    return weight / (weight + gamma)
