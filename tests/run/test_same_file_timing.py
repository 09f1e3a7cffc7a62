"""One timing per file in a latency worker (``harness.worker.stages.SameFileTimings``): cells whose
spooled file, feeds, runtime and runtime options are the same get one timing, marked
``same_file_as``; anything that differs is timed on its own. Real spools, a real latency job, real
runtimes."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from harness.core.job import PHASE_LATENCY, SPOOL_DIR, CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Latency, Record
from harness.core.status import Status
from harness.worker import stages
from harness.worker.spool import write_spool

RUNTIMES = [name for name, module in (("ort-cpu", "onnxruntime"), ("openvino", "openvino"))
            if importlib.util.find_spec(module)]
QUICK = LatencyProtocol(warmup_max_s=0.05, min_runs=50, min_time_s=0.0, max_time_s=1.0, confirm=False)

pytestmark = pytest.mark.skipif(not RUNTIMES, reason="neither onnxruntime nor openvino is installed")


def linear(path: Path, producer: str = "torch") -> None:
    from onnx import TensorProto, helper, numpy_helper, save

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8) / 64, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=producer)
    model.ir_version = 8
    save(model, str(path))


def spool(run_dir: Path, gid: str, feeds: dict, producer: str = "torch") -> None:
    folder = run_dir / SPOOL_DIR / gid
    folder.mkdir(parents=True)
    linear(folder / "model.onnx", producer)
    write_spool(folder, "model.onnx", feeds, torch="2.13.0")


def latency_job(tmp_path: Path, groups: dict[str, list[str]], protocol: LatencyProtocol = QUICK) -> dict[str, Record]:
    """Run a latency job over spooled groups (gid → runtimes); records by cell id."""
    from harness.worker.main import run_job

    run_dir = tmp_path / "run"
    job_groups = tuple(ExportGroup(gid, "lin", "cases.py:lin", "dynamo", 18,
                                   cells=tuple(CellJob(f"{gid}-{r}", r, r) for r in runtimes))
                       for gid, runtimes in groups.items())
    events: list[dict] = []
    run_job(Job(run_id="r", run_dir=str(run_dir), env="env", groups=job_groups, base_dir=str(tmp_path),
                phase=PHASE_LATENCY, latency=protocol), events.append)
    return {r.cell_id: r for r in (Record.from_dict(e["record"]) for e in events if e["event"] == "record")}


def test_the_same_file_is_timed_once_per_runtime_and_anything_different_on_its_own(tmp_path):
    run_dir = tmp_path / "run"
    x = {"x": np.ones((2, 8), np.float32)}
    spool(run_dir, "op13", x)
    spool(run_dir, "op18", x)                                   # the same bytes, the same feeds
    spool(run_dir, "other_feeds", {"x": np.full((2, 8), 2, np.float32)})
    spool(run_dir, "other_file", x, producer="torch 2")       # one byte of metadata apart
    assert (run_dir / SPOOL_DIR / "op13" / "model.onnx").read_bytes() == \
        (run_dir / SPOOL_DIR / "op18" / "model.onnx").read_bytes()
    recs = latency_job(tmp_path, {g: RUNTIMES for g in ("op13", "op18", "other_feeds", "other_file")})

    assert all(r.status is Status.PASS and r.latency_ms.median for r in recs.values()), recs
    for runtime in RUNTIMES:
        first, same = recs[f"op13-{runtime}"].latency_ms, recs[f"op18-{runtime}"].latency_ms
        assert first.same_file_as is None and same.same_file_as == f"op13-{runtime}"
        assert (same.median, same.samples, same.iterations) == (first.median, first.samples, first.iterations)
        for gid in ("other_feeds", "other_file"):
            own = recs[f"{gid}-{runtime}"].latency_ms
            assert own.same_file_as is None and own.samples != first.samples, gid
    if len(RUNTIMES) == 2:   # one file, two runtimes: two timings
        assert recs["op13-openvino"].latency_ms.same_file_as is None
        assert recs["op13-openvino"].latency_ms.samples != recs["op13-ort-cpu"].latency_ms.samples
    # The record says so, and the stored form keeps it.
    stored = Record.from_dict(recs[f"op18-{RUNTIMES[0]}"].to_dict())
    assert stored.latency_ms.same_file_as == f"op13-{RUNTIMES[0]}"


def test_a_failed_timing_is_not_shared_and_a_loaded_one_stays_marked(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    x = {"x": np.ones((2, 8), np.float32)}
    for gid in ("a", "b", "c", "d"):
        spool(run_dir, gid, x)
    timed: list[str] = []
    real = stages.time_cell

    def first_fails_then_loaded(job, group, cell, spooled):
        rec = real(job, group, cell, spooled)
        if not timed:
            rec.status, rec.stage, rec.error, rec.latency_ms = Status.FAIL, "latency", "RuntimeError: once", Latency()
        else:
            rec.latency_ms.loaded = True
        timed.append(cell.cell_id)
        return rec

    monkeypatch.setattr(stages, "time_cell", first_fails_then_loaded)
    runtime = RUNTIMES[0]
    recs = latency_job(tmp_path, {gid: [runtime] for gid in ("a", "b", "c", "d")})
    # a failed: b timed on its own (and taken on a busy machine); c and d share b's timing.
    assert timed == [f"a-{runtime}", f"b-{runtime}"]
    assert recs[f"a-{runtime}"].status is Status.FAIL
    assert [recs[f"{g}-{runtime}"].latency_ms.same_file_as for g in "bcd"] == [None, f"b-{runtime}", f"b-{runtime}"]
    assert all(recs[f"{g}-{runtime}"].latency_ms.loaded for g in "bcd")
    assert all("latency" in recs[f"{g}-{runtime}"].duration_s for g in "bcd")
