"""The gate's latency verdict under noise: real files timed interleaved in real ONNX Runtime (and
OpenVINO) processes, through the gate's own comparison (``retime.timed``), under a synthetic CPU
load of one spinning process (a core's worth of other work) the whole time.

- two byte-different files of the same graph (the producer string differs, as between two torch
  releases that export the same nodes): never "slower" in 20 comparisons, nor one file against
  itself in 5;
- a file with three more MatMul layers (about 1.3x the work): "slower" every time, with "the file
  is slower" as its attribution;
- one file in two runtime stacks, one of which is slower on it: "the runtime stack is slower".

Each comparison is what the gate does for one cell (at least ``MIN_SETS`` fresh process sets,
more until the interval is decisive); the processes run the test's own interpreter (numpy, onnx,
onnxruntime and openvino, as ``nox -s tests`` installs them).

End to end (``e2e``) and alone (``timing``: ``nox -s tests`` runs these after the parallel run, as
they need the core the busy process leaves free): 35 comparisons of real processes timed for real, about 70 s alone on two
cores and far more on a loaded machine; what they judge is a timing, so no cheaper stand-in would
assert the same. The gate's logic on given timings is unit-tested in ``test_stats.py`` and ``test_retime.py``.
"""
from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.core.status import Status
from harness.envs.provider import harness_process_env
from harness.gate.compare import CellComparison, Settings, Verdict
from harness.gate.retime import timed
from harness.run.ab import ABSettings, Stack, TimedFile
from harness.worker.bench_latency import ab_models
from harness.worker.spool import write_spool

RUNS = 20          # comparisons of byte-different equal files (the bar)
SAME_RUNS = 5      # comparisons of a file with itself
SLOW_RUNS = 8      # comparisons of the slower file
MIN_SETS = 2       # the gate's least (--remeasure 2); decisive intervals end a comparison early
BUSY_TRIES = 3     # a comparison with no clean round is taken again, at most this many times in all
KEY = CellKey("mlp", "dynamo", 18, "ort-cpu")

pytestmark = [pytest.mark.e2e, pytest.mark.timing]


def stack(runtime: str, label: str | None = None) -> Stack:
    env = harness_process_env(1)
    env.pop("VIRTUAL_ENV", None)
    return Stack(label or runtime, sys.executable, runtime, env)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, TimedFile]:
    folder = tmp_path_factory.mktemp("ab")
    spools = {name: TimedFile(Path(p)) for name, p in ab_models(folder).items()}
    assert (Path(spools["base"].spool) / "model.onnx").read_bytes() != (Path(spools["twin"].spool) / "model.onnx").read_bytes()
    return spools


