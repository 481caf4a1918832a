"""trainer.rollout_pipeline's bookkeeping: policy versions and staleness, when one_step_off prefetches, and that a
batch in flight is never carried over a checkpoint or a resume (it is regenerated from the restored weights)."""

import pytest

from luffy_pool.trainer.rollout_pipeline import PendingRollout, RolloutPipeline, staleness


def _schedule(mode, last_step, save_freq=-1, resume_at=0):
    """Replays the split step's decisions (luffy_pool/trainer/rollout_source.py) for steps resume_at+1 .. last_step:
    returns {step: (version that generated its batch, staleness)}."""
    pipe, out = RolloutPipeline(mode), {}
    for step in range(resume_at + 1, last_step + 1):
        pending = pipe.take(step)
        if pending is None:  # generated now, from the weights after step - 1 updates
            pending = PendingRollout(step=step, version=step - 1)
        out[step] = (pending.version, staleness(step, pending.version))
        save_due = save_freq > 0 and (step % save_freq == 0 or step == last_step)
        if pipe.should_prefetch(step, last_step, save_due, stopping=False):
            pipe.put(PendingRollout(step=step + 1, version=step - 1))  # launched before update `step`
    assert pipe.pending is None  # nothing left in flight after the last step
    return out


def test_sync_generates_every_batch_from_the_latest_weights():
    assert _schedule("sync", 4) == {1: (0, 0), 2: (1, 0), 3: (2, 0), 4: (3, 0)}


def test_one_step_off_trains_on_batches_one_update_stale_after_the_first():
    assert _schedule("one_step_off", 4) == {1: (0, 0), 2: (0, 1), 3: (1, 1), 4: (2, 1)}


def test_no_prefetch_past_a_save_so_the_batch_after_it_comes_from_the_saved_weights():
    run = _schedule("one_step_off", 6, save_freq=3)
    assert run[4] == (3, 0)  # step 3 is saved: step 4's batch is generated after update 3
    assert run[5] == (3, 1)
    # a run resumed from the step-3 checkpoint makes the same decisions from there
    assert _schedule("one_step_off", 6, save_freq=3, resume_at=3) == {s: run[s] for s in (4, 5, 6)}


def test_take_refuses_a_batch_launched_for_another_step_and_put_keeps_one():
    pipe = RolloutPipeline("one_step_off")
    pipe.put(PendingRollout(step=3, version=1))
    with pytest.raises(RuntimeError, match="still in flight"):
        pipe.put(PendingRollout(step=4, version=2))
    assert not pipe.should_prefetch(2, 10, save_after_step=False, stopping=False)  # one already in flight
    with pytest.raises(RuntimeError, match="for step 3, not step 2"):
        pipe.take(2)


def test_drop_forgets_the_batch_in_flight_and_stop_prevents_a_new_one():
    pipe = RolloutPipeline("one_step_off")
    pending = PendingRollout(step=5, version=3, rewind={"sampler": {"cursor": 8}})
    pipe.put(pending)
    assert pipe.drop() is pending and pipe.take(5) is None
    assert not pipe.should_prefetch(5, 10, save_after_step=False, stopping=True)
    assert not RolloutPipeline("sync").should_prefetch(5, 10, save_after_step=False, stopping=False)


@pytest.mark.parametrize("step,version", [(0, 0), (3, 3), (3, -1)])
def test_staleness_refuses_a_version_the_step_cannot_have(step, version):
    with pytest.raises(ValueError, match=f"step {step}"):
        staleness(step, version)


def test_an_unknown_pipeline_is_refused_by_its_key():
    with pytest.raises(ValueError, match="trainer.rollout_pipeline='two_step_off'"):
        RolloutPipeline("two_step_off")


class _State:
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class _Future:
    waited = False

    def get(self):
        self.waited = True


class _Steps:
    """The trainer's side a rollout source calls (``StepRollout``): here only the samplers' un-draw."""

    def __init__(self, sampler, ratios):
        self.sampler, self.ratios, self.data_iter = sampler, ratios, iter([])

    def restore_samplers(self, states):
        self.sampler.load_state_dict(states["sampler"])
        self.ratios.load_state_dict(states["ratio_sampler"])
        self.data_iter = None


