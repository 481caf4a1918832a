"""The fixed hook protocol of the training step, and the narrow context hooks are built from.

The trainer (luffy_pool/trainer/mix_trainer.py) runs each stage of the step as one loop over its active hooks (the
method's, self-replay's, later ones), in this order:

- ``compose(batch) -> (batch, metrics)``: the step's prompts, before they are recorded and rolled out (ExGRPO
  replaces part of them with experience questions; ReLIFT keeps them with their demonstrations).
- ``plan_slots(batch, gen_batch, ratios, step) -> (ratios, metrics)``: the slot plan of the rollout: the
  ``[B, n]`` prefix ratios, and per-slot traces written into ``gen_batch`` (LUFFY's sampler draws ``ratios``
  first; a hook may replace it: Prefix-RFT's schedule, UFT's hints, ExGRPO's replayed trajectories).
- ``after_score(batch, step) -> metrics``: after every row is rewarded, before the log-prob passes.
- ``after_log_probs(batch, step) -> metrics``: after the old / reference log-prob passes.
- ``before_update(batch) -> (metrics, update_state)``: after the advantage, before the actor's update; it may add
  per-row tensors the loss reads (``Method.batch_keys``) and return a small dict sent with the update
  (``meta_info["update_state"]``, e.g. ExGRPO's phase) next to the step.
- ``after_update(batch, timing) -> metrics``: after the actor's update (ReLIFT's SFT stage, ExGRPO's retirement).
- ``state_dict()`` / ``load_state_dict(state)``: saved with the trainer's state in the checkpoint's ``data.pt``
  under the hook's ``name``, by one path (the trainer's ``state_dict``).

Every default does nothing, so a hook overrides only its stages. A hook that reads or rewrites the old log-probs
sets ``needs_old_log_probs`` (the trainer then never skips the old-log-prob pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class StepContext:
    """What a hook may use: the sections, the actor worker group (``compute_log_prob``, ``sft_update_actor``, ...),
    the tokenizer, the training dataset and its collate function, and the run's shape."""

    sections: Any
    wg: Any
    tokenizer: Any
    dataset: Any
    collate_fn: Optional[Callable]
    world_size: int
    response_length: int
    total_steps: int
    knobs: Any = None


class StepHooks:
    """A hook of the step: override the stages it takes part in (module docstring). ``name`` keys its state."""

    name = "hooks"
    needs_old_log_probs = False

    def compose(self, batch):
        return batch, {}

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        return ratios, {}

    def after_score(self, batch, step: int) -> dict:
        return {}

    def after_log_probs(self, batch, step: int) -> dict:
        return {}

    def before_update(self, batch) -> tuple[dict, dict]:
        return {}, {}

    def after_update(self, batch, timing: dict) -> dict:
        return {}

    def state_dict(self) -> Optional[dict]:
        return None

    def load_state_dict(self, state: dict) -> None:
        return None
