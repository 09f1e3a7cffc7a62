"""The latency phase's own check: each figure measured twice, in two fresh processes.

Per-process timing of small models is multi-modal (memory layout and the core a process lands on
are fixed when it starts): the same file in the same stack times 0.015 ms in one fresh process and
0.024 ms in the next, each with a narrow interval, so one process's interval says nothing of the
next. The latency phase therefore times an environment's passing cells once with the matrix's
protocol and once more in a second fresh latency worker with a short protocol
(``LatencyProtocol.confirm_protocol``). Two figures that agree (the second within the first's
interval, widened to at least ``unstable_spread``) are stored as measured, with both in
``processes``. Where they disagree, the cell is timed in ``confirm_processes`` more fresh workers
and stored with the median of every process's median: ``unstable``, saying why, and ``bimodal``
with both modes when the processes split in two. A timing taken on a loaded machine is stored as
it is (``loaded``): a busy machine, not a mode, and the gate times such cells again anyway.

Runner side; ``time_again(cells, protocol)`` runs one fresh latency worker over ``cells``.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, Sequence

from harness.core.job import LatencyProtocol
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.core.timing import median_interval
from harness.run.ab import modes


def _half(lat: Latency) -> float:
    """The relative half-width of a timing's interval (0 without one)."""
    if lat.median is None or lat.median <= 0 or lat.interval is None:
        return 0.0
    return max(lat.median - lat.interval[0], lat.interval[1] - lat.median) / lat.median


def agree(first: Latency, second: Latency, tolerance: float) -> bool:
    """The second figure within the first's interval and its own, and within ``tolerance``."""
    if not first.median or not second.median:
        return True
    allowed = max(tolerance, _half(first) + _half(second))
    return abs(math.log(second.median / first.median)) <= math.log1p(allowed)


def _timed(rec: Record | None) -> bool:
    return rec is not None and rec.status is Status.PASS and bool(rec.latency_ms.median)


def settle(lat: Latency, medians: Sequence[float], confidence: float) -> None:
    """Store the median of the processes' medians, an interval over them, and why (in place)."""
    first, second = medians[0], medians[1]
    ordered = sorted(medians)
    lat.median = statistics.median(ordered)
    lat.ci_low, lat.ci_high = median_interval(ordered, confidence) or (ordered[0], ordered[-1])
    two = modes(list(medians))
    lat.bimodal = two is not None
    lat.modes = [round(two.low, 6), round(two.high, 6)] if two else []
    why = (f"two fresh processes disagree ({first:.3g} vs {second:.3g} ms): the median of "
           f"{len(medians)} processes" + (f", bimodal: {two.text()}" if two else ""))
    lat.unstable = True
    lat.unstable_why = "; ".join(filter(None, [why, lat.unstable_why]))


def confirm(timings: dict[str, Record], protocol: LatencyProtocol,
            time_again: Callable[[list[str], LatencyProtocol], dict[str, Record]]) -> dict[str, int]:
    """Check every passing, unloaded timing of ``timings`` (cell id → the latency phase's record)
    in a second fresh process and settle those that disagree (in place); returns counts."""
    checked = [cid for cid, rec in timings.items() if _timed(rec) and not rec.latency_ms.loaded]
    if not protocol.confirm or not checked:
        return {"checked": 0, "disagreed": 0, "unchecked": 0}
    short = protocol.confirm_protocol()
    second = time_again(checked, short)
    disagreed, unchecked = [], 0
    for cid in checked:
        lat, again = timings[cid].latency_ms, second.get(cid)
        lat.processes = [round(lat.median, 6)]
        if not _timed(again) or again.latency_ms.loaded:
            unchecked += 1     # the second process failed or was timed on a busy machine
            continue
        lat.processes.append(round(again.latency_ms.median, 6))
        if not agree(lat, again.latency_ms, protocol.unstable_spread):
            disagreed.append(cid)
    more: list[dict[str, Record]] = [time_again(disagreed, short) for _ in range(protocol.confirm_processes)
                                     if disagreed]
    for cid in disagreed:
        lat = timings[cid].latency_ms
        medians = lat.processes + [r[cid].latency_ms.median for r in more
                                   if _timed(r.get(cid)) and not r[cid].latency_ms.loaded]
        lat.processes = [round(m, 6) for m in medians]
        settle(lat, medians, protocol.confidence)
    return {"checked": len(checked), "disagreed": len(disagreed), "unchecked": unchecked}
