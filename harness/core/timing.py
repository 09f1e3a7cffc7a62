"""What the worker's timing and the runner's checks of it share: the order-statistic interval of
a median (the latency protocol stops on it; the confirmation of a figure compares with it) and
the thresholds that make a timing window loaded or a round of interleaved timing contended
(``harness.worker.machine_load`` measures; ``harness.run.ab`` and the gate judge). Standard
library only.
"""
from __future__ import annotations

import math
from typing import Sequence

# A timing window is loaded when other processes used more than this share of the machine, or
# the hypervisor stole more than STEAL_LOADED of its CPUs; a round of interleaved timing is
# contended when the timing process ran for less than CONTENDED of it.
OTHER_CPU_LOADED = 0.25
STEAL_LOADED = 0.05
CONTENDED = 0.5


def median_ci_rank(n: int, confidence: float = 0.95) -> int | None:
    """The 1-based rank j such that [x_(j), x_(n+1-j)] of n sorted samples covers the median
    with probability >= ``confidence`` for any continuous distribution: the largest j with
    P(Bin(n, 1/2) <= j - 1) <= (1 - confidence) / 2. None when n is too small for that.

    Walks down from the middle of Bin(n, 1/2) with the pmf recurrence: O(sqrt(n)) steps."""
    if n < 1:
        return None
    tail = (1 - confidence) / 2
    k = n // 2
    pmf = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))
    cdf = 0.5 + pmf / 2 if n % 2 == 0 else 0.5   # P(X <= n // 2), by symmetry
    while cdf > tail and k >= 0:
        cdf -= pmf                      # now P(X <= k - 1)
        pmf *= k / (n - k + 1)          # pmf(k - 1)
        k -= 1
    j = k + 1
    return j if j >= 1 else None


def median_interval(ordered: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The order-statistic confidence interval of the median of already sorted samples."""
    j = median_ci_rank(len(ordered), confidence)
    if j is None:
        return None
    return ordered[j - 1], ordered[len(ordered) - j]
