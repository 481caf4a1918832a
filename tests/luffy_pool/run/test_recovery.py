"""The restart policy of automatic recovery (luffy_pool/run/recovery.py): classification, counting, capacity
wait, resume mode, and the launcher's fit loop with a recovery. Pure logic: no Ray cluster, no workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray.exceptions as rex

from luffy_pool.run import recovery as rec
from luffy_pool.run.checkpointing import CheckpointUnusableError
from verl.utils.ray_utils import WorkerGroupError
from verl.utils.signals import AbortedBySignal

DEAD = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: W\n\tip: 10.0.0.7\n"
    "Worker exits unexpectedly by a signal. SIGKILL"
)


def _group_error(failures: dict, **kw) -> WorkerGroupError:
    return WorkerGroupError("actor_rollout", "update_actor", failures, **kw)


def test_a_dead_rank_in_a_worker_group_call_is_a_recoverable_worker_death_naming_its_node():
    exc = _group_error({1: rex.RayActorError(None, DEAD), 0: RuntimeError("Connection closed by peer [10.0.0.7]:4")})
    failure = rec.classify_failure(exc)
    assert (failure.cause, failure.recoverable, failure.node) == (rec.WORKER_DIED, True, "10.0.0.7")


@pytest.mark.parametrize(
    "exc, cause",
    [
        (rex.NodeDiedError("node 3f2a died"), rec.NODE_DIED),
        (rex.OutOfMemoryError("Task was killed due to the node running low on memory"), rec.OOM_KILLED),
        (rex.RayActorError(None, "The actor died unexpectedly: the OS killed it (out of memory)"), rec.OOM_KILLED),
        (_group_error({}, pending_ranks=[0, 1], timed_out=True, timeout_s=60.0), rec.COLLECTIVE_TIMEOUT),
        (_group_error({0: RuntimeError("[gloo] Connection reset by peer")}), rec.COLLECTIVE_TIMEOUT),
        (
            _group_error({0: RuntimeError("Watchdog caught collective operation timeout: WorkNCCL(...)")}),
            rec.COLLECTIVE_TIMEOUT,
        ),
    ],
)
def test_lost_processes_nodes_and_collectives_are_recoverable(exc, cause):
    failure = rec.classify_failure(exc)
    assert failure.cause == cause and failure.recoverable


def test_a_model_name_containing_oom_is_no_memory_kill():
    exc = rex.RayActorError(None, "The actor died unexpectedly: BloomForCausalLM worker exited with code 1")
    assert rec.classify_failure(exc).cause == rec.WORKER_DIED


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("data.train_batch_size=3 is not divisible"),
        _group_error({0: KeyError("responses"), 1: KeyError("responses")}),  # the program is wrong on every rank
        _group_error({0: RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")}),  # the config's, not a kill
        rex.RayActorError(
            None, "The actor died because of an error raised in its creation task", actor_init_failed=True
        ),
        CheckpointUnusableError("cannot resume from global_step_2: manifest.json missing"),
        AbortedBySignal(15, "second stop signal"),
        KeyboardInterrupt(),
    ],
)
def test_config_and_user_errors_signals_and_bad_checkpoints_are_not_recoverable(exc):
    assert not rec.classify_failure(exc).recoverable


def test_the_same_cause_at_the_same_step_after_a_restart_ends_the_run_naming_it():
    policy = rec.RestartPolicy(max_restarts=3)
    died = rec.Failure(rec.WORKER_DIED, True, "rank 1 died")
    assert policy.decide(died, 5).attempt == 1
    again = policy.decide(died, 5)  # resumed from the checkpoint, replayed, died at step 5 again: deterministic
    assert not again.restart and "\n" not in again.reason
    assert again.reason.startswith("worker_died at step 5 again after the restart for it at step 5")
    assert again.reason.endswith(": rank 1 died")
    assert not policy.decide(died, 4).restart  # earlier in the replay: still no step past 5 completed
    assert policy.total == 1


def test_the_same_cause_at_a_later_step_restarts_again():
    policy = rec.RestartPolicy(max_restarts=1)
    died = rec.Failure(rec.WORKER_DIED, True, "x")
    assert [policy.decide(died, s).restart for s in (5, 6, 9)] == [True, True, True]  # progress before each
    assert policy.decide(died, 9).restart is False and policy.total == 3


def test_other_causes_at_one_step_restart_until_max_restarts_without_progress():
    policy = rec.RestartPolicy(max_restarts=2)
    causes = [rec.Failure(c, True, "x") for c in (rec.WORKER_DIED, rec.NODE_DIED, rec.OOM_KILLED)]
    assert [policy.decide(f, 5).attempt for f in causes[:2]] == [1, 2]
    stop = policy.decide(causes[2], 5)
    assert not stop.restart and stop.reason.startswith(
        "oom_killed at step 5 after 2 restart(s) there without progress (trainer.max_restarts=2)"
    )
    assert policy.decide(causes[2], 6).attempt == 1  # step 6 was reached: the count starts again


def test_a_failure_while_the_rebuild_starts_is_no_replay_but_counts():
    policy = rec.RestartPolicy(max_restarts=2)
    died = rec.Failure(rec.WORKER_DIED, True, "x")
    assert policy.decide(died, 5).attempt == 1
    assert policy.decide(died, 5, replay=False).attempt == 2  # the new group lost a rank before any step ran
    assert not policy.decide(died, 5, replay=False).restart  # max_restarts=2 without progress
    assert not policy.decide(died, 5).restart  # and the replayed step 5 is not restarted


def test_max_restarts_zero_and_unrecoverable_failures_never_restart():
    assert not rec.RestartPolicy(0).decide(rec.Failure(rec.WORKER_DIED, True, "x"), 1).restart
    decision = rec.RestartPolicy(3).decide(rec.Failure("ValueError", False, "bad key"), 1)
    assert not decision.restart and "not recoverable" in decision.reason


def test_resume_mode_of_a_restart(tmp_path):
    from verl.utils.checkpoint import layout

    assert rec.restart_resume_mode("disable", in_root=True) == "auto"
    assert rec.restart_resume_mode("disable", in_root=False) == "disable"  # step 1 again
    assert rec.restart_resume_mode("/ck/global_step_4", in_root=False) == "/ck/global_step_4"
    ckpt = SimpleNamespace(root=str(tmp_path), last_saved_step=None)
    assert not rec.saved_in_root(ckpt) and not rec.saved_in_root(None)
    ckpt.last_saved_step = 4  # resumed from a folder elsewhere, nothing saved here yet
    assert not rec.saved_in_root(ckpt)
    layout.write_tracker(str(tmp_path), 4)
    assert rec.saved_in_root(ckpt)


GPU_NODE = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}


def test_capacity_needs_a_node_of_its_own_per_node_group():
    groups, bundle = rec.world_shape(2, 2, use_gpu=True)
    assert (groups, bundle) == ([2, 2], {"CPU": 1.0, "GPU": 1.0})
    assert rec.can_host([GPU_NODE, GPU_NODE], groups, bundle)
    assert not rec.can_host([GPU_NODE, dict(GPU_NODE, Alive=False)], groups, bundle)
    assert not rec.can_host([{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 4.0}}], groups, bundle)  # one node
    assert not rec.can_host([GPU_NODE, {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}], groups, bundle)
    assert rec.can_host([{"Alive": True, "Resources": {"CPU": 2.0}}], *rec.world_shape(1, 2, use_gpu=False))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_split_engines_need_their_own_node_groups_beside_the_actor_s():
    groups, bundle = rec.world_shape(1, 2, use_gpu=True)
    rollout = rec.world_shape(1, 2, use_gpu=True)[0]
    four = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 4.0}}
    assert rec.can_host([GPU_NODE], groups, bundle)  # the actor alone fits 2 GPUs
    assert not rec.can_host([GPU_NODE], groups, bundle, rollout_groups=rollout)  # 2 + 2 ranks on 2 GPUs
    assert rec.can_host([four], groups, bundle, rollout_groups=rollout)  # two pools may share a node
    assert rec.can_host([GPU_NODE, GPU_NODE], groups, bundle, rollout_groups=rollout)
    # 2 rollout groups need 2 nodes of their own: one 4-GPU node holds actor 2 + rollout 2, not rollout 2 + 2
    assert not rec.can_host([four], groups, bundle, rollout_groups=[1, 1])
    assert rec.can_host([four, {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}}], groups, bundle, [1, 1])
    # best fit alone puts the actor's 4 on the 4-GPU node and strands the rollout's 2; actor 4 + rollout 2 on 6 fit
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": g}} for g in (6.0, 4.0)]
    assert rec.can_host(nodes, [4], bundle, rollout_groups=[2, 4])


def test_wait_for_capacity_waits_until_the_node_returns():
    clock = FakeClock()
    listings = iter([[GPU_NODE]] * 3 + [[GPU_NODE, GPU_NODE]])
    waited = rec.wait_for_capacity(
        [2, 2], {"CPU": 1.0, "GPU": 1.0}, 60, lambda: next(listings), clock=clock, sleep=clock.sleep, poll_s=5
    )
    assert waited == 15.0


def test_wait_for_capacity_gives_up_after_restart_wait_s_naming_the_keys():
    clock = FakeClock()
    with pytest.raises(rec.CapacityTimeout, match=r"trainer.restart_wait_s=12 s.*trainer.nnodes"):
        rec.wait_for_capacity(
            [2, 2], {"CPU": 1.0, "GPU": 1.0}, 12, lambda: [GPU_NODE], clock=clock, sleep=clock.sleep, poll_s=5
        )
    assert clock.now == 12.0


def test_wait_for_capacity_asks_for_the_split_rollout_pool_too():
    clock = FakeClock()
    with pytest.raises(
        rec.CapacityTimeout,
        match=r"\+ 1 rollout node group\(s\) of 2 rank\(s\).*"
        r"actor_rollout_ref.rollout.n_gpus_per_node",
    ):
        rec.wait_for_capacity(
            [2],
            {"CPU": 1.0, "GPU": 1.0},
            10,
            lambda: [GPU_NODE],
            clock=clock,
            sleep=clock.sleep,
            poll_s=5,
            rollout_groups=[2],
        )
    assert (
        rec.wait_for_capacity([2], {"CPU": 1.0, "GPU": 1.0}, 10, lambda: [GPU_NODE], clock=clock, sleep=clock.sleep)
        == 0.0
    )  # the actor alone fits at once


def test_wait_for_capacity_returns_at_once_on_a_stop_signal():
    clock = FakeClock()
    assert (
        rec.wait_for_capacity(
            [2, 2], {"CPU": 1.0}, 60, lambda: [], clock=clock, sleep=clock.sleep, should_stop=lambda: True
        )
        == -1.0
    )


def test_restart_line_names_cause_node_step_and_steps_lost():
    line = rec.restart_line(
        rec.Failure(rec.WORKER_DIED, True, "rank 1 died", "10.0.0.7"),
        step=5,
        resume_step=4,
        attempt=1,
        max_restarts=3,
        total=1,
    )
    assert line.startswith("restart 1 of 3 (trainer.max_restarts) for worker_died at step 5 (node 10.0.0.7)")
    assert "resuming from step 4, 1 step(s) lost" in line


# ---------------------------------------------------------------------- the launcher's loop
class FakeTrainer:
    def __init__(self, fail: bool, name: str):
        self.fail, self.name, self.global_steps, self.checkpointer = fail, name, 3, None
        self.stop = SimpleNamespace(signum=None, requested=False)

    def fit(self):
        if self.fail:
            raise _group_error({1: rex.RayActorError(None, DEAD)})
        return {"trainer": self.name}


def test_fit_and_close_continues_with_the_rebuilt_trainer_and_closes_each_run():
    from luffy_pool.run.launcher import fit_and_close

    closed = []

    class OneRestart:
        def restart(self, trainer, close, exc):
            assert rec.classify_failure(exc).cause == rec.WORKER_DIED
            close()
            return FakeTrainer(False, "second"), lambda: closed.append("second")

    metrics = fit_and_close(FakeTrainer(True, "first"), lambda **_: closed.append("first"), OneRestart())
    assert metrics == {"trainer": "second"} and closed == ["first", "second"]


def test_fit_and_close_without_recovery_ends_on_a_dead_worker():
    from luffy_pool.run.launcher import fit_and_close

    closed = []
    with pytest.raises(WorkerGroupError):
        fit_and_close(FakeTrainer(True, "only"), lambda: closed.append(1))
    assert closed == [1]


# ---------------------------------------------------------------------- Recovery.restart with fakes
def _recovery(rebuilt: list, nodes_fn, max_restarts=1, resume_mode="disable", split_engines=None, use_gpu=False):
    from omegaconf import OmegaConf

    t = SimpleNamespace(
        resume_mode=resume_mode, max_restarts=max_restarts, restart_wait_s=30, nnodes=1, n_gpus_per_node=2
    )
    r_nodes, r_per_node = split_engines or (1, 0)
    workers = SimpleNamespace(
        hybrid_engine=split_engines is None, rollout=SimpleNamespace(nnodes=r_nodes, n_gpus_per_node=r_per_node)
    )

    def rebuild(config, tracker):
        rebuilt.append((config.trainer.resume_mode, tracker))
        return FakeTrainer(False, "rebuilt"), lambda **kw: rebuilt.append(("closed", kw))

    clock = FakeClock()
    return rec.Recovery(
        OmegaConf.create({"trainer": {"resume_mode": resume_mode}}),
        SimpleNamespace(trainer=t, workers=workers),
        rebuild,
        use_gpu=use_gpu,
        nodes_fn=nodes_fn,
        clock=clock,
        sleep=clock.sleep,
        poll_s=1,
    )


def _failed_trainer(tmp_path, saved_step):
    from verl.utils.checkpoint import layout

    trainer = FakeTrainer(True, "first")
    trainer.tracker = "the-tracker"
    if saved_step is not None:
        layout.write_tracker(str(tmp_path), saved_step)
    trainer.checkpointer = SimpleNamespace(
        root=str(tmp_path), last_saved_step=saved_step, last_good_checkpoint=lambda: None, refused_summary=lambda: ""
    )
    return trainer


CPU_NODE = [{"Alive": True, "Resources": {"CPU": 4.0}}]


def test_restart_closes_the_workers_keeps_the_tracker_and_resumes_auto(tmp_path, caplog):
    rebuilt, closes = [], []
    recovery = _recovery(rebuilt, lambda: CPU_NODE)
    trainer = _failed_trainer(tmp_path, saved_step=2)
    exc = _group_error({1: rex.RayActorError(None, DEAD)})
    new, _close = recovery.restart(trainer, lambda **kw: closes.append(kw), exc)
    assert closes == [{"keep_tracker": True}] and rebuilt == [("auto", "the-tracker")]
    assert new.pending_metrics == {rec.RESTARTS_METRIC: 1, rec.STEPS_LOST_METRIC: 1}  # failed in step 3, saved 2
    assert "restart 1 of 1 (trainer.max_restarts) for worker_died at step 3 (node 10.0.0.7)" in caplog.text
    caplog.clear()
    assert recovery.restart(trainer, lambda **kw: None, exc) is None  # the same failure at the same step again
    stops = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert (
        len(stops) == 1
        and stops[0].startswith("no restart: worker_died at step 3 again after the restart for it at step 3")
        and "\n" not in stops[0]
    )
    assert len(rebuilt) == 1 and "restart 2" not in caplog.text


def test_restart_after_progress_resumes_again(tmp_path):
    rebuilt = []
    recovery = _recovery(rebuilt, lambda: CPU_NODE)  # max_restarts=1
    exc = _group_error({1: rex.RayActorError(None, DEAD)})
    assert recovery.restart(_failed_trainer(tmp_path, saved_step=2), lambda **kw: None, exc) is not None
    later = _failed_trainer(tmp_path, saved_step=6)
    later.global_steps = 7  # the rebuilt run got past step 3 and then lost a worker again
    new, _ = recovery.restart(later, lambda **kw: None, exc)
    assert len(rebuilt) == 2 and new.pending_metrics == {rec.RESTARTS_METRIC: 2, rec.STEPS_LOST_METRIC: 1}


def test_split_engines_restart_waits_for_the_rollout_pool_too(tmp_path):
    rebuilt, listings = [], []
    two_gpus = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}]  # the actor's 1 x 2 ranks fit, 1 x 2 more not

    def nodes():
        listings.append(1)
        return two_gpus if len(listings) <= 3 else [dict(two_gpus[0], Resources={"CPU": 8.0, "GPU": 4.0})]

    recovery = _recovery(rebuilt, nodes, split_engines=(1, 2), use_gpu=True)
    assert recovery.rollout_groups == [2]
    new, _ = recovery.restart(_failed_trainer(tmp_path, 2), lambda **kw: None, rex.NodeDiedError("node died"))
    assert len(listings) == 4 and recovery.clock.now == 3.0 and len(rebuilt) == 1  # waited for 4 GPUs, poll_s=1
    hybrid = _recovery([], lambda: two_gpus, use_gpu=True)
    assert hybrid.rollout_groups is None
    assert hybrid.restart(_failed_trainer(tmp_path, 2), lambda **kw: None, rex.NodeDiedError("x")) is not None


def test_restart_without_a_checkpoint_keeps_the_run_s_resume_mode(tmp_path):
    rebuilt = []
    new, _ = _recovery(rebuilt, lambda: CPU_NODE).restart(
        _failed_trainer(tmp_path, None), lambda **kw: None, rex.NodeDiedError("node died")
    )
    assert rebuilt == [("disable", "the-tracker")] and new.pending_metrics[rec.STEPS_LOST_METRIC] == 3


def test_sigterm_while_waiting_for_capacity_exits_143_without_rebuilding(tmp_path):
    import os
    import signal

    rebuilt, calls = [], []

    def nodes():  # the cluster never has room; the first look brings a SIGTERM
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return []

    with pytest.raises(AbortedBySignal) as err:
        _recovery(rebuilt, nodes).restart(
            _failed_trainer(tmp_path, 2), lambda **kw: None, _group_error({1: rex.RayActorError(None, DEAD)})
        )
    assert err.value.code == 143 and rebuilt == [] and "newest checkpoint is step 2" in str(err.value)


def test_a_worker_lost_while_the_rebuild_starts_counts_as_another_restart(tmp_path):
    rebuilt, attempts = [], []
    recovery = _recovery(rebuilt, lambda: CPU_NODE, max_restarts=2)
    plain_rebuild = recovery.rebuild

    def flaky_rebuild(config, tracker):
        attempts.append(1)
        if len(attempts) == 1:
            raise _group_error({0: rex.RayActorError(None, DEAD)})
        return plain_rebuild(config, tracker)

    recovery.rebuild = flaky_rebuild
    new, _ = recovery.restart(
        _failed_trainer(tmp_path, 2), lambda **kw: None, _group_error({1: rex.RayActorError(None, DEAD)})
    )
    assert len(attempts) == 2 and new.pending_metrics[rec.RESTARTS_METRIC] == 2
    # a rebuild that keeps losing a worker spends the budget, then the run ends with that failure
    always = _recovery([], lambda: CPU_NODE, max_restarts=2)
    always.rebuild = lambda config, tracker: (
        attempts.append(1) or (_ for _ in ()).throw(_group_error({0: rex.RayActorError(None, DEAD)}))
    )
    attempts.clear()
    with pytest.raises(WorkerGroupError):
        always.restart(_failed_trainer(tmp_path, 2), lambda **kw: None, rex.RayActorError(None, DEAD))
    assert len(attempts) == 2 and always.policy.total == 2


def test_a_stop_signal_still_ends_a_recovering_run_with_its_exit_code(tmp_path):
    from luffy_pool.run.launcher import fit_and_close

    stopped = FakeTrainer(False, "stopped")
    stopped.stop.signum = 15  # fit returned after SIGTERM (its step saved)
    rebuilt, closed = [], []
    with pytest.raises(SystemExit) as err:
        fit_and_close(stopped, lambda **kw: closed.append(kw), _recovery(rebuilt, lambda: CPU_NODE))
    assert err.value.code == 143 and closed == [{}] and rebuilt == []

    # a pod's SIGTERM reaches the workers too: the step they die in is not restarted once a stop was asked
    dying = _failed_trainer(tmp_path, 2)
    dying.stop.signum, dying.stop.requested = 15, True
    with pytest.raises(WorkerGroupError):
        fit_and_close(dying, lambda **kw: closed.append(kw), _recovery(rebuilt, lambda: CPU_NODE))
    assert rebuilt == []
