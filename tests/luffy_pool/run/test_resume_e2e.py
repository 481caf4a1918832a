"""End to end: a LUFFY run survives SIGKILL and SIGTERM of its driver and loses nothing.

Every run is a separate driver process (Hydra config -> launcher -> its own Ray instance with 2 FSDP
ranks -> fit) on an 8-prompt task with 4 prompts per step, so an epoch is 2 steps and every periodic
checkpoint (save_freq=2) sits on an epoch boundary. Timeline of the interrupted run (one chain of drivers
on one checkpoint folder):

1. SIGKILL while the step-4 checkpoint is being written -> step 2 stays the checkpoint resume uses;
2. resume from step 2 (epoch boundary) -> trains 3; SIGTERM in the middle of step 3: the run finishes and
   saves that step, releases Ray and exits 143;
3. resume from step 3 (mid-epoch) -> trains 4 (checkpoint), SIGKILL during step 5;
4. resume from step 4 -> trains 5, 6.

It must end with the same per-step prompts and (fp32, same world size) the same weights as an
uninterrupted run. A 2-rank checkpoint is also resumed on 1 rank. The interrupted chain runs at the same
time as the reference chain (``runs``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from luffy_pool.run.checkpointing import read_data_order
from verl.utils.checkpoint import layout

pytestmark = pytest.mark.e2e

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 6


# ---------------------------------------------------------------------- the driver (child process)
def drive(
    config_path: str,
    result_dir: str,
    hang_in_save_step: int = -1,
    dump_after_resume: bool = False,
    hang_in_step: int = -1,
    signal_in_step: int = -1,
    prepare: str = "",
) -> None:
    """Run ``fit`` like ``main_mix_ppo`` does, with step markers the parent can kill on.

    ``signal_in_step``: that step waits until the parent's stop signal has arrived, then runs; the run
    ends through ``fit_and_close`` like ``run_ppo`` (exit code 128 + signal). ``prepare``: ``"module:function"``
    (a module of this folder) called with the built trainer before ``fit`` (before any resume).
    """
    import importlib

    from omegaconf import OmegaConf

    from luffy_pool.run.launcher import build_trainer, fit_and_close

    trainer, close = build_trainer(OmegaConf.load(config_path))
    if prepare:
        module, function = prepare.split(":")
        getattr(importlib.import_module(module), function)(trainer)
    ckpt = trainer.checkpointer
    assert ckpt is not None, "the launcher must build a TrainerCheckpointer"
    real_step, real_draw = trainer.rollout_step, trainer.draw_batch
    real_save, real_resume = trainer.wg.save_checkpoint, ckpt.maybe_resume

    def step_start():
        print(f"STEP_START {trainer.global_steps}", flush=True)
        if trainer.global_steps == hang_in_step:  # the step has begun (its data drawn); the parent kills us here
            time.sleep(3600)
        if trainer.global_steps == signal_in_step:
            deadline = time.monotonic() + 600
            while not trainer.stop.requested and time.monotonic() < deadline:
                time.sleep(0.1)

    def draw(step_no, metrics, timing):  # hybrid engine: once the step's data is drawn (and recorded)
        batch = real_draw(step_no, metrics, timing)
        step_start()
        return batch

    def split_step(timing):  # split engines (hybrid_engine=False): fit's step (a batch may be drawn a step early)
        step_start()
        return real_step(timing)

    def save(local_path, global_step=None, **kw):
        out = real_save(local_path, global_step=global_step, **kw)
        if global_step == hang_in_save_step:
            print(f"SAVE_WRITTEN {global_step}", flush=True)
            time.sleep(3600)
        return out

    def resume(tr):
        step_no = real_resume(tr)
        print(f"RESUMED_AT {step_no}", flush=True)
        if dump_after_resume:
            trainer.wg.save_hf_model(os.path.join(result_dir, "after_resume_hf"))
        return step_no

    if trainer.rollout_wg is None:
        trainer.draw_batch = draw
    else:
        trainer.rollout_step = split_step
    trainer.wg.save_checkpoint, ckpt.maybe_resume = save, resume
    if signal_in_step > 0:
        fit_and_close(trainer, close)  # raises SystemExit(128 + signal) after the stop
        print("DRIVER_DONE", flush=True)
        return
    try:
        trainer.fit()
        trainer.wg.save_hf_model(os.path.join(result_dir, "final_hf"))
    finally:
        close()
    print("DRIVER_DONE", flush=True)


# ---------------------------------------------------------------------- parent side
def _proc_start_time(pid: int):
    """Field 22 of /proc/<pid>/stat (start time): tells a process from a later one that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append((child, _proc_start_time(child)))
            todo.append(child)
    return out


