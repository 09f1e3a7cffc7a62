"""The interleaved verdict's arithmetic and how the gate shows it: per-set log ratios over clean
rounds, the t-interval across sets (checked against a hand computation with scipy's t), modes
among process medians, which stored cells are timed again, "cannot tell" in the coverage and the
exit code, and the facts gate.md / gate.json / junit.xml carry. The real timing is in
test_interleaved.py."""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.core.status import Status
from harness.gate.compare import (
    CellComparison,
    Coverage,
    Settings,
    Verdict,
    compare_cell,
)
from harness.gate.output import render_json, render_junit, render_markdown
from harness.gate.retime import attribute, cannot_tell, suspect
from harness.gate.sources import Side
from harness.gate.stats import (
    MIN_CLEAN_ROUNDS,
    LatencyChange,
    analyse,
    decisive,
    ratio_interval,
    set_logs,
)
from harness.run.ab import ABRun, ProcessTiming, modes

KEY = CellKey("data_dependent_scale", "dynamo", 18, "openvino")


def proc(stack: int, rows: list[tuple[float, float]], cpu: float = 1.0, steal: float = 0.0) -> ProcessTiming:
    return ProcessTiming(stack, [list(r) for r in rows], [cpu] * len(rows), {"steal": steal})


def test_interval_is_a_t_interval_of_per_set_log_ratios() -> None:
    from scipy.stats import t

    logs = [0.10, 0.20, 0.30]
    iv = ratio_interval(logs, 0.95)
    half = t.ppf(0.975, 2) * 0.1 / math.sqrt(3)     # sd of 0.1, 0.2, 0.3 is 0.1
    assert iv.ratio == pytest.approx(math.exp(0.2))
    assert (iv.low, iv.high) == pytest.approx((math.exp(0.2 - half), math.exp(0.2 + half)))
    assert iv.n == 3 and ratio_interval([0.1]) is None


def test_a_set_is_the_median_over_its_clean_rounds() -> None:
    rounds = [(1.0, 1.3)] * 5 + [(1.0, 9.0)]          # one wild round does not move the median
    one = set_logs([proc(0, rounds)])
    assert one["main"] == pytest.approx(math.log(1.3)) and one["file"] == one["main"] and "stack" not in one
    contended = proc(0, rounds, cpu=0.3)              # the process lost most of every round
    assert set_logs([contended]) is None
    stolen = proc(0, rounds, steal=0.2)               # steal elsewhere: the rounds had their core
    assert set_logs([stolen])["main"] == pytest.approx(math.log(1.3))
    assert set_logs([proc(0, rounds[:MIN_CLEAN_ROUNDS - 1])]) is None
    on_gpu = ProcessTiming(0, [list(r) for r in rounds], [None] * len(rounds), {})   # no CPU share told
    assert set_logs([on_gpu])["main"] == pytest.approx(math.log(1.3))


def test_two_stacks_separate_the_file_from_the_stack() -> None:
    # Stack B is 1.2x slower for either file; the candidate's file 1.1x slower in either stack.
    a = proc(0, [(1.0, 1.1)] * 6)
    b = proc(1, [(1.2, 1.32)] * 6)
    logs = set_logs([a, b])
    assert logs["main"] == pytest.approx(math.log(1.32))
    assert logs["file"] == pytest.approx(math.log(1.1)) and logs["stack"] == pytest.approx(math.log(1.2))


def test_analyse_pools_sets_and_reports_modes() -> None:
    # Per-process modes (the 0.015 / 0.024 ms) shared by both files of a process.
    speeds = [0.015, 0.024, 0.015, 0.025, 0.015, 0.024]
    run = ABRun(["openvino 2026.4.1"], [proc(0, [(s, s * 1.01)] * 8) for s in speeds], seconds=3.0)
    iv = analyse(run)
    assert iv.main.ratio == pytest.approx(1.01, abs=1e-6) and iv.usable == 6 and iv.stack is None
    assert iv.modes["baseline"].low == pytest.approx(0.015) and iv.modes["baseline"].n_high == 3
    assert decisive(iv, 1.10)
    busy = ABRun(["x"], [proc(0, [(1.0, 1.0)] * 8, cpu=0.2)] * 4)
    assert analyse(busy).main is None and analyse(busy).loaded


