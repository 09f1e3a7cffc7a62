"""The timeout rule (``Progress``) and why a worker ended early (``Death``)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from harness.core.status import Status

TIMEOUT_WALL_FACTOR = 4.0    # no cell runs past this many times cell_timeout_s of wall time
IDLE_WINDOW_S = 10.0         # a tree that got under IDLE_CPU_SHARE of a CPU over this long is idle
IDLE_CPU_SHARE = 0.02
CPU_POLL_S = 1.0


@dataclass
class Death:
    """Why a worker ended early, and whether that settles the cell at once."""

    status: Status
    why: str
    final: bool = False           # timeouts and memory-limit kills are not retried
    wall_s: float | None = None   # a timeout: the wall and CPU time since the last progress
    cpu_s: float | None = None
    killed: bool = False          # ended by a signal it did not send itself (an OOM kill, a kill -9)


class Progress:
    """The timeout rule: a cell's budget is ``timeout_s`` since its last progress (an event), in
    CPU seconds of its process tree when the tree is measured (``measure``), so that load on the
    machine does not decide the verdict; a tree that got (almost) no CPU over ``IDLE_WINDOW_S`` is
    hung and ends at ``timeout_s`` of wall time; nothing runs past ``TIMEOUT_WALL_FACTOR`` times
    ``timeout_s``. Unmeasured (a container's processes are Docker's): wall time alone."""

    def __init__(self, timeout_s: float, measure: Callable[[], float | None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.measure, self.clock = timeout_s, measure, clock
        self.samples: deque[tuple[float, float]] = deque()
        self.extra_s = 0.0
        self.reset()

    def reset(self, extra_s: float = 0.0) -> None:
        """Progress now; ``extra_s`` more budget until the next (the worker's imports).

        The tree's CPU time is first read at the next poll ``CPU_POLL_S`` later, not here: a
        worker sends several events a second, and reading its whole tree at each (every process's
        ``/proc`` entry) cost the runner more CPU than the timing it shares the machine with. The
        CPU a cell uses in that first second is not charged to it."""
        self.extra_s = extra_s
        self.start = self.clock()
        self.samples.clear()
        self.cpu0: float | None = None
        self.next_sample = self.start + CPU_POLL_S

    def _sample(self, now: float) -> float | None:
        cpu = self.measure() if self.measure is not None else None
        if cpu is not None:
            if self.cpu0 is None:
                self.cpu0 = cpu
            self.samples.append((now, cpu))
            while len(self.samples) > 2 and self.samples[1][0] <= now - IDLE_WINDOW_S:
                self.samples.popleft()
        return cpu

    def times(self) -> tuple[float, float | None]:
        """Wall and CPU seconds since the last progress."""
        now = self.clock()
        cpu = self.samples[-1][1] if self.samples else None
        return now - self.start, (cpu - self.cpu0 if cpu is not None and self.cpu0 is not None else None)

    def poll(self) -> Death | None:
        """A ``timeout`` death once the budget is spent; None while the cell may go on."""
        now = self.clock()
        if now >= self.next_sample:
            self.next_sample = now + CPU_POLL_S
            self._sample(now)
        budget = self.timeout_s + self.extra_s
        wall, cpu = self.times()
        if wall < budget:
            return None
        if cpu is None:
            why = f"Timeout: no progress within {self.timeout_s:g} s"
        elif cpu >= budget:
            why = (f"Timeout: no progress within {self.timeout_s:g} s of CPU time ({cpu:.0f} s CPU "
                   f"in {wall:.0f} s)")
        elif wall >= budget * TIMEOUT_WALL_FACTOR:
            why = (f"Timeout: no progress within {wall:.0f} s ({TIMEOUT_WALL_FACTOR:g} x "
                   f"cell_timeout_s={self.timeout_s:g}; {cpu:.0f} s CPU)")
        elif self._idle(now):
            why = (f"Timeout: no progress within {self.timeout_s:g} s, its processes idle "
                   f"({cpu:.1f} s CPU in {wall:.0f} s)")
        else:
            return None       # starved, not hung: it gets its budget in CPU seconds
        return Death(Status.TIMEOUT, why, final=True, wall_s=round(wall, 3),
                     cpu_s=None if cpu is None else round(cpu, 3))

    def _idle(self, now: float) -> bool:
        window = min(IDLE_WINDOW_S, self.timeout_s)
        old = [s for s in self.samples if s[0] <= now - window]
        if not old:
            return False      # not watched long enough to tell
        t0, c0 = old[-1]
        t1, c1 = self.samples[-1]
        return t1 > t0 and (c1 - c0) / (t1 - t0) < IDLE_CPU_SHARE