class Driver:
    """A driver subprocess whose output we follow; ``kill()`` SIGKILLs it, then the Ray processes it started."""

    def __init__(self, config_path: str, result_dir: str, log_path: str, **drive_kwargs):
        os.makedirs(result_dir, exist_ok=True)
        code = (
            f"import sys; sys.path.insert(0, {HERE!r}); import test_resume_e2e as t; "
            f"t.drive({config_path!r}, {result_dir!r}, **{drive_kwargs!r})"
        )
        env = dict(os.environ, RAY_ADDRESS="", PYTHONUNBUFFERED="1")
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=result_dir,
        )

    def wait_for(self, marker: str, timeout_s: float = 900) -> None:
        watchdog = threading.Timer(timeout_s, self.proc.kill)  # a silent hang must not block the suite
        watchdog.start()
        try:
            for line in self.proc.stdout:
                self.log.write(line)
                if marker in line:
                    self.log.flush()
                    return
        finally:
            watchdog.cancel()
        self.kill()
        raise AssertionError(f"driver never printed {marker!r} (exit {self.proc.returncode}); see {self.log.name}")

    def kill(self) -> None:
        doomed = _descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        time.sleep(2)
        for pid, started in doomed:  # Ray's gcs/raylet/workers started by this driver
            if started is not None and _proc_start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 600) -> tuple[int, int]:
        """Send ``sig`` and let the driver wind down -> (its exit code, how many of the processes it had started
        are still alive 60 s after it exited)."""
        started = _descendants(self.proc.pid)
        self.proc.send_signal(sig)
        for line in self.proc.stdout:
            self.log.write(line)
        rc = self.proc.wait(timeout=timeout_s)
        self.log.close()
        deadline, alive = time.monotonic() + 60, started
        while alive and time.monotonic() < deadline:
            time.sleep(1)
            alive = [(pid, t) for pid, t in alive if t is not None and _proc_start_time(pid) == t]
        return rc, len(alive)

    def finish(self, timeout_s: float = 1200) -> None:
        self.wait_for("DRIVER_DONE", timeout_s)
        for line in self.proc.stdout:
            self.log.write(line)
        assert self.proc.wait(timeout=120) == 0, f"driver failed; see {self.log.name}"
        self.log.close()


def _config(compose_config, luffy_overrides, model_dir, task_dir, out_dir, path, extra=()):
    """The tiny LUFFY run's overrides with ours replacing any same-key entry (Hydra rejects duplicates)."""
    from omegaconf import OmegaConf

    ours = ["trainer.save_freq=2", "trainer.test_freq=-1", "trainer.max_optim_to_keep=3", *extra]
    keys = {o.split("=", 1)[0].lstrip("+") for o in ours}
    base = [
        o
        for o in luffy_overrides(model_dir, task_dir, out_dir, steps=STEPS)
        if o.split("=", 1)[0].lstrip("+") not in keys
    ]
    OmegaConf.save(compose_config(base + ours), path)
    return str(path)


def _hf_weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _sigterm_mid_step(driver: "Driver", step: int, ckpt_root) -> dict:
    """SIGTERM ``driver`` (started with ``signal_in_step=step``) once it is in that step; what it left behind."""
    try:
        driver.wait_for(f"STEP_START {step}")
        rc, left_alive = driver.stop(signal.SIGTERM)
        return {
            "rc": rc,
            "tracker": layout.read_tracker(str(ckpt_root)),
            "left_alive": left_alive,
            "published": [s for s, _ in layout.list_step_dirs(str(ckpt_root))],
        }
    finally:
        if driver.proc.poll() is None:
            driver.kill()


def _interrupted_chain(root, run_cfg) -> dict:
    """SIGKILL while the step-4 checkpoint is written; resume, SIGTERM in step 3; resume, SIGKILL in step 5;
    resume to the end (module docstring). One chain: each resume starts from what the previous stop left."""
    out = {}
    first = Driver(run_cfg, str(root / "run_result1"), str(root / "run1.log"), hang_in_save_step=4)
    first.wait_for("SAVE_WRITTEN 4")
    first.kill()
    out["after_save_kill"] = {
        "tracker": layout.read_tracker(str(root / "run")),
        "published": [s for s, _ in layout.list_step_dirs(str(root / "run"))],
        "tmp_exists": (root / "run" / ".tmp_global_step_4").is_dir(),
    }
    out["sigterm"] = _sigterm_mid_step(
        Driver(run_cfg, str(root / "run_result2"), str(root / "run2.log"), signal_in_step=3), 3, root / "run"
    )

    # Killed inside step 5 (fast tiny steps could otherwise finish step 5 and 6 before a timed kill).
    third = Driver(run_cfg, str(root / "run_result3"), str(root / "run3.log"), hang_in_step=5)
    third.wait_for("RESUMED_AT")
    third.wait_for("STEP_START 5")
    time.sleep(0.5)
    third.kill()

    Driver(run_cfg, str(root / "run_result4"), str(root / "run4.log")).finish()
    return out


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, compose_config, luffy_overrides):
    """Every driver of this module. Two independent chains run at once (each driver is one process tree with
    its own Ray; the kill points are markers, not timers, so the overlap changes no outcome): the
    uninterrupted reference and its 1-rank resume; and the interrupted run with its three resumes. Each
    driver alone leaves part of the 2 cores idle (start-up, Ray, the driver)."""
    from luffy_pool.tiny import write_task_parquets

    root = tmp_path_factory.mktemp("resume_e2e")
    task = str(root / "task")
    write_task_parquets(task, n_train=8, n_test=4, level=2, seed=0)
    mk = lambda name, extra=(): _config(
        compose_config,
        luffy_overrides,
        tiny_model_dir,
        task,  # noqa: E731
        str(root / name),
        root / f"{name}.yaml",
        extra,
    )
    ref_cfg, run_cfg = mk("ref"), mk("run")
    one_cfg = mk(
        "one_rank",
        [
            "trainer.n_gpus_per_node=1",
            f"trainer.resume_mode={root / 'ref' / 'global_step_4'}",
            "trainer.total_training_steps=5",
        ],
    )

    def reference_chain() -> None:
        Driver(ref_cfg, str(root / "ref_result"), str(root / "ref.log")).finish()
        Driver(one_cfg, str(root / "one_result"), str(root / "one.log"), dump_after_resume=True).finish()

    with ThreadPoolExecutor(2) as pool:
        interrupted, reference = pool.submit(_interrupted_chain, root, run_cfg), pool.submit(reference_chain)
        reference.result()
        return {"root": root, "ref": root / "ref", "run": root / "run", **interrupted.result()}


