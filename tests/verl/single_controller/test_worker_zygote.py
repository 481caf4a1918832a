"""Fork-started workers (verl/single_controller/ray/worker_zygote.py): the client Ray executes hands its argv,
environment, folder and stdio to a zygote that forked the worker; exit codes and signals come back, a child
goes when its client goes, and a zygote that cannot start leaves the worker to start plainly. The part through
Ray (a RayWorkerGroup with LUFFY_FORK_WORKERS=1): tests/verl/single_controller/test_ray_worker_group.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from verl.single_controller.ray import worker_zygote
from verl.single_controller.ray.base import zygote_executable

ZYGOTE = worker_zygote.__file__
# A stand-in for Ray's default_worker.py: reports what it sees, then exits as told.
SCRIPT = """
import json, os, sys, time
import random
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
                  "rank": os.environ.get("RANK"), "shared": os.environ.get("SHARED"), "random": random.random(),
                  "path": sys.path, "preloaded": "email.mime.text" in sys.modules}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
action = sys.argv[1]
if action == "sleep":
    time.sleep(60)
if action in ("term", "kill"):
    os.kill(os.getpid(), 15 if action == "term" else 9)
sys.exit(int(action))
"""


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


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
        proc = subprocess.run([sys.executable, ZYGOTE, "--preload", preload, *args], capture_output=True, text=True,
                              env=dict(os.environ, **(env or {})), cwd=cwd or str(tmp_path), timeout=120, **kwargs)
        seen = json.loads(proc.stdout.splitlines()[0]) if proc.stdout else None
        if seen and "--serve" in _cmdline_or_empty(seen["ppid"]):
            zygotes.add(seen["ppid"])
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
    # one zygote (the preload's imports done once) forked both; it is not the client
    assert a["ppid"] == b["ppid"] and "--serve" in _cmdline(a["ppid"]) and a["preloaded"]
    assert (a["rank"], b["rank"]) == ("0", "1") and a["shared"] == b["shared"] == os.environ["SHARED"]
    assert a["argv"] == [script, "3"] and a["cwd"] == str(folder) and b["cwd"] == str(tmp_path)
    # sys.path as `python script` has it (Ray's import adds its thirdparty folder), not the zygote's own folder
    plain = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                           capture_output=True, text=True, check=True, cwd=str(tmp_path))
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
with open(f"/proc/{os.getppid()}/maps") as f:
    zygote_has_ray = "_raylet" in f.read()
print(json.dumps({"ppid": os.getppid(), "ray": tries_ray.ray is not None and tries_ray.ObjectRef is not None,
                  "loads": tries_ray.LOADS, "zygote_has_ray": zygote_has_ray, "job": os.environ.get("RAY_JOB_ID"),
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
    assert a["ppid"] == b["ppid"] and "--serve" in _cmdline(a["ppid"]) and not a["zygote_has_ray"]
    assert (a["job"], b["job"]) == ("01000000", "02000000")
    # the module that found no Ray in the zygote was imported again in the child, and has Ray there
    assert a["ray"] and b["ray"] and a["loads"] == b["loads"] == 2 and a["loaded_with_job"]
    # asking whether Ray is installed is not importing it: the answer is yes, and that module is not imported again
    assert a["probe"] == [True, 1]


@pytest.mark.parametrize("action, sig", [("term", signal.SIGTERM), ("kill", signal.SIGKILL)])
def test_a_signal_ending_the_worker_ends_the_client_with_it(run_client, script, action, sig):
    # SIGKILL is how Ray stops a worker group: the client must end the same way, without a traceback of its own
    proc, seen = run_client(script, action)
    assert proc.returncode == -sig and "--serve" in _cmdline(seen["ppid"]) and "Traceback" not in proc.stderr


def test_killing_the_client_ends_its_worker(run_client, script, tmp_path):
    run_client(script, "0")  # the zygote is up
    client = subprocess.Popen([sys.executable, ZYGOTE, "--preload", "email.mime.text", script, "sleep"],
                              stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    seen = json.loads(client.stdout.readline())
    client.kill()  # Ray's SIGKILL of the process it started
    client.wait()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{seen['pid']}") and "worker_main" in _cmdline_or_empty(seen["pid"]):
        assert time.monotonic() < deadline, "the forked worker outlived its client"
        time.sleep(0.05)


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


def test_executable_names_this_interpreter_the_zygote_and_the_modules():
    exe = zygote_executable("a.b,c")
    assert exe.split() == [sys.executable, ZYGOTE, "--preload", "a.b,c"]


def test_the_fsdp_worker_preloads_vllm_only_for_its_vllm_rollout_roles():
    from types import SimpleNamespace

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    vllm, hf = (SimpleNamespace(rollout=SimpleNamespace(name=name)) for name in ("vllm", "hf"))  # all it reads
    plain = ActorRolloutRefWorker.fork_preload(hf, "actor_rollout_ref", "cpu")
    assert plain[0] == "verl.workers.fsdp_workers" and not any(name.startswith("vllm") for name in plain)
    assert ActorRolloutRefWorker.fork_preload(vllm, "actor", "cpu") == plain
    mods = ActorRolloutRefWorker.fork_preload(vllm, "actor_rollout_ref", "cpu")
    assert "vllm.entrypoints.llm" in mods and "vllm.v1.worker.cpu_worker" in mods
    assert "vllm.v1.worker.cpu_worker" not in ActorRolloutRefWorker.fork_preload(vllm, "rollout", "cuda")


def test_the_switch_and_a_failing_preload_hint(monkeypatch):
    from verl.single_controller.ray.base import FORK_WORKERS_ENV, RayClassWithInitArgs, fork_workers_enabled

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

    assert RayClassWithInitArgs(Plain)._fork_preload() == [__name__]
    assert RayClassWithInitArgs(Hinted, 3, name="m")._fork_preload() == ["json", "m.3"]
    assert RayClassWithInitArgs(Broken, 3)._fork_preload() == [__name__]  # a hint that fails: the module only


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
