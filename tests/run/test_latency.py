"""harness/worker/latency.py: the median's interval, stopping rules, bounded samples (fake clock)."""
from __future__ import annotations

import json
import random
import statistics

import pytest
from scipy.stats import binom

from harness.core.cell import CellKey
from harness.core.job import LatencyProtocol
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.core.timing import median_ci_rank
from harness.worker import latency as lat
from harness.worker.latency import (
    MAX_KEPT,
    bounded_sample,
    converged,
    measure,
    median_interval,
    summarize,
)


def scipy_rank(n: int, confidence: float = 0.95) -> int | None:
    """The largest j with P(Bin(n, 1/2) <= j - 1) <= (1 - confidence) / 2, from scipy."""
    tail = (1 - confidence) / 2
    j = int(binom.ppf(tail, n, 0.5))           # smallest k with cdf(k) >= tail
    j = j + 1 if binom.cdf(j, n, 0.5) <= tail else j
    return j if j >= 1 else None


@pytest.mark.parametrize("confidence", [0.95, 0.99, 0.9])
def test_median_rank_matches_the_exact_binomial(confidence):
    for n in [*range(1, 400), 999, 1000, 1001, 4097, 20000, 123457, 10**6]:
        assert median_ci_rank(n, confidence) == scipy_rank(n, confidence), n


def test_interval_needs_six_samples_at_95_percent():
    assert median_ci_rank(5) is None and median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (1.0, 6.0)
    ordered = [float(i) for i in range(1, 201)]
    assert median_interval(ordered) == (86.0, 115.0)   # ranks 86 and 200 + 1 - 86


def test_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(11)
    hits = 0
    for _ in range(2000):
        low, high = median_interval(sorted(rng.expovariate(1.0) for _ in range(51)))
        hits += low <= 0.6931471805599453 <= high        # ln 2: the exponential's median
    assert 0.94 <= hits / 2000 <= 0.985


def test_converged_needs_a_narrow_interval_around_the_median():
    rng = random.Random(1)
    tight = sorted(rng.gauss(1.0, 0.01) for _ in range(500))
    wide = sorted(rng.gauss(1.0, 0.5) for _ in range(500))
    assert converged(tight, 0.01) and not converged(wide, 0.01)
    assert not converged(tight[:5], 0.5)     # too few samples for any interval