def test_a_busy_timing_says_what_it_measured() -> None:
    """A contended round is lost alone; steal loses a GPU runtime's process (which tells no CPU
    share) as a whole: the text gives the measured shares."""
    contended = analyse(ABRun(["a"], [proc(0, [(1.0, 1.0)] * 8, cpu=0.3, steal=0.08)] * 4))
    assert contended.loaded and contended.steal == 0.08 and contended.round_cpu == 0.3
    text = contended.busy_text()
    assert text.startswith("0 of 32 rounds had their core (0 of 4 process sets usable; the hypervisor took 8% of")
    assert "ran on a CPU for 30% of its time" in text
    assert contended.to_dict()["round_cpu"] == 0.3 and contended.to_dict()["steal"] == 0.08
    gpu = [ProcessTiming(0, [[1.0, 1.0]] * 8, [None] * 8, {"steal": 0.08})] * 4
    on_gpu = analyse(ABRun(["cuda"], gpu))
    assert on_gpu.loaded and on_gpu.round_cpu is None and "ran on a CPU" not in on_gpu.busy_text()
    quiet = analyse(ABRun(["cuda"], [ProcessTiming(0, [[1.0, 1.0]] * 8, [None] * 8, {"steal": 0.01})] * 4))
    assert not quiet.loaded


def test_modes_need_two_processes_each_side_of_a_wide_gap() -> None:
    assert modes([0.015, 0.024, 0.015, 0.025]) is not None
    assert modes([0.015, 0.016, 0.015, 0.0155, 0.0152]) is None        # one mode
    assert modes([0.015, 0.015, 0.015, 0.024]) is None                  # one odd process: no mode
    assert modes([0.015, 0.024]) is None                                # too few to tell


def _record(torch: str, median: float, **lat) -> Record:
    return Record.for_cell(f"r{torch}", KEY, torch, "env", Status.PASS,
                           latency_ms={"median": median, "ci_low": median * 0.99, "ci_high": median * 1.01,
                                       "samples": [median] * 5, "threads": 1, **lat})


@pytest.mark.parametrize("base, cand, extra, chosen", [
    (0.0165, 0.0201, {}, True),                        # ×1.22: the first look
    (0.0100, 0.0102, {}, False),                       # within √1.1 either way: nothing to time
    (0.0100, 0.0080, {}, True),                        # faster: timed too
    (0.0100, 0.0100, {"loaded": True}, True),          # a loaded figure is no evidence either way
    (0.0100, 0.0102, {"bimodal": True}, True),         # split into modes, and not lower
])
def test_which_stored_cells_are_timed_again(base, cand, extra, chosen) -> None:
    cell = compare_cell(KEY, _record("a", base), _record("b", cand, **extra), Settings(), True)
    assert suspect(cell, Settings().latency_threshold) is chosen


def test_cannot_tell_is_compared_but_never_blocks_and_alone_exits_2() -> None:
    told = CellComparison(KEY, Verdict.UNCHANGED, _record("a", 1), _record("b", 1))
    unknown = CellComparison(KEY, Verdict.SLOWER, _record("a", 1), _record("b", 1.5),
                             latency=LatencyChange(1, 1.5, 1.5, None, True, False))
    cannot_tell(unknown, "the machine was busy")
    assert unknown.verdict is Verdict.CANNOT_TELL and not unknown.verdict.blocking
    assert not unknown.latency.slower and "first look ×1.50" in unknown.detail
    both = Coverage.of([told, unknown])
    assert both.compared == 2 and both.latency_unknown == 1 and both.problem(1.0) is None
    assert "the latency of 1 cannot be told" in both.summary()
    assert "no cell was compared in full" in Coverage.of([unknown]).problem(1.0)


def _slower_cell() -> CellComparison:
    from harness.gate.stats import Interleaved, RatioInterval

    base, cand = _record("2.9.1", 0.0165), _record("2.13.0", 0.0201)
    cell = CellComparison(KEY, Verdict.SLOWER, base, cand, remeasured=True,
                          latency=LatencyChange(0.0107, 0.0139, 1.30, None, True, False, method="interleaved",
                                                ratio_interval=(1.26, 1.34)))
    cell.interleaved = Interleaved(RatioInterval(1.30, 1.26, 1.34, 4, 0.95), RatioInterval(1.30, 1.26, 1.34, 4, 0.95),
                                   stacks=("openvino 2026.4.1",), sets=4, usable=4, rounds=80, clean=78)
    cell.attribution, why = attribute(cell, cell.interleaved, base, cand, threshold=Settings().latency_threshold)
    cell.detail = f"{cell.interleaved.main.text()}; {why}"
    return cell


