"""The inputs the methods' losses read: :class:`FamilyLossInputs` and :func:`require`.

A method's pure loss blocks have the call shape ``fn(inputs: FamilyLossInputs, cfg) -> (loss, metrics)`` of
``verl.trainer.ppo.core_algos`` (``cfg`` read by attribute, ``metrics`` scalar tensors or floats), as in their
authors' code. :class:`FamilyLossInputs` extends ``PolicyLossInputs`` with the tensors the methods need (token
entropies, expert/correct-row masks, the step) and with what the method's ``loss(inputs, knobs, step)`` builds
its block's ``cfg`` from: the actor's loss section, its batch sizes, the expert-row share of the slot plan and the
hooks' ``update_state`` (luffy_pool/methods/losses.py builds them in the actor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from verl.trainer.ppo.loss_inputs import PolicyLossInputs


@dataclass(frozen=True)
class FamilyLossInputs(PolicyLossInputs):
    """``PolicyLossInputs`` plus the family's tensors, each ``[rows, response_length]`` unless noted.

    ``entropy``: token entropies of the current policy (SRFT's weights, ReLIFT's bonus); ``expert_mask``
    ``[rows]`` bool: expert (demonstration) rows; ``correct_mask`` ``[rows]`` bool: rows whose sequence score is
    exactly 1 (SRFT's sign rule); ``step``: the update's step (0 on the first update; a step schedule reads it);
    ``method_batch``: the micro-batch's tensors of the method's ``batch_keys`` (what its hooks added, e.g. a
    teacher's log-probs). A loss that needs an absent field raises ValueError naming it.
    """

    entropy: Optional[Any] = None
    expert_mask: Optional[Any] = None
    correct_mask: Optional[Any] = None
    step: Optional[int] = None
    knobs: Optional[Any] = None
    settings: Optional[Any] = None
    batch_sizes: Optional[Any] = None
    expert_share: float = 0.0
    update_state: Optional[dict] = None
    method_batch: Optional[dict] = None


def require(inputs: FamilyLossInputs, field: str, loss: str) -> Any:
    """``inputs.<field>``, or ValueError naming the loss and the missing field."""
    value = getattr(inputs, field)
    if value is None:
        raise ValueError(f"the {loss} loss needs inputs.{field}")
    return value