def test_sigkill_while_writing_a_checkpoint_leaves_the_previous_one_for_resume(runs):
    state = runs["after_save_kill"]
    assert state["tracker"] == 2 and state["published"] == [2] and state["tmp_exists"]
    assert "RESUMED_AT 2" in open(runs["root"] / "run2.log").read()


def test_resume_from_an_epoch_boundary_trains_the_remaining_steps(runs):
    data = torch.load(runs["run"] / "global_step_2" / layout.DATA_FILE, weights_only=False)
    assert data["sampler"]["perm_index"] == 8, "step 2 ends epoch 1 (8 prompts, 4 per step)"
    log = open(runs["root"] / "run2.log").read()
    assert "STEP_START 3" in log and runs["sigterm"]["tracker"] == 3  # step 3 trained and saved after the resume


def test_kill_during_step_5_then_resume_matches_an_uninterrupted_run(runs):
    assert "STEP_START 5" in open(runs["root"] / "run3.log").read()
    assert "RESUMED_AT 4" in open(runs["root"] / "run4.log").read()
    ref_order, run_order = read_data_order(str(runs["ref"])), read_data_order(str(runs["run"]))
    assert sorted(ref_order) == list(range(1, STEPS + 1))
    assert run_order == ref_order
    assert layout.read_tracker(str(runs["run"])) == STEPS
    ref_w = _hf_weights(runs["root"] / "ref_result" / "final_hf")
    run_w = _hf_weights(runs["root"] / "run_result4" / "final_hf")
    assert _max_diff(ref_w, run_w) <= 1e-6
    metrics = [json.loads(line) for line in open(runs["run"] / "metrics.jsonl") if line.strip()]
    assert [m["step"] for m in metrics if "checkpoint/size_mb" in m][-1] == STEPS


def test_two_rank_checkpoint_resumes_on_one_rank(runs):
    from verl.model_merger import merge_checkpoint

    assert "RESUMED_AT 4" in open(runs["root"] / "one.log").read()
    merged = merge_checkpoint(str(runs["ref"] / "global_step_4"), str(runs["root"] / "ref_step4_hf"))
    assert _max_diff(_hf_weights(runs["root"] / "one_result" / "after_resume_hf"), _hf_weights(merged)) <= 1e-7
    assert read_data_order(str(runs["root"] / "one_rank"))[5] == read_data_order(str(runs["ref"]))[5]
    assert layout.read_tracker(str(runs["root"] / "one_rank")) == 5


# ---------------------------------------------------------------------- SIGTERM (link 2 of the interrupted chain)
def test_sigterm_mid_step_saves_that_step_releases_ray_and_exits_143(runs):
    sigterm_run = runs["sigterm"]
    assert sigterm_run["rc"] == 143, f"see {runs['root'] / 'run2.log'}"
    assert sigterm_run["tracker"] == 3 and sigterm_run["published"] == [2, 3]
    assert sigterm_run["left_alive"] == 0, "the Ray processes of the stopped driver must exit with it"
    log = open(runs["root"] / "run2.log").read()
    assert "received SIGTERM" in log and "STEP_START 4" not in log and "Traceback" not in log


def test_resume_after_sigterm_matches_an_uninterrupted_run(runs):
    # the resume from the SIGTERM checkpoint (step 3, mid-epoch) trains on from step 4; the chain's end (links
    # 3 and 4) has the uninterrupted run's prompts and weights (test_kill_during_step_5_then_resume_...)
    log = open(runs["root"] / "run3.log").read()
    assert "RESUMED_AT 3" in log and "STEP_START 3" not in log and "STEP_START 4" in log
    assert read_data_order(str(runs["run"])) == read_data_order(str(runs["ref"]))
    ref_w = _hf_weights(runs["root"] / "ref_result" / "final_hf")
    assert _max_diff(ref_w, _hf_weights(runs["root"] / "run_result4" / "final_hf")) <= 1e-6
