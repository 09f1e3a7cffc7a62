"""Significance of a latency change.

The first look, on two stored records: the median ratio passes a threshold AND the two sides
differ significantly, as asv compare does (either alone flaps). The evidence is the recorded
confidence intervals of the two medians when both records have one (they must not overlap),
otherwise Mann–Whitney U (``scipy.stats.mannwhitneyu``) on the records' samples. A side timed on a
loaded machine (``Latency.loaded``) decides nothing (``discount_load``). The first look chooses
the cells to time again; it decides only with ``--remeasure 0``.

The verdict, on an interleaved A/B timing (``harness.run.ab``, ``analyse``): per process set, the
median over its clean rounds of the paired log ratio; across sets, a t-interval of their mean
(``scipy.stats.t``), so that rounds of one process count once and per-process modes widen the
interval instead of deciding it. Slower only when the whole interval lies above the threshold.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from harness.core.timing import CONTENDED
from harness.run.ab import ABRun, Modes, ProcessTiming, modes

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
    from scipy.stats import mannwhitneyu  # imported when a test runs: the CLI's startup stays light

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
    method: str = "mann-whitney"    # "interval": the recorded intervals decided; "interleaved": A/B timing
    intervals: tuple[Interval, Interval] | None = None   # (baseline, candidate) when recorded
    loaded: tuple[str, ...] = ()    # sides timed on a loaded machine: no slower/faster from them
    ratio_interval: Interval | None = None   # interleaved: the confidence interval of the ratio

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
    can be told from it (``harness.worker.machine_load``)."""
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


# -- interleaved A/B timing (harness.run.ab) ------------------------------------------------------
# A set of processes (one per stack) is evidence when it kept this many rounds in which every
# process had its core; a comparison needs this many such sets, else it cannot tell (loaded).
MIN_CLEAN_ROUNDS = 3
MIN_SETS = 2
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioInterval:
    """A ratio and its confidence interval: a t-interval on per-process log ratios (each the
    median over that process's rounds), so rounds of one process count as one observation."""

    ratio: float
    low: float
    high: float
    n: int              # process sets
    confidence: float

    def text(self) -> str:
        return f"×{self.ratio:.2f} ({self.confidence:.0%} interval {self.low:.2f}–{self.high:.2f})"

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": round(self.ratio, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "processes": self.n, "confidence": self.confidence}


def ratio_interval(logs: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> RatioInterval | None:
    """The t-interval (``scipy.stats.t``) of the mean of per-process log ratios, as a ratio."""
    if len(logs) < 2:
        return None
    from scipy.stats import t

    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = float(t.ppf((1 + confidence) / 2, len(logs) - 1)) * sd / math.sqrt(len(logs))
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs), confidence)


def _log(a: float, b: float) -> float:
    return math.log(a / b) if a > 0 and b > 0 else 0.0


def set_logs(procs: list[ProcessTiming]) -> dict[str, float] | None:
    """One set's median log ratios over its clean rounds: ``main`` (candidate file in the
    candidate's stack / baseline file in the baseline's), ``file`` (candidate / baseline file in
    the same stack) and, with two stacks, ``stack`` (candidate / baseline stack, same file).
    File 0 is the baseline's, file 1 the candidate's; stack 0 the baseline's. None: loaded."""
    kept = [r for r in range(min(len(p.t) for p in procs)) if all(p.clean(r) for p in procs)]
    if len(kept) < MIN_CLEAN_ROUNDS:
        return None
    a, b = procs[0].t, procs[-1].t
    out = {"main": statistics.median(_log(b[r][1], a[r][0]) for r in kept),
           "file": statistics.median((_log(a[r][1], a[r][0]) + _log(b[r][1], b[r][0])) / 2 for r in kept)}
    if len(procs) > 1:
        out["stack"] = statistics.median((_log(b[r][0], a[r][0]) + _log(b[r][1], a[r][1])) / 2 for r in kept)
    return out


