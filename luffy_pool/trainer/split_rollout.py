"""The driver's step on split engines (``actor_rollout_ref.hybrid_engine=False``): the rollout group generates,
the actor group trains, the weights cross over the weight group (``verl/workers/split_weights.py``).

``split_step`` replaces the hybrid step's first two stages (update_weights -> rollout): it takes the batch launched
for this step (``trainer.rollout_pipeline=one_step_off``: during the previous step) or launches it now, waits for
its rows, and, when the pipeline allows (``RolloutPipeline.should_prefetch``), launches the next step's generation on
the current weights, then hands this batch to the training stages (``MIXRayPPOTrainer._train_on``), so generating N+1
overlaps training on N. A launch waits for nothing (the push and the generation are queued on the workers, which
run each caller's calls in order): the push runs while the driver scores. No push starts while a generation is in
flight (``finish_in_flight`` first: ``rollout_pipeline``'s docstring says why). ``drop_in_flight`` waits for a batch
still generating and rewinds the data and prefix-ratio samplers to before it, before a checkpoint is written or the
run ends.
"""

from __future__ import annotations

import time

from luffy_pool.trainer.rollout_pipeline import PendingRollout, RolloutPipeline, staleness

STALENESS_METRIC = "rollout/staleness"


def _add_time(timing: dict, name: str, t0: float) -> None:
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


class SplitRolloutMixin:
    """Split-engine stages of ``MIXRayPPOTrainer`` (``rollout_wg`` None: the hybrid engine, nothing here runs)."""

    # The hybrid engine's values (also what a trainer built without __init__, e.g. a test double, reads).
    rollout_wg = None
    pipeline = None
    split_ranks = 0

    def init_split(self, rollout_wg) -> None:
        self.rollout_wg = rollout_wg
        self.split_ranks = rollout_wg.world_size if rollout_wg is not None else 0
        self.pipeline = RolloutPipeline(self.sections.trainer.rollout_pipeline) if rollout_wg is not None else None

    @property
    def gen_wg(self):
        """The group that generates: the split engines', else the actor's."""
        return self.rollout_wg if self.rollout_wg is not None else self.wg

    @property
    def gen_world_size(self) -> int:
        return self.rollout_wg.world_size if self.rollout_wg is not None else self.world_size

    def _start_push(self) -> list:
        """Every actor rank gathers, its rank 0 broadcasts, every rollout rank receives: started together, not
        waited for; returns the refs (actor ranks first). A batch still generating is finished first: the engines
        would receive only after it, and the actor's rank 0 would wait in the broadcast meanwhile."""
        self.finish_in_flight()
        return list(self.wg.send_weights()) + list(self.rollout_wg.receive_weights())

    def finish_in_flight(self) -> None:
        """Wait for the batch generating (if any) and keep its rows for its own step (unlike ``drop_in_flight``)."""
        pending = self.pipeline.to_finish_before_push() if self.pipeline is not None else None
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

    def push_to_engines(self) -> dict:
        """A push waited for (the ``update_weights`` stage outside a launch, e.g. before validation), after the
        batch in flight is finished."""
        return self._push_metrics(self._start_push())

    def _launch_generation(self, step: int, timing: dict) -> PendingRollout:
        """Draw step ``step``'s batch, push the actor's current weights and start the engines on it, all without
        waiting: Ray runs each worker's calls in the order they were made, so the engines generate after receiving
        and the actor sends before any later call (its update). Called when the engines are idle."""
        from verl.protocol import DataProto

        rewind = {
            "sampler": self.train_dataloader.sampler.state_dict(),
            "ratio_sampler": self.ratio_sampler.state_dict(),
        }
        metrics: dict = {}
        batch = self._start_batch(DataProto.from_single_dict(self._next_batch()), step, metrics, timing)
        t0 = time.perf_counter()
        push = self._start_push()
        _add_time(timing, "update_weights", t0)
        batch, gen_batch, ratios, stage = self._prepare_rollout(batch, step)
        metrics.update(stage)
        future = self.rollout_wg.generate_sequences_async(gen_batch)
        # The weights pushed have seen the updates of steps 1 .. global_steps - 1 (the actor sends before it updates).
        return PendingRollout(
            step=step,
            version=self.global_steps - 1,
            rewind=rewind,
            metrics=metrics,
            handle={"future": future, "push": push, "batch": batch, "ratios": ratios},
        )

    def split_step(self, timing: dict):
        """One training step on split engines; returns ``_train_on``'s ``StepOutput``.

        With one_step_off the next batch is launched once this one is generated (as verl's one_step_off_policy: no
        collective of the push ever waits on a generation), and without waiting for its push, so the push runs while
        the driver scores this batch; the actor's update is queued behind its send."""
        step = self.global_steps
        pending = self.pipeline.take(step)
        if pending is None:  # sync mode, the first step, after a resume or a checkpoint: generate it now
            pending = self._launch_generation(step, timing)
        t0 = time.perf_counter()
        gen_out = pending.output  # finished already when a push came between (validation)
        if gen_out is None:  # with one_step_off, mostly generated while the last step trained
            gen_out = pending.handle["future"].get()
        _add_time(timing, "gen", t0)
        t = self.sections.trainer
        last = self.last_step()
        save_due = self.checkpointer is not None and self._due(t.save_freq, step >= last)
        if self.pipeline.should_prefetch(step, last, save_due, self.stop.requested):
            self.pipeline.put(self._launch_generation(step + 1, timing))
        pending.metrics.update(self._push_metrics(pending.handle["push"]))  # done: the engines generated after it
        batch, ratios, metrics = self._merge_rollout(
            pending.handle["batch"], gen_out, pending.handle["ratios"], pending.metrics, step
        )
        metrics[STALENESS_METRIC] = staleness(step, pending.version)
        return self._train_on(batch, ratios, metrics, timing)

    def drop_in_flight(self) -> None:
        """Wait for a batch still generating (the engines finish it before any later push), discard its rows and
        rewind the samplers to before it was drawn: the next step draws and generates it again, from the weights
        of now (what a run resumed from a checkpoint written now does too)."""
        pending = self.pipeline.drop() if self.pipeline is not None else None
        if pending is None:
            return
        if pending.output is None:
            pending.handle["future"].get()
        self._push_metrics(pending.handle.get("push") or [])  # its errors, if any, surface here
        self.train_dataloader.sampler.load_state_dict(pending.rewind["sampler"])
        self.ratio_sampler.load_state_dict(pending.rewind["ratio_sampler"])
        self._data_iter = None
