"""Where a training step's rolled-out batch comes from: a rollout source injected into the trainer.

A source has ``get(step, timing) -> (batch, ratios, metrics)`` (the step's prompts, drawn and generated, merged
with their rows), ``push() -> metrics`` (the actor's current weights into the engines, e.g. before validation) and
``drop_in_flight()`` (a batch still generating is waited for and un-drawn, before a checkpoint or the end of the
run). It reaches the trainer only through :class:`StepRollout`, the five calls that make a step's batch.

- :class:`ColocatedRollout`: the hybrid engine (``actor_rollout_ref.hybrid_engine=True``): the actor's own ranks
  push into their engines and generate.
- :class:`SplitRollout`: engines on ranks of their own (``hybrid_engine=False``), the weights crossing over the
  weight group (verl/workers/split_weights.py), with ``trainer.rollout_pipeline`` ``sync`` (generate at the start
  of the step) or ``one_step_off`` (batch N+1 launched before the actor trains on N: luffy_pool/trainer/
  rollout_pipeline.py says what is kept consistent). A launch waits for nothing (the push and the generation are
  queued on the workers, which run each caller's calls in order): the push runs while the driver scores. No push
  starts while a generation is in flight (``finish_in_flight`` first).

A fully asynchronous source plugs in here: it needs only these three calls.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from luffy_pool.trainer.rollout_pipeline import PendingRollout, RolloutPipeline, staleness

STALENESS_METRIC = "rollout/staleness"


def _add_time(timing: dict, name: str, t0: float) -> None:
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


@contextlib.contextmanager
def _timed(name: str, timing: dict):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _add_time(timing, name, t0)


class StepRollout(Protocol):
    """What a source needs from the trainer to make one step's batch (MIXRayPPOTrainer implements it)."""

    def draw_batch(self, step: int, metrics: dict, timing: dict): ...

    def prepare_rollout(self, batch, step: int): ...

    def merge_rollout(self, batch, gen_out, ratios, metrics: dict, step: int): ...

    def sampler_states(self) -> dict: ...

    def restore_samplers(self, states: dict) -> None: ...


class ColocatedRollout:
    """The hybrid engine: push into the actor ranks' own engines, then generate there."""

    extra_ranks = 0

    def __init__(self, steps: StepRollout, wg):
        self.steps, self.wg = steps, wg

    @property
    def gen_wg(self):
        return self.wg

    def push(self) -> dict:
        """Every rank's engine gets its actor's weights; ``timing_s/weight_sync``: the slowest rank's push."""
        from verl.workers.sharding_manager.fsdp_sharding_manager import WEIGHT_SYNC_METRIC

        per_rank = self.wg.update_weights()
        values = [float(r[WEIGHT_SYNC_METRIC]) for r in per_rank if r.get(WEIGHT_SYNC_METRIC) is not None]
        return {WEIGHT_SYNC_METRIC: max(values)} if values else {}

    def generate(self, batch, step: int, metrics: dict, timing: dict):
        """Push, then generate the drawn ``batch`` -> (merged batch, ratios, metrics)."""
        with _timed("update_weights", timing):
            metrics.update(self.push())
        with _timed("gen", timing):
            batch, gen_batch, ratios, stage = self.steps.prepare_rollout(batch, step)
            metrics.update(stage)
            gen_out = self.wg.generate_sequences(gen_batch)
            return self.steps.merge_rollout(batch, gen_out, ratios, metrics, step)

    def get(self, step: int, timing: dict, *, prefetch: bool = False):
        metrics: dict = {}
        batch = self.steps.draw_batch(step, metrics, timing)
        return self.generate(batch, step, metrics, timing)

    def drop_in_flight(self) -> None:
        return None


