"""How the actor runs a method's loss: one dispatch through verl's ``POLICY_LOSS_REGISTRY``.

A method with a ``loss`` registers it there under the method's name (``register_method``), and its preset sets
``actor.policy_loss`` to that name. The actor received the method and its frozen knobs once, at init
(``MethodSelection``); each micro-batch it builds :class:`~luffy_pool.methods.loss_inputs.FamilyLossInputs` with
the tensors the methods read (token entropies, expert rows: those with prefix tokens, correct rows:
``row_scores == 1``), the knobs, the update's step (``global_steps − 1``: 0 on the first update) and the hooks'
``update_state`` and the method's own per-row tensors (``Method.batch_keys``), and calls the registered entry,
which calls ``method.loss(inputs, knobs, step)``. Rows a hook's gate dropped (``loss_row_mask == 0``) get an
all-zero response mask.
"""

from __future__ import annotations

import torch

from luffy_pool.methods.base import get_method
from luffy_pool.methods.loss_inputs import FamilyLossInputs


def method_policy_loss(actor, micro: dict, log_prob, entropy, response_mask, global_steps, update_state):
    """The actor's ``compute_policy_loss`` for a method's loss -> (loss, metrics as ``actor/<name>`` floats)."""
    from verl.utils.batch_sizes import rank_batch_sizes

    if global_steps is None:
        raise ValueError(
            f"policy loss {actor.policy_loss!r} needs the update's step (meta_info['global_steps']), which the "
            f"trainer sends with every update"
        )
    mask = response_mask
    if "loss_row_mask" in micro:  # rows a gate dropped take no part in the loss
        mask = response_mask * micro["loss_row_mask"].to(response_mask.dtype).unsqueeze(-1)
    prefix = micro["prefix_mask"]
    selection = actor.method_selection
    own_keys = get_method(selection.name).batch_keys if selection is not None else ()
    inputs = FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=micro["old_log_probs"],
        advantages=micro["advantages"],
        response_mask=mask,
        prefix_mask=prefix,
        behaviour_log_probs=micro.get("behaviour_log_probs"),
        entropy=entropy.detach(),
        expert_mask=prefix.bool().any(-1),
        correct_mask=(micro["row_scores"] == 1.0) if "row_scores" in micro else None,
        step=int(global_steps) - 1,
        knobs=selection.knobs,
        settings=actor.update_config.loss,
        batch_sizes=actor.batch_sizes if actor.batch_sizes is not None else rank_batch_sizes(actor.config),
        expert_share=selection.expert_share,
        update_state=dict(update_state or {}),
        method_batch={k: micro[k] for k in own_keys if k in micro},
    )
    loss, out = actor.policy_loss_fn(inputs, actor.policy_loss_cfg)
    metrics = {f"actor/{k}": float(v.item() if torch.is_tensor(v) else v) for k, v in out.items()}
    metrics["actor/pg_loss"] = loss.item()
    extra = actor.extra_policy_loss(out, metrics)
    return (loss if extra is None else loss + extra), metrics
