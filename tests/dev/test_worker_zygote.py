"""Fork-started workers (dev/luffy_pool_dev/worker_zygote.py): the client Ray executes hands its argv,
environment, folder and stdio to a zygote whose guard forked the worker; exit codes and signals come back, a
child goes when its client goes (even holding the GIL), and a zygote that cannot start, or whose preload
initialised CUDA, leaves the worker to start plainly; GPU ranks are never forked. The part through Ray (a
RayWorkerGroup through verl's actor hook with LUFFY_FORK_WORKERS=1): test_ray_worker_group.py in
tests/verl/single_controller. The actor hook (fork_workers.py) is tested here through verl's create_actor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from luffy_pool_dev import worker_zygote
from luffy_pool_dev.fork_workers import zygote_executable

ZYGOTE = worker_zygote.__file__
# A stand-in for Ray's default_worker.py: reports what it sees, then exits as told.
SCRIPT = """
import json, os, sys, time
import random
with open(f"/proc/{os.getppid()}/status") as f:  # the guard's parent: the zygote
    zygote = int(next(line.split()[1] for line in f if line.startswith("PPid:")))
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "zygote": zygote, "argv": sys.argv, "cwd": os.getcwd(),
                  "rank": os.environ.get("RANK"), "shared": os.environ.get("SHARED"), "random": random.random(),
                  "path": sys.path, "preloaded": "email.mime.text" in sys.modules}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
action = sys.argv[1]
if action == "sleep":
    time.sleep(60)
if action == "stuck":  # a C call that keeps the GIL, as a rank blocked in a CUDA call does (PyDLL keeps it)
    import ctypes
    ctypes.PyDLL(None).sleep(60)
if action in ("term", "kill"):
    os.kill(os.getpid(), 15 if action == "term" else 9)
sys.exit(int(action))
"""


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _wait_gone(pid: int, marker: str, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}") and marker in _cmdline_or_empty(pid) and _state(pid) != "Z":
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "worker_main.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.fixture
def run_client(tmp_path, monkeypatch):
    """Runs the client as Ray would (its parent stands in for the raylet); stops the zygotes it started."""
    zygotes = set()
    # a key of this test's own: no zygote of an earlier test (or run) answers
    monkeypatch.setenv("SHARED", f"value-{os.getpid()}-{time.monotonic_ns()}")

    def run(*args, preload="email.mime.text", env=None, cwd=None, **kwargs):
        proc = subprocess.run(
            [sys.executable, ZYGOTE, "--preload", preload, *args],
            capture_output=True,
            text=True,
            env=dict(os.environ, **(env or {})),
            cwd=cwd or str(tmp_path),
            timeout=120,
            **kwargs,
        )
        seen = json.loads(proc.stdout.splitlines()[0]) if proc.stdout else None
        if seen and "--serve" in _cmdline_or_empty(seen.get("zygote", 0)):
            zygotes.add(seen["zygote"])
        return proc, seen

    yield run
    for pid in zygotes:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _cmdline_or_empty(pid: int) -> str:
    try:
        return _cmdline(pid)
    except OSError:
        return ""


def test_key_leaves_out_what_each_rank_and_job_gets_on_its_own():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "RANK": "0", "MASTER_PORT": "1234", "RAY_JOB_ID": "01000000"}
    same = dict(base, RANK="3", MASTER_PORT="999", LOCAL_RANK="1")
    key = worker_zygote.zygote_key
    assert key(base, "m", 7) == key(same, "m", 7)
    # Ray is not preloaded (each child loads it with its job's id): a zygote serves every job of its raylet
    assert key(base, "m", 7) == key(dict(base, RAY_JOB_ID="02000000"), "m", 7)
    assert key(base, "m", 7) != key(dict(base, OMP_NUM_THREADS="2"), "m", 7)
    assert key(base, "m", 7) != key(base, "m,vllm", 7) and key(base, "m", 7) != key(base, "m", 8)  # another raylet


def test_forked_worker_gets_the_clients_argv_env_folder_stdio_and_exit_code(run_client, script, tmp_path):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    first, a = run_client(script, "3", env={"RANK": "0"}, cwd=str(folder))
    second, b = run_client(script, "0", env={"RANK": "1"})
    assert (first.returncode, second.returncode) == (3, 0)
    assert "to stderr" in first.stderr and "to stderr" in second.stderr  # the client's own stdio
    # one zygote (the preload's imports done once) forked both, each through a guard of its own; not the client
    assert a["zygote"] == b["zygote"] and "--serve" in _cmdline(a["zygote"]) and a["preloaded"]
    assert a["ppid"] != b["ppid"] and a["ppid"] not in (os.getpid(), a["zygote"])
    assert (a["rank"], b["rank"]) == ("0", "1") and a["shared"] == b["shared"] == os.environ["SHARED"]
    assert a["argv"] == [script, "3"] and a["cwd"] == str(folder) and b["cwd"] == str(tmp_path)
    # sys.path as `python script` has it (Ray's import adds its thirdparty folder), not the zygote's own folder
    plain = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(tmp_path),
    )
    assert a["path"][0] == os.path.dirname(script) and set(json.loads(plain.stdout)) <= set(a["path"])
    assert os.path.dirname(ZYGOTE) not in a["path"]
    assert a["random"] != b["random"]  # each child re-seeded, not the zygote's generator state


# A module that, like vLLM's ray_utils, works without Ray; and a stand-in worker reporting what its child sees.
TRIES_RAY = """
try:
    import ray
    from ray import ObjectRef
