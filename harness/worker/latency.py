"""Latency protocol: warm up until stable, then sample until the median is known well enough.

Warm-up runs windows of calls (each >= ``warmup_window_runs`` calls and >= ``warmup_window_s``)
and ends once the medians of the last ``warmup_windows`` windows agree within
``warmup_tolerance`` (and at least ``warmup_runs`` calls and ``warmup_s`` have passed), or at
``warmup_max_s``. Sampling then times one call at a time and stops when the distribution-free
confidence interval of the median (order statistics, exact binomial ranks) lies within ±``rel_ci``
of the median after at least ``min_runs`` calls and ``min_time_s`` ("converged"; from
``early_runs`` calls on where the stricter ``early_confidence`` interval already is), or at
``max_time_s`` ("time_cap") or ``max_runs`` ("max_runs").

A timing is ``unstable`` when the robust spread of its calls (IQR / 1.349 / median, the CV a
normal distribution of that IQR would have; single slow calls leave it alone) exceeds
``unstable_spread`` or the median's interval is wider than ±``rel_ci``; and ``loaded`` when the
machine was busy with other work while it was taken (``harness.worker.machine_load``): a loaded
median can sit well above the true one inside a narrow interval.

A record keeps a bounded sample (``bounded_sample``): every value up to ``MAX_KEPT`` in time
order, beyond that ``MAX_KEPT`` evenly spaced order statistics (minimum and maximum included),
so a record stays small and the gate's rank test still sees the whole distribution's shape.

Worker side: standard library only (no scipy in the environments); the interval is checked
against ``scipy.stats.binom`` in the tests.

A timed call with ``self_timed = True`` (a runtime in another process that times itself, such as
Node.js around ``session.run``) returns the seconds of one inference: that is the sample; the
protocol's own clock then only bounds the windows and caps.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.core.job import LatencyProtocol
from harness.core.record import Latency
from harness.core.timing import median_interval
from harness.worker.machine_load import LoadProbe

MAX_KEPT = 1000
# Binding overheads measured in this process, per (runtime, threads): one identity model each.
_OVERHEADS: dict[tuple[str, int | None], float | None] = {}


def converged(ordered: Sequence[float], rel: float, confidence: float = 0.95) -> bool:
    """Whether the median's interval lies within ±rel of the median."""
    interval = median_interval(ordered, confidence)
    if interval is None:
        return False
    median = statistics.median(ordered)
    return interval[0] >= median * (1 - rel) and interval[1] <= median * (1 + rel)


def bounded_sample(samples: Sequence[float], keep: int = MAX_KEPT) -> list[float]:
    """Every sample when there are at most ``keep`` (time order), else ``keep`` evenly spaced
    order statistics from the minimum to the maximum; values rounded to 6 significant digits."""
    if len(samples) <= keep:
        chosen = list(samples)
    else:
        ordered, n = sorted(samples), len(samples)
        chosen = [ordered[round(i * (n - 1) / (keep - 1))] for i in range(keep)]
    return [float(f"{s:.6g}") for s in chosen]


def warm_up(fn: Callable[[], Any], protocol: LatencyProtocol) -> tuple[int, bool]:
    """Call ``fn`` until consecutive window medians agree; returns (calls, whether stable)."""
    p = protocol
    self_timed = getattr(fn, "self_timed", False)
    start = window_start = time.perf_counter()
    medians: list[float] = []
    window: list[float] = []
    n = 0
    while True:
        t0 = time.perf_counter()
        reported = fn()
        t1 = time.perf_counter()
        window.append(reported if self_timed else t1 - t0)
        n += 1
        if len(window) >= p.warmup_window_runs and t1 - window_start >= p.warmup_window_s:
            medians.append(statistics.median(window))
            window, window_start = [], t1
            recent = medians[-p.warmup_windows:]
            if (n >= p.warmup_runs and t1 - start >= p.warmup_s and len(recent) == p.warmup_windows
                    and max(recent) <= min(recent) * (1 + p.warmup_tolerance)):
                return n, True
        if t1 - start >= p.warmup_max_s:
            return n, False


