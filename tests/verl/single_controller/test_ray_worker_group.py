"""A 2-rank RayWorkerGroup end to end: the environment each rank sees, every dispatch mode through
real actors, DataProtoFuture chaining, a gloo all-reduce (process group joined in the workers'
constructors), and how failures and timeouts surface."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray
import torch
from ray import cloudpickle

from verl.protocol import DataProto, DataProtoFuture
from verl.single_controller.base import Dispatch, Execute, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, WorkerGroupError

# Test modules are not importable inside Ray workers; ship their classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENV_KEYS = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WG_PREFIX",
    "WG_BACKEND",
    "OMP_NUM_THREADS",
    "PROBE_FLAG",
]


class ProbeWorker(Worker):
    """Multiplies rows by ``scale`` and reports where it runs. Joins torch.distributed in ``__init__``,
    as the FSDP workers do: every rank must know MASTER_ADDR/PORT before any constructor finishes."""

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.backend = self.init_torch_distributed()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag):
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "tag": tag,
            "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in ENV_KEYS},
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def collector(self):
        import gc

        return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def square(self, value):
        return value * value

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale_rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            tensors={"x": data.batch["x"] * self.scale},
            non_tensors={"rank": [self.rank] * len(data)},
            meta_info={"scale": self.scale},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scale_rows_async(self, data: DataProto) -> DataProto:
        return self.scale_rows(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def fail_rows_async(self, data: DataProto) -> DataProto:
        if self.rank == 1:
            raise RuntimeError("rank 1 cannot produce rows")
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def row_sum(self, data: DataProto):
        return {"rank": self.rank, "sum": int(data.batch["x"].sum())}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_echo(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self):
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank_plus_one(self):
        import torch.distributed as dist

        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return self.backend, dist.get_backend(), value.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank(self, bad_rank):
        if self.rank == bad_rank:
            raise ValueError(f"rank {self.rank} refuses")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank


def rows(*values: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.tensor(values)}, meta_info={"source": "driver"})


@pytest.fixture(scope="module")
def group(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="probe_pool")
    worker_cls = RayClassWithInitArgs(ProbeWorker, scale=3)
    worker_cls.update_options({"runtime_env": {"env_vars": {"PROBE_FLAG": "on"}}})
    wg = RayWorkerGroup(pool, worker_cls, name_prefix="probe")
    yield wg
    wg.shutdown()
    pool.release()


def _fork_switches() -> dict:
    """The variables that start a group's ranks through the dev package's fork server (dev/luffy_pool_dev), through
    verl's generic actor hook."""
    from luffy_pool_dev import ACTOR_HOOK, FORK_WORKERS_ENV

    from verl.single_controller.ray.base import ACTOR_RUNTIME_ENV_HOOK_ENV

    return {ACTOR_RUNTIME_ENV_HOOK_ENV: ACTOR_HOOK, FORK_WORKERS_ENV: "1"}


def _forked_group(ranks: int, worker_cls, prefix: str):
    """A worker group of ``ranks`` CPU ranks started through the fork server (the switches set only while it starts)."""
    switches = _fork_switches()
    before = {k: os.environ.get(k) for k in switches}
    os.environ.update(switches)
    try:
        return RayWorkerGroup(
            RayResourcePool([ranks], use_gpu=False, name_prefix=f"{prefix}_pool"), worker_cls, name_prefix=prefix
        )
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_ranks_see_group_environment(group):
    info = group.whoami("hello")
    assert [i["rank"] for i in info] == [0, 1] and {i["world_size"] for i in info} == {2}
    env0, env1 = info[0]["env"], info[1]["env"]
    assert (env0["RANK"], env1["RANK"]) == ("0", "1")
    assert (env0["LOCAL_RANK"], env1["LOCAL_RANK"]) == ("0", "1")
    assert env0["WORLD_SIZE"] == env1["WORLD_SIZE"] == env0["LOCAL_WORLD_SIZE"] == "2"
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == group.master_addr
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] == str(group.master_port)
    assert env0["WG_PREFIX"] == "probe" and env0["WG_BACKEND"] == "ray"
    assert env0["OMP_NUM_THREADS"] == "1" and env1["PROBE_FLAG"] == "on"
    assert info[0]["pid"] != info[1]["pid"] and {i["tag"] for i in info} == {"hello"}


