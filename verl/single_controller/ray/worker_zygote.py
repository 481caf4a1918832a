"""Fork-started Ray workers: import the worker modules once per node and environment, fork every rank from there.

A rank's process spends 6-14 CPU-s importing torch, transformers, the worker module and vLLM before it does any
work; on a 2-core test machine that is a quarter of the test suite. With ``LUFFY_FORK_WORKERS=1`` the worker group
starts its actors with ``runtime_env.py_executable`` set to this file, so Ray runs ``python worker_zygote.py
--preload MODULE default_worker.py ARGS`` where it would run ``python default_worker.py ARGS``:

* the client (this file run as a script, standard library only) connects to the zygote of its raylet and
  environment, starting it on first use, and hands over its argv, environment, working folder and stdio;
* the zygote imported ``MODULE`` once; for each request it forks a child that takes the client's stdio,
  environment and folder, re-seeds its random generators and runs Ray's ``default_worker.py`` as ``__main__``;
* the client forwards the signals it gets to the child and exits with the child's status; the child exits when
  its client goes away (Ray killed it), and the zygote when its raylet is gone and no child is left.

Ray itself stays out of the zygote, so one zygote serves every job of its raylet (each rehearsal of a recipe is a
job of its own, and a vLLM preload is ~10 CPU-s): Ray's core library reads the job's id (``RAY_JOB_ID``) when it is
loaded, so a worker must load it after it has its job's environment. While the zygote imports, ``import ray`` fails
as if Ray were not installed; a module that tolerated that (vLLM's ``ray_utils``) is imported again in each child,
once the child has its environment, and the child imports Ray itself (~0.2 CPU-s).

Anything that fails before the fork (no zygote, a failed import) falls back to exec'ing the worker as Ray would,
and a child that cannot re-import a module execs the worker plainly, so a run loses nothing. Environment variables
a rank or a job gets on its own (RANK, MASTER_PORT, RAY_JOB_ID) are not part of the zygote's key: only Ray and the
rank's own code read them; every other variable is. A zygote also exits after 300 s without a rank. The worker's
PID is the child's; the one Ray started is the client's.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time

# Set per rank by the worker group, or per job by Ray, and read only after the fork (Ray is not preloaded): ranks of
# every job of a raylet with the same environment otherwise share a zygote.
PER_PROCESS_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "WG_PREFIX", "RAY_JOB_ID"})
KEPT_OUT = ("ray",)  # packages the zygote never imports (see the module docstring)
IDLE_EXIT_S = 300.0  # a zygote with no child and no request for this long exits (its raylet may live on)


def zygote_key(env: dict, preload: str, raylet_pid: int) -> str:
    shared = sorted((k, v) for k, v in env.items() if k not in PER_PROCESS_ENV)
    blob = json.dumps([sys.executable, preload, raylet_pid, shared]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def socket_path(key: str) -> str:
    """The zygote's socket, in a folder only this user can enter (the client hands it its environment and stdio).
    AF_UNIX paths are short (108 bytes): not under Ray's session folder."""
    folder = os.path.join("/tmp", f"luffy-zygote-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.stat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not this user's alone (mode {oct(info.st_mode & 0o777)})")
    return os.path.join(folder, f"{key}.sock")


def _send(sock: socket.socket, payload: dict, fds: list) -> None:
    data = json.dumps(payload).encode()
    rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))
    sock.sendmsg([struct.pack("!I", len(data))], [rights])
    sock.sendall(data)


def _recv_request(sock: socket.socket) -> tuple[dict, list]:
    head, anc, _, _ = sock.recvmsg(4, socket.CMSG_SPACE(3 * struct.calcsize("i")))
    fds = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // struct.calcsize('i')}i", data))
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ConnectionError("client went away mid-request")
        body += chunk
    return json.loads(body), fds


def _readline(sock: socket.socket) -> str:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("zygote closed the connection")
        line += chunk
    return line.decode().strip()


# ---------------------------------------------------------------- client: what Ray executes

def _exec_plainly(argv: list) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _connect(path: str, preload: str, key: str) -> socket.socket:
    import fcntl

    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two ranks starting at once start one zygote
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            return sock
        except OSError:
            pass
        log = _log_path(key)
        import subprocess

        with open(log, "ab") as out:
            server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", path, "--preload", preload,
                                       "--raylet-pid", str(os.getppid())], stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=out, start_new_session=True, close_fds=True)
        while True:  # the zygote binds before it imports: this wait is its interpreter start only
            if server.poll() is not None:
                raise OSError(f"zygote exited with {server.returncode} before listening (see {log})")
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                return sock
            except OSError:
                time.sleep(0.02)


def _log_path(key: str) -> str:
    """The zygote's output goes next to the workers' logs of its Ray session, where `ray logs` finds it."""
    args = dict(a[2:].split("=", 1) for a in sys.argv if a.startswith("--") and "=" in a)
    logs = os.path.join(args.get("temp-dir", "/tmp/ray"), args.get("session-name", "session_latest"), "logs")
    return os.path.join(logs, f"luffy-zygote-{key}.log") if os.path.isdir(logs) else socket_path(key)[:-5] + ".log"


