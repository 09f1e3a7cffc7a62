"""The architectures view: newest passing opset per runtime, else the newest failure's signature,
else a skip; one count line per torch release; absent for runs without zoo cases."""
from __future__ import annotations

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.core.status import Status
from harness.report.aggregate import records_frame
from harness.report.architectures import (
    architecture_tables,
    architectures_markdown,
    count_lines,
)
from harness.report.markdown import render_markdown


def rec(case, torch, exporter, opset, status, stage=None, runtime="ort-cpu", signature=None):
    r = Record.for_cell("run", CellKey(case, exporter, opset, runtime), torch, "env", status, stage=stage)
    r.signature = signature or (f"{stage}:0000abcd" if stage else None)
    return r


RECORDS = [
    # bert: dynamo passes at 18 and 23 on 2.13.0 → newest passing opset 23.
    rec("hf-bert", "2.13.0", "dynamo", 18, Status.PASS),
    rec("hf-bert", "2.13.0", "dynamo", 23, Status.PASS),
    rec("hf-bert", "2.13.0", "optimum", 18, Status.PASS),
    rec("hf-bert", "2.13.0", "optimum", 23, Status.FAIL, "export", signature="export:11112222"),
    # gpt2: passes only at 18 on openvino; fails everywhere on ort-cpu (newest failure shown).
    rec("hf-gpt2", "2.13.0", "dynamo", 18, Status.FAIL, "run", signature="run:aaaa0018"),
    rec("hf-gpt2", "2.13.0", "dynamo", 23, Status.FAIL, "parity", signature="parity:bbbb0023"),
    rec("hf-gpt2", "2.13.0", "dynamo", 18, Status.PASS, runtime="openvino"),
    rec("hf-gpt2", "2.13.0", "optimum", 18, Status.FAIL, "export", signature="export:cccc0018"),
    # internlm2: skipped (not counted as attempted).
    rec("hf-internlm2", "2.13.0", "dynamo", 18, Status.SKIP),
    rec("hf-internlm2", "2.13.0", "optimum", 18, Status.SKIP),
    # an older torch and a non-zoo case, which the view leaves out.
    rec("hf-bert", "2.6.0", "dynamo", 18, Status.FAIL, "export", signature="export:dddd0018"),
    rec("mha", "2.13.0", "dynamo", 18, Status.PASS),
]


def test_cells_show_newest_passing_opset_else_newest_failure_else_skip():
    tables = architecture_tables(records_frame(RECORDS))
    ort = tables["ort-cpu"]
    assert ort["columns"] == [("2.6.0", "dynamo"), ("2.13.0", "dynamo"), ("2.13.0", "optimum")]
    rows = {case: cells for case, cells in ort["rows"]}
    assert set(rows) == {"hf-bert", "hf-gpt2", "hf-internlm2"}          # mha is no zoo case
    assert rows["hf-bert"][1]["text"] == "op23" and rows["hf-bert"][1]["status"] == "pass"
    assert rows["hf-bert"][2]["text"] == "op18"                          # optimum fails at 23
    assert rows["hf-bert"][0]["text"] == "export:dddd0018"
    assert rows["hf-gpt2"][1]["text"] == "parity:bbbb0023"               # the newest opset's failure
    assert rows["hf-internlm2"][1]["status"] == "skip"
    assert {case: cells[1]["text"] for case, cells in tables["openvino"]["rows"]} == {"hf-gpt2": "op18"}


def test_count_line_per_torch_release():
    lines = count_lines(records_frame(RECORDS))
    assert lines[0] == "torch 2.6.0: dynamo exports 0 of 1 architectures (0 pass on some runtime)"
    # 2.13.0 dynamo: bert exports and passes; gpt2 exports (fails later) and passes on openvino.
    assert lines[1] == ("torch 2.13.0: dynamo exports 2 of 2 architectures (2 pass on some runtime; "
                        "1 skipped) · optimum exports 1 of 2 architectures (1 pass on some runtime; "
                        "1 skipped)")


def test_markdown_section_only_for_zoo_runs():
    md = render_markdown(RECORDS)
    assert "## Architectures" in md and "| hf-bert " in md and "✅ `op23`" in md
    assert md.index("## Architectures") < md.index("## Failures by signature")
    plain = [r for r in RECORDS if r.case == "mha"]
    assert architectures_markdown(records_frame(plain)) == ""
    assert "Architectures" not in render_markdown(plain)
