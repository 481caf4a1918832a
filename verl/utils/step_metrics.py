"""The actor update's step metrics, reduced so they do not depend on how a mini-batch is cut into micro-batches.

``update_policy`` computes each loss metric per micro-batch, already averaged over that micro-batch's tokens
(``off_policy_prob`` over its off-policy tokens, ``ppo_kl`` over its response tokens, ...). Averaging those
values with equal weight, as LUFFY's code does, makes the step's number depend on the micro-batching: with
``use_dynamic_bsz`` a 64-row micro-batch and a 3-row one count the same, and a micro-batch without any
off-policy token adds a 0 to ``off_policy_prob``. ``actor.metric_aggregation`` chooses:

- ``token_weighted``: each metric carries ``(value x tokens, tokens)`` over the tokens it is defined on
  (:data:`LOSS_METRIC_TOKENS`, which each loss declares when it registers; response tokens unless listed) and is
  reduced once for the step, over every micro-batch, mini-batch and data-parallel rank: the token mean over the
  whole step. A micro-batch without
  a metric's tokens contributes nothing (the step logs 0 only when no micro-batch had any).
  ``actor/pg_loss`` is the loss as the optimizer saw it: per mini-batch the sum of the micro-batch losses as
  scaled for gradient accumulation, one entry per optimizer step (averaged over ranks, as FSDP averages the
  gradients), like ``actor/grad_norm``; the driver's ``reduce_metrics`` averages the entries.
- ``micro_batch_mean`` (LUFFY): one list entry per micro-batch; the driver averages them with equal weight.
"""

from __future__ import annotations

from typing import Optional

import torch

METRIC_AGGREGATIONS = ("token_weighted", "micro_batch_mean")

# The loss metrics reported as the optimizer saw them (summed over a mini-batch's micro-batches / grad accum).
OPTIMIZER_LOSS_KEYS = ("actor/pg_loss",)

# The token sets a metric may be averaged over:
#   valid: the micro-batch's response tokens (a metric no loss lists: entropy, KL loss, most losses' own);
#   off / on: response tokens inside / outside the prefix (off-policy) mask;
#   off_rows / on_rows: response tokens of rows with / without any off-policy token.
METRIC_TOKEN_SETS = ("valid", "off", "on", "off_rows", "on_rows")
# loss name -> {metric key: token set} for the metrics of a registered loss not averaged over ``valid``; filled
# by ``register_policy_loss(name, metric_tokens=...)`` (verl/trainer/ppo/core_algos.py).
LOSS_METRIC_TOKENS: dict[str, dict[str, str]] = {}


def token_counts(response_mask: torch.Tensor, prefix_mask: Optional[torch.Tensor]) -> dict[str, float]:
    """Sizes of the token sets of :data:`LOSS_METRIC_TOKENS` in one micro-batch."""
    valid = response_mask.bool()
    counts = {"valid": float(valid.sum())}
    if prefix_mask is not None:
        prefix = prefix_mask.bool() & valid
        off_rows = prefix_mask.bool().any(dim=-1, keepdim=True)
        counts.update(
            off=float(prefix.sum()),
            on=float((valid & ~prefix_mask.bool()).sum()),
            off_rows=float((valid & off_rows).sum()),
            on_rows=float((valid & ~off_rows).sum()),
        )
    return counts


class StepMetrics:
    """Collects one update step's actor metrics; :meth:`result` returns the metric lists the worker sends.

    Args:
        aggregation: one of :data:`METRIC_AGGREGATIONS`.
        policy_loss: the registered loss name, which picks the metrics' token sets.
        grad_accum: the divisor of each micro-batch loss (``RankBatchSizes.gradient_accumulation``).
    """

    def __init__(self, aggregation: str, policy_loss: str, grad_accum: int):
        if aggregation not in METRIC_AGGREGATIONS:
            raise ValueError(
                f"actor_rollout_ref.actor.metric_aggregation={aggregation!r}; valid: {list(METRIC_AGGREGATIONS)}"
            )
        self.aggregation = aggregation
        self.tokens_of = LOSS_METRIC_TOKENS.get(policy_loss, {})
        self.grad_accum = grad_accum
        self.weighted: dict[str, list[float]] = {}  # key -> [Σ value·weight, Σ weight]
        self.per_step: dict[str, list[float]] = {}  # key -> one entry per optimizer step
        self.mini_loss: dict[str, float] = {}  # the optimizer loss keys of the mini-batch in progress

    def add_micro_batch(
        self, metrics: dict[str, float], response_mask: torch.Tensor, prefix_mask: Optional[torch.Tensor] = None
    ) -> None:
        """One micro-batch's metrics (each averaged over that micro-batch's own tokens)."""
        if self.aggregation == "micro_batch_mean":
            for k, v in metrics.items():
                self.per_step.setdefault(k, []).append(v)
            return
        counts = token_counts(response_mask, prefix_mask)
        for k, v in metrics.items():
            if k in OPTIMIZER_LOSS_KEYS:
                self.mini_loss[k] = self.mini_loss.get(k, 0.0) + v / self.grad_accum
                continue
            weight = counts[self.tokens_of.get(k, "valid")]
            acc = self.weighted.setdefault(k, [0.0, 0.0])
            if weight > 0:  # an empty set adds nothing (its value is a placeholder 0)
                acc[0] += float(v) * weight
                acc[1] += weight

    def end_mini_batch(self, grad_norm: float) -> None:
        """Close a mini-batch: its optimizer step's grad norm and (token_weighted) its optimizer loss."""
        self.per_step.setdefault("actor/grad_norm", []).append(grad_norm)
        for k, v in self.mini_loss.items():
            self.per_step.setdefault(k, []).append(v)
        self.mini_loss = {}

    def result(self, dp_group=None) -> dict[str, list]:
        """``{key: [values]}``: token means over the step (one value), per-step entries, or LUFFY's lists.

        With a ``dp_group`` of several ranks (token_weighted) the sums and the optimizer losses are
        all-reduced first, so every rank returns the step over all ranks' rows; all ranks must call this.
        """
        out = {k: list(v) for k, v in self.per_step.items()}
        if self.aggregation == "micro_batch_mean":
            return out
        keys = sorted(self.weighted)
        loss_keys = sorted(k for k in out if k in OPTIMIZER_LOSS_KEYS)
        flat = [x for k in keys for x in self.weighted[k]] + [x for k in loss_keys for x in out[k]]
        world = _group_size(dp_group)
        if world > 1 and flat:
            import torch.distributed as dist

            from verl.utils.seqlen_balancing import _collective_device

            buf = torch.tensor(flat, dtype=torch.float64, device=_collective_device(dp_group))
            dist.all_reduce(buf, group=dp_group)
            flat = buf.cpu().tolist()
        for i, k in enumerate(keys):
            total, weight = flat[2 * i], flat[2 * i + 1]
            out[k] = [total / weight if weight > 0 else 0.0]  # no token of its set in the whole step: 0, as LUFFY
        pos = 2 * len(keys)
        for k in loss_keys:
            n = len(out[k])
            out[k] = [x / world for x in flat[pos : pos + n]]
            pos += n
        return out


def _group_size(group) -> int:
    if group is None:
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
