"""harness/gate/stats.py and compare.py's timing rule: Mann–Whitney U (scipy) on samples, recorded
median intervals where both records have them, the ratio-and-significance rule."""
from __future__ import annotations

import random

import pytest

from harness.core.cell import CellKey
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.gate.compare import Settings, compare_timing, timing_detail
from harness.gate.stats import compare_intervals, compare_latency, mann_whitney_u
from harness.worker.latency import bounded_sample, summarize


def test_mann_whitney_reference_values() -> None:
    # Exact two-sided p-values: 2 of the C(6, 3) = 20 arrangements are as extreme.
    assert mann_whitney_u([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(0.1)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6]).u == 0.0
    assert mann_whitney_u([1.0] * 50, [1.0] * 70).p_value == 1.0   # nothing to tell apart
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


def test_identical_distributions_are_not_significant() -> None:
    rng = random.Random(7)
    for _ in range(20):
        base = [rng.lognormvariate(0, 0.2) for _ in range(300)]
        cand = [rng.lognormvariate(0, 0.2) for _ in range(300)]
        change = compare_latency(base, cand)
        assert not change.slower and not change.faster
    same = [rng.gauss(1, 0.1) for _ in range(200)]
    assert compare_latency(same, list(same)).p_value == pytest.approx(1.0)


def test_clearly_shifted_distribution_is_a_significant_slowdown() -> None:
    rng = random.Random(3)
    base = [rng.gauss(1.0, 0.05) for _ in range(200)]
    cand = [rng.gauss(1.3, 0.05) for _ in range(200)]
    change = compare_latency(base, cand)
    assert change.slower and change.ratio == pytest.approx(1.3, rel=0.03) and change.p_value < 1e-10
    assert change.method == "mann-whitney"
    assert compare_latency(cand, base).faster


def test_ratio_below_threshold_is_never_flagged_even_when_significant() -> None:
    rng = random.Random(5)
    base = [rng.gauss(1.0, 0.005) for _ in range(500)]
    cand = [rng.gauss(1.05, 0.005) for _ in range(500)]
    change = compare_latency(base, cand, threshold=1.10)
    assert change.p_value < 1e-50 and not change.slower
    assert compare_latency(base, cand, threshold=1.02).slower


def test_too_few_samples_are_never_flagged() -> None:
    change = compare_latency([1.0], [5.0])
    assert change.p_value is None and not change.slower
    with pytest.raises(ValueError):
        compare_latency([], [1.0])


def test_the_test_still_works_on_bounded_samples() -> None:
    """Records keep 1,000 order statistics of 100,000 samples: a 20 % slowdown stays significant,
    two draws of one distribution stay unremarkable."""
    rng = random.Random(9)
    draw = lambda scale: [scale * (0.05 + rng.expovariate(200)) for _ in range(100_000)]
    base, same, slower = bounded_sample(draw(1.0)), bounded_sample(draw(1.0)), bounded_sample(draw(1.2))
    assert len(base) == len(slower) == 1000
    change = compare_latency(base, slower)
    assert change.slower and change.ratio == pytest.approx(1.2, rel=0.02) and change.p_value < 1e-20
    assert not compare_latency(base, same).significant


def test_intervals_decide_when_they_do_not_overlap_and_the_ratio_passes() -> None:
    slower = compare_intervals(1.0, (0.99, 1.01), 1.2, (1.19, 1.21))
    assert slower.slower and slower.method == "interval" and slower.intervals == ((0.99, 1.01), (1.19, 1.21))
    faster = compare_intervals(1.2, (1.19, 1.21), 1.0, (0.99, 1.01))
    assert faster.faster and not faster.slower
    overlapping = compare_intervals(1.0, (0.9, 1.3), 1.2, (1.1, 1.4))
    assert overlapping.ratio == pytest.approx(1.2) and not overlapping.significant
    small = compare_intervals(1.0, (0.999, 1.001), 1.05, (1.049, 1.051))   # apart, but under ×1.10
    assert not small.significant and compare_intervals(1.0, (0.999, 1.001), 1.05, (1.049, 1.051), 1.02).slower


def _record(latency: Latency) -> Record:
    return Record.for_cell("r", CellKey("c", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.PASS,
                           latency_ms=latency)


def test_gate_uses_recorded_intervals_and_falls_back_to_samples_for_old_records() -> None:
    rng = random.Random(4)
    base = summarize([rng.gauss(1.0, 0.02) for _ in range(3000)], threads=1)
    cand = summarize([rng.gauss(1.25, 0.02) for _ in range(3000)], threads=1)
    change = compare_timing(_record(base), _record(cand), Settings())
    assert change.method == "interval" and change.slower
    assert change.base_median == base.median and change.p_value < 1e-10
    assert "no overlap" in timing_detail(change)
    # Records from before the interval was recorded: the same samples decide, by rank test.
    old_base = Latency.from_dict({"median": base.median, "samples": base.samples, "threads": 1})
    old_cand = Latency.from_dict({"median": cand.median, "samples": cand.samples, "threads": 1})
    old = compare_timing(_record(old_base), _record(old_cand), Settings())
    assert old.method == "mann-whitney" and old.slower and timing_detail(old).startswith("median ×1.2")
    # One side old, one side new: no common evidence but samples, so the samples decide.
    assert compare_timing(_record(old_base), _record(cand), Settings()).method == "mann-whitney"
    # Different thread counts are never compared.
    other = summarize(cand.samples, threads=2)
    assert compare_timing(_record(base), _record(other), Settings()) is None
