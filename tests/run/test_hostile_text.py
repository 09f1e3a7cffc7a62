"""A case's texts and values are data: an error text with lone surrogates (a file name that is
not UTF-8, through os.fsdecode), a model that is not a module and the longest name a case may have
each end as a recorded cell, and the run, its reports and a resume all finish."""
from __future__ import annotations

import json

import pytest
from helpers import TESTS, run_harness, run_matrix

from harness.core.record import read_records
from harness.matrix.names import NAME_MAX_CHARS

pytestmark = pytest.mark.e2e
ESCAPED = "weights-\\xff\\xfe.bin"     # the undecodable bytes, written out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "hostile-text", "hostile_text.yaml")


def test_every_case_is_a_recorded_cell(run):
    recs = {r.case: r for r in read_records(run / "results.jsonl")}
    assert json.loads((run / "run.json").read_text())["finished"]
    assert len(recs) == 5
    raised = recs["surrogate_error"]
    assert (raised.status, raised.stage) == ("fail", "reference")
    assert raised.error == f"FileNotFoundError: cannot open {ESCAPED}"
    assert raised.signature.startswith("reference:")
    traced = recs["surrogate_at_export"]
    assert (traced.status, traced.stage) == ("fail", "export") and ESCAPED in traced.error
    for name, got in (("not_a_module", "got str 'a model'"), ("a_class", "got the class Linear")):
        r = recs[name]
        assert (r.status, r.stage) == ("fail", "reference")
        assert f"case {name!r}: the first element it returns must be a torch.nn.Module" in r.error
        assert got in r.error
    longest = recs["n" * NAME_MAX_CHARS]
    assert longest.status == "pass"
    assert list((run / "logs").iterdir())   # the cells wrote their logs


def test_reports_show_the_escaped_text(run):
    md = (run / "matrix.md").read_text(encoding="utf-8")
    html = (run / "matrix.html").read_text(encoding="utf-8")
    assert ESCAPED in md and ESCAPED.replace("\\", "\\\\") in html   # html: inside its JSON
    (run / "matrix.md").unlink()
    run_harness("report", str(run))   # re-rendered from the records alone: still escaped
    assert ESCAPED in (run / "matrix.md").read_text(encoding="utf-8")


def test_resuming_before_the_surrogate_cell_finishes(run, tmp_path):
    """An interrupted run whose next cell is the surrogate one: resuming runs it and finishes
    (it used to die in the signature code on every resume)."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = (copy / "results.jsonl").read_text().splitlines()
    (copy / "results.jsonl").write_text("".join(ln + "\n" for ln in lines if "surrogate_error" not in ln))
    meta = json.loads((copy / "run.json").read_text())
    meta["finished"] = False
    (copy / "run.json").write_text(json.dumps(meta))
    run_harness("matrix", "--config", str(TESTS / "matrices" / "hostile_text.yaml"), "--output", str(copy),
                "--fresh")
    recs = {r.case: r for r in read_records(copy / "results.jsonl")}
    assert len(recs) == 5 and recs["surrogate_error"].error.endswith(ESCAPED)
    assert json.loads((copy / "run.json").read_text())["finished"]
