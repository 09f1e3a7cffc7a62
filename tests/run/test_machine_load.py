"""Latency on a loaded machine: the robust spread, the load probe, and the gate's refusal.

On a quiet machine single slow calls inflate the CV of every timing while the median's interval
stays within ±1 %; under load the interval stays narrow around a median many times too high.
"unstable" follows the robust spread and the interval, and "loaded" is measured while timing.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from harness.core import proctree
from harness.core.cell import CellKey
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.gate.compare import Settings, Verdict, compare_cell
from harness.worker.latency import robust_spread, summarize
from harness.worker.machine_load import LoadProbe, descendants, machine_counters, own_cpu_s

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc (Linux)")


def test_single_call_outliers_inflate_the_cv_but_leave_the_timing_stable():
    rng = random.Random(7)
    samples = [0.195 * (1 + rng.gauss(0, 0.01)) for _ in range(2000)]
    samples[::50] = [0.195 * 40] * len(samples[::50])       # 2 % of calls preempted
    lat = summarize(samples, threads=1, unstable_spread=0.05, rel_ci=0.01)
    assert lat.cv > 0.5                  # what the old rule (cv > 5 %) flagged
    assert lat.spread < 0.02 and lat.unstable is False
    assert lat.ci_high / lat.median - 1 < 0.01


def test_a_wide_spread_or_a_wide_interval_is_unstable():
    rng = random.Random(8)
    bimodal = [rng.choice((1.0, 1.5)) * (1 + rng.gauss(0, 0.005)) for _ in range(2000)]
    assert robust_spread(sorted(bimodal)) > 0.2
    assert summarize(bimodal, unstable_spread=0.05).unstable is True
    few = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97, 1.0]      # tight, but 9 calls: a ±3 % interval
    assert summarize(few, unstable_spread=0.05).unstable is False
    assert summarize(few, unstable_spread=0.05, rel_ci=0.01).unstable is True


@linux
def test_the_probe_counts_a_busy_child_as_its_own_and_an_orphan_as_another_process():
    burn = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"
    before = own_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", burn.format(s=0.6) + "time.sleep(30)"])
    try:
        time.sleep(0.3)
        deadline = time.time() + 20
        while own_cpu_s() - before < 0.55 and time.time() < deadline:
            time.sleep(0.1)
        assert own_cpu_s() - before >= 0.55          # a live child's CPU is the cell's own
    finally:
        child.kill()
        child.wait()
    cpus = machine_counters()[2]
    # Orphans (reparented away from this process) burning every CPU: other processes' load.
    started = subprocess.run(["sh", "-c", " ".join(f"{sys.executable} -c '{burn.format(s=1.5)}' >/dev/null 2>&1 & echo $!;"
                                                   for _ in range(cpus))], check=True, capture_output=True, text=True)
    try:
        probe = LoadProbe.start()
        time.sleep(1.0)
        load = probe.result()
    finally:   # the orphans end here: a process a test made subreaper would otherwise inherit them running
        for pid in map(int, started.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    assert load["loaded"] is True and load["other_cpu"] > 0.5, load
    assert load["cpus"] == cpus and load["cpu_share"] < 0.2 and load["window_s"] >= 1.0


@linux
def test_descendants_are_found_through_every_generation_as_a_scan_of_proc_finds_them(monkeypatch):
    """The children files (one per thread) find a grandchild as a scan of /proc does; where the
    kernel has no such files the scan answers alone."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']);"
            " print('up', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        found = descendants(os.getpid())
        assert child.pid in found and len(found) == 2, found
        with monkeypatch.context() as m:
            m.setattr(proctree, "children_files", lambda pid: None)
            assert sorted(descendants(os.getpid())) == sorted(found)
    finally:
        grandchildren = [p for p in descendants(child.pid)]
        child.kill()
        child.wait()
        for pid in grandchildren:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _timed(torch: str, median: float, loaded: bool | None) -> Record:
    lat = Latency(median=median, ci_low=median * 0.995, ci_high=median * 1.005, threads=1,
                  samples=[median] * 5, loaded=loaded,
                  load={"other_cpu": 0.9, "steal": 0.0} if loaded else {})
    return Record.for_cell("r", CellKey("conv_bn", "dynamo", 18, "ort-cpu"), torch, "env", Status.PASS,
                           latency_ms=lat)


def test_the_gate_never_calls_a_loaded_figure_slower():
    key = CellKey("conv_bn", "dynamo", 18, "ort-cpu")
    quiet = compare_cell(key, _timed("2.13.0", 0.195, False), _timed("2.9.1", 3.55, False), Settings(), True)
    assert quiet.verdict is Verdict.SLOWER
    loaded = compare_cell(key, _timed("2.13.0", 0.195, False), _timed("2.9.1", 3.55, True), Settings(), True)
    assert loaded.verdict is Verdict.UNCHANGED and loaded.latency.loaded == ("candidate",)
    assert any("loaded machine on the candidate" in n and "×18.21" in n for n in loaded.notes), loaded.notes
    faster = compare_cell(key, _timed("2.13.0", 3.55, True), _timed("2.9.1", 0.195, False), Settings(), True)
    assert faster.verdict is Verdict.UNCHANGED and faster.latency.loaded == ("baseline",)
    from harness.gate.output import render_markdown
    from harness.gate.sources import Side

    base, cand = Side("2.13.0", "2.13.0", [loaded.base]), Side("2.9.1", "2.9.1", [loaded.cand])
    text = render_markdown(base, cand, [quiet, loaded], Settings())
    assert "Latency not compared for 1 cell(s)**: timed on a loaded machine on the candidate" in text


def test_a_loaded_latency_round_trips_and_old_records_have_no_flag():
    rec = _timed("2.13.0", 1.0, True)
    back = Record.from_dict(rec.to_dict())
    assert back.latency_ms.loaded is True and back.latency_ms.load["other_cpu"] == 0.9
    old = Latency.from_dict({"median": 1.0})
    assert old.loaded is None and "load" not in old.to_dict() and "loaded" not in old.to_dict()


def test_every_timed_cell_of_a_real_run_records_its_load_and_the_report_marks_loaded_ones(e2e_run, e2e_records):
    timed = [r for r in e2e_records if r.latency_ms.median is not None]
    assert timed
    for rec in timed:
        lat = rec.latency_ms
        assert isinstance(lat.loaded, bool) and 0 <= lat.load["other_cpu"] <= 1.5 and lat.load["window_s"] > 0
        assert lat.spread is not None and lat.unstable == (lat.spread > 0.05 or lat.ci_high - lat.median > 0.01 * lat.median
                                                           or lat.median - lat.ci_low > 0.01 * lat.median)
    loaded = [r for r in timed if r.latency_ms.loaded]
    md = (e2e_run / "matrix.md").read_text()
    html = (e2e_run / "matrix.html").read_text()
    if loaded:
        assert f"{len(loaded)} of {len(timed)} latencies were measured on a loaded machine" in md
        assert f"{len(loaded)} of {len(timed)} latencies were measured on a loaded machine" in html
        assert md.split("## Matrix", 1)[1].split("\n## ", 1)[0].count("†") == len(loaded)   # one mark per figure
    else:
        assert "latencies were measured on a loaded machine" not in md and "ms †" not in md