@pytest.mark.parametrize("file, stack, named", [
    ((1.38, 1.34, 1.42), (1.02, 1.004, 1.035), "file"),     # two processes of one runtime: 2 % apart
    ((1.38, 1.34, 1.42), (0.98, 0.964, 0.999), "file"),
    ((1.01, 0.99, 1.03), (1.30, 1.26, 1.34), "stack"),
    ((1.20, 1.15, 1.25), (1.12, 1.08, 1.16), "both"),
    ((1.06, 1.03, 1.09), (1.06, 1.03, 1.09), "neither"),     # each shown above 1, neither above √1.1
])
def test_a_part_is_named_slower_only_above_the_square_root_of_the_threshold(file, stack, named) -> None:
    from harness.gate.stats import Interleaved, RatioInterval

    def interval(r: tuple[float, float, float]) -> RatioInterval:
        return RatioInterval(*r, 6, 0.95)

    main = interval((file[0] * stack[0], file[1] * stack[1], file[2] * stack[2]))
    iv = Interleaved(main, interval(file), interval(stack), stacks=("onnxruntime 1.31.0", "onnxruntime 1.32.0"),
                     sets=6, usable=6, rounds=120, clean=120)
    cell = CellComparison(KEY, Verdict.SLOWER, _record("a", 1), _record("b", 1.4))
    attribution, why = attribute(cell, iv, None, None, threshold=1.1)
    assert attribution == named, why
    assert ("the file is slower" in why) is (named == "file")
    assert ("the runtime stack is slower" in why) is (named == "stack")
    assert ("onnxruntime 1.31.0 → onnxruntime 1.32.0" in why) is (named != "file")


def test_the_reports_carry_the_interval_and_the_attribution() -> None:
    cell = _slower_cell()
    side_a, side_b = Side("2.9.1", "2.9.1", [cell.base]), Side("2.13.0", "2.13.0", [cell.cand])
    md = render_markdown(side_a, side_b, [cell], Settings(), remeasure=4)
    row = next(line for line in md.splitlines() if line.startswith("| + |"))
    assert "1.30 (1.26–1.34)" in row and "the file is slower, in the same runtime stack (openvino 2026.4.1)" in row
    assert "whole 95% interval of the paired ratio lies above 1.1" in md
    data = json.loads(render_json(side_a, side_b, [cell], Settings(), 1, {}, remeasure=4))
    out = data["cells"][0]
    assert out["attribution"] == "file" and out["latency"]["ratio_interval"] == [1.26, 1.34]
    assert out["interleaved"]["ratio"] == {"ratio": 1.3, "low": 1.26, "high": 1.34, "processes": 4, "confidence": 0.95}
    assert data["settings"]["confidence"] == 0.95 and data["settings"]["remeasure"] == 4
    junit = ET.fromstring(render_junit(side_a, side_b, [cell]))
    failure = junit.find("testcase/failure")
    assert failure is not None and "the file is slower" in failure.get("message")


def test_a_file_that_cannot_be_made_again_leaves_the_latency_untold(tmp_path) -> None:
    from types import SimpleNamespace

    from harness.core.env import EnvSpec
    from harness.gate.retime import Exported, decide
    from harness.run.ab import ABSettings, TimedFile

    cell = compare_cell(KEY, _record("a", 0.010), _record("b", 0.015), Settings(), True)
    assert cell.verdict is Verdict.SLOWER
    broken = Record.for_cell("r", KEY, "b", "env", Status.FAIL, stage="export", error="ConversionError: boom")
    cand = Exported(broken, TimedFile(tmp_path), EnvSpec("e", "2.13.0", "3.11", "cpu", [], []), "ort-cpu")
    req = SimpleNamespace(provider="venv", settings=Settings())
    decide(cell, None, cand, None, req, ABSettings(), {"baseline": "EnvironmentFailure: torch 9.9 is not on the index"})
    assert cell.verdict is Verdict.CANNOT_TELL and not cell.verdict.blocking
    assert "the baseline's file could not be made again (EnvironmentFailure: torch 9.9" in cell.detail
    cell.verdict = Verdict.SLOWER
    base = Exported(_record("a", 0.01), TimedFile(tmp_path), EnvSpec("e", "2.9.1", "3.11", "cpu", [], []), "ort-cpu")
    decide(cell, base, cand, None, req, ABSettings())
    assert "the baseline's file could not be made again (its exported file was not kept)" in cell.detail
    (tmp_path / "spool.json").write_text("{}")
    decide(cell, base, cand, None, req, ABSettings())
    assert "the candidate's file could not be made again (fail at export: ConversionError: boom)" in cell.detail
