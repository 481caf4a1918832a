"""Small tensor helpers the methods' losses share: the authors' masked means (which differ in their empty-mask
behaviour and ε), the policy-shaping function, the LUFFY-lineage clipped on-policy term and the aggregation.

Each authors' codebase carries its own ``masked_mean``: the LUFFY-lineage forks (ElliottYan/LUFFY,
TsinghuaC3I/Unify-Post-Training, TheRoadQaQ/ReLIFT) use ``Σ v·m / Σ m`` (NaN on an empty mask, which their actors
then test for), Trinity-RFT adds 1e-8 to the denominator (0 on an empty mask). Golden tests compare bit for bit,
so each method uses the one its authors use.
"""

from __future__ import annotations

import torch


def masked_mean_plain(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ v·m / Σ m`` (verl 0.2's ``masked_mean``, as in the LUFFY-lineage forks): NaN when empty."""
    if axis is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim=axis) / mask.sum(dim=axis)


def masked_mean_eps(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ v·m / (Σ m + 1e-8)`` (Trinity-RFT's ``trinity.algorithm.utils.masked_mean``): 0 when empty."""
    if axis is None:
        return (values * mask).sum() / (mask.sum() + 1e-8)
    return (values * mask).sum(dim=axis) / (mask.sum(dim=axis) + 1e-8)


def shaped(weight: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """Policy shaping ``f(w) = w / (w + γ)`` (LUFFY's ``p_div_p_γ``)."""
    return weight / (weight + gamma)


# off_policy_reshape values the LUFFY-lineage losses accept, and their γ (None: no shaping)
OFF_POLICY_RESHAPES = {"no_reshape": None, "p_div_p_0.1": 0.1, "p_div_p_0.3": 0.3, "p_div_p_0.5": 0.5}


def shape_off_ratio(ratio: torch.Tensor, reshape: str, loss: str) -> torch.Tensor:
    """``ratio`` through ``off_policy_reshape`` (``p_div_p_γ``: ``w/(w+γ)``); ValueError naming ``loss``
    for a reshape outside :data:`OFF_POLICY_RESHAPES` (the ones the released scripts use)."""
    if reshape not in OFF_POLICY_RESHAPES:
        raise ValueError(f"{loss} supports off_policy_reshape in {list(OFF_POLICY_RESHAPES)}, got {reshape!r}")
    gamma = OFF_POLICY_RESHAPES[reshape]
    return ratio if gamma is None else shaped(ratio, gamma)


def clipped_on_losses(
    adv: torch.Tensor, value: torch.Tensor, clamp_arg: torch.Tensor, mask: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LUFFY-lineage on-policy term: ``−A·value``, and unless ``cfg.loss_remove_clip`` the max with
    ``−A·clamp(clamp_arg, 1−ε, max(clip_upper_bound, 1+ε))`` -> (losses, clip fraction over ``mask``)."""
    losses = -adv * value
    if cfg.loss_remove_clip:
        return losses, torch.tensor(0.0)
    upper = max(cfg.clip_upper_bound, 1.0 + cfg.clip_ratio)
    losses2 = -adv * torch.clamp(clamp_arg, 1.0 - cfg.clip_ratio, upper)
    clipfrac = masked_mean_plain(torch.gt(losses2, losses).float(), mask)
    return torch.max(losses, losses2), clipfrac


def aggregate(pg_losses: torch.Tensor, mask: torch.Tensor, remove_token_mean: bool) -> torch.Tensor:
    """``Σ L·m / width`` (``loss_remove_token_mean``) or the plain token mean."""
    if remove_token_mean:
        return (pg_losses * mask).sum() / mask.shape[-1]
    return masked_mean_plain(pg_losses, mask)
