"""Bookkeeping of ``trainer.rollout_pipeline`` on split engines: which batch is in flight, on which weights.

With ``one_step_off`` the driver launches the generation of batch N+1 (a Ray future on the rollout group) before
the actor trains on batch N, so it runs on the weights before update N: each batch records the policy version
that generated it (the number of updates those weights had seen) and the trainer logs
``rollout/staleness`` = updates made before the batch's own update minus that version (0 when generated right
before its update, 1 for a prefetched batch). ``sync`` never prefetches: every batch is generated at the start of
its own step (staleness 0).

A batch in flight is never saved with a checkpoint. Instead (the simplest correct choice) the driver does not
prefetch past a step that will be saved or is the last, and when a signal asks for a save while one is in flight,
the batch is dropped and the data / prefix-ratio samplers are rewound to before it was drawn, so the saved cursor
points at it. Either way the batch after a checkpoint is generated from the checkpoint's weights, in the
uninterrupted run and in a run resumed from that checkpoint alike, and the two are equal from there.

No weight push starts while a generation is in flight. The engines run their calls in order, so a push queued
behind a generation would hold the actor's rank 0 in the broadcast for the whole generation (and past the weight
group's collective timeout when it is long). A push outside a launch, i.e. the one before validation (``test_freq``
need not fall on the steps that do not prefetch), first finishes the batch in flight: it waits for its rows and
keeps them for its own step, whose staleness stays 1. Validation then scores the weights just trained, as in sync
mode and on the hybrid engine (so ``maybe_save_best`` pairs a score with the weights it saves), at the cost of one
push. The other choice, verl's (recipe/one_step_off_policy/ray_trainer.py ``fit`` at commit 0062357: ``_validate``
on the engines' current weights, no push), would score the weights before the last update; and a validation
generation queues behind the batch in flight either way, so the driver waits as long.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

PIPELINES = ("sync", "one_step_off")


@dataclass
class PendingRollout:
    """One launched generation: the step it is for and the policy version that generates it; ``handle`` holds
    what the trainer needs to finish it (its future, prompt rows, ratios, metrics); ``rewind`` the sampler states
    from before its batch was drawn; ``output`` its generated rows once waited for before its step (None: the
    engines may still be generating it)."""

    step: int
    version: int
    handle: Any = None
    rewind: Optional[dict] = None
    metrics: dict = field(default_factory=dict)
    output: Any = None


def staleness(step: int, version: int) -> int:
    """Updates the policy made between the weights that generated step ``step``'s batch and its own update
    (``step`` counts from 1; its update is the ``step``-th, so ``step - 1`` came before)."""
    if step < 1 or version < 0 or version > step - 1:
        raise ValueError(f"a batch for step {step} cannot come from policy version {version} (0 .. {step - 1})")
    return step - 1 - version


class RolloutPipeline:
    """The in-flight batch (at most one) and the decisions around it; the trainer does the Ray calls."""

    def __init__(self, mode: str) -> None:
        if mode not in PIPELINES:
            raise ValueError(f"trainer.rollout_pipeline={mode!r} must be one of {', '.join(PIPELINES)}")
        self.mode = mode
        self.pending: Optional[PendingRollout] = None

    @property
    def overlaps(self) -> bool:
        return self.mode == "one_step_off"

    def should_prefetch(self, step: int, last_step: int, save_after_step: bool, stopping: bool) -> bool:
        """Whether to launch step ``step + 1``'s generation before training on step ``step``: one_step_off only,
        and not past the last step, a step whose checkpoint is due, or a requested stop (the batch after a
        checkpoint comes from the checkpoint's weights)."""
        return self.overlaps and self.pending is None and step < last_step and not save_after_step and not stopping

    def to_finish_before_push(self) -> Optional[PendingRollout]:
        """The batch whose generation the trainer must wait for before it starts a weight push (keeping its rows
        in ``output``); None when the engines generate nothing, so a push starts on them at once."""
        return self.pending if self.pending is not None and self.pending.output is None else None

    def put(self, pending: PendingRollout) -> None:
        if self.pending is not None:
            raise RuntimeError(f"step {self.pending.step}'s generation is still in flight; one_step_off keeps one")
        self.pending = pending

    def take(self, step: int) -> Optional[PendingRollout]:
        """The batch launched for ``step``, or None when none is in flight (first step, after a resume, after a
        save or in sync mode): the trainer then generates it now, from the current weights."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.step != step:
            raise RuntimeError(f"the generation in flight is for step {pending.step}, not step {step}")
        return pending

    def drop(self) -> Optional[PendingRollout]:
        """Forget the batch in flight (a save or stop came while it ran); the caller waits for it and rewinds."""
        pending, self.pending = self.pending, None
        return pending
