"""Fork-started Ray workers: import the worker modules once per node and environment, fork every rank from there.

A rank's process spends 6-14 CPU-s importing torch, transformers, the worker module and vLLM before it does any
work; on a 2-core test machine that is a quarter of the test suite. With ``LUFFY_FORK_WORKERS=1`` the test
harness's actor hook (fork_workers.py, named by verl's ``VERL_ACTOR_RUNTIME_ENV_HOOK``) starts a worker group's actors
with ``runtime_env.py_executable`` set to this file, so Ray runs ``python worker_zygote.py --preload MODULE
default_worker.py ARGS`` where it would run ``python default_worker.py ARGS``:

* the client (this file run as a script, standard library only) connects to the zygote of its raylet and
  environment, starting it on first use, and hands over its argv, environment, working folder and stdio;
* the zygote imported ``MODULE`` once; for each request it forks a guard, which forks the rank: a child that
  takes the client's stdio, environment and folder, re-seeds its random generators and runs Ray's
  ``default_worker.py`` as ``__main__``;
* the client forwards the signals it gets to the rank and exits with the rank's status (the guard reports it);
* the rank dies with its client, as a process Ray killed dies: the guard watches the client's connection and
  SIGKILLs the rank when it closes, and the rank has the kernel's parent-death signal (``PR_SET_PDEATHSIG``,
  SIGKILL) on its guard. Neither needs the rank's interpreter, so killing the process Ray started stays a hard
  kill for a rank blocked in a CUDA call that holds the GIL (a watcher thread in the rank would never run; Ray's
  own ``ray.kill`` SIGKILLs the PID the rank registered);
* the zygote exits when its raylet is gone and no guard is left.

Only CPU ranks are forked. A worker group whose ranks ask Ray for GPUs starts them plainly (``gpu_refusal``, in
``fork_workers.actor_runtime_env``): a forked rank would share its zygote's CUDA driver state, and the fork
server is measured on CPU ranks only. A preload that initialised CUDA (``torch.cuda.is_initialized()``) makes the
zygote refuse to fork: it answers the waiting ranks and later ones (a ``.refused`` file beside its socket) with
the module's name, and they start plainly.

Ray itself stays out of the zygote, so one zygote serves every job of its raylet (each rehearsal of a recipe is a
job of its own, and a vLLM preload is ~10 CPU-s): Ray's core library reads the job's id (``RAY_JOB_ID``) when it is
loaded, so a worker must load it after it has its job's environment. While the zygote imports, ``import ray`` fails
as if Ray were not installed; a module that tolerated that (vLLM's ``ray_utils``) is imported again in each child,
once the child has its environment, and the child imports Ray itself (~0.2 CPU-s).

Anything that fails before the fork (no zygote, a failed import) falls back to exec'ing the worker as Ray would,
and a child that cannot re-import a module execs the worker plainly, so a run loses nothing. Environment variables
a rank or a job gets on its own (RANK, MASTER_PORT, RAY_JOB_ID) are not part of the zygote's key: only Ray and the
rank's own code read them; every other variable is. A zygote also exits after 300 s without a rank. The worker's
PID is the rank's (its parent is its guard, whose parent is the zygote); the one Ray started is the client's.
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
PER_PROCESS_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "RAY_LOCAL_RANK",
        "RAY_LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WG_PREFIX",
        "RAY_JOB_ID",
    }
)
KEPT_OUT = ("ray",)  # packages the zygote never imports (see the module docstring)
IDLE_EXIT_S = 300.0  # a zygote with no child and no request for this long exits (its raylet may live on)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def gpu_refusal(num_gpus: float, group: str) -> str:
    """Why ranks asking Ray for ``num_gpus`` GPUs each are not forked ("" when they may be)."""
    if not num_gpus or float(num_gpus) <= 0:
        return ""
    return (
        f"LUFFY_FORK_WORKERS is set, but the ranks of {group} ask for {float(num_gpus):g} GPU(s) each: they start "
        f"as Ray starts them (the fork server forks CPU ranks only; a forked rank would share its zygote's CUDA "
        f"driver state)"
    )


def cuda_initialized(modules=None) -> bool:
    """Whether torch, if it was imported, initialised CUDA in this process (a child cannot use a forked context)."""
    torch = (sys.modules if modules is None else modules).get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without its cuda module initialised nothing
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends (prctl(2) ``PR_SET_PDEATHSIG``). Delivered
    by the kernel, not by Python code, so it ends a process stuck in a C call that holds the GIL."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def refused_path(path: str) -> str:
    """The file a zygote that refused to fork leaves beside its socket: its reason, for the ranks that come later."""
    return path[: -len(".sock")] + ".refused" if path.endswith(".sock") else path + ".refused"


def zygote_key(env: dict, preload: str, raylet_pid: int) -> str:
    shared = sorted((k, v) for k, v in env.items() if k not in PER_PROCESS_ENV)
    # this file's path names the checkout: a job of another checkout on the same raylet (two clones testing at once)
    # imports other sources, so it must not fork from this one's preloaded modules
    blob = json.dumps([sys.executable, os.path.abspath(__file__), preload, raylet_pid, shared]).encode()
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
        _raise_if_refused(path)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            return sock
        except OSError:
            pass
        log = _log_path(key)
        import subprocess

        with open(log, "ab") as out:
            server = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--serve",
                    path,
                    "--preload",
                    preload,
                    "--raylet-pid",
                    str(os.getppid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )
        while True:  # the zygote binds before it imports: this wait is its interpreter start only
            if server.poll() is not None:
                _raise_if_refused(path)
                raise OSError(f"zygote exited with {server.returncode} before listening (see {log})")
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                return sock
            except OSError:
                time.sleep(0.02)


def _raise_if_refused(path: str) -> None:
    try:
        with open(refused_path(path)) as f:
            raise OSError(f.read().strip())
    except FileNotFoundError:
        pass


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
        answer = _readline(sock)
        if answer.startswith("plain "):  # the zygote refused to fork (its preload initialised CUDA)
            raise OSError(answer[len("plain ") :])
        child = int(answer)
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


def _guard(conn: socket.socket, request: dict, fds: list, listener: socket.socket, reimport: list) -> None:
    """In the zygote's child: fork the rank, tell the client its PID, then wait for whichever ends first. The rank
    ending: its status goes to the client. The client ending (Ray killed it): SIGKILL the rank, then exit (the
    rank's parent-death signal kills it too, should this guard itself be killed)."""
    import select

    guard = os.getpid()
    listener.close()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the zygote's handlers are not a guard's
        signal.signal(sig, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        _become_worker(conn, request, fds, reimport, guard)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"{pid}\n".encode())
    except OSError:  # the client is already gone
        os.kill(pid, signal.SIGKILL)
        os._exit(1)
    try:
        ended = os.pidfd_open(pid)  # readable when the rank ends (Linux 5.3)
    except (AttributeError, OSError):
        ended = None  # poll its status instead
    while True:
        ready, _, _ = select.select([conn] if ended is None else [conn, ended], [], [], 0.2 if ended is None else None)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            reply = (
                f"signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit {os.waitstatus_to_exitcode(status)}"
            )
            try:
                conn.sendall(f"{reply}\n".encode())
            except OSError:
                pass
            os._exit(0)
        if conn in ready:
            try:
                gone = not conn.recv(1)  # a client sends nothing after its request: readable means it closed
            except OSError:
                gone = True
            if gone:
                os.kill(pid, signal.SIGKILL)
                os._exit(1)


def _become_worker(conn: socket.socket, request: dict, fds: list, reimport: list, guard: int) -> None:
    """In the forked rank: bind its life to its guard's, take the client's stdio, environment and folder, then run
    Ray's worker as __main__."""
    import atexit
    import runpy

    try:
        set_parent_death_signal(signal.SIGKILL)
    except (OSError, AttributeError) as err:  # the guard's SIGKILL on the client's exit still ends it
        print(f"worker_zygote: no parent-death signal ({err})", file=sys.stderr, flush=True)
    if os.getppid() != guard:  # the guard ended before the signal was set: nothing would deliver it
        os._exit(1)
    os.setpgid(0, 0)  # a group of its own, as Ray starts a worker: Ray stops a worker by killing its group
    conn.close()
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
        set_by_imports, reimport, cuda_by = _preload(preload)
        if cuda_by:
            _refuse(
                listener,
                path,
                f"preloading {cuda_by} initialised CUDA (torch.cuda.is_initialized()): a forked "
                f"rank cannot use its zygote's CUDA context",
            )
        else:
            _fork_on_request(listener, set_by_imports, reimport, raylet_pid)
    finally:
        listener.close()
        for leftover in (path, path + ".lock"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def _refuse(listener: socket.socket, path: str, reason: str) -> None:
    """Fork nothing: leave ``reason`` for later ranks, stop listening and answer those already waiting."""
    print(f"worker_zygote: not forking: {reason}", file=sys.stderr, flush=True)
    with open(refused_path(path), "w") as f:
        f.write(reason)
    os.unlink(path)  # no client connects any more; those in the backlog are answered below
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # the backlog is empty
            return
        try:
            conn.setblocking(True)
            _, fds = _recv_request(conn)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"plain {reason}\n".encode())
        except (OSError, ValueError, ConnectionError):
            pass
        conn.close()


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
    which a rank that imported them itself would have, the modules that tried to import Ray (each child imports
    them again, with Ray), and the first module after whose import CUDA was initialised ("" if none)."""
    import gc
    import importlib

    before = dict(os.environ)
    names = [name for name in preload.split(",") if name]
    kept_out, cuda_by = _KeptOut(), ""
    sys.meta_path.insert(0, kept_out)
    gc.disable()  # imports build objects that live as long as the zygote: no collection walks them meanwhile
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as err:  # the ranks import it themselves (and report the error where the run sees it)
                print(f"worker_zygote: preloading {name} failed: {err!r}", file=sys.stderr, flush=True)
            cuda_by = cuda_by or (name if cuda_initialized() else "")
    finally:
        sys.meta_path.remove(kept_out)
        gc.freeze()  # the imported objects stay out of the children's collections and their pages stay shared
        gc.enable()
    reimport = [name for name in kept_out.tried if name in sys.modules]
    for name in kept_out.tried:  # it needs Ray to import at all: whoever imported it may have kept a fallback
        if name not in sys.modules and name not in names:
            print(
                f"worker_zygote: {name} cannot be imported without Ray; a module that imports it inside a try "
                "keeps its fallback in the forked ranks",
                file=sys.stderr,
                flush=True,
            )
    return {k: v for k, v in os.environ.items() if before.get(k) != v}, reimport, cuda_by


def _reimport(names: list, argv: list) -> None:
    """In the child, with its job's environment: import again the modules that found no Ray in the zygote. A module
    that fails to is left half-initialised, so the worker then starts plainly (an exec, keeping this PID)."""
    import importlib

    for name in names:
        try:
            importlib.reload(sys.modules[name])
        except Exception as err:  # noqa: BLE001
            print(
                f"worker_zygote: re-importing {name} failed ({err!r}): starting the worker plainly",
                file=sys.stderr,
                flush=True,
            )
            _exec_plainly(argv)


def _fork_on_request(listener: socket.socket, set_by_imports: dict, reimport: list, raylet_pid: int) -> None:
    import select

    guards: set = set()  # one per living rank (_guard); each reports its rank's status to its client
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
                try:
                    request["env"].update(set_by_imports)
                    _guard(conn, request, fds, listener, reimport)
                finally:
                    os._exit(1)
            for fd in fds:
                os.close(fd)
            conn.close()  # the guard has it
            guards.add(pid)
        while guards:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            guards.discard(pid)
        if guards or ready:
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