def client(argv: list) -> None:
    preload = ""
    if argv[:1] == ["--preload"]:
        preload, argv = argv[1], argv[2:]
    key = zygote_key(dict(os.environ), preload, os.getppid())  # Ray's raylet started this process
    try:
        path = socket_path(key)
        sock = _connect(path, preload, key)
        _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
        child = int(_readline(sock))
    except (OSError, ValueError, ConnectionError) as err:
        print(f"worker_zygote: starting the worker plainly ({err})", file=sys.stderr, flush=True)
        _exec_plainly(argv)
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    try:
        status = _readline(sock)
    except ConnectionError:
        os._exit(1)
    kind, _, value = status.partition(" ")
    if kind == "signal":
        if int(value) not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(int(value), signal.SIG_DFL)
        os.kill(os.getpid(), int(value))
    os._exit(int(value) if kind == "exit" else 1)


# ---------------------------------------------------------------- zygote

def _become_worker(conn: socket.socket, request: dict, fds: list, listener: socket.socket, others: list,
                   reimport: list) -> None:
    """In the forked child: take the client's stdio, environment and folder, then run Ray's worker as __main__."""
    import atexit
    import runpy
    import threading

    os.setpgid(0, 0)  # a group of its own, as Ray starts a worker: Ray stops a worker by killing its group
    listener.close()
    for other in others:
        other.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python default_worker.py` has it
    _reseed()
    _reimport(reimport, argv)

    def watch_client():  # Ray stops a worker by killing the process it started: the client
        try:
            conn.recv(1)
        finally:
            os._exit(1)

    threading.Thread(target=watch_client, name="zygote-client-watch", daemon=True).start()
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _reseed() -> None:
    """A forked child would share the zygote's generator states; a fresh process starts from OS entropy."""
    seed = int.from_bytes(os.urandom(8), "little")
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def serve(path: str, preload: str, raylet_pid: int) -> None:
    sys.path.pop(0)  # this file's folder: a rank's imports resolve as in a worker Ray started itself
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped: the finally below removes the socket
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # clients wait in the backlog while the imports run
    try:
        _fork_on_request(listener, *_preload(preload), raylet_pid)
    finally:
        listener.close()
        for leftover in (path, path + ".lock"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


class _KeptOut:
    """Makes ``import ray`` fail during the preload as it would without Ray installed; notes who tried. A probe
    (``importlib.util.find_spec("ray")``) still finds it: Ray is installed, only loading it waits for the child."""

    def __init__(self):
        self.tried: list = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in KEPT_OUT:
            return None
        frame, importing = sys._getframe(1), False
        while frame is not None:  # the module whose code asked, past the import machinery
            module = frame.f_globals.get("__name__", "")
            if module.startswith(("importlib", "_frozen_importlib")) or module.partition(".")[0] in KEPT_OUT:
                importing = importing or frame.f_code.co_name == "_find_and_load"
            else:
                if importing and module not in self.tried:
                    self.tried.append(module)
                break
            frame = frame.f_back
        if not importing:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (kept out of the worker zygote)", name=name)


def _preload(preload: str) -> tuple:
    """Imports the modules without Ray. Returns what the imports set in the environment (vLLM's env_override does),
    which a rank that imported them itself would have, and the modules that tried to import Ray (each child imports
    them again, with Ray)."""
    import gc
    import importlib

    before = dict(os.environ)
    names = [name for name in preload.split(",") if name]
    kept_out = _KeptOut()
    sys.meta_path.insert(0, kept_out)
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as err:  # the ranks import it themselves (and report the error where the run sees it)
                print(f"worker_zygote: preloading {name} failed: {err!r}", file=sys.stderr, flush=True)
    finally:
        sys.meta_path.remove(kept_out)
    gc.freeze()  # the imported objects stay out of the children's collections and their pages stay shared
    reimport = [name for name in kept_out.tried if name in sys.modules]
    for name in kept_out.tried:  # it needs Ray to import at all: whoever imported it may have kept a fallback
        if name not in sys.modules and name not in names:
            print(f"worker_zygote: {name} cannot be imported without Ray; a module that imports it inside a try "
                  "keeps its fallback in the forked ranks", file=sys.stderr, flush=True)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}, reimport


def _reimport(names: list, argv: list) -> None:
    """In the child, with its job's environment: import again the modules that found no Ray in the zygote. A module
    that fails to is left half-initialised, so the worker then starts plainly (an exec, keeping this PID)."""
    import importlib

    for name in names:
        try:
            importlib.reload(sys.modules[name])
        except Exception as err:  # noqa: BLE001
            print(f"worker_zygote: re-importing {name} failed ({err!r}): starting the worker plainly",
                  file=sys.stderr, flush=True)
            _exec_plainly(argv)


def _fork_on_request(listener: socket.socket, set_by_imports: dict, reimport: list, raylet_pid: int) -> None:
    import select

    children: dict[int, socket.socket] = {}
    idle_since = time.monotonic()
    while True:
        ready, _, _ = select.select([listener], [], [], 0.5)
        if ready:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (OSError, ValueError, ConnectionError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                request["env"].update(set_by_imports)
                _become_worker(conn, request, fds, listener, list(children.values()), reimport)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                conn.sendall(f"{pid}\n".encode())
            except OSError:  # the client is gone: its child sees that and exits
                pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                reply = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                         else f"exit {os.waitstatus_to_exitcode(status)}")
                try:
                    conn.sendall(f"{reply}\n".encode())
                except OSError:
                    pass
                conn.close()
        if children or ready:
            idle_since = time.monotonic()
        elif not _alive(raylet_pid) or time.monotonic() - idle_since > IDLE_EXIT_S:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
        serve(args["--serve"], args.get("--preload", ""), int(args["--raylet-pid"]))
    else:
        client(sys.argv[1:])