def test_bounded_sample_keeps_order_when_small_and_order_statistics_when_large():
    assert bounded_sample([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    rng = random.Random(2)
    big = [rng.lognormvariate(0, 0.3) for _ in range(100_000)]
    kept = bounded_sample(big)
    assert len(kept) == MAX_KEPT and kept == sorted(kept)
    assert kept[0] == pytest.approx(min(big), rel=1e-5) and kept[-1] == pytest.approx(max(big), rel=1e-5)
    ordered = sorted(big)
    for i in (1, 250, 500, 900, 998):                # kept[i] is the i/999 quantile
        assert kept[i] == pytest.approx(ordered[round(i * 99_999 / 999)], rel=1e-5)


def test_a_record_of_a_hundred_thousand_samples_stays_small_and_keeps_its_interval():
    rng = random.Random(3)
    samples = [0.01 + rng.expovariate(1000) for _ in range(100_000)]
    summary = summarize(samples, threads=1)
    assert summary.iterations == 100_000 and len(summary.samples) == MAX_KEPT
    assert summary.ci_low <= summary.median <= summary.ci_high
    assert summary.median == statistics.median(samples)
    rec = Record.for_cell("r", CellKey("c", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.PASS,
                          latency_ms=summary)
    text = rec.to_json()
    assert len(text.encode()) < 50_000
    assert Record.from_dict(json.loads(text)).latency_ms.interval == (summary.ci_low, summary.ci_high)


def test_old_latency_without_interval_still_loads():
    old = Latency.from_dict({"median": 1.0, "p90": 1.2, "samples": [1.0] * 5000, "iterations": 5000})
    assert old.interval is None and old.stop is None and len(old.samples) == 5000
    assert "ci_low" not in old.to_dict()


class FakeClock:
    """perf_counter that only moves when the timed function 'runs' for a scripted duration."""

    def __init__(self, durations_ms):
        self.now, self.durations, self.calls = 0.0, iter(durations_ms), 0

    def perf_counter(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += next(self.durations) / 1e3
        self.calls += 1


@pytest.fixture
def clock(monkeypatch):
    def install(durations):
        fake = FakeClock(durations)
        monkeypatch.setattr(lat.time, "perf_counter", fake.perf_counter)
        return fake
    return install


def jitter(seed: int, center: float, rel: float):
    rng = random.Random(seed)
    while True:
        yield center * (1 + rng.uniform(-rel, rel))


def test_warm_up_ends_once_windows_agree_then_sampling_converges(clock):
    def script():
        noise = jitter(4, 1.0, 0.02)
        for i in range(10**6):                  # slow first calls (allocation, caches) decaying
            yield next(noise) + 4 * 0.9 ** i
    fake = clock(script())
    p = LatencyProtocol(warmup_runs=10, warmup_s=0.0, warmup_window_runs=10, warmup_window_s=0.0,
                        warmup_windows=3, min_runs=50, min_time_s=0.0)
    res = measure(fake.call, p, threads=1)
    assert res.warmup_stable and 60 <= res.warmup_iterations <= 150  # once within ~2 % of 1 ms
    assert res.stop == "converged" and res.median == pytest.approx(1.0, rel=0.01)
    assert res.ci_low >= res.median * 0.99 and res.ci_high <= res.median * 1.01
    assert res.iterations >= p.early_runs and res.threads == 1 and res.confidence == 0.95


def test_a_median_that_never_settles_stops_at_the_time_cap(clock):
    def bimodal():
        while True:
            yield 1.0
            yield 2.0
    fake = clock(bimodal())
    p = LatencyProtocol(warmup_max_s=0.01, min_runs=20, min_time_s=0.0, max_time_s=0.3)
    res = measure(fake.call, p)
    assert res.stop == "time_cap"
    assert 190 <= res.iterations <= 210          # 0.3 s of 1.5 ms calls


def test_max_runs_caps_the_sample(clock):
    def bimodal():
        while True:
            yield 1.0
            yield 3.0
    fake = clock(bimodal())
    res = measure(fake.call, LatencyProtocol(warmup_max_s=0.0, min_runs=10, max_runs=77, min_time_s=0.0))
    assert (res.stop, res.iterations) == ("max_runs", 77)


def test_warm_up_that_keeps_drifting_ends_at_its_cap_unstable(clock):
    def drifting():
        d = 1.0
        while True:
            yield d
            d *= 1.01                           # 10 % slower every ten calls: never stable
    fake = clock(drifting())
    p = LatencyProtocol(warmup_window_s=0.0, warmup_max_s=0.2, min_runs=10, min_time_s=0.0,
                        max_time_s=0.05, rel_ci=0.5)
    res = measure(fake.call, p)
    assert res.warmup_stable is False and res.warmup_iterations > 30


def test_minimum_time_is_honoured_even_when_the_median_converges_early(clock):
    fake = clock(jitter(5, 2.0, 0.001))
    res = measure(fake.call, LatencyProtocol(warmup_max_s=0.0, min_runs=10, min_time_s=0.5))
    assert res.stop == "converged" and res.iterations >= 250          # 0.5 s of 2 ms calls


def test_protocol_rejects_nonsense():
    for bad in ({"rel_ci": 0}, {"confidence": 1.0}, {"max_runs": 5}, {"warmup_windows": 0},
                {"warmup_tolerance": -0.1}):
        with pytest.raises(ValueError):
            LatencyProtocol(**bad)
    assert LatencyProtocol.from_dict({"min_runs": 20, "min_time_s": 0.05}).rel_ci == 0.01


def test_a_tight_spread_stops_before_min_runs_and_a_wide_one_does_not(clock):
    tight = clock(jitter(6, 2.0, 0.002))
    p = LatencyProtocol(warmup_max_s=0.0, min_runs=200, min_time_s=0.0, early_runs=30)
    res = measure(tight.call, p)
    assert res.stop == "converged" and 30 <= res.iterations < 200
    assert res.ci_low >= res.median * 0.99 and res.ci_high <= res.median * 1.01
    wide = clock(jitter(6, 2.0, 0.2))            # ±20 %: the early look cannot settle it
    res = measure(wide.call, p)
    assert res.iterations >= 200


def test_early_stopping_keeps_the_median_interval_honest():
    """Of many runs of a tight but noisy timing (true median 1 ms), those stopped before
    min_runs still hold the true median inside ±1 % about as often as the interval promises."""
    import statistics as st

    missed = early = 0
    for seed in range(300):
        noise = jitter(seed, 1.0, 0.03)
        samples, stop = [], None
        p = LatencyProtocol(min_runs=200, min_time_s=0.0, early_runs=30)
        fake = FakeClock(noise)
        lat.time.perf_counter, saved = fake.perf_counter, lat.time.perf_counter
        try:
            samples, stop = lat.take_samples(fake.call, p)
        finally:
            lat.time.perf_counter = saved
        if len(samples) < 200:
            early += 1
            missed += abs(st.median(samples) - 1.0) > 0.01
    assert early > 0
    assert missed <= 0.05 * early + 1, (missed, early)