def test_rendezvous_on_the_drivers_own_node_starts_no_probe_task(group, monkeypatch):
    """Rank 0's node is the driver's: MASTER_ADDR/PORT are picked here, without a Ray task (a worker process)."""
    import socket

    from verl.single_controller.ray import base

    def no_task(*args, **kwargs):
        raise AssertionError("a probe task was started for the driver's own node")

    monkeypatch.setattr(base.ray, "remote", no_task)
    pg = group.resource_pool.get_placement_groups(strategy="STRICT_PACK")[0]
    addr, port = group._pick_rendezvous(pg)
    assert addr == ray.util.get_node_ip_address() and isinstance(port, int) and port > 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, port))  # the port it chose is free


def test_each_rank_imported_its_class_with_the_collector_paused_and_has_it_back(group):
    """The dev actor hook's setup hook (tests/conftest.py sets verl's VERL_ACTOR_RUNTIME_ENV_HOOK) paused the collector
    before the class was imported; the Worker's construction froze what the start-up built and gave automatic
    collection back (dev/luffy_pool_dev/startup_gc.py)."""
    for rank in group.collector():
        assert rank["enabled"] and rank["frozen"] > 100_000, rank  # torch alone is several 100k objects


def test_all_to_all_splits_per_rank_lists_else_broadcasts(group):
    assert group.echo(["a", "b"]) == [(0, "a"), (1, "b")]
    assert group.echo("same") == [(0, "same"), (1, "same")]


def test_dp_compute_takes_one_value_per_rank(group):
    assert group.square([3, 4]) == [9, 16]
    with pytest.raises(ValueError, match="method 'square': DP_COMPUTE needs argument 0"):
        group.square([1, 2, 3])


def test_dp_compute_proto_chunks_rows_and_concatenates(group):
    out = group.scale_rows(rows(1, 2, 3, 4))
    assert out.batch["x"].tolist() == [3, 6, 9, 12]
    assert out.non_tensor_batch["rank"].tolist() == [0, 0, 1, 1]
    assert out.meta_info == {"scale": 3}
    with pytest.raises(ValueError, match="3 rows cannot be split into 2 equal chunks"):
        group.scale_rows(rows(1, 2, 3))


def test_non_blocking_call_returns_future_that_chains_into_next_call(group):
    future = group.scale_rows_async(rows(1, 2, 3, 4))
    assert isinstance(future, DataProtoFuture) and len(future.futures) == 2
    chained = group.scale_rows(future)  # each worker resolves its own chunk of the future
    assert chained.batch["x"].tolist() == [9, 18, 27, 36]
    assert future.get().batch["x"].tolist() == [3, 6, 9, 12]


def test_failed_future_names_producer_in_driver_and_in_chained_call(group):
    future = group.fail_rows_async(rows(1, 2, 3, 4))
    with pytest.raises(
        WorkerGroupError, match="method 'fail_rows_async' failed on rank 1: RuntimeError: rank 1 cannot produce rows"
    ):
        future.get()
    with pytest.raises(WorkerGroupError) as info:
        group.scale_rows(future)
    message = str(info.value)
    assert "method 'scale_rows' failed on ranks [0, 1]" in message
    assert "WorkerGroupError: worker group 'probe' method 'fail_rows_async' failed on rank 1" in message


def test_dp_compute_proto_with_func_runs_function_on_each_chunk(group):
    def add_rank_hundreds(worker, data):
        return DataProto.from_dict(tensors={"x": data.batch["x"] + 100 * worker.rank})

    out = group.execute_with_func_generator(add_rank_hundreds, rows(1, 2, 3, 4))
    assert out.batch["x"].tolist() == [1, 2, 103, 104]


def test_dp_compute_metric_returns_per_rank_list(group):
    assert group.row_sum(rows(1, 2, 3, 4)) == [{"rank": 0, "sum": 3}, {"rank": 1, "sum": 7}]


