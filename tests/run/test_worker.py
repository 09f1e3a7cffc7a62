"""The worker in-process: its helpers, and one real job from Job to Record events."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from harness.core.cell import CellKey
from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Record
from harness.core.status import Stage, Status
from harness.runtimes.base import match_feeds as _match_feeds
from harness.worker.logcap import cap_file
from harness.worker.main import GroupLogs, run_job
from harness.worker.stages import StageFailure, short_error, stage


def test_stage_turns_exceptions_into_failures_and_times_them():
    durations: dict[str, float] = {}
    with pytest.raises(StageFailure) as info:
        with stage(Stage.CHECK, durations):
            raise ValueError("bad graph")
    assert info.value.stage == "check" and info.value.status is Status.FAIL
    assert isinstance(info.value.exc, ValueError) and durations["check"] >= 0


def test_stage_maps_an_unavailable_runtime_to_skip():
    from harness.runtimes.base import RuntimeUnavailable

    with pytest.raises(StageFailure) as info:
        with stage(Stage.LOAD, {}):
            raise RuntimeUnavailable("no GPU")
    assert info.value.status is Status.SKIP


def test_short_error_names_type_and_first_line():
    try:
        try:
            raise KeyError("inner detail")
        except KeyError as inner:
            raise RuntimeError("wrapper\nsecond line") from inner
    except RuntimeError as exc:
        text = short_error(exc)
    assert text.startswith("RuntimeError: wrapper") and "second line" not in text
    assert "KeyError" in text


def test_match_feeds_by_name_then_by_position():
    a, b = np.zeros(1), np.ones(1)
    assert list(_match_feeds({"x": a, "y": b}, ["y", "x"])) == ["y", "x"]
    assert _match_feeds({"input_0": a}, ["renamed"])["renamed"] is a
    with pytest.raises(ValueError, match="do not match"):
        _match_feeds({"input_0": a}, ["p", "q"])


def test_group_logs_capture_c_level_output_and_cap_the_file(tmp_path):
    log = tmp_path / "log.txt"
    logs = GroupLogs(max_bytes=4096)
    with logs.block("g", log):
        os.write(1, b"from fd 1\n")
        os.write(2, b"from fd 2\n")
    os.write(1, b"after\n")
    text = log.read_text()
    assert "from fd 1" in text and "from fd 2" in text and "after" not in text
    with logs.block("g", log):
        os.write(1, b"".join(b"line %05d\n" % i for i in range(10000)))   # 110 kB
    data = log.read_bytes()
    assert data.startswith(b"from fd 1") and data.endswith(b"line 09999\n")
    assert len(data) < 4096 + 256 and b"bytes cut" in data


def test_cap_file_counts_every_cut(tmp_path):
    log = tmp_path / "log.txt"
    log.write_bytes(b"a" * 10000)
    cap_file(log, 1000)
    with open(log, "ab") as fh:
        fh.write(b"b" * 5000)
    cap_file(log, 1000)
    data = log.read_bytes()
    assert data.startswith(b"a" * 500) and data.endswith(b"b" * 500)
    # 10000 + 5000 bytes written, 1000 kept: 14000 cut in all, said in one notice.
    assert data.count(b"bytes cut") == 1 and b"[... 14000 bytes cut" in data


def test_run_job_emits_one_record_per_cell(tmp_path):
    case = tmp_path / "cases.py"
    case.write_text("import torch\n"
                    "def lin():\n"
                    "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),), {0: {0: 'batch'}}\n"
                    "def broken():\n"
                    "    raise RuntimeError('broken on purpose')\n")
    cells = (CellJob("c-ok", "ort-cpu", "ort-cpu"),)
    groups = (ExportGroup("g1", "lin", f"{case}:lin", "torchscript", 17, cells=cells),
              ExportGroup("g2", "broken", f"{case}:broken", "torchscript", 17,
                          cells=(CellJob("c-bad", "ort-cpu", "ort-cpu"),)))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=groups, base_dir=str(tmp_path),
              latency=LatencyProtocol(min_runs=5, min_time_s=0.0, warmup_runs=1, warmup_s=0.0))
    events: list[dict] = []
    run_job(Job.from_dict(json.loads(job.to_json())), events.append)
    kinds = [e["event"] + (f":{e['stage']}" if e["event"] == "stage" else "") for e in events]
    assert kinds == ["hello", "group_start", "stage:reference", "stage:export", "stage:check",
                     "cell_start", "stage:load", "stage:run", "stage:parity", "stage:latency", "record",
                     "group_start", "stage:reference", "cell_start", "record"]
    ok, bad = (Record.from_dict(e["record"]) for e in events if e["event"] == "record")
    assert ok.status is Status.PASS and ok.key == CellKey("lin", "torchscript", 17, "ort-cpu")
    assert ok.parity.max_abs is not None and len(ok.parity.shapes) == 2 and ok.latency_ms.iterations >= 5
    # wall and CPU seconds: the group's shared stages and the cell's own (latency timing included)
    assert ok.wall_s >= sum(ok.duration_s.values()) - 0.01 and 0 < ok.cpu_s
    assert bad.wall_s >= bad.duration_s["reference"] - 0.01
    assert (bad.status, bad.stage) == (Status.FAIL, "reference") and "broken on purpose" in bad.error
    bundle = tmp_path / "run" / "bundles" / "c-bad"
    assert (bundle / "cell.json").exists() and Job.read(bundle / "cell.json").groups[0].cells[0].cell_id == "c-bad"


def _export_failure() -> BaseException:
    """torch.onnx's shape: a wrapper raised from the real error, which itself was raised while
    torch.export handled an unrelated IndexError (an implicit __context__)."""
    class UserError(Exception):
        pass

    class TorchExportError(RuntimeError):
        pass

    try:
        try:
            try:
                [][0]
            except IndexError:
                raise UserError("Constraints violated (seq)! For more information, run with TORCH_LOGS")
        except UserError as exc:
            raise TorchExportError("Failed to export the model with torch.export. This is step 1/3") from exc
    except TorchExportError as exc:
        return exc


def test_a_parity_failure_keeps_its_numbers_per_shape_and_output(tmp_path):
    case = tmp_path / "cases.py"
    # The exported graph adds 1 where eager adds nothing, from the example shape on.
    case.write_text("import torch\n"
                    "class Off(torch.nn.Module):\n"
                    "    def forward(self, x):\n"
                    "        return x * 2, x + (1.0 if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() else 0.0)\n"
                    "def off():\n"
                    "    return Off(), (torch.zeros(2, 4),), {0: {0: 'batch'}}\n")
    group = ExportGroup("g", "off", f"{case}:off", "torchscript", 17, cells=(CellJob("c", "ort-cpu", "ort-cpu"),))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,), base_dir=str(tmp_path),
              bundles=False, latency=LatencyProtocol(enabled=False))
    events: list[dict] = []
    run_job(job, events.append)
    rec = next(Record.from_dict(e["record"]) for e in events if e["event"] == "record")
    assert (rec.status, rec.stage) == (Status.FAIL, "parity"), rec.error
    assert rec.parity.max_abs == pytest.approx(1.0) and len(rec.parity.shapes) == 2
    for shape in rec.parity.shapes:
        doubled, shifted = shape["outputs"]
        assert shape["failed"] and doubled["max_abs"] == 0.0 and "error" not in doubled
        elements = math.prod(next(iter(shape["inputs"].values())))
        assert shifted["max_abs"] == pytest.approx(1.0) and shifted["beyond"] == elements
        assert (shifted["eager"], shifted["runtime"]) == (0.0, 1.0) and shifted["worst_index"] is not None
    assert Record.from_dict(json.loads(rec.to_json())).parity.shapes == rec.parity.shapes


def test_root_cause_follows_cause_never_an_unrelated_context():
    from harness.core.errors import root_cause

    exc = _export_failure()
    assert type(root_cause(exc)).__name__ == "UserError"
    text = short_error(exc)
    assert text.endswith("<- UserError: Constraints violated (seq)! For more information, run with TORCH_LOGS")
    assert "IndexError" not in text


def test_an_implicit_context_alone_is_not_a_cause():
    try:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("graph inputs do not match")
    except ValueError as exc:
        assert short_error(exc) == "ValueError: graph inputs do not match"


NESTED_CASE = """
import torch

