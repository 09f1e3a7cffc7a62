"""The binding overhead (harness/runtimes/binding_overhead.py, latency.binding_overhead) and what a
real worker job records with the adaptive protocol: interval, stop reason, binding overhead (stored
as ``floor_ms``), a bounded sample; the report shows a sub-0.1 ms latency against its overhead."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Record
from harness.core.status import Status
from harness.runtimes.base import RuntimeAdapter
from harness.runtimes.binding_overhead import identity_call, write_identity_model
from harness.worker import latency

RUNTIMES = [name for name, module in (("ort-cpu", "onnxruntime"), ("openvino", "openvino"))
            if importlib.util.find_spec(module)]
QUICK = LatencyProtocol(warmup_max_s=0.05, min_runs=50, min_time_s=0.0, max_time_s=2.0)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_identity_model_runs_in_each_runtime_and_gives_its_input_back(runtime, tmp_path):
    from harness.runtimes import load_adapter

    adapter_cls = load_adapter(runtime)
    with adapter_cls(write_identity_model(tmp_path / "id.onnx"), threads=1) as adapter:
        x = np.array([3.25], dtype=np.float32)
        np.testing.assert_array_equal(adapter.infer({"x": x})[0], x)
    with identity_call(adapter_cls, 1) as call:
        call()


class Unloadable(RuntimeAdapter):
    name = "unloadable"

    def activate_impl(self) -> None:
        raise RuntimeError("no such device")

    def infer_impl(self, feeds):
        return []

    def input_names_impl(self):
        return []


def test_a_runtime_whose_overhead_cannot_be_measured_gets_none_not_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(latency, "_OVERHEADS", {})
    assert latency.binding_overhead(Unloadable, QUICK, 1) is None
    assert "binding overhead of unloadable not measured" in capsys.readouterr().out


def test_overhead_is_measured_once_per_runtime_and_thread_count(monkeypatch):
    monkeypatch.setattr(latency, "_OVERHEADS", {})
    calls = []

    class Counting(Unloadable):
        name = "counting"

        def activate_impl(self) -> None:
            calls.append(self.threads)

    assert latency.binding_overhead(Counting, QUICK, 1) > 0
    latency.binding_overhead(Counting, QUICK, 1)
    latency.binding_overhead(Counting, QUICK, 2)
    assert calls == [1, 2]


def run_linear_job(tmp_path, **job) -> list[Record]:
    """A real worker job: a 4 → 3 linear layer exported with TorchScript, run and timed in every
    installed runtime; its records."""
    from harness.worker.main import run_job

    case = tmp_path / "cases.py"
    case.write_text("import torch\n"
                    "def lin():\n"
                    "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),)\n")
    cells = tuple(CellJob(f"c-{r}", r, r) for r in RUNTIMES)
    group = ExportGroup("g1", "lin", f"{case}:lin", "torchscript", 17, cells=cells)
    events: list[dict] = []
    run_job(Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,),
                base_dir=str(tmp_path), **job), events.append)
    records = [Record.from_dict(e["record"]) for e in events if e["event"] == "record"]
    assert [r.status for r in records] == [Status.PASS] * len(RUNTIMES)
    return records


@pytest.mark.skipif(not RUNTIMES, reason="neither onnxruntime nor openvino is installed")
def test_a_worker_job_records_interval_stop_overhead_and_a_bounded_sample(tmp_path, monkeypatch):
    from harness.report.markdown import render_markdown

    monkeypatch.setattr(latency, "_OVERHEADS", {})
    records = run_linear_job(tmp_path, latency=LatencyProtocol(min_runs=200, min_time_s=0.05))
    for rec in records:
        lat = rec.latency_ms
        assert lat.ci_low <= lat.median <= lat.ci_high and lat.confidence == 0.95
        assert lat.stop in ("converged", "time_cap") and lat.iterations >= 200
        assert lat.warmup_iterations >= 10 and lat.warmup_stable is not None
        assert lat.binding_overhead_ms is not None and 0 < lat.binding_overhead_ms
        assert rec.to_dict()["latency_ms"]["floor_ms"] == lat.binding_overhead_ms   # schema v1's key
        assert len(lat.samples) == min(lat.iterations, 1000)
        assert len(json.dumps(rec.to_dict())) < 50_000
    # A linear layer of 4 → 3 runs in microseconds: the matrix shows it against its binding overhead.
    md = render_markdown(records)
    for rec in records:
        assert f"{rec.latency_ms.median:.3g} ms (floor {rec.latency_ms.binding_overhead_ms:.2g})" in md
    assert "identity model" in md


@pytest.mark.skipif(not RUNTIMES, reason="neither onnxruntime nor openvino is installed")
def test_a_confirming_job_times_without_measuring_the_overhead(tmp_path, monkeypatch):
    """The latency phase's confirming workers (``floor=False``) give only their medians: the
    identity model is never timed there, and their records carry no overhead."""
    monkeypatch.setattr(latency, "_OVERHEADS", {})
    records = run_linear_job(tmp_path, latency=QUICK, floor=False)
    assert all(r.latency_ms.median > 0 and r.latency_ms.binding_overhead_ms is None for r in records)
    assert latency._OVERHEADS == {}


def test_the_identity_model_is_kept_once_and_the_overhead_reads_it_from_there(tmp_path, monkeypatch):
    """The verdict phase keeps the identity model in the run's spool (``keep_identity_model``);
    the latency worker's overhead loads that file rather than writing one of its own."""
    from harness.runtimes.binding_overhead import keep_identity_model

    kept = tmp_path / "spool" / "identity.onnx"
    kept.parent.mkdir()
    keep_identity_model(kept)
    assert kept.read_bytes() == write_identity_model(tmp_path / "fresh.onnx").read_bytes()
    inode = kept.stat().st_ino
    keep_identity_model(kept)                         # there already: left as it is
    assert kept.stat().st_ino == inode and sorted(p.name for p in kept.parent.iterdir()) == ["identity.onnx"]

    loaded = []

    class Recording(Unloadable):
        name = "recording"

        def activate_impl(self) -> None:
            loaded.append(self.model_path)

    monkeypatch.setattr(latency, "_OVERHEADS", {})
    assert latency.binding_overhead(Recording, QUICK, 1, kept) > 0
    monkeypatch.setattr(latency, "_OVERHEADS", {})
    assert latency.binding_overhead(Recording, QUICK, 1, tmp_path / "missing.onnx") > 0
    assert loaded[0] == kept and loaded[1] != kept and loaded[1].name == "identity.onnx"