def take_samples(fn: Callable[[], Any], protocol: LatencyProtocol) -> tuple[list[float], str]:
    """Time single calls (milliseconds) until the median converges or a cap; (samples, stop)."""
    p = protocol
    self_timed = getattr(fn, "self_timed", False)
    samples: list[float] = []
    start = time.perf_counter()
    next_check = min(p.early_runs, p.min_runs)
    while True:
        t0 = time.perf_counter()
        reported = fn()
        t1 = time.perf_counter()
        samples.append((reported if self_timed else t1 - t0) * 1e3)
        n = len(samples)
        if n >= next_check and t1 - start >= p.min_time_s:
            # Before min_runs only the stricter interval may stop it: each early look is one
            # more chance to stop on a sample that happens to look tight.
            confidence = p.confidence if n >= p.min_runs else max(p.confidence, p.early_confidence)
            if converged(sorted(samples), p.rel_ci, confidence):
                return samples, "converged"
            next_check = n + max(1, n // 10)   # re-check as the sample grows by 10 %
            if n < p.min_runs:
                next_check = min(next_check, p.min_runs)
        if t1 - start >= p.max_time_s:
            return samples, "time_cap"
        if n >= p.max_runs:
            return samples, "max_runs"


def measure(fn: Callable[[], Any], protocol: LatencyProtocol, threads: int | None = None) -> Latency:
    """Time ``fn`` (one synchronous inference) and summarise in milliseconds; whether the
    machine was busy with other work during the warm-up and sampling is recorded beside."""
    probe = LoadProbe.start()
    warm_runs, stable = warm_up(fn, protocol)
    samples, stop = take_samples(fn, protocol)
    load = probe.result()
    lat = summarize(samples, threads, protocol.unstable_spread, protocol.confidence, protocol.rel_ci)
    lat.stop, lat.warmup_iterations, lat.warmup_stable = stop, warm_runs, stable
    lat.loaded, lat.load = load.pop("loaded", None), load
    return lat


# IQR / 1.349 estimates the standard deviation of a normal distribution: the spread is the
# coefficient of variation such a distribution would have, unmoved by up to a quarter of slow
# calls (and, unlike the MAD, not blind to two modes of similar weight).
IQR_TO_SD = 1 / 1.349


def robust_spread(ordered: Sequence[float]) -> float:
    """The interquartile range / 1.349, relative to the median (0 for a zero median)."""
    median = statistics.median(ordered)
    if median <= 0 or len(ordered) < 2:
        return 0.0
    quart = statistics.quantiles(ordered, n=4)
    return IQR_TO_SD * (quart[2] - quart[0]) / median


def summarize(samples: Sequence[float], threads: int | None = None, unstable_spread: float = 0.05,
              confidence: float = 0.95, rel_ci: float | None = None) -> Latency:
    """Robust statistics of all samples; the record keeps a bounded sample of them.

    Unstable: the robust spread exceeds ``unstable_spread``, or the median's interval is missing
    or (with ``rel_ci``) wider than ±``rel_ci`` of it. The CV is kept for information: single
    slow calls inflate it on any machine."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=10) if len(ordered) >= 2 else [ordered[0]] * 9
    quart = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    mean = statistics.fmean(ordered)
    cv = statistics.pstdev(ordered) / mean if mean > 0 else 0.0
    interval = median_interval(ordered, confidence)
    median = statistics.median(ordered)
    spread = robust_spread(ordered)
    half = None if interval is None or median <= 0 else max(median - interval[0], interval[1] - median) / median
    wide = interval is None or (rel_ci is not None and half is not None and half > rel_ci)
    why = [f"robust spread {spread:.1%} > {unstable_spread:.0%}"] if spread > unstable_spread else []
    if interval is None:
        why.append(f"too few calls ({len(ordered)}) for an interval of the median")
    elif wide:
        why.append(f"median interval ±{half:.1%} wider than ±{rel_ci:.0%}")
    return Latency(median=median, p90=q[8], min=ordered[0], mean=mean, unstable_why="; ".join(why) or None,
                   iqr=quart[2] - quart[0], cv=cv, spread=spread, unstable=spread > unstable_spread or wide,
                   iterations=len(ordered), threads=threads,
                   ci_low=interval[0] if interval else None, ci_high=interval[1] if interval else None,
                   confidence=confidence if interval else None,
                   samples=bounded_sample(samples))


def binding_overhead(adapter_cls: type, protocol: LatencyProtocol, threads: int | None,
                     model: Path | None = None) -> float | None:
    """The binding overhead: median per-call time (ms) of the runtime's binding on an identity
    model (``model`` where that file exists), measured once per process and runtime with the
    cell's protocol; None (and a log line) where it cannot run."""
    key = (adapter_cls.name, threads)
    if key not in _OVERHEADS:
        from harness.runtimes.binding_overhead import identity_call

        try:
            with identity_call(adapter_cls, threads, model) as call:
                _OVERHEADS[key] = measure(call, protocol, threads).median
            where = model if model is not None and model.is_file() else "one written here"
            print(f"binding overhead of {adapter_cls.name}: {_OVERHEADS[key]:.3g} ms (identity model: {where})",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - the overhead is context for a latency, never a verdict
            print(f"binding overhead of {adapter_cls.name} not measured: {type(exc).__name__}: {exc}", flush=True)
            _OVERHEADS[key] = None
    return _OVERHEADS[key]
