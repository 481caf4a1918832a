"""End to end: a LUFFY run with ``trainer.max_restarts=1`` survives ``kill -9`` of one of its worker processes.

The driver (a child process: Hydra config -> ``build_trainer`` -> ``fit_and_close`` with the run's recovery, as
``run_ppo`` does) trains a 3-step tiny LUFFY run on 2 CPU ranks, saving every step. It pauses at the start of
step 2 (the step-1 checkpoint is published) and prints its workers' pids; the test copies that checkpoint,
SIGKILLs rank 1's process, waits for it to be gone and lets the driver go on. Step 2's first worker call fails,
the driver logs one restart, rebuilds the worker group, resumes from step 1 and finishes steps 2 and 3 with
exit 0. A second driver, an uninterrupted run resumed from the copied step-1 checkpoint, runs at the same time;
the steps after the restart must have its metrics (timings aside).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from verl.utils.checkpoint import layout

pytestmark = pytest.mark.e2e

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, PAUSE_STEP = 3, 2
# Wall-clock or machine-dependent metrics; every other key must be equal after the restart.
CLOCK_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "mfu/", "checkpoint/", "trainer/")
CLOCK_KEYS = {"time", "reward/score_time_s"}


def drive(config_path: str, go_file: str = "") -> None:
    """``run_ppo`` with a pause at the start of PAUSE_STEP of the first attempt (until ``go_file`` exists)."""
    import copy

    import ray
    from omegaconf import OmegaConf

    from luffy_pool.run.launcher import build_trainer, fit_and_close, recovery_for

    config = OmegaConf.load(config_path)
    original = copy.deepcopy(config)
    trainer, close = build_trainer(config)
    real_step = trainer.rollout_step

    def step(timing):
        if go_file and trainer.global_steps == PAUSE_STEP:
            pids = ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in trainer.wg._workers])
            print(f"PAUSED {trainer.global_steps} WORKER_PIDS {json.dumps(pids)}", flush=True)
            deadline = time.monotonic() + 600
            while not os.path.exists(go_file) and time.monotonic() < deadline:
                time.sleep(0.1)
        return real_step(timing)

    trainer.rollout_step = step
    fit_and_close(trainer, close, recovery_for(original, trainer.sections))
    print("DRIVER_DONE", flush=True)


class Driver:
    """A driver subprocess; a thread copies its output to ``log_path`` as it comes (two drivers run at once)."""

    def __init__(self, config_path: str, log_path: str, go_file: str = ""):
        code = (
            f"import sys; sys.path.insert(0, {HERE!r}); import test_recovery_e2e as t; "
            f"t.drive({config_path!r}, {go_file!r})"
        )
        self.log_path, self.lines, self.cond = log_path, [], threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, RAY_ADDRESS="", PYTHONUNBUFFERED="1"),
            cwd=os.path.dirname(log_path),
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                with self.cond:
                    self.lines.append(line)
                    self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # end of output
            self.cond.notify_all()

    def wait_for(self, marker: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self.cond:
            while time.monotonic() < deadline:
                for line in self.lines[seen:]:
                    if line is None:
                        raise AssertionError(
                            f"driver ended (exit {self.proc.wait()}) without {marker!r}; see {self.log_path}"
                        )
                    if marker in line:
                        return line
                seen = len(self.lines)
                self.cond.wait(timeout=1.0)
        self.proc.kill()  # a hang fails the test instead of the suite
        raise AssertionError(f"driver never printed {marker!r} within {timeout_s} s; see {self.log_path}")

    def finish(self) -> int:
        self.wait_for("DRIVER_DONE")
        rc = self.proc.wait(timeout=120)
        self.reader.join(timeout=60)
        return rc


def _config(compose_config, luffy_overrides, model_dir, task_dir, out_dir, path) -> str:
    from omegaconf import OmegaConf

    ours = ["trainer.save_freq=1", "trainer.test_freq=-1", "trainer.max_restarts=1", "trainer.restart_wait_s=60"]
    keys = {o.split("=", 1)[0] for o in ours}
    base = [o for o in luffy_overrides(model_dir, task_dir, out_dir, steps=STEPS) if o.split("=", 1)[0] not in keys]
    OmegaConf.save(compose_config(base + ours), path)
    return str(path)


def _metrics(folder) -> list:
    return [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl")) if line.strip()]


def _comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in CLOCK_KEYS and not k.startswith(CLOCK_PREFIXES)}


def _wait_gone(pid: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead; its parent reaps it
                    return
        except OSError:
            return
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} still alive {timeout_s} s after SIGKILL"


def test_kill_9_of_a_worker_restarts_resumes_and_matches_an_uninterrupted_resume(
    tiny_model_dir, tmp_path, compose_config, luffy_overrides
):
    from luffy_pool.tiny import write_task_parquets

    task = str(tmp_path / "task")
    write_task_parquets(task, n_train=8, n_test=4, level=2, seed=0)
    run_cfg, ref_cfg = (
        _config(compose_config, luffy_overrides, tiny_model_dir, task, str(tmp_path / name), tmp_path / f"{name}.yaml")
        for name in ("run", "ref")
    )
    go = str(tmp_path / "go")
    started = time.monotonic()
    run = Driver(run_cfg, str(tmp_path / "run.log"), go_file=go)
    ref = None
    try:
        line = run.wait_for(f"PAUSED {PAUSE_STEP}")
        assert layout.read_tracker(str(tmp_path / "run")) == PAUSE_STEP - 1
        # the reference resumes from a copy of the very checkpoint the restart will resume from
        step_dir = layout.step_dir_name(PAUSE_STEP - 1)
        shutil.copytree(tmp_path / "run" / step_dir, tmp_path / "ref" / step_dir)
        layout.write_tracker(str(tmp_path / "ref"), PAUSE_STEP - 1)
        ref = Driver(ref_cfg, str(tmp_path / "ref.log"))
        victim = json.loads(line.split("WORKER_PIDS", 1)[1])[1]
        os.kill(victim, signal.SIGKILL)
        _wait_gone(victim)
        open(go, "w").close()
        assert run.finish() == 0, f"see {tmp_path / 'run.log'}"
        assert ref.finish() == 0, f"see {tmp_path / 'ref.log'}"
    finally:
        for d in (run, ref):
            if d is not None and d.proc.poll() is None:
                d.proc.kill()
    print(f"recovery e2e: {time.monotonic() - started:.0f} s")

    log = open(tmp_path / "run.log").read()
    restarts = [ln for ln in log.splitlines() if "(trainer.max_restarts) for" in ln]
    assert len(restarts) == 1, restarts
    assert f"restart 1 of 1 (trainer.max_restarts) for worker_died at step {PAUSE_STEP}" in restarts[0]
    assert f"resuming from step {PAUSE_STEP - 1}, 1 step(s) lost" in restarts[0]
    assert layout.read_tracker(str(tmp_path / "run")) == STEPS

    run_m, ref_m = _metrics(tmp_path / "run"), _metrics(tmp_path / "ref")
    assert [m["step"] for m in run_m] == list(range(1, STEPS + 1))  # step 2's failed attempt logged nothing
    assert [m["step"] for m in ref_m] == list(range(PAUSE_STEP, STEPS + 1))
    after = run_m[PAUSE_STEP - 1 :]
    assert after[0]["trainer/restarts"] == 1 and after[0]["trainer/steps_lost"] == 1
    assert all("trainer/restarts" not in m for m in after[1:] + run_m[:1])
    for got, want in zip(after, ref_m):
        got, want = _comparable(got), _comparable(want)
        assert got.keys() == want.keys()
        bad = {
            k: (got[k], want[k])
            for k in got
            if not (
                got[k] == want[k]
                or (isinstance(got[k], float) and math.isclose(got[k], want[k], rel_tol=1e-5, abs_tol=1e-6))
            )
        }
        assert not bad, f"step {got['step']}: {bad}"


# ---------------------------------------------------------------------- two fake nodes
TWO_NODES = r'''
import json, time
import ray
from ray.cluster_utils import Cluster
from luffy_pool.run.recovery import CapacityTimeout, wait_for_capacity, world_shape
from verl.single_controller.ray import RayResourcePool

node = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 96 << 20}
cluster = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
out = {}
try:
    worker = cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    groups, bundle = world_shape(nnodes=2, per_node=2, use_gpu=True)
    out["full"] = wait_for_capacity(groups, bundle, 30, ray.nodes, poll_s=0.2)
    cluster.remove_node(worker)
    deadline = time.monotonic() + 120
    while sum(n["Alive"] for n in ray.nodes()) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    t0 = time.monotonic()
    try:
        wait_for_capacity(groups, bundle, 3, ray.nodes, poll_s=0.2)
        out["gave_up"] = None
    except CapacityTimeout as exc:
        out["gave_up"], out["gave_up_after_s"] = str(exc), time.monotonic() - t0
    import threading
    result = {}
    waiter = threading.Thread(target=lambda: result.update(waited=wait_for_capacity(groups, bundle, 300, ray.nodes,
                                                                                    poll_s=0.2)))
    waiter.start()
    time.sleep(1.0)
    out["waiting_while_absent"] = waiter.is_alive()
    cluster.add_node(**node)
    waiter.join(timeout=300)
    out["returned"] = not waiter.is_alive() and "waited" in result
    # the capacity it waited for is what the run's resource pool places: 2 node groups of 2 GPU ranks
    pool = RayResourcePool(process_on_nodes=groups, use_gpu=True, name_prefix="recovery_test", placement_timeout_s=120)
    pool.get_placement_groups()
    out["placed_on_distinct_nodes"] = len(set(pool.node_ids())) == 2
    pool.release()
    print("RESULT " + json.dumps(out), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
'''


def test_two_node_cluster_waits_for_a_removed_node_and_gives_up_naming_the_keys(tmp_path):
    started = time.monotonic()
    env = dict(os.environ, RAY_ADDRESS="", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-c", TWO_NODES], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    print(f"two-node capacity e2e: {time.monotonic() - started:.0f} s")
    assert out["full"] >= 0.0  # both nodes up: returned (not raised)
    assert out["gave_up"] is not None and out["gave_up_after_s"] >= 3.0
    assert "trainer.restart_wait_s=3" in out["gave_up"] and "trainer.nnodes" in out["gave_up"]
    assert out["waiting_while_absent"] and out["returned"] and out["placed_on_distinct_nodes"]