@pytest.mark.skipif(not RUNTIMES, reason="neither onnxruntime nor openvino is installed")
def test_a_latency_worker_given_the_kept_model_does_not_import_onnx(tmp_path):
    """What the kept model saves: a latency worker imports onnx (about a second) only to write one."""
    import subprocess
    import sys

    from harness.runtimes.binding_overhead import keep_identity_model

    keep_identity_model(tmp_path / "identity.onnx")
    script = ("import sys\n"
              "from pathlib import Path\n"
              "from harness.core.job import LatencyProtocol\n"
              "from harness.runtimes import load_adapter\n"
              "from harness.worker.latency import binding_overhead\n"
              "quick = LatencyProtocol(warmup_max_s=0.05, min_runs=50, min_time_s=0.0, max_time_s=2.0)\n"
              f"for name in {RUNTIMES!r}:\n"
              "    assert binding_overhead(load_adapter(name), quick, 1, Path(sys.argv[1])) > 0\n"
              "print('onnx' in sys.modules)\n")
    for model, imported, where in ((tmp_path / "identity.onnx", "False", str(tmp_path / "identity.onnx")),
                                   (tmp_path / "missing.onnx", "True", "one written here")):
        out = subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True, text=True, check=True)
        *log, last = out.stdout.strip().splitlines()
        assert last == imported, out.stderr
        assert len(log) == len(RUNTIMES) and all(line.endswith(f"(identity model: {where})") for line in log), log
