"""Graph drift in the gate: information by default; with --block-on io a cell that works on both
sides but whose file changed its input/output names or dynamic dims is a regression."""
from __future__ import annotations

import json

from helpers import TESTS

from harness.cli import main
from harness.core.cell import CellKey
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.gate.compare import Settings, Verdict, compare_sides
from harness.gate.output import render_junit, render_markdown
from harness.gate.sources import Side
from harness.run.annotate import Annotator
from harness.store.runs import update_index


def graph(shape: list, ops: dict | None = None, output: str = "output_0") -> dict:
    ops = ops or {"Relu": 1}
    return {"opset": 18, "nodes": sum(ops.values()), "ops": ops, "bytes": 1000,
            "io": {"inputs": [{"name": "input_0", "dtype": "float", "shape": shape}],
                   "outputs": [{"name": output, "dtype": "float", "shape": shape}]}}


KEYS = {"same": CellKey("same", "dynamo", 18, "ort-cpu"), "ops": CellKey("ops", "dynamo", 18, "ort-cpu"),
        "fixed": CellKey("fixed", "dynamo", 18, "ort-cpu"), "renamed": CellKey("renamed", "dynamo", 18, "ort-cpu"),
        "broken": CellKey("broken", "dynamo", 18, "ort-cpu")}
BEFORE = {"same": graph(["b", 8]), "ops": graph(["b", 8]), "fixed": graph(["b", 8]),
          "renamed": graph(["b", 8]), "broken": graph(["b", 8])}
AFTER = {"same": graph(["s9", 8]), "ops": graph(["b", 8], {"Relu": 1, "Identity": 2}),
         "fixed": graph([4, 8]), "renamed": graph(["b", 8], output="y"), "broken": graph([4, 8])}


def records(torch: str, graphs: dict, run_id: str) -> list[Record]:
    out = []
    for name, key in KEYS.items():
        failing = torch == "2.13.0" and name == "broken"
        out.append(Record.for_cell(run_id, key, torch, "env", Status.FAIL if failing else Status.PASS,
                                   stage="run" if failing else None, graph=graphs[name]))
    return out


def sides() -> tuple[Side, Side]:
    return (Side("2.6.0", "2.6.0", records("2.6.0", BEFORE, "a"), ["a"]),
            Side("2.13.0", "2.13.0", records("2.13.0", AFTER, "b"), ["b"]))


def test_drift_is_information_by_default():
    base, cand = sides()
    cells = {c.key.case: c for c in compare_sides(base, cand, Annotator([]), Settings())}
    assert {k: c.verdict for k, c in cells.items()} == {
        "same": Verdict.UNCHANGED, "ops": Verdict.UNCHANGED, "fixed": Verdict.UNCHANGED,
        "renamed": Verdict.UNCHANGED, "broken": Verdict.NEW_FAILURE}
    assert not cells["same"].drift.changed          # only a symbol's name moved
    assert cells["ops"].drift.ops_added == {"Identity": 2} and not cells["ops"].drift.io_changed
    assert cells["fixed"].drift.io_changed and cells["renamed"].drift.io_changed
    md = render_markdown(base, cand, list(cells.values()), Settings())
    assert "### Graph changes (information)" in md and "✅" not in md.splitlines()[0]
    assert "| fixed · dynamo · op18 | input_0 dims [b, 8] → [4, 8] · output_0 dims [b, 8] → [4, 8] |" in md
    assert "| renamed · dynamo · op18 | outputs ['output_0'] → ['y'] |" in md
    assert "same · dynamo" not in md.split("### Graph changes", 1)[1]
    junit = render_junit(base, cand, list(cells.values()))
    assert "graph changes: ops +Identity×2" in junit


def test_block_on_io_makes_interface_changes_regressions():
    base, cand = sides()
    cells = {c.key.case: c for c in compare_sides(base, cand, Annotator([]), Settings(block_on=("io",)))}
    assert cells["fixed"].verdict is Verdict.INTERFACE_CHANGE and cells["fixed"].verdict.blocking
    assert cells["renamed"].verdict is Verdict.INTERFACE_CHANGE
    assert cells["fixed"].detail == "input_0 dims [b, 8] → [4, 8]; output_0 dims [b, 8] → [4, 8]"
    assert cells["ops"].verdict is Verdict.UNCHANGED and cells["same"].verdict is Verdict.UNCHANGED
    assert cells["broken"].verdict is Verdict.NEW_FAILURE     # the failure stays the news
    md = render_markdown(base, cand, list(cells.values()), Settings(block_on=("io",)))
    assert "### Input/output changes (`--block-on io`)" in md


def _store(tmp_path) -> tuple:
    reports = tmp_path / "reports"
    for run_id, torch, graphs in (("20260101-000000-aaaaaa", "2.6.0", BEFORE),
                                  ("20260101-000100-aaaaaa", "2.13.0", AFTER)):
        run_dir = reports / "runs" / run_id
        run_dir.mkdir(parents=True)
        RunMeta(run_id=run_id, started=1.0, finished=True).write(run_dir)
        for rec in records(torch, graphs, run_id):
            if rec.case != "broken":
                append_record(run_dir / "results.jsonl", rec)
        update_index(run_dir, reports)
    return reports, "20260101-000000-aaaaaa", "20260101-000100-aaaaaa"


def test_cli_block_on_io_sets_the_exit_code(tmp_path):
    reports, a, b = _store(tmp_path)
    common = ["--reports", str(reports), "gate", "--config", str(TESTS / "matrices" / "gate.yaml"),
              "--baseline", a, "--candidate", b, "--remeasure", "0"]
    assert main([*common, "--output", str(tmp_path / "info")]) == 0
    assert main([*common, "--output", str(tmp_path / "block"), "--block-on", "io"]) == 1
    data = json.loads((tmp_path / "block" / "gate.json").read_text())
    assert data["settings"]["block_on"] == ["io"] and data["counts"]["interface change"] == 2
    fixed = next(c for c in data["cells"] if c["case"] == "fixed")
    assert fixed["drift"]["io_changed"] and fixed["drift"]["dims"][0][0] == "input_0"