class SplitRollout:
    """Engines on ranks of their own, ``sync`` or ``one_step_off`` (module docstring). ``wg``: the actor group
    (sends the weights), ``rollout_wg``: the engines' (receive and generate)."""

    def __init__(self, steps: StepRollout, wg, rollout_wg, mode: str):
        self.steps, self.wg, self.rollout_wg = steps, wg, rollout_wg
        self.pipeline = RolloutPipeline(mode)

    @property
    def gen_wg(self):
        return self.rollout_wg

    @property
    def extra_ranks(self) -> int:
        return self.rollout_wg.world_size

    # ------------------------------------------------------------------ weights
    def _start_push(self) -> list:
        """Every actor rank gathers, its rank 0 broadcasts, every rollout rank receives: started together, not
        waited for; returns the refs (actor ranks first). A batch still generating is finished first: the engines
        would receive only after it, and the actor's rank 0 would wait in the broadcast meanwhile."""
        self.finish_in_flight()
        return list(self.wg.send_weights()) + list(self.rollout_wg.receive_weights())

    def finish_in_flight(self) -> None:
        """Wait for the batch generating (if any) and keep its rows for its own step (unlike ``drop_in_flight``)."""
        pending = self.pipeline.to_finish_before_push()
        if pending is not None:
            pending.output = pending.handle["future"].get()

    def _push_metrics(self, refs: list) -> dict:
        """Waits for a push's refs; ``timing_s/weight_sync``: the slowest engine's receive."""
        from verl.utils.ray_utils import get_ranked
        from verl.workers.sharding_manager.fsdp_sharding_manager import WEIGHT_SYNC_METRIC

        if not refs:
            return {}
        out = get_ranked(
            refs, list(range(len(refs))), group_name="weight_group", method_name="send_weights / receive_weights"
        )
        values = [float(r[WEIGHT_SYNC_METRIC]) for r in out[self.wg.world_size :]]
        return {WEIGHT_SYNC_METRIC: max(values)} if values else {}

    def push(self) -> dict:
        """A push waited for (outside a launch, e.g. before validation), after the batch in flight is finished."""
        return self._push_metrics(self._start_push())

    # ------------------------------------------------------------------ generation
    def launch(self, step: int, timing: dict, version: int) -> PendingRollout:
        """Draw step ``step``'s batch, push the actor's current weights and start the engines on it, all without
        waiting: Ray runs each worker's calls in the order they were made, so the engines generate after receiving
        and the actor sends before any later call (its update). Called when the engines are idle. ``version``: the
        updates the pushed weights have seen (the actor sends before it updates)."""
        rewind = self.steps.sampler_states()
        metrics: dict = {}
        batch = self.steps.draw_batch(step, metrics, timing)
        with _timed("update_weights", timing):
            push = self._start_push()
        batch, gen_batch, ratios, stage = self.steps.prepare_rollout(batch, step)
        metrics.update(stage)
        future = self.rollout_wg.generate_sequences_async(gen_batch)
        return PendingRollout(
            step=step,
            version=version,
            rewind=rewind,
            metrics=metrics,
            handle={"future": future, "push": push, "batch": batch, "ratios": ratios},
        )

    def get(self, step: int, timing: dict, *, prefetch: bool = False):
        """Step ``step``'s batch: the one launched during the last step, or launched now. With ``prefetch`` (the
        trainer's decision: one_step_off and no save, stop or end after this step) the next step's batch is
        launched once this one is generated (as verl's one_step_off_policy: no collective of the push ever waits on
        a generation), without waiting for its push; the actor's update is queued behind its send."""
        pending = self.pipeline.take(step)
        if pending is None:  # sync mode, the first step, after a resume or a checkpoint: generate it now
            pending = self.launch(step, timing, version=step - 1)
        t0 = time.perf_counter()
        gen_out = pending.output  # finished already when a push came between (validation)
        if gen_out is None:  # with one_step_off, mostly generated while the last step trained
            gen_out = pending.handle["future"].get()
        _add_time(timing, "gen", t0)
        if prefetch and self.pipeline.overlaps and self.pipeline.pending is None:
            self.pipeline.put(self.launch(step + 1, timing, version=step - 1))
        pending.metrics.update(self._push_metrics(pending.handle["push"]))  # done: the engines generated after it
        batch, ratios, metrics = self.steps.merge_rollout(
            pending.handle["batch"], gen_out, pending.handle["ratios"], pending.metrics, step
        )
        metrics[STALENESS_METRIC] = staleness(step, pending.version)
        return batch, ratios, metrics

    def drop_in_flight(self) -> None:
        """Wait for a batch still generating (the engines finish it before any later push), discard its rows and
        rewind the samplers to before it was drawn: the next step draws and generates it again, from the weights
        of now (what a run resumed from a checkpoint written now does too)."""
        pending = self.pipeline.drop()
        if pending is None:
            return
        if pending.output is None:
            pending.handle["future"].get()
        self._push_metrics(pending.handle.get("push") or [])  # its errors, if any, surface here
        self.steps.restore_samplers(pending.rewind)