except ImportError:
    ray = ObjectRef = None
LOADS = globals().get("LOADS", 0) + 1
"""
PROBES_RAY = """
import importlib.util
FOUND = importlib.util.find_spec("ray") is not None
LOADS = globals().get("LOADS", 0) + 1
"""
RAY_SCRIPT = """
import json, os, sys
import probes_ray, tries_ray
with open(f"/proc/{os.getppid()}/maps") as f:  # the guard's, a fork of the zygote's
    zygote_has_ray = "_raylet" in f.read()
with open(f"/proc/{os.getppid()}/status") as f:
    zygote = int(next(line.split()[1] for line in f if line.startswith("PPid:")))
print(json.dumps({"ppid": os.getppid(), "zygote": zygote,
                  "ray": tries_ray.ray is not None and tries_ray.ObjectRef is not None, "loads": tries_ray.LOADS,
                  "zygote_has_ray": zygote_has_ray, "job": os.environ.get("RAY_JOB_ID"),
                  "loaded_with_job": tries_ray.ray.__name__ == "ray" and "ray._raylet" in sys.modules,
                  "probe": [probes_ray.FOUND, probes_ray.LOADS]}), flush=True)
"""


def test_ray_stays_out_of_the_zygote_and_each_child_imports_it_with_its_jobs_environment(run_client, tmp_path):
    (tmp_path / "tries_ray.py").write_text(TRIES_RAY)
    (tmp_path / "probes_ray.py").write_text(PROBES_RAY)
    script = tmp_path / "ray_main.py"
    script.write_text(RAY_SCRIPT)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    first, a = run_client(str(script), preload="probes_ray,tries_ray", env=dict(env, RAY_JOB_ID="01000000"))
    second, b = run_client(str(script), preload="probes_ray,tries_ray", env=dict(env, RAY_JOB_ID="02000000"))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    # two jobs, one zygote; it never loaded Ray's core library, so each child loads it with its own job id
    assert a["zygote"] == b["zygote"] and "--serve" in _cmdline(a["zygote"]) and not a["zygote_has_ray"]
    assert (a["job"], b["job"]) == ("01000000", "02000000")
    # the module that found no Ray in the zygote was imported again in the child, and has Ray there
    assert a["ray"] and b["ray"] and a["loads"] == b["loads"] == 2 and a["loaded_with_job"]
    # asking whether Ray is installed is not importing it: the answer is yes, and that module is not imported again
    assert a["probe"] == [True, 1]


@pytest.mark.parametrize("action, sig", [("term", signal.SIGTERM), ("kill", signal.SIGKILL)])
def test_a_signal_ending_the_worker_ends_the_client_with_it(run_client, script, action, sig):
    # SIGKILL is how Ray stops a worker group: the client must end the same way, without a traceback of its own
    proc, seen = run_client(script, action)
    assert proc.returncode == -sig and "--serve" in _cmdline(seen["zygote"]) and "Traceback" not in proc.stderr


@pytest.mark.parametrize("action", ["sleep", "stuck"])
def test_killing_the_client_ends_its_worker_even_one_holding_the_gil(run_client, script, tmp_path, action):
    _, up = run_client(script, "0")  # the zygote is up
    client = subprocess.Popen(
        [sys.executable, ZYGOTE, "--preload", "email.mime.text", script, action],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
        env=dict(os.environ),
    )
    seen = json.loads(client.stdout.readline())
    assert seen["zygote"] == up["zygote"] and "--serve" in _cmdline(seen["ppid"])  # forked, through a guard
    time.sleep(0.3)  # into the sleep: "stuck" holds the GIL from here on, no thread of the rank can run
    client.kill()  # Ray's SIGKILL of the process it started (ray.kill)
    client.wait()
    _wait_gone(seen["pid"], "worker_main", "the forked worker outlived its client")
    _wait_gone(seen["ppid"], "--serve", "the rank's guard outlived its client")


def test_a_rank_dies_with_its_guard_by_the_parent_death_signal(run_client, script, tmp_path):
    _, up = run_client(script, "0")
    client = subprocess.Popen(
        [sys.executable, ZYGOTE, "--preload", "email.mime.text", script, "stuck"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
        env=dict(os.environ),
    )
    try:
        seen = json.loads(client.stdout.readline())
        assert seen["zygote"] == up["zygote"] and "--serve" in _cmdline(seen["ppid"])
        os.kill(seen["ppid"], signal.SIGKILL)  # the guard, killed before it could kill the rank itself
        _wait_gone(seen["pid"], "worker_main", "the forked worker outlived its guard")
        assert client.wait(timeout=30) == 1  # its zygote connection closed without a status
    finally:
        client.kill()


PDEATHSIG_PARENT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import worker_zygote
if os.fork() == 0:
    worker_zygote.set_parent_death_signal()
    print(os.getpid(), flush=True)
    import ctypes
    ctypes.PyDLL(None).sleep(60)  # holding the GIL: no Python code of this child runs
    os._exit(0)
time.sleep(60)
"""