@pytest.fixture(scope="module")
def busy_core():
    """A process spinning for the whole module: a core's worth of other work, where the kernel
    puts it. Pinned to one core, it made a timing process woken on that core share it for most
    of a few-millisecond round before the kernel moved one of them (median round share 0.52 to
    0.72 against 0.98 unpinned, on two cores), which no other work on a real machine does."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _record(torch: str) -> Record:
    return Record.for_cell(f"r{torch}", KEY, torch, "env", Status.PASS, latency_ms={"median": 0.1, "threads": 1})


def compare(files: list[TimedFile], stacks: list[Stack]) -> CellComparison:
    """One gate comparison of a cell whose stored figures flagged it slower. One the machine was
    too busy to time (no clean round: steal from the hypervisor, or a contended core, as
    ``busy_text`` says) is taken again, up to ``BUSY_TRIES`` times: a busy spell on a shared
    machine passes (CI once had a minute in which 0 of 480 rounds of two comparisons were clean,
    before and after which every comparison was told)."""
    for _ in range(BUSY_TRIES):
        cell = CellComparison(KEY, Verdict.SLOWER, _record("a"), _record("b"), "first look")
        timed(cell, files, stacks, (cell.base, cell.cand), Settings(), ABSettings(min_processes=MIN_SETS))
        if not cell.interleaved.loaded:
            break
    return cell


def told(files: list[TimedFile], stacks: list[Stack]) -> CellComparison:
    """A comparison whose verdict the test needs: where the machine stayed too busy to time it
    ``BUSY_TRIES`` times over, the test says so and skips (a "cannot tell" is the gate's right
    answer then, not a finding about the gate). ``test_equal_files_are_never_slower_under_load``
    fails if most comparisons on this machine cannot be told, so a gate that never tells is caught."""
    cell = compare(files, stacks)
    if cell.interleaved.loaded:
        pytest.skip(f"the machine was too busy to time, {BUSY_TRIES} times over: {cell.detail}")
    return cell


def test_equal_files_are_never_slower_under_load(files, busy_core) -> None:
    twins = [compare([files["base"], files["twin"]], [stack("ort-cpu")]) for _ in range(RUNS)]
    same = [compare([files["base"], files["base"]], [stack("ort-cpu")]) for _ in range(SAME_RUNS)]
    verdicts = [c.verdict for c in twins + same]
    assert Verdict.SLOWER not in verdicts and Verdict.FASTER not in verdicts, [c.detail for c in twins + same]
    # Not a gate that says nothing: the busy core leaves the other free, and the comparisons decide.
    decided = [c for c in twins + same if c.verdict is Verdict.UNCHANGED]
    assert len(decided) >= 0.8 * len(verdicts), [c.detail for c in twins + same]
    # Each told ratio inside the threshold, and no lean: the median of them within ±5 % of 1. (One
    # comparison of 25 beside a spinning core on a VM that loses CPU time to its host came out
    # beyond ±5 % on CI and was still, rightly, "unchanged".)
    threshold = Settings().latency_threshold
    ratios = sorted(round(c.interleaved.main.ratio, 3) for c in decided)
    assert all(1 / threshold < r < threshold for r in ratios), ratios
    assert 0.95 < statistics.median(ratios) < 1.05, ratios
    assert all(c.detail.startswith("not reproducible: first look") or "within the 1.1 threshold" in c.detail
               for c in decided)


def test_a_file_doing_more_work_is_slower_every_time(files, busy_core) -> None:
    cells = [told([files["base"], files["slow"]], [stack("ort-cpu")]) for _ in range(SLOW_RUNS)]
    assert [c.verdict for c in cells] == [Verdict.SLOWER] * SLOW_RUNS, [c.detail for c in cells]
    for c in cells:
        assert c.interleaved.main.low > Settings().latency_threshold
        assert 1.15 < c.interleaved.main.ratio < 1.45
        assert c.attribution == "file" and "the file is slower, in the same runtime stack (ort-cpu)" in c.detail
        assert c.latency.method == "interleaved" and c.latency.ratio_interval[0] > 1.1


def test_in_two_stacks_the_file_is_named(files, busy_core) -> None:
    """Two processes of one runtime under two labels: each stack loads both files, rounds
    alternate; the file carries the slowdown, the stack none that counts (two processes of one
    runtime differ by a percent or two, which six process pairs can resolve)."""
    cell = told([files["base"], files["slow"]], [stack("ort-cpu", "stack A"), stack("ort-cpu", "stack B")])
    assert cell.verdict is Verdict.SLOWER, cell.detail
    iv = cell.interleaved
    assert iv.sets >= 6 and iv.stacks == ("stack A", "stack B")
    threshold = Settings().latency_threshold
    assert iv.file.low > threshold and iv.stack.low < math.sqrt(threshold)
    # Quiet, the stacks' ratio is within 2 % of 1; with three more spinning processes on the two
    # cores it came out ×1.08 (0.93 to 1.24, 4 usable sets): within the threshold, never named.
    assert 1 / threshold < iv.stack.ratio < threshold, iv.stack
    assert cell.attribution == "file" and "the file is slower" in cell.detail and "in either runtime stack" in cell.detail


def test_a_slower_runtime_stack_is_named(tmp_path, busy_core) -> None:
    """One small model (byte-different copies) in ONNX Runtime, then in OpenVINO, whose TopK over
    4,096 values costs about 2.5 times ONNX Runtime's through the harness's call path (×2.5 to ×2.9
    in four comparisons on an Intel Xeon, lowest bound 1.8): the stack is slower, not the file. A
    16-value MatMul, dominated by each binding's call overhead, came out ×1.2 to ×1.7 with
    intervals reaching below 1: too close to the bar to say anything of the gate."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    graph = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["values", "indices"])], "topk",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
                              [helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 5])], [k])
    feed = {"x": np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)}
    spools = []
    for name in ("base", "twin"):
        folder = tmp_path / name
        folder.mkdir()
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=f"torch {name}")
        model.ir_version = 8
        onnx.save(model, str(folder / "model.onnx"))
        write_spool(folder, "model.onnx", feed)
        spools.append(TimedFile(folder))
    cell = told(spools, [stack("ort-cpu", "onnxruntime"), stack("openvino", "openvino")])
    assert cell.verdict is Verdict.SLOWER, cell.detail
    assert cell.attribution == "stack", cell.detail
    assert "the runtime stack is slower" in cell.detail and "(onnxruntime → openvino)" in cell.detail
    assert cell.interleaved.stack.low > 1.5, cell.detail
    assert 0.9 < cell.interleaved.file.ratio < 1.1 and cell.interleaved.file.low < math.sqrt(Settings().latency_threshold)


def test_the_gates_ratio_is_the_one_timed_by_hand(files) -> None:
    """The slower file's ratio as the gate measures it, and as a plain onnxruntime loop that
    alternates the two files in fresh processes measures it (tests/direct_interleaved.py), by hand
    just before and just after the gate: a shared machine drifts by several per cent within
    minutes, so the gate's ratio must fall within what the hand-timed processes spanned around
    it, widened by 10 %: the two time differently (the gate in blocks of calls, the loop call by
    call), and on an AMD EPYC (AVX2) the gate's ratio came out 5 to 8 % above the loop's in every
    run (1.35 and 1.38 against 1.27 to 1.31), where on the machines before they agreed within 5 %."""
    import json

    from helpers import TESTS

    base, slow = (Path(files[k].spool) / "model.onnx" for k in ("base", "slow"))

    def by_hand() -> list[float]:
        out = subprocess.run([sys.executable, str(TESTS / "direct_interleaved.py"), str(base), str(slow)],
                             capture_output=True, text=True, check=True)
        return [b / a for a, b in json.loads(out.stdout.strip().splitlines()[-1])["processes"]]

    before = by_hand()
    cell = told([files["base"], files["slow"]], [stack("ort-cpu")])
    direct = before + by_hand()
    assert min(direct) / 1.1 <= cell.interleaved.main.ratio <= max(direct) * 1.1, (cell.detail, direct)
    # Not a bound so wide it says nothing: the hand-timed processes agree among themselves.
    assert max(direct) / min(direct) < 1.25, direct