def test_rank_zero_modes_run_only_rank_zero(group):
    assert group.rank_zero_echo("v") == (0, "v")
    assert group.only_rank_zero() == 0
    assert group.execute_func_rank_zero(lambda worker, k: worker.rank + k, 5) == 5


def test_execute_helpers(group):
    assert group.execute_all("echo", ["p", "q"]) == [(0, "p"), (1, "q")]
    assert group.execute_rank_zero("echo", "z") == (0, "z")
    assert ray.get(group.execute_all_async("square", 5)) == [25, 25]


def test_gloo_all_reduce_across_two_ranks(group):
    assert group.all_reduce_rank_plus_one() == [("gloo", "gloo", 3.0), ("gloo", "gloo", 3.0)]


def test_raising_worker_names_group_rank_and_method(group):
    with pytest.raises(WorkerGroupError) as info:
        group.fail_on_rank(1)
    message = str(info.value)
    assert "worker group 'probe'" in message and "method 'fail_on_rank'" in message
    assert "failed on rank 1: ValueError: rank 1 refuses" in message
    assert sorted(info.value.failures) == [1]
    assert group.fail_on_rank(-1) == [0, 1]  # the group is still usable
    group.check_alive()


def test_call_timeout_raises_instead_of_waiting(group):
    group.call_timeout_s = 0.5
    try:
        with pytest.raises(WorkerGroupError, match=r"timed out after 0.5 s waiting for ranks \[0, 1\]"):
            group.sleep(2.0)
    finally:
        group.call_timeout_s = None
    assert group.sleep(0) == [0, 1]


def test_fork_started_ranks_come_from_one_zygote_and_keep_their_group_environment(ray_session):
    """LUFFY_FORK_WORKERS=1 (tests/run.sh sets it): both ranks are forked from one process that imported the
    worker's module (dev/luffy_pool_dev/worker_zygote.py); each still sees its own rank's environment,
    joins gloo and had its start-up collector pause."""

    def parent(pid):
        with open(f"/proc/{pid}/status") as f:
            ppid = int(next(line.split()[1] for line in f if line.startswith("PPid:")))
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            return ppid, f.read().replace(b"\0", b" ").decode()

    def zygote(pid):  # a rank's parent is its guard, the guard's the zygote (both run worker_zygote.py --serve)
        guard, guard_cmd = parent(pid)
        assert "worker_zygote.py --serve" in guard_cmd
        return parent(guard)

    worker_cls = RayClassWithInitArgs(ProbeWorker, scale=2)
    # the module group's environment: where tests/run.sh forks that group too, its zygote serves this one
    worker_cls.update_options({"runtime_env": {"env_vars": {"PROBE_FLAG": "on"}}})
    wg = _forked_group(2, worker_cls, "forked")
    try:
        info = wg.whoami("forked")
        (z0, cmd0), (z1, _) = (zygote(i["pid"]) for i in info)
        assert z0 == z1 and "worker_zygote.py --serve" in cmd0 and f"--preload {ProbeWorker.__module__}" in cmd0
        assert [(i["env"]["RANK"], i["env"]["MASTER_PORT"]) for i in info] == [
            ("0", str(wg.master_port)),
            ("1", str(wg.master_port)),
        ]
        assert wg.all_reduce_rank_plus_one() == [("gloo", "gloo", 3.0), ("gloo", "gloo", 3.0)]
        assert all(rank["enabled"] and rank["frozen"] > 100_000 for rank in wg.collector())
    finally:
        wg.shutdown()
        wg.resource_pool.release()


def _hold_the_gil(worker, seconds: float) -> None:
    """Run in a rank: a C call that keeps the GIL (ctypes.PyDLL), as a rank blocked in a CUDA call does."""
    import ctypes

    ctypes.PyDLL(None).sleep(int(seconds))


