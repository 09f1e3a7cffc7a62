"""Whether the machine was busy with other work while a latency was timed.

A latency taken while other processes compete for the CPUs is a number about the machine, not
about the cell: the median's interval stays narrow (every call is slowed alike) around a median
many times too high. ``LoadProbe`` brackets the timed calls and measures, over exactly that
window:

- ``other_cpu``: the CPU time every other process of the machine used (``/proc/stat``'s busy
  time less this process's and its children's, ``/proc/<pid>/stat``), as a share of the
  machine's capacity (wall time × CPUs);
- ``steal``: the time the hypervisor gave this virtual machine's CPUs to others, as a share;
- ``cpu_share``: this process's (and its children's) CPU time against wall time (information:
  a runtime that waits on a GPU or another process gets little CPU without any load);
- ``loadavg``: the 1-minute load average at the end, with ``cpus`` (information only: it lags
  by a minute, so it still holds the verdict workers that ran just before the timing).

The window is ``loaded`` when others used more than ``OTHER_CPU_LOADED`` of the machine or steal
exceeded ``STEAL_LOADED`` (by more than the counters' clock-tick rounding can add in a short
window). Where ``/proc`` is missing (not Linux) only the load average is
known, and the window is loaded when it exceeds the CPUs by half (beyond this process's own).

Interleaved A/B timing (``harness.worker.runtime_only.ab_timer``) also asks, per round of a few milliseconds,
whether the timing process had its core (``cpu_clock``: its CPU time against wall time): a round
in which it ran for less than ``CONTENDED`` of the time was competing for a CPU with other work
(or lost it to the hypervisor: stolen time is not counted as the process's), and is left out.
What a round keeps is a ratio of two block medians (each the median call of a block of calls),
which a few preempted calls do not move, so a round is dropped only once the timing process lost
most of it; and another process on *another* core does not make a round
contended at all: both files of a round feel it alike.

Worker side: standard library only.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.core.proctree import descendants
from harness.core.timing import OTHER_CPU_LOADED, STEAL_LOADED

_PROC = Path("/proc")


def _clock_tick() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


_TICK = _clock_tick()


def machine_counters() -> tuple[float, float, int] | None:
    """(busy seconds, steal seconds, CPUs) of the whole machine from /proc/stat, or None."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    total = next((ln.split() for ln in lines if ln.startswith("cpu ")), None)
    cpus = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    if total is None or len(total) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (float(v) for v in total[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK, steal / _TICK, cpus or (os.cpu_count() or 1)


def _proc_cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process from /proc/<pid>/stat, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1]), (float(fields[11]) + float(fields[12])) / _TICK
    except (IndexError, ValueError):
        return None


def own_cpu_s() -> float:
    """CPU seconds of this process (all threads) and of its live descendants (a runtime host
    process the cell talks to), so their work is never counted as someone else's load."""
    own = time.process_time()
    for pid in descendants(os.getpid()):
        info = _proc_cpu(pid)
        if info is not None:
            own += info[1]
    return own


def has_children() -> bool:
    """Whether this process has child processes (a runtime host it talks to)."""
    return bool(descendants(os.getpid()))


def cpu_clock() -> Callable[[], float]:
    """A clock of this process's CPU seconds: ``time.process_time`` (every thread, cheap), or,
    where the process has children, ``own_cpu_s`` (theirs too: a scan of /proc per reading)."""
    return own_cpu_s if has_children() else time.process_time


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass
class LoadProbe:
    """Counters at the start of a timing window; ``result()`` reads them again at its end."""

    wall: float
    own: float
    machine: tuple[float, float, int] | None

    @classmethod
    def start(cls) -> "LoadProbe":
        return cls(time.perf_counter(), own_cpu_s(), machine_counters())

    def result(self) -> dict[str, Any]:
        """``{"loaded": bool, "other_cpu", "steal", "cpu_share", "loadavg", "cpus", "window_s"}``."""
        wall = max(time.perf_counter() - self.wall, 1e-9)
        own = max(own_cpu_s() - self.own, 0.0)
        end = machine_counters()
        load = _loadavg()
        out: dict[str, Any] = {"window_s": round(wall, 3), "cpu_share": round(own / wall, 3),
                               "loadavg": None if load is None else round(load, 2)}
        if self.machine is not None and end is not None:
            cpus = end[2]
            capacity = wall * cpus
            other = max(end[0] - self.machine[0] - own, 0.0) / capacity
            steal = max(end[1] - self.machine[1], 0.0) / capacity
            # /proc/stat counts whole clock ticks per CPU: a short window is only called loaded
            # when its share exceeds the threshold by more than that rounding can add.
            slack = 2 * cpus / _TICK / capacity
            out.update(cpus=cpus, other_cpu=round(other, 3), steal=round(steal, 3),
                       loaded=other - slack > OTHER_CPU_LOADED or steal - slack > STEAL_LOADED)
        else:
            cpus = os.cpu_count() or 1
            out.update(cpus=cpus, loaded=None if load is None else load - 1 > 1.5 * cpus)
        return out