def test_a_save_with_a_batch_in_flight_waits_for_it_and_rewinds_both_samplers():
    from luffy_pool.trainer.rollout_source import ColocatedRollout, SplitRollout

    sampler, ratios, future = _State(8), _State("rng@step4"), _Future()
    steps = _Steps(sampler, ratios)
    source = SplitRollout(steps, None, None, "one_step_off")
    rewind = {"sampler": sampler.state_dict(), "ratio_sampler": ratios.state_dict()}
    sampler.value, ratios.value = 12, "rng@step5"  # what drawing step 5's batch moved
    source.pipeline.put(PendingRollout(step=5, version=3, handle={"future": future}, rewind=rewind))
    source.drop_in_flight()
    assert future.waited and source.pipeline.pending is None
    assert (sampler.value, ratios.value, steps.data_iter) == (8, "rng@step4", None)  # step 5 is drawn again
    source.drop_in_flight()  # nothing in flight: nothing to do
    assert ColocatedRollout(steps, None).drop_in_flight() is None  # the hybrid engine has nothing in flight


def test_a_push_must_first_finish_the_batch_in_flight_which_keeps_its_rows():
    pipe = RolloutPipeline("one_step_off")
    assert pipe.to_finish_before_push() is None  # engines idle: a push starts at once
    pending = PendingRollout(step=3, version=1)
    pipe.put(pending)
    assert pipe.to_finish_before_push() is pending
    pending.output = "rows of batch 3"
    assert pipe.to_finish_before_push() is None  # finished: nothing ahead of a push on the engines
    assert pipe.take(3).output == "rows of batch 3"  # its own step trains on it (staleness still 1)
    assert staleness(3, pending.version) == 1


class _Rows:
    """A generation's future: ``get`` returns its rows and counts the waits."""

    def __init__(self, rows):
        self.rows, self.gets = rows, 0

    def get(self):
        self.gets += 1
        return self.rows


class _Actor:
    def send_weights(self):
        return ["send ref"]


class _Engines:
    def receive_weights(self):
        return ["receive ref"]

    def generate_sequences_async(self, prompts):
        return _Rows(f"rows of {prompts}")

    def generate_validation(self, prompts):
        return f"scores of {prompts}"


def test_validation_with_a_batch_in_flight_waits_for_it_before_the_push():
    """What the split trainer sends its rollout group when validation comes on a step that prefetched (one_step_off,
    test_freq off the save steps): the batch in flight is finished and kept, then the push, then validation."""
    from luffy_pool.trainer.rollout_source import SplitRollout
    from tests.helpers.rollout_calls import queued_behind_a_generation, record_rollout_calls

    steps = _Steps(_State(8), _State("rng"))
    source = SplitRollout(steps, _Actor(), _Engines(), "one_step_off")
    events = record_rollout_calls(source)
    future = source.rollout_wg.generate_sequences_async("batch 3")  # launched before update 2
    source.pipeline.put(PendingRollout(step=3, version=1, handle={"future": future}))
    assert source._start_push() == ["send ref", "receive ref"]  # validation's update_weights stage
    source.rollout_wg.generate_validation("val prompts")
    assert events == ["generate 1", "generated 1", "push", "validate"]
    assert queued_behind_a_generation(events) == []
    pending = source.pipeline.pending
    assert pending.step == 3 and pending.output == "rows of batch 3"
    source._start_push()  # the engines are idle now: no second wait
    source.pipeline.pending.handle["push"] = []
    source.pipeline.pending.rewind = {"sampler": {"value": 4}, "ratio_sampler": {"value": "rng@3"}}
    source.drop_in_flight()  # a save after it: the kept rows are dropped without another wait
    assert future._future.gets == 1 and steps.sampler.value == 4


def test_the_order_before_the_fix_is_flagged():
    """The pushes issued for validation with batch 2 generating: the push and the validation queue behind it."""
    from tests.helpers.rollout_calls import queued_behind_a_generation

    before = ["push", "generate 1", "generated 1", "push", "generate 2", "push", "validate", "generated 2"]
    assert queued_behind_a_generation(before) == [(5, "push"), (6, "validate")]
    after = ["push", "generate 1", "generated 1", "push", "generate 2", "generated 2", "push", "validate"]
    assert queued_behind_a_generation(after) == []