def test_ray_kill_of_a_forked_rank_holding_the_gil_is_a_hard_kill(ray_session):
    """ray.kill of a forked rank blocked in a C call that keeps the GIL ends its process within seconds. Ray 2.60
    SIGKILLs the PID the rank registered; where the process Ray started (the client) is killed instead, the rank's
    guard and parent-death signal end it (tests/dev/test_worker_zygote.py)."""

    wg = _forked_group(1, RayClassWithInitArgs(Worker), "stuck")
    try:
        rank = wg.workers[0]
        pid, zygote, command, _ = ray.get(rank.__ray_call__.remote(_where))
        assert "worker_zygote.py --serve" in command  # forked
        rank.__ray_call__.remote(_hold_the_gil, 120)
        time.sleep(1.0)  # into the call: from here no thread of the rank runs Python
        ray.kill(rank)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}"):
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            assert time.monotonic() < deadline, "ray.kill left the forked rank running"
            time.sleep(0.05)
    finally:
        wg.shutdown()
        wg.resource_pool.release()


def _zygote_of_this_rank() -> int:
    """A forked rank's parent is its guard; the guard's parent is the zygote (worker_zygote.py)."""
    with open(f"/proc/{os.getppid()}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("PPid:")))


def _where(worker) -> tuple:
    """Run in a rank (``__ray_call__``): its PID, its zygote's PID and command, and the Ray job it registered with."""
    zygote = _zygote_of_this_rank()
    with open(f"/proc/{zygote}/cmdline", "rb") as f:
        command = f.read().replace(b"\0", b" ").decode()
    return os.getpid(), zygote, command, ray.get_runtime_context().get_job_id()


# A second driver: a job of its own on the same Ray, starting a forked group of the same class and environment.
SECOND_JOB = r"""
import json, os, sys
import ray
from verl.single_controller.base import Worker
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

def where(worker):  # the rank's PID, its zygote's (the parent of its guard) and its job
    with open(f"/proc/{os.getppid()}/status") as f:
        zygote = int(next(line.split()[1] for line in f if line.startswith("PPid:")))
    return os.getpid(), zygote, ray.get_runtime_context().get_job_id()

ray.init(address=sys.argv[1], log_to_driver=False)
pool = RayResourcePool([2], use_gpu=False, name_prefix="second_job_pool")
wg = RayWorkerGroup(pool, RayClassWithInitArgs(Worker), name_prefix="second_job")
ranks = ray.get([w.__ray_call__.remote(where) for w in wg.workers])
print("RESULT " + json.dumps({"job": ray.get_runtime_context().get_job_id(), "ranks": ranks}), flush=True)
"""


@pytest.mark.e2e  # a second driver process (~4 s)
def test_one_zygote_serves_two_jobs_and_each_rank_registers_with_its_own_job(ray_session, tmp_path):
    """Ray stays out of the zygote (its core library reads the job id when loaded), so the ranks of another job on
    this raylet fork from the same zygote, each registered with its own job; this job's ranks outlive the other's."""
    import json
    import subprocess

    wg = _forked_group(2, RayClassWithInitArgs(Worker), "first_job")
    try:
        ours = ray.get([w.__ray_call__.remote(_where) for w in wg.workers])
        script = tmp_path / "second_job.py"
        script.write_text(SECOND_JOB)
        env = dict(os.environ, **_fork_switches())
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run(
            [sys.executable, str(script), ray.get_runtime_context().gcs_address],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and result, proc.stdout[-3000:] + proc.stderr[-3000:]
        theirs = json.loads(result[0][len("RESULT ") :])
        zygote = ours[0][1]
        assert "worker_zygote.py --serve" in ours[0][2] and {r[1] for r in ours} == {zygote}
        assert {z for _, z, _ in theirs["ranks"]} == {zygote}  # the other job's ranks: the same zygote
        assert {r[3] for r in ours} == {ray.get_runtime_context().get_job_id()}
        assert {job for _, _, job in theirs["ranks"]} == {theirs["job"]} != {ray.get_runtime_context().get_job_id()}
        # that job has ended and Ray has stopped its workers; this job's ranks still answer
        assert [r[0] for r in ray.get([w.__ray_call__.remote(_where) for w in wg.workers])] == [r[0] for r in ours]
    finally:
        wg.shutdown()
        wg.resource_pool.release()
