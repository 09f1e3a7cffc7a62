"""Latency protocol (DESIGN.md): warm-up, then enough timed runs; robust statistics."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from harness.core.job import LatencyProtocol
from harness.core.record import Latency


def measure(fn: Callable[[], Any], protocol: LatencyProtocol, threads: int | None = None) -> Latency:
    """Time ``fn`` (one synchronous inference) and summarise in milliseconds."""
    start = time.perf_counter()
    n = 0
    while n < protocol.warmup_runs or time.perf_counter() - start < protocol.warmup_s:
        fn()
        n += 1
        if time.perf_counter() - start > protocol.max_time_s:
            break
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < protocol.min_runs or time.perf_counter() - start < protocol.min_time_s:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > protocol.max_time_s:
            break
    return summarize(samples, threads, protocol.unstable_cv)


def summarize(samples: list[float], threads: int | None = None, unstable_cv: float = 0.05) -> Latency:
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=10) if len(ordered) >= 2 else [ordered[0]] * 9
    quart = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    mean = statistics.fmean(ordered)
    cv = statistics.pstdev(ordered) / mean if mean > 0 else 0.0
    return Latency(median=statistics.median(ordered), p90=q[8], min=ordered[0], mean=mean,
                   iqr=quart[2] - quart[0], cv=cv, unstable=cv > unstable_cv,
                   iterations=len(ordered), threads=threads,
                   samples=[round(s, 5) for s in samples])
