"""``determinism: true``: a group exported twice, each in a fresh process, and the two files
compared: nodes, initializers and interface; metadata-only differences named as such."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Record
from harness.core.status import Status
from harness.worker.determinism import compare_exports
from harness.worker.main import run_job


def model(weight: float = 1.0, op: str = "Mul", producer: str = "1.0"):
    import numpy as np

    w = numpy_helper.from_array(np.full((2,), weight, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    return helper.make_model(graph, producer_name="t", producer_version=producer)


@pytest.mark.parametrize("other,identical,differs", [
    (model(), True, []),
    (model(producer="2.0"), True, ["metadata"]),
    (model(weight=2.0), False, ["initializers"]),
    (model(op="Add"), False, ["nodes"]),
])
def test_two_files_are_compared_by_what_they_compute(tmp_path, other, identical, differs):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(model(), a)
    onnx.save(other, b)
    result = compare_exports(a, b)
    assert (result["identical"], result["differs"]) == (identical, differs)
    if differs == ["metadata"]:
        assert result["detail"]["metadata"] == ["producer_version"]


CASES = ("import os, torch\n"
         "def seeded():\n"
         "    torch.manual_seed(0)\n"
         "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),), {0: {0: 'batch'}}\n"
         "def unseeded():\n"
         "    torch.manual_seed(int.from_bytes(os.urandom(4), 'little'))   # new weights per process\n"
         "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),), {0: {0: 'batch'}}\n")


def test_a_group_is_exported_in_two_fresh_processes_and_compared(tmp_path):
    case = tmp_path / "cases.py"
    case.write_text(CASES)
    groups = tuple(ExportGroup(f"g-{fn}", fn, f"{case}:{fn}", "torchscript", 17,
                               cells=(CellJob(f"c-{fn}", "ort-cpu", "ort-cpu"),)) for fn in ("seeded", "unseeded"))
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=groups, base_dir=str(tmp_path),
              bundles=False, latency=LatencyProtocol(enabled=False), determinism=True)
    events: list[dict] = []
    run_job(job, events.append)
    seeded, unseeded = (Record.from_dict(e["record"]) for e in events if e["event"] == "record")
    assert seeded.status is Status.PASS and seeded.graph["determinism"] == {"identical": True, "differs": []}
    # each process built its own weights: the files differ in the initializers, the cell still passes
    assert unseeded.status is Status.PASS and unseeded.graph["determinism"]["identical"] is False
    assert unseeded.graph["determinism"]["differs"] == ["initializers"]
    assert any("not deterministic" in n for n in unseeded.notes)
    assert not list((tmp_path / "run").rglob("*.again.onnx*"))
