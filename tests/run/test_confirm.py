"""harness/run/confirm.py: the latency phase checks each figure in a second fresh process and
settles those that disagree over more processes. The processes here are given figures (the
issue's per-process modes: 0.015 ms in one fresh process, 0.024 in the next); the real latency
workers do it in tests/run/test_e2e_schedule.py."""
from __future__ import annotations

import itertools

import pytest

from harness.core.cell import CellKey
from harness.core.job import LatencyProtocol
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.run.confirm import agree, confirm

KEY = CellKey("data_dependent_scale", "dynamo", 18, "ort-cpu")


def timing(median: float, loaded: bool = False, status: Status = Status.PASS) -> Record:
    return Record.for_cell("r", KEY, "2.13.0", "env", status, latency_ms={
        "median": median, "ci_low": median * 0.995, "ci_high": median * 1.005, "loaded": loaded,
        "unstable": False, "samples": [median] * 3})


class Processes:
    """Fresh latency workers that time every cell at the next figure of its list."""

    def __init__(self, figures: dict[str, list[float]]) -> None:
        self.figures = {cid: iter(v) for cid, v in figures.items()}
        self.calls: list[tuple[list[str], LatencyProtocol]] = []

    def __call__(self, ids: list[str], protocol: LatencyProtocol) -> dict[str, Record]:
        self.calls.append((ids, protocol))
        return {cid: timing(next(self.figures[cid])) for cid in ids}


def test_two_figures_agree_within_the_interval_or_the_spread() -> None:
    first = Latency(median=0.0105, ci_low=0.0104, ci_high=0.0106)
    assert agree(first, Latency(median=0.0107), 0.05)
    assert not agree(first, Latency(median=0.0225), 0.05)
    wide = Latency(median=0.0105, ci_low=0.008, ci_high=0.013)     # its own interval says ±24 %
    assert agree(wide, Latency(median=0.0125), 0.05)


def test_agreeing_processes_keep_the_figure_and_record_both() -> None:
    timings = {"a": timing(0.0105)}
    procs = Processes({"a": [0.0106]})
    counts = confirm(timings, LatencyProtocol(), procs)
    lat = timings["a"].latency_ms
    assert counts == {"checked": 1, "disagreed": 0, "unchecked": 0} and len(procs.calls) == 1
    assert lat.median == 0.0105 and lat.processes == [0.0105, 0.0106] and not lat.unstable
    assert procs.calls[0][1] == LatencyProtocol().confirm_protocol() and not procs.calls[0][1].confirm


def test_disagreeing_processes_are_settled_over_more_and_say_why() -> None:
    timings = {"a": timing(0.015), "b": timing(0.0105)}
    procs = Processes({"a": [0.024, 0.015, 0.025, 0.015, 0.024], "b": itertools.repeat(0.0105)})
    counts = confirm(timings, LatencyProtocol(confirm_processes=4), procs)
    assert counts == {"checked": 2, "disagreed": 1, "unchecked": 0}
    assert [ids for ids, _ in procs.calls] == [["a", "b"], ["a"], ["a"], ["a"], ["a"]]
    lat = timings["a"].latency_ms
    assert lat.processes == [0.015, 0.024, 0.015, 0.025, 0.015, 0.024]
    assert lat.median == pytest.approx(0.0195) and lat.unstable and lat.bimodal
    assert lat.modes == [0.015, 0.024]
    assert lat.unstable_why.startswith("two fresh processes disagree (0.015 vs 0.024 ms): the median of 6")
    assert "bimodal: 0.015 ms (3 processes) / 0.024 ms (3)" in lat.unstable_why
    assert lat.ci_low <= lat.median <= lat.ci_high
    assert not timings["b"].latency_ms.unstable and timings["b"].latency_ms.processes == [0.0105, 0.0105]


def test_loaded_failed_or_unconfirmed_timings_are_left_as_they_are() -> None:
    timings = {"busy": timing(0.02, loaded=True), "failed": timing(0.02, status=Status.FAIL)}
    procs = Processes({})
    assert confirm(timings, LatencyProtocol(), procs) == {"checked": 0, "disagreed": 0, "unchecked": 0}
    assert not procs.calls
    timings = {"a": timing(0.01)}
    assert confirm(timings, LatencyProtocol(confirm=False), Processes({}))["checked"] == 0
    assert timings["a"].latency_ms.processes == []
    # A second process timed on a busy machine checks nothing: the figure stays, unchecked.
    busy = {"a": timing(0.01)}
    assert confirm(busy, LatencyProtocol(), lambda ids, p: {"a": timing(0.03, loaded=True)})["unchecked"] == 1
    assert busy["a"].latency_ms.processes == [0.01] and busy["a"].latency_ms.median == 0.01
