"""Graph drift between torch releases: the comparison itself, and the report parts drawn from it
(absent for runs stored before the facts: the fixtures' byte-for-byte references cover that)."""
from __future__ import annotations

import json

from harness.core.cell import CellKey, ExportOptions
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.report.drift import GraphDrift, graph_drift, run_drifts
from harness.report.html import write_reports


def facts(ops: dict, inputs: list, outputs=None, opset=18, size=10_000) -> dict:
    spec = lambda name, shape, dtype="float": {"name": name, "dtype": dtype, "shape": shape}
    return {"opset": opset, "nodes": sum(ops.values()), "ops": ops, "bytes": size,
            "inputs": [i[0] for i in inputs], "outputs": ["output_0"],
            "io": {"inputs": [spec(*i) for i in inputs], "outputs": outputs or [spec("output_0", ["s0", 4])]}}


def test_ops_nodes_opset_and_size_changes():
    before = facts({"Gemm": 2, "Relu": 1, "Reshape": 3}, [("input_0", ["s0", 12])], size=10_000)
    after = facts({"MatMul": 2, "Add": 2, "Relu": 1, "Reshape": 1}, [("input_0", ["s77", 12])], opset=20, size=12_000)
    d = graph_drift(before, after, "2.6.0", "2.13.0")
    assert d.ops_added == {"Add": 2, "MatMul": 2} and d.ops_removed == {"Gemm": 2}
    assert d.ops_count == {"Reshape": (3, 1)} and d.nodes is None     # 6 nodes on both sides
    assert d.opset == (18, 20) and d.bytes == (10_000, 12_000)
    assert not d.io_changed            # s0 → s77: a symbol's name is not the interface
    assert d.summary().startswith("ops +Add×2, +MatMul×2, −Gemm×2, Reshape 3→1")
    assert "opset 18 → 20" in d.summary() and "9.8 kB → 11.7 kB" in d.summary()


def test_interface_changes_are_names_and_which_dims_are_fixed():
    base = facts({"Relu": 1}, [("input_0", ["batch", "seq", 8])])
    fixed = facts({"Relu": 1}, [("input_0", ["batch", 6, 8])])
    d = graph_drift(base, fixed)
    assert d.io_changed and d.dims == [("input_0", ["batch", "seq", 8], ["batch", 6, 8])]
    assert "input_0 dims [batch, seq, 8] → [batch, 6, 8]" in d.summary()
    renamed = facts({"Relu": 1}, [("x", ["batch", "seq", 8])])
    assert graph_drift(base, renamed).names == {"inputs": (["input_0"], ["x"])}
    retyped = facts({"Relu": 1}, [("input_0", ["batch", "seq", 8], "double")])
    d = graph_drift(base, retyped)
    assert d.dtypes == [("input_0", "float", "double")] and not d.io_changed and d.changed
    # metadata-sized growth (producer strings) is not a change
    assert not graph_drift(base, {**base, "bytes": base["bytes"] + 30}).changed


def test_a_change_of_capture_strategy_is_drift_when_both_sides_name_one():
    base = facts({"Relu": 1}, [("input_0", ["batch", 8])])
    strict = {**base, "capture_strategy": "torch.export(strict=True)"}
    non_strict = {**base, "capture_strategy": "torch.export(strict=False)"}
    d = graph_drift(non_strict, strict, "2.6.0", "2.13.0")
    assert d.changed and not d.io_changed
    assert d.capture == ("torch.export(strict=False)", "torch.export(strict=True)")
    assert d.summary() == "captured with torch.export(strict=False) → torch.export(strict=True)"
    assert d.to_dict()["capture"] == ["torch.export(strict=False)", "torch.export(strict=True)"]
    assert not graph_drift(non_strict, dict(non_strict)).changed
    assert not graph_drift(base, strict).changed      # an older record does not say: no drift


def test_no_drift_without_the_facts_on_both_sides():
    old = {"opset": 18, "nodes": 1, "ops": {"Relu": 1}, "bytes": 100, "inputs": ["input_0"]}
    assert graph_drift(old, facts({"Relu": 1}, [("input_0", [1])])) is None
    assert graph_drift({}, {}) is None


def _run(tmp_path, graphs: dict[str, dict], status=Status.PASS) -> tuple:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = RunMeta(run_id="r1", started=1.0, finished=True)
    meta.write(run_dir)
    key = CellKey("m", "dynamo", 18, "ort-cpu", ExportOptions())
    records = []
    for torch, graph in graphs.items():
        rec = Record.for_cell("r1", key, torch, "env", status, graph=graph)
        append_record(run_dir / "results.jsonl", rec)
        records.append(rec)
    return run_dir, meta, records


def test_report_shows_drift_only_where_both_releases_have_facts(tmp_path):
    base = facts({"Relu": 1}, [("input_0", ["batch", "seq", 8])])
    fixed = facts({"Relu": 1, "Reshape": 1}, [("input_0", ["batch", 6, 8])])
    run_dir, meta, records = _run(tmp_path, {"2.6.0": base, "2.13.0": fixed})
    drifts = run_drifts(records)
    assert len(drifts) == 1 and isinstance(drifts[0].drift, GraphDrift)
    md = write_reports(run_dir, records, meta, None).read_text(encoding="utf-8")
    assert "## Graph changes between torch versions" in md
    assert "| m · dynamo · op18 | 2.6.0 → 2.13.0 | ops +Reshape×1 · nodes 1 → 2 · input_0 dims" in md
    html = (run_dir / "matrix.html").read_text(encoding="utf-8")
    assert 'id="graph-changes"' in html and "Graph changes since torch" in html   # the details script
    details = json.loads(html.split('id="cell-data">', 1)[1].split("</script>", 1)[0])
    assert details[1]["drift"]["before"] == "2.6.0" and details[1]["drift"]["io_changed"] is True
    assert "drift" not in details[0]


def test_report_without_facts_has_no_drift_parts(tmp_path):
    old = {"opset": 18, "nodes": 1, "ops": {"Relu": 1}, "bytes": 100, "inputs": ["input_0"]}
    run_dir, meta, records = _run(tmp_path, {"2.6.0": old, "2.13.0": old})
    md = write_reports(run_dir, records, meta, None).read_text(encoding="utf-8")
    html = (run_dir / "matrix.html").read_text(encoding="utf-8")
    assert "Graph changes" not in md and "Graph changes" not in html and "d-extra" not in html
