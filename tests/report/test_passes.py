"""Optional passes that could not be made (harness.core.passes) are loud: a record's
``passes_not_run`` reaches run.json when the run is finalized (before it is immutable), the
terminal summary, matrix.md and matrix.html; a run whose passes all ran shows none of it."""
from __future__ import annotations

import json
import shutil

from helpers import BOTH, FIXTURES

from harness.cli.commands.matrix import summary
from harness.core.record import Record, append_records, read_records
from harness.core.run import RunMeta
from harness.report import render_run
from harness.store.reductions import append_reduction
from harness.store.rundir import finalize


def _run(tmp_path, records: list[Record]):
    run = tmp_path / "reports" / "runs" / "20260101-000000-abcdef"
    run.mkdir(parents=True)
    append_records(run / "results.jsonl", records)
    RunMeta(run_id=run.name, started=1.0, config="m.yaml").write(run)
    return run


def _rec(cid: str, status: str = "pass", **kw) -> Record:
    return Record(run_id="20260101-000000-abcdef", case=cid, torch="2.13.0", exporter="dynamo", opset=18,
                  runtime="ort-cpu", status=status, cell_id=cid, **kw)


def test_passes_not_made_reach_run_json_the_summary_and_both_reports(tmp_path):
    why = "onnxruntime 1.17.9 could not be installed, so the file was not tried there: no version"
    a, b = _rec("a"), _rec("b")
    for rec in (a, b):
        rec.pass_not_run("runtime_floor", why)
    c = _rec("c", "fail", stage="export")
    c.pass_not_run("blame", "the blame ladder itself failed: RuntimeError: boom")
    run = _run(tmp_path, [a, b, c, _rec("d")])
    append_reduction(run, "c", {"failed": True, "note": "Polygraphy is not available: no wheel"})
    finalize(run, RunMeta.from_dict(json.loads((run / "run.json").read_text())), tmp_path / "reports")
    meta = json.loads((run / "run.json").read_text())
    assert meta["finished"] is True
    assert meta["passes_not_run"] == [
        {"pass": "runtime_floor", "reason": why, "cells": 2, "examples": ["a", "b"]},
        {"pass": "reduce", "reason": "Polygraphy is not available: no wheel", "cells": 1, "examples": ["c"]},
        {"pass": "blame", "reason": "the blame ladder itself failed: RuntimeError: boom", "cells": 1, "examples": ["c"]},
    ]
    assert [r.passes_not_run for r in read_records(run / "results.jsonl")][3] == {}   # "d": none written
    render_run(run, tmp_path / "reports")
    md, html = (run / "matrix.md").read_text(), (run / "matrix.html").read_text()
    assert "## Passes not made" in md and why in md and md.index("## Passes not made") < md.index("## Matrix")
    assert 'id="passes-not-made"' in html and "Polygraphy is not available" in html
    lines = summary(run)
    assert "passes not made (3):" in lines
    assert f"  runtime_floor not made for 2 cell(s): {why}" in lines


def test_a_run_whose_passes_all_ran_says_nothing_of_them(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "finished": False}))   # as the runner leaves it
    finalize(run, RunMeta.from_dict(data), tmp_path / "reports")
    assert "passes_not_run" not in json.loads((run / "run.json").read_text())
    render_run(run, None)
    assert "Passes not made" not in (run / "matrix.md").read_text()
    assert not any("passes not made" in line for line in summary(run))


def test_a_blame_ladder_that_breaks_is_the_records_pass_not_run():
    from types import SimpleNamespace

    from harness.worker.diagnose.blame import diagnose

    rec = _rec("x", "fail", stage="parity")
    diagnose(SimpleNamespace(failure=None), None, rec)     # a context without what the ladder reads
    assert rec.blame.party == "unknown"
    assert rec.passes_not_run["blame"].startswith("the blame ladder itself failed: AttributeError")
    assert Record.from_dict(json.loads(rec.to_json())).passes_not_run == rec.passes_not_run   # stored as is
