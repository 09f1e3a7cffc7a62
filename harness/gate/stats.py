"""Significance of a latency change: a ratio rule plus evidence that the medians differ.

A change counts only when the median ratio passes a threshold AND the two sides differ
significantly, as asv compare does; either alone flaps (a 30 % swing on a noisy host is not
significant, a significant 1 % change is not worth blocking a torch bump). The evidence is the
recorded confidence intervals of the two medians when both records have one (they must not
overlap), otherwise Mann–Whitney U (``scipy.stats.mannwhitneyu``) on the records' samples.
A side timed on a loaded machine (``Latency.loaded``) decides nothing (``discount_load``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Sequence


# asv's default p-value threshold: with hundreds of gated cells, 0.05 would flag several by chance.
DEFAULT_ALPHA = 0.002
DEFAULT_RATIO = 1.10

Interval = tuple[float, float]


@dataclass(frozen=True)
class UTest:
    u: float          # U statistic of the first sample
    p_value: float    # two-sided


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> UTest:
    """Two-sided Mann–Whitney U test (scipy's default method: exact for small samples without
    ties, else the normal approximation with tie and continuity corrections)."""
    if len(x) == 0 or len(y) == 0:
        raise ValueError("mann_whitney_u needs two non-empty samples")
    if len(set(x) | set(y)) == 1:
        return UTest(len(x) * len(y) / 2, 1.0)   # every value equal: nothing to tell apart
    from scipy.stats import mannwhitneyu   # imported when a test runs: the CLI's startup stays light

    res = mannwhitneyu(x, y, alternative="two-sided")
    return UTest(float(res.statistic), float(res.pvalue))


@dataclass(frozen=True)
class LatencyChange:
    base_median: float
    cand_median: float
    ratio: float              # candidate / baseline median
    p_value: float | None     # Mann–Whitney U on the samples; None when not tested
    slower: bool              # ratio above threshold and significant
    faster: bool              # ratio below 1/threshold and significant
    method: str = "mann-whitney"                  # or "interval": the recorded intervals decided
    intervals: tuple[Interval, Interval] | None = None   # (baseline, candidate) when recorded
    loaded: tuple[str, ...] = ()    # sides timed on a loaded machine: no slower/faster from them

    @property
    def significant(self) -> bool:
        return self.slower or self.faster

    @property
    def load_note(self) -> str | None:
        if not self.loaded:
            return None
        return (f"latency not compared: measured on a loaded machine on the {' and the '.join(self.loaded)} "
                f"(median ×{self.ratio:.2f}); re-run on a quiet machine to compare it")


def discount_load(change: LatencyChange, base_loaded: bool | None, cand_loaded: bool | None) -> LatencyChange:
    """The change with no verdict where either side was timed on a loaded machine: a loaded
    median sits many times too high inside a narrow interval, so neither "slower" nor "faster"
    can be told from it (``harness.run.machine_load``)."""
    sides = tuple(name for name, flag in (("baseline", base_loaded), ("candidate", cand_loaded)) if flag)
    if not sides:
        return change
    return replace(change, slower=False, faster=False, loaded=sides)


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


def compare_intervals(base_median: float, base_ci: Interval, cand_median: float, cand_ci: Interval,
                      threshold: float = DEFAULT_RATIO, p_value: float | None = None) -> LatencyChange:
    """Classify by recorded medians and their confidence intervals: slower when the ratio passes
    the threshold and the candidate's interval lies wholly above the baseline's (faster: the
    mirror image). ``p_value`` is carried along for display only."""
    ratio = cand_median / base_median if base_median > 0 else math.inf
    return LatencyChange(base_median, cand_median, ratio, p_value,
                         slower=ratio > threshold and cand_ci[0] > base_ci[1],
                         faster=ratio * threshold < 1 and cand_ci[1] < base_ci[0],
                         method="interval", intervals=(tuple(base_ci), tuple(cand_ci)))
