"""harness/stats.py: Mann–Whitney U against reference values, and the ratio-and-significance rule."""
from __future__ import annotations

import random

import pytest

from harness.gate.stats import compare_latency, mann_whitney_u


def test_exact_small_samples_match_reference_values() -> None:
    # Reference p-values from scipy.stats.mannwhitneyu(method="exact"), two-sided.
    assert mann_whitney_u([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(0.1)
    res = mann_whitney_u([0.1 * i for i in range(10)], [0.1 * i + 0.05 for i in range(10)])
    assert (res.method, res.u) == ("exact", 45.0)
    assert res.p_value == pytest.approx(0.7393643508194593)
    assert mann_whitney_u(list(range(10)), list(range(10, 20))).p_value == pytest.approx(2 / 184756)


def test_normal_approximation_with_ties_matches_reference() -> None:
    # scipy.stats.mannwhitneyu(method="asymptotic"): tie and continuity corrections.
    res = mann_whitney_u([i % 7 for i in range(60)], [i % 7 + 1 for i in range(80)])
    assert (res.method, res.u) == ("normal", 1746.0)
    assert res.p_value == pytest.approx(0.00548133373863431, rel=1e-9)


def test_all_equal_samples_are_not_different() -> None:
    assert mann_whitney_u([1.0] * 50, [1.0] * 70).p_value == 1.0


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
