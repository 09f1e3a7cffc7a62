"""Significance of a latency change: Mann–Whitney U on per-iteration samples, plus a ratio rule.

A change counts only when the median ratio passes a threshold AND the two sample sets differ
significantly, as asv compare does; either alone flaps (a 30 % swing on a noisy host is not
significant, a significant 1 % change is not worth blocking a torch bump). Standard library only.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

# asv's default p-value threshold: with hundreds of gated cells, 0.05 would flag several by chance.
DEFAULT_ALPHA = 0.002
DEFAULT_RATIO = 1.10
# Beyond this many pairs the exact null distribution is costly and the normal approximation exact enough.
_EXACT_MAX_PAIRS = 2500


@dataclass(frozen=True)
class UTest:
    u: float          # U statistic of the first sample
    p_value: float    # two-sided
    method: str       # "exact" or "normal"


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) and the sizes of tied groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _exact_cdf_counts(n1: int, n2: int) -> list[int]:
    """Number of arrangements giving each U in 0..n1*n2 (no ties): the Gaussian binomial
    coefficient [n1+n2 choose n1]_q, built by polynomial multiplication and exact division."""
    size = n1 * n2 + 1
    poly = [1] + [0] * (size - 1)
    for i in range(1, n1 + 1):
        # multiply by (1 - q^(n2+i)), then divide by (1 - q^i)
        shift = n2 + i
        for k in range(size - 1, shift - 1, -1):
            poly[k] -= poly[k - shift]
        for k in range(i, size):
            poly[k] += poly[k - i]
    return poly


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> UTest:
    """Two-sided Mann–Whitney U test; exact for small samples without ties, otherwise the normal
    approximation with tie and continuity corrections (as scipy's 'asymptotic' method)."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs two non-empty samples")
    ranks, ties = _ranks(list(x) + list(y))
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    if not ties and n1 * n2 <= _EXACT_MAX_PAIRS:
        counts = _exact_cdf_counts(n1, n2)
        total = sum(counts)
        lo = min(u1, n1 * n2 - u1)
        tail = sum(counts[: int(lo) + 1]) / total
        return UTest(u1, min(1.0, 2 * tail), "exact")
    n = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties) / (n * (n - 1))
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return UTest(u1, 1.0, "normal")  # every value equal: nothing to tell apart
    z = max(abs(u1 - mean) - 0.5, 0.0) / math.sqrt(var)
    return UTest(u1, math.erfc(z / math.sqrt(2)), "normal")


@dataclass(frozen=True)
class LatencyChange:
    base_median: float
    cand_median: float
    ratio: float              # candidate / baseline median
    p_value: float | None     # None when either side has too few samples to test
    slower: bool              # ratio above threshold and significant
    faster: bool              # ratio below 1/threshold and significant

    @property
    def significant(self) -> bool:
        return self.slower or self.faster


def compare_latency(base: Sequence[float], cand: Sequence[float], threshold: float = DEFAULT_RATIO,
                    alpha: float = DEFAULT_ALPHA) -> LatencyChange:
    """Classify the change from ``base`` to ``cand`` samples (milliseconds per iteration)."""
    if not base or not cand:
        raise ValueError("compare_latency needs samples on both sides")
    bm, cm = statistics.median(base), statistics.median(cand)
    ratio = cm / bm if bm > 0 else math.inf
    if len(base) < 2 or len(cand) < 2:
        return LatencyChange(bm, cm, ratio, None, False, False)
    p = mann_whitney_u(cand, base).p_value
    return LatencyChange(bm, cm, ratio, p, slower=ratio > threshold and p < alpha,
                         faster=ratio * threshold < 1 and p < alpha)