class Baked(torch.nn.Module):
    def forward(self, x, state):
        b, s, f = x.shape
        return x.reshape(int(b) * int(s), int(f)).sum(-1), state[0] * state[1]["scale"]

def nested():
    x = torch.randn(2, 3, 4)
    state = (torch.randn(2, 4), {"scale": torch.randn(2, 4)})
    return Baked(), (x, state), {0: {0: "b", 1: "s"}, "state.0": {0: "b"}, "state.1.scale": {0: "b"}}
"""


def test_a_failing_nested_input_cell_bundles_every_leaf(tmp_path):
    case = tmp_path / "nested.py"
    case.write_text(NESTED_CASE)
    group = ExportGroup("g", "nested", f"{case}:nested", "torchscript", 17,
                        cells=(CellJob("c-nested", "ort-cpu", "ort-cpu"),))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,), base_dir=str(tmp_path),
              latency=LatencyProtocol(enabled=False))
    events: list[dict] = []
    run_job(job, events.append)
    (rec,) = (Record.from_dict(e["record"]) for e in events if e["event"] == "record")
    # the Reshape target is baked from the example: the graph runs there and rejects the second shape
    assert (rec.status, rec.stage) == (Status.FAIL, "run"), rec.error
    assert "rejected when growing 'b' (input_0 dim 0, input_1_0 dim 0, input_1_1_scale dim 0)" in rec.error
    assert rec.graph["inputs"] == ["input_0", "input_1_0", "input_1_1_scale"]
    assert rec.options["dim_marking"] == "dynamic_axes"
    bundle = tmp_path / "run" / "bundles" / "c-nested"
    with np.load(bundle / "inputs.npz") as first, np.load(bundle / "inputs_shape2.npz") as second:
        assert {k: first[k].shape for k in first.files} == {
            "input_0": (2, 3, 4), "input_1_0": (2, 4), "input_1_1_scale": (2, 4)}
        assert {k: second[k].shape for k in second.files} == {
            "input_0": (3, 4, 4), "input_1_0": (3, 4), "input_1_1_scale": (3, 4)}
    structure = json.loads((bundle / "inputs.json").read_text())
    assert [leaf["path"] for leaf in structure[0]["leaves"]] == ["x", "state.0", "state.1.scale"]
def test_verdict_phase_spools_the_export_and_the_latency_phase_times_it(tmp_path):
    """A run's two phases in the real worker: verdicts without latency (the file and feeds kept in
    the spool), then the spooled file loaded again in each runtime and timed."""
    case = tmp_path / "cases.py"
    case.write_text("import torch\n"
                    "def lin():\n"
                    "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),), {0: {0: 'batch'}}\n")
    group = ExportGroup("g1", "lin", f"{case}:lin", "torchscript", 17,
                        cells=(CellJob("c-ort", "ort-cpu", "ort-cpu"), CellJob("c-ov", "openvino", "openvino")))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,), base_dir=str(tmp_path),
              latency=LatencyProtocol(min_runs=5, min_time_s=0.0, warmup_runs=1, warmup_s=0.0),
              phase="verdicts")
    events: list[dict] = []
    run_job(Job.from_dict(json.loads(job.to_json())), events.append)
    verdicts = [Record.from_dict(e["record"]) for e in events if e["event"] == "record"]
    assert [r.status for r in verdicts] == [Status.PASS, Status.PASS]
    assert all(not r.latency_ms and "latency" not in r.duration_s and r.parity.max_abs is not None
               for r in verdicts)
    spooled = sorted(p.name for p in (tmp_path / "run" / "spool" / "g1").iterdir())
    assert "g1.onnx" in spooled and "feeds.npz" in spooled and "spool.json" in spooled

    events.clear()
    run_job(job.replace(phase="latency"), events.append)
    timings = {r.cell_id: r for r in (Record.from_dict(e["record"]) for e in events if e["event"] == "record")}
    assert set(timings) == {"c-ort", "c-ov"}
    for r in timings.values():
        assert r.status is Status.PASS and r.latency_ms.iterations >= 5 and r.latency_ms.binding_overhead_ms
        assert r.torch == verdicts[0].torch and set(r.duration_s) == {"latency"}


def test_a_missing_spool_fails_the_cell_at_latency(tmp_path):
    group = ExportGroup("gone", "lin", "x.py:lin", "dynamo", 18, cells=(CellJob("c", "ort-cpu", "ort-cpu"),))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,), phase="latency")
    events: list[dict] = []
    run_job(job, events.append)
    (rec,) = [Record.from_dict(e["record"]) for e in events if e["event"] == "record"]
    assert (rec.status, rec.stage) == (Status.FAIL, "latency") and "spooled export of gone" in rec.error
