"""The driver's rollout-correction stage (algorithm.rollout_correction; verl's place: after the old log-probs,
before the advantages).

It compares the engine's sampling log-probs (``rollout_log_probs``, from ``rollout.calculate_log_probs``) with the
actor's recomputed ``old_log_probs`` on the on-policy tokens only, ``response_mask & ~prefix_mask``: LUFFY's
off-policy prefix and full-trace tokens were not sampled by the engine (their ``rollout_log_probs`` are 0) and
keep the off-policy loss's shaping, which models their behaviour policy. The math is
``verl.trainer.ppo.rollout_corr.rollout_correction``; this module only picks the tokens and writes the batch:

- ``rollout_is_weights`` (with ``rollout_is``): the truncated weights on on-policy tokens, 1 elsewhere, so a
  loss that multiplies every token's term by them leaves the off-policy tokens unchanged;
- ``response_mask`` (with ``rollout_rs``): the response mask less the rejected on-policy tokens; the actor then
  takes its loss mask from it instead of the attention mask (the forward pass still sees every token);
- the ``rollout_corr/*`` metrics.

With ``bypass_mode`` (:func:`bypass_old_log_probs`) there is no old-log-prob pass: the engine's log-probs are the
old ones on the tokens it sampled, and the off-policy tokens are marked unknown (NaN) for the actor to fill.
"""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.trainer.ppo.rollout_corr import rollout_correction

IS_WEIGHTS_KEY = "rollout_is_weights"


def enabled(rc) -> bool:
    """Whether the ``algorithm.rollout_correction`` section asks for weights or rejection."""
    return rc.rollout_is is not None or rc.rollout_rs is not None


def apply_rollout_correction(batch: DataProto, rc, response_length: int) -> dict:
    """Write ``rollout_is_weights`` / the rejected ``response_mask`` into ``batch`` per the section ``rc``
    (``algorithm.rollout_correction``); returns the ``rollout_corr/*`` metrics (none when the batch holds no
    on-policy token, e.g. every slot a full trace: then the weights are all 1 and nothing is rejected)."""
    t = batch.batch
    for key, why in (
        ("rollout_log_probs", "set actor_rollout_ref.rollout.calculate_log_probs=True"),
        ("old_log_probs", "the old-log-prob pass must run (the trainer forces it)"),
    ):
        if key not in t.keys():
            raise ValueError(f"algorithm.rollout_correction needs '{key}' in the batch: {why}")
    valid = t["attention_mask"][:, -response_length:]  # what the actor's loss mask is without rejection
    on_policy = valid.bool() & ~t["prefix_mask"].bool()
    old_log_probs = t["old_log_probs"]
    if rc.rollout_is is not None:
        t[IS_WEIGHTS_KEY] = torch.ones_like(old_log_probs)
    if rc.rollout_rs is not None:
        t["response_mask"] = valid.clone()
    if not bool(on_policy.any()):
        return {}
    out = rollout_correction(
        old_log_probs.float(),
        t["rollout_log_probs"].float(),
        on_policy.float(),
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )
    if out.weights is not None:
        t[IS_WEIGHTS_KEY] = torch.where(on_policy, out.weights.to(old_log_probs.dtype), t[IS_WEIGHTS_KEY])
    if rc.rollout_rs is not None:
        rejected = on_policy & ~out.response_mask.bool()
        t["response_mask"] = valid * (~rejected).to(valid.dtype)
    return out.metrics


def bypass_old_log_probs(batch: DataProto, response_length: int) -> None:
    """verl's ``bypass_mode``: write ``old_log_probs`` from ``rollout_log_probs`` instead of the actor's pass. On the
    tokens the engine sampled they are its log-probs; on the valid off-policy (prefix) tokens, which it did not
    sample, NaN, which the actor replaces with its current log-prob (verl/trainer/ppo/rollout_corr.py
    ``fill_unknown_old_log_probs``); 0 on padding."""
    t = batch.batch
    if "rollout_log_probs" not in t.keys():
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode needs 'rollout_log_probs' in the batch: set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    valid = t["attention_mask"][:, -response_length:].bool()
    off_policy = valid & t["prefix_mask"].bool()
    old = t["rollout_log_probs"].float().masked_fill(~valid, 0.0)
    t["old_log_probs"] = old.masked_fill(off_policy, float("nan"))