@dataclass
class Interleaved:
    """What an interleaved A/B timing says of one cell (``analyse``)."""

    main: RatioInterval | None                 # None: too few clean process sets (loaded)
    file: RatioInterval | None = None
    stack: RatioInterval | None = None         # None with one stack
    base_ms: float | None = None               # median of process medians, each side's file in its stack
    cand_ms: float | None = None
    modes: dict[str, Modes] = field(default_factory=dict)    # side → its two modes across processes
    stacks: tuple[str, ...] = ()
    sets: int = 0
    usable: int = 0
    rounds: int = 0
    clean: int = 0
    seconds: float = 0.0
    error: str | None = None
    other_cpu: float | None = None             # the median share of the machine others used (information)
    steal: float | None = None                 # the median share of the machine the hypervisor took (information)
    round_cpu: float | None = None             # the median share of a round the timing process ran on a CPU

    @property
    def loaded(self) -> bool:
        return self.error is None and self.main is None

    def busy_text(self) -> str:
        """Why the rounds were not evidence, in the measured terms: a timing process short of its
        core, the hypervisor's steal (a GPU runtime's process loses every round to it), and
        the share of the machine other processes used."""
        why = [f"{self.usable} of {self.sets} process sets usable"]
        if self.steal:
            why.append(f"the hypervisor took {self.steal:.0%} of the machine (steal)")
        if self.round_cpu is not None:
            why.append(f"a round ran on a CPU for {self.round_cpu:.0%} of its time (median; "
                       f"below {CONTENDED:.0%} it is contended)")
        if self.other_cpu is not None:
            why.append(f"other processes used {self.other_cpu:.0%} of the machine")
        return f"{self.clean} of {self.rounds} rounds had their core ({'; '.join(why)})"

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": None if self.main is None else self.main.to_dict(),
                "file": None if self.file is None else self.file.to_dict(),
                "stack": None if self.stack is None else self.stack.to_dict(),
                "base_ms": self.base_ms, "cand_ms": self.cand_ms, "stacks": list(self.stacks),
                "bimodal": {side: m.to_dict() for side, m in self.modes.items()},
                "process_sets": self.sets, "usable_sets": self.usable, "rounds": self.rounds,
                "clean_rounds": self.clean, "loaded": self.loaded, "other_cpu": self.other_cpu,
                "steal": self.steal, "round_cpu": self.round_cpu,
                "seconds": self.seconds, "error": self.error}


def _median(values: list[Any]) -> float | None:
    """The median of the numbers among ``values`` (to 3 digits), or None where there are none."""
    nums = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(nums), 3) if nums else None


def analyse(run: ABRun, confidence: float = DEFAULT_CONFIDENCE) -> Interleaved:
    """The paired ratios of an ``ABRun`` of two files (baseline's first) in one or two stacks."""
    sets = run.sets()
    logs = [x for x in (set_logs(s) for s in sets) if x is not None]
    out = Interleaved(None, stacks=tuple(run.stacks), sets=len(sets), usable=len(logs), rounds=run.rounds,
                      clean=run.clean, seconds=run.seconds, error=run.error)
    out.other_cpu = _median([p.load.get("other_cpu") for p in run.processes])
    out.steal = _median([p.load.get("steal") for p in run.processes])
    out.round_cpu = _median([c for p in run.processes for c in p.cpu])
    if len(logs) >= MIN_SETS:
        out.main = ratio_interval([x["main"] for x in logs], confidence)
        out.file = ratio_interval([x["file"] for x in logs], confidence)
        if "stack" in logs[0]:
            out.stack = ratio_interval([x["stack"] for x in logs], confidence)
    for side, stack, f in (("baseline", 0, 0), ("candidate", len(run.stacks) - 1, 1)):
        meds = [m[f] for p in run.processes if p.stack == stack and (m := p.medians()) is not None]
        if meds:
            setattr(out, "base_ms" if f == 0 else "cand_ms", statistics.median(meds))
        if (two := modes(meds)) is not None:
            out.modes[side] = two
    return out


def decisive(iv: Interleaved, threshold: float) -> bool:
    """Whether more processes could not change the verdict: the interval wholly above the
    threshold, wholly below its inverse, or wholly between the two."""
    m = iv.main
    if m is None:
        return False
    return m.low > threshold or m.high < 1 / threshold or (m.high < threshold and m.low > 1 / threshold)
