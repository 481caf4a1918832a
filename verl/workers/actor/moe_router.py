"""MoE router statistics of the actor's update: the auxiliary load-balancing loss and a load-balance metric.

A forward hook on each top-k router (Qwen3-MoE's ``mlp.gate``, transformers' ``Qwen3MoeTopKRouter``: it returns
``(router_logits [T, E], scores, indices [T, k])``) records what the update's forward routed, whatever path ran
the model (padded rows, packed rows, the chunked scoring head, Ulysses shards); the log-prob passes record
nothing. Per micro-batch the actor logs

- ``actor/moe_aux_loss``: the Switch Transformer load-balancing loss (Fedus et al. 2021, eqs. 4-6),
  ``E * sum_e f_e * P_e`` with ``f_e`` the share of top-k assignments to expert e and ``P_e`` its mean router
  probability, both pooled over the layers as transformers' ``load_balancing_loss_func`` pools them (what
  ``router_aux_loss_coef`` scales when Qwen3-MoE is trained with ``output_router_logits``); 1.0 when balanced;
- ``actor/moe_load_max_over_mean``: per layer, the busiest expert's top-k assignments over the mean per expert
  (1.0 = even, E/k = every token to the same experts), averaged over the layers.

``actor.router_aux_loss_coef`` (default 0.0) adds ``coef * aux`` to the loss; at 0.0 it is only logged, as verl's
FSDP actor leaves the aux loss out of the RL loss. Padding tokens are left out when the router saw padded rows.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import nn


def _is_router(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        hasattr(module, "top_k")
        and hasattr(module, "num_experts")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.shape[0] == module.num_experts
    )


def _token_weights(rows: int, attention_mask: Optional[torch.Tensor], device) -> Optional[torch.Tensor]:
    """[rows] weights of the routed tokens: the attention mask when the router saw the padded rows, else None
    (packed rows hold real tokens only; other layouts count every routed token)."""
    if attention_mask is None or rows != attention_mask.numel():
        return None
    return attention_mask.reshape(-1).to(device=device, dtype=torch.float32)


def _layer_stats(logits: torch.Tensor, indices: torch.Tensor, num_experts: int, weights: Optional[torch.Tensor]):
    """(top-k assignments per expert [E], router probabilities summed per expert [E], tokens) of one layer."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_k = indices.shape[-1]
    if weights is None:
        weights = probs.new_ones(probs.shape[0])
    counts = probs.new_zeros(num_experts).scatter_add_(0, indices.reshape(-1), weights.repeat_interleave(top_k))
    return counts, (probs * weights[:, None]).sum(0), weights.sum()


def load_balancing_loss(
    routed: list[tuple[torch.Tensor, torch.Tensor]], num_experts: int, attention_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Switch load-balancing loss of the layers' ``(router_logits [T, E], top-k indices [T, k])``, pooled over layers."""
    counts, probs, rows = 0.0, 0.0, 0.0
    for logits, indices in routed:
        c, p, n = _layer_stats(
            logits, indices, num_experts, _token_weights(logits.shape[0], attention_mask, logits.device)
        )
        counts, probs, rows = counts + c, probs + p, rows + n
    if not routed or float(rows) == 0:
        return torch.zeros(())
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def load_max_over_mean(
    routed: list[tuple[torch.Tensor, torch.Tensor]], num_experts: int, attention_mask: Optional[torch.Tensor] = None
) -> float:
    """Mean over layers of (max over experts of the top-k assignments) / (their mean per expert)."""
    ratios = []
    with torch.no_grad():
        for logits, indices in routed:
            weights = _token_weights(logits.shape[0], attention_mask, logits.device)
            counts, _, _ = _layer_stats(logits, indices, num_experts, weights)
            if float(counts.sum()) > 0:
                ratios.append(float(counts.max() / counts.mean()))
    return sum(ratios) / len(ratios) if ratios else 0.0


class RouterRecorder:
    """Forward hooks on a model's top-k routers; records ``(logits, indices)`` per layer inside :meth:`recording`."""

    def __init__(self, routers: list[nn.Module]):
        self.num_experts = int(routers[0].num_experts)
        self._routed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._active = False
        self.handles = [r.register_forward_hook(self._hook) for r in routers]

    @classmethod
    def attach(cls, module: nn.Module) -> Optional["RouterRecorder"]:
        """A recorder on ``module``'s routers, or None for a dense model."""
        routers = [m for m in module.modules() if _is_router(m)]
        return cls(routers) if routers else None

    def _hook(self, module, args, output) -> None:
        # gradient checkpointing re-runs the forward in backward: recording is off by then
        if self._active:
            self._routed.append((output[0], output[2]))

    @contextlib.contextmanager
    def recording(self):
        self._routed, self._active = [], True
        try:
            yield self
        finally:
            self._active = False

    def loss_term(self, attention_mask: Optional[torch.Tensor], coef: float, metrics: dict):
        """Log the recorded forward's aux loss and load metric into ``metrics``; return ``coef * aux`` (0.0 when
        ``coef`` is 0). Clears the record."""
        routed, self._routed = self._routed, []
        aux = load_balancing_loss(routed, self.num_experts, attention_mask)
        metrics["actor/moe_aux_loss"] = float(aux.detach())
        metrics["actor/moe_load_max_over_mean"] = load_max_over_mean(routed, self.num_experts, attention_mask)
        return coef * aux if coef else 0.0
