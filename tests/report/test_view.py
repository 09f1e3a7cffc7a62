"""`harness view`: a cell's file served by Netron (no browser here), and the reasons when a cell
has nothing to show."""
from __future__ import annotations

import shutil
import urllib.request

import onnx
import pytest
from onnx import TensorProto, helper

from harness.core.cell import CellKey
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.matrix.rules import ConfigError
from harness.report.view import can_browse, find_record, view_cell


@pytest.fixture
def run(tmp_path):
    run_dir = tmp_path / "reports" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    RunMeta(run_id="r1", started=1.0, finished=True).write(run_dir)
    bundle = run_dir / "bundles" / "torch2.13.0-m-dynamo-op18-ort-cpu"
    bundle.mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), str(bundle / "model.onnx"))
    (bundle / "cell.json").write_text("{}")
    key = CellKey("m", "dynamo", 18, "ort-cpu")
    append_record(run_dir / "results.jsonl", Record.for_cell("r1", key, "2.13.0", "e", Status.FAIL, stage="run",
                                                             bundle=str(bundle)))
    append_record(run_dir / "results.jsonl", Record.for_cell("r1", CellKey("ok", "dynamo", 18, "ort-cpu"), "2.13.0",
                                                             "e", Status.PASS))
    return run_dir


def test_view_serves_the_model_over_http(run, capsys):
    import netron

    try:
        assert view_cell("m-dynamo-op18-ort-cpu", str(run), run.parent.parent, browse=False, wait=False) == 0
        url = next(ln.split()[1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("Netron:"))
        with urllib.request.urlopen(url, timeout=20) as response:
            assert response.status == 200 and b"netron" in response.read().lower()
    finally:
        netron.stop()


def test_cells_without_a_file_say_why(run):
    with pytest.raises(ConfigError, match="has no bundle"):
        view_cell("torch2.13.0-ok-dynamo-op18-ort-cpu", str(run), run.parent.parent, wait=False)
    with pytest.raises(ConfigError, match="no reduced.onnx: run `python -m harness reduce"):
        view_cell("torch2.13.0-m-dynamo-op18-ort-cpu", str(run), run.parent.parent, reduced=True, wait=False)
    with pytest.raises(ConfigError, match="no cell 'nope'"):
        find_record([], "nope")
    shutil.rmtree(run / "bundles")
    with pytest.raises(ConfigError, match="no model.onnx in its bundle"):
        view_cell("torch2.13.0-m-dynamo-op18-ort-cpu", str(run), run.parent.parent, wait=False)


def test_no_browser_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert can_browse() is False
