"""CPU seconds of a run and every process it starts (Ray's raylet, workers, engines), read from /proc.

Wall time on a shared machine says little (other users' jobs stretch it), so the reproduction reports CPU
time: a sampler thread walks the process tree under the child every ``interval`` seconds and keeps the last
utime+stime seen per process; the total is their sum. A process that lives shorter than one interval, or
the CPU a process burns after its last sample, is missed (the total is a slight undercount). Where /proc
is unavailable, only the child's own rusage is counted (``source`` says which).
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from typing import Mapping, Optional, Sequence

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, float]]:
    """``{pid: (ppid, cpu seconds)}`` of every process readable in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        table[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return table


class TreeCpuSampler:
    """Samples the CPU time of ``root`` and its descendants until ``stop()``; ``total`` = CPU seconds."""

    def __init__(self, root: int, interval: float = 0.25):
        self.root, self.interval = root, interval
        self.last_seen: dict[int, float] = {}
        self._members = {root}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [p for p in self._members if p in table]
        while stack:  # members stay members after they exit; their children are found while they live
            pid = stack.pop()
            self._members.add(pid)
            self.last_seen[pid] = max(self.last_seen.get(pid, 0.0), table[pid][1])
            stack.extend(c for c in children.get(pid, []) if c not in self._members)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> "TreeCpuSampler":
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.total

    @property
    def total(self) -> float:
        return float(sum(self.last_seen.values()))


def run_measured(
    cmd: Sequence[str], log_path: str, env: Mapping[str, str], cwd: str, timeout_s: Optional[float]
) -> tuple[int, float, float, str]:
    """Run ``cmd`` (output to ``log_path``); returns (exit code, wall s, CPU s, CPU source)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd)
        sampler = TreeCpuSampler(proc.pid).start() if os.path.isdir("/proc") else None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if sampler:
                sampler.stop()
            raise
        sampled = sampler.stop() if sampler else 0.0
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if sampled >= rusage:
        return code, wall, sampled, "proc"
    return code, wall, rusage, "rusage"
