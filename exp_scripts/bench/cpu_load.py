"""CPU accounting for the step benchmark: how busy the whole machine was, and how much of it was us.

The machine is shared, so every timed step is reported with ``foreign_cores``: the machine's busy CPU
time (``/proc/stat``) minus the CPU time of the measuring process's whole process tree (Ray's raylet,
workers and reward processes are descendants of the driver, so they count as ours), divided by the
step's wall time. Linux only; elsewhere the samples read as unavailable and the load is reported as NaN.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Iterable, Optional

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/stat cpu columns counted as busy: user nice system (idle iowait skipped) irq softirq steal.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """One reading: wall clock (s), machine busy ticks, ticks of our process tree (None = unavailable)."""

    wall_s: float
    machine_busy_ticks: Optional[int]
    own_tree_ticks: Optional[int]


def parse_machine_busy_ticks(proc_stat_text: str) -> int:
    """Busy ticks summed over all CPUs from the aggregate ``cpu`` line of ``/proc/stat``."""
    for line in proc_stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            return sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
    raise ValueError("no aggregate 'cpu' line in /proc/stat text")


def parse_proc_pid_stat(text: str) -> tuple[int, int, int]:
    """``(pid, ppid, ticks)`` of one ``/proc/<pid>/stat`` line; ticks = utime+stime+cutime+cstime.

    The command name may hold spaces and parentheses, so fields are counted after its last ')'.
    """
    pid = int(text[: text.index("(")].strip())
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is the state (field 3); utime..cstime are fields 14..17.
    ppid = int(rest[1])
    ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return pid, ppid, ticks


def tree_ticks(processes: Iterable[tuple[int, int, int]], root_pid: int) -> int:
    """CPU ticks of ``root_pid`` and all its live descendants, from ``(pid, ppid, ticks)`` rows."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for pid, ppid, t in processes:
        children.setdefault(ppid, []).append(pid)
        ticks[pid] = t
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # a process that exited between listdir and open
        return None


def _all_processes() -> list[tuple[int, int, int]]:
    rows = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            text = _read(f"/proc/{name}/stat")
            if text:
                rows.append(parse_proc_pid_stat(text))
    return rows


def sample(root_pid: Optional[int] = None) -> CpuSample:
    """Read the machine's busy ticks and our tree's ticks now (both None off Linux)."""
    wall = time.perf_counter()
    stat = _read("/proc/stat")
    if stat is None:
        return CpuSample(wall, None, None)
    root = os.getpid() if root_pid is None else root_pid
    return CpuSample(wall, parse_machine_busy_ticks(stat), tree_ticks(_all_processes(), root))


def cores_between(a: CpuSample, b: CpuSample, ticks_per_s: int = CLOCK_TICKS) -> dict[str, float]:
    """``foreign_cores`` and ``own_cores`` used on average between two samples (NaN when unavailable).

    Foreign load is clamped at 0: tick rounding (10 ms) can make it slightly negative on a quiet machine.
    """
    span = b.wall_s - a.wall_s
    if span <= 0 or None in (a.machine_busy_ticks, b.machine_busy_ticks, a.own_tree_ticks, b.own_tree_ticks):
        return {"foreign_cores": math.nan, "own_cores": math.nan}
    machine = (b.machine_busy_ticks - a.machine_busy_ticks) / ticks_per_s / span
    own = (b.own_tree_ticks - a.own_tree_ticks) / ticks_per_s / span
    return {"foreign_cores": max(0.0, machine - own), "own_cores": own}


def machine_busy_cores(window_s: float = 2.0) -> float:
    """Average busy cores of the whole machine over ``window_s`` (the orchestrator has no load of its own)."""
    a = sample()
    time.sleep(window_s)
    b = sample()
    if a.machine_busy_ticks is None:
        return math.nan
    return (b.machine_busy_ticks - a.machine_busy_ticks) / CLOCK_TICKS / (b.wall_s - a.wall_s)


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.5, window_s: float = 2.0) -> tuple[float, float]:
    """Wait until the machine's load drops below ``threshold_cores`` (or ``max_wait_s`` passes).

    Returns ``(seconds waited, last measured busy cores)``.
    """
    start = time.perf_counter()
    busy = machine_busy_cores(window_s)
    while not busy < threshold_cores and time.perf_counter() - start < max_wait_s:
        busy = machine_busy_cores(window_s)
    return time.perf_counter() - start, busy


class StepRecorder:
    """Marks step boundaries; each ``mark()`` closes one step with its wall time and CPU shares.

    A step's wall time runs from the end of the previous ``mark()`` to the start of this one, so the
    recorder's own ``/proc`` scan (a few ms per mark with Ray's dozen processes) is charged to no step.
    """

    def __init__(self, root_pid: Optional[int] = None):
        self.root_pid = root_pid
        self.steps: list[dict] = []
        self.restart()

    def restart(self) -> None:
        """Start the next step's clock now (drops whatever ran since the last mark)."""
        self._last = sample(self.root_pid)
        self._start = time.perf_counter()

    def mark(self, **extra) -> dict:
        end = time.perf_counter()
        now = sample(self.root_pid)
        step = {"wall_s": end - self._start, **cores_between(self._last, now), **extra}
        self._last = now
        self.steps.append(step)
        self._start = time.perf_counter()
        return step