def test_set_parent_death_signal_kills_the_child_when_its_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PDEATHSIG_PARENT, os.path.dirname(ZYGOTE)], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())  # printed once the signal is set
    assert _state(child) in ("S", "R")
    parent.kill()
    parent.wait()
    _wait_gone(child, "-c", "the child outlived its parent")


def test_a_zygote_that_dies_while_importing_leaves_the_worker_to_start_plainly(run_client, script, tmp_path):
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(9)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc, seen = run_client(script, "5", preload="dies_on_import", env=env)
    assert proc.returncode == 5 and seen["argv"] == [script, "5"]
    assert "starting the worker plainly" in proc.stderr
    assert "--serve" not in _cmdline_or_empty(seen["ppid"])  # exec'd in place: the client is the worker
    # the zygote that died left its socket: the next client replaces it (here: this test removes it)
    path = worker_zygote.socket_path(worker_zygote.zygote_key(dict(os.environ, **env), "dies_on_import", os.getpid()))
    assert os.path.exists(path)
    for leftover in (path, path + ".lock"):
        os.unlink(leftover)


INITS_CUDA = """
import torch
torch.cuda.is_initialized = lambda: True  # what a module that touches the GPU at import time leaves behind
"""


def test_a_preload_that_initialised_cuda_forks_nothing_and_names_the_module(run_client, script, tmp_path):
    (tmp_path / "inits_cuda.py").write_text(INITS_CUDA)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    preload = "email.mime.text,inits_cuda"
    path = worker_zygote.socket_path(worker_zygote.zygote_key(dict(os.environ, **env), preload, os.getpid()))
    try:
        first, a = run_client(script, "4", preload=preload, env=env)
        second, b = run_client(script, "0", preload=preload, env=env)
        reason = "starting the worker plainly (preloading inits_cuda initialised CUDA (torch.cuda.is_initialized())"
        for proc, seen, code in ((first, a, 4), (second, b, 0)):
            assert proc.returncode == code and reason in proc.stderr, proc.stderr
            assert seen["ppid"] == os.getpid()  # exec'd in place by the client Ray started: no zygote, no guard
        # the zygote left its reason and went: the second rank read it without starting another
        assert not os.path.exists(path) and os.path.exists(worker_zygote.refused_path(path))
    finally:
        for leftover in (worker_zygote.refused_path(path), path + ".lock"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def test_cuda_initialized_asks_torch_only_when_it_was_imported():
    from types import SimpleNamespace

    assert not worker_zygote.cuda_initialized({})  # torch never imported: nothing initialised CUDA
    fake = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    assert worker_zygote.cuda_initialized({"torch": fake})
    assert not worker_zygote.cuda_initialized({"torch": SimpleNamespace()})  # a torch without its cuda module


def _created_actors(monkeypatch, fork: str = "1"):
    """verl's create_actor with the dev actor hook switched on (LUFFY_FORK_WORKERS=``fork``), recording the options it
    hands to Ray instead of starting actors."""
    from types import SimpleNamespace

    from luffy_pool_dev import ACTOR_HOOK, FORK_WORKERS_ENV

    from verl.single_controller.ray import base

    created = []

    class FakeRemote:  # records the actor options create_actor hands to Ray
        def options(self, **options):
            created.append(options)
            return SimpleNamespace(remote=lambda *a, **k: len(created))

    monkeypatch.setenv(base.ACTOR_RUNTIME_ENV_HOOK_ENV, ACTOR_HOOK)
    monkeypatch.setenv(FORK_WORKERS_ENV, fork)
    monkeypatch.setattr(base.ray, "remote", lambda cls: FakeRemote())
    monkeypatch.setattr(base, "PlacementGroupSchedulingStrategy", lambda **kw: kw)
    return created


def test_gpu_ranks_start_as_ray_starts_them_with_one_line_saying_why(monkeypatch, caplog):
    from luffy_pool_dev import fork_workers

    from verl.single_controller.ray import base

    created = _created_actors(monkeypatch)

    class Plain:
        pass

    def start(cls, num_gpus, options=None):
        cls.update_options(options or {})
        for rank in range(2):
            cls.create_actor(None, rank, {"RANK": str(rank)}, num_cpus=1.0, num_gpus=num_gpus)
        return [o["runtime_env"].get("py_executable") for o in created[-2:]]

    assert start(base.RayClassWithInitArgs(Plain), 0.0) == [zygote_executable(__name__)] * 2  # CPU ranks: forked
    with caplog.at_level("WARNING", logger=fork_workers.__name__):
        assert start(base.RayClassWithInitArgs(Plain), 1.0) == [None, None]
        assert start(base.RayClassWithInitArgs(Plain), 0.0, {"num_gpus": 0.5}) == [None, None]  # the options' ask
        gpu_by_resource = base.RayClassWithInitArgs(Plain)
        gpu_by_resource.set_additional_resource({"GPU": 1.0})
        assert start(gpu_by_resource, 0.0) == [None, None]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [worker_zygote.gpu_refusal(1.0, "Plain")]  # one per class, not per group or rank
    assert lines[0].startswith(
        "LUFFY_FORK_WORKERS is set, but the ranks of Plain ask for 1 GPU(s) each: they start as Ray starts them"
    )
    assert worker_zygote.gpu_refusal(0.0, "Plain") == ""


def test_every_rank_gets_the_start_up_gc_pause_and_the_callers_choices_win(monkeypatch):
    """The hook gives each actor Ray's setup hook (the start-up GC pause) whether or not it forks; a setup hook or an
    executable the caller put in the runtime env stays; the rank's own variables and OMP_NUM_THREADS stay too."""
    from luffy_pool_dev import fork_workers

    from verl.single_controller.ray import base

    created = _created_actors(monkeypatch, fork="0")

    class Plain:
        pass

    cls = base.RayClassWithInitArgs(Plain)
    cls.create_actor(None, 0, {"RANK": "0"}, num_cpus=1.0, num_gpus=0.0)
    env = created[-1]["runtime_env"]
    assert "py_executable" not in env  # LUFFY_FORK_WORKERS=0: started as Ray starts it
    assert env["env_vars"][fork_workers.SETUP_HOOK_ENV] == fork_workers.STARTUP_GC_HOOK
    assert env["env_vars"]["RANK"] == "0" and "OMP_NUM_THREADS" in env["env_vars"]
    module, name = fork_workers.STARTUP_GC_HOOK.rsplit(".", 1)  # Ray's setup hook format: module.function
    from luffy_pool_dev import startup_gc

    assert getattr(__import__(module, fromlist=[name]), name) is startup_gc.pause_in_ray_worker

    monkeypatch.setenv(fork_workers.FORK_WORKERS_ENV, "1")
    own = base.RayClassWithInitArgs(Plain)
    own.update_options({"runtime_env": {"py_executable": "mine", "env_vars": {fork_workers.SETUP_HOOK_ENV: "m.f"}}})
    own.create_actor(None, 0, {}, num_cpus=1.0, num_gpus=0.0)
    env = created[-1]["runtime_env"]
    assert env["py_executable"] == "mine" and env["env_vars"][fork_workers.SETUP_HOOK_ENV] == "m.f"


def test_executable_names_this_interpreter_the_zygote_and_the_modules():
    exe = zygote_executable("a.b,c")
    assert exe.split() == [sys.executable, ZYGOTE, "--preload", "a.b,c"]


def test_the_fsdp_worker_preloads_vllm_only_for_its_vllm_rollout_roles():
    from types import SimpleNamespace

    from luffy_pool_dev.fork_workers import preload_modules

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    vllm, hf = (SimpleNamespace(rollout=SimpleNamespace(name=name)) for name in ("vllm", "hf"))  # all it reads
    plain = preload_modules(ActorRolloutRefWorker, (hf, "actor_rollout_ref", "cpu"))
    assert plain[0] == "verl.workers.fsdp_workers" and not any(name.startswith("vllm") for name in plain)
    assert preload_modules(ActorRolloutRefWorker, (vllm, "actor", "cpu")) == plain
    mods = preload_modules(ActorRolloutRefWorker, (vllm,), {"role": "actor_rollout_ref", "device": "cpu"})
    assert "vllm.entrypoints.llm" in mods and "vllm.v1.worker.cpu_worker" in mods
    assert "vllm.v1.worker.cpu_worker" not in preload_modules(ActorRolloutRefWorker, (vllm, "rollout", "cuda"))

    class MethodWorker(ActorRolloutRefWorker):  # a method's worker (luffy_pool/workers): its own module first
        pass

    assert preload_modules(MethodWorker, (vllm, "rollout", "cpu"))[0] == __name__


def test_the_switch_and_a_failing_preload_hint(monkeypatch):
    from luffy_pool_dev.fork_workers import FORK_WORKERS_ENV, fork_workers_enabled, preload_modules

    for value, on in (("1", True), ("true", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv(FORK_WORKERS_ENV, value)
        assert fork_workers_enabled() is on, value
    monkeypatch.delenv(FORK_WORKERS_ENV)
    assert not fork_workers_enabled()  # off unless asked for

    class Plain:
        pass

    class Hinted:
        @classmethod
        def fork_preload(cls, size, name="x"):
            return ["json", f"{name}.{size}"]

    class Broken:
        @classmethod
        def fork_preload(cls, size):
            raise KeyError(size)

    assert preload_modules(Plain) == [__name__]
    assert preload_modules(Hinted, (3,), {"name": "m"}) == ["json", "m.3"]
    assert preload_modules(Broken, (3,)) == [__name__]  # a hint that fails: the module only


def test_the_socket_sits_in_a_folder_only_this_user_can_enter(monkeypatch):
    folder = os.path.dirname(worker_zygote.socket_path("k"))
    info = os.stat(folder)
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700
    # a folder someone else owns is refused (the client then starts its worker plainly)
    other = os.getuid() + 4_000_000
    monkeypatch.setattr(worker_zygote.os, "getuid", lambda: other)
    try:
        with pytest.raises(PermissionError, match="not this user's alone"):
            worker_zygote.socket_path("k")
    finally:
        os.rmdir(f"/tmp/luffy-zygote-{other}")
