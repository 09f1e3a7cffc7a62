"""Containment: a case that raises, aborts or hangs is one bad cell, never a dead run."""
from __future__ import annotations

import json

import pytest
from helpers import TESTS, run_harness, run_matrix

from harness.core.record import read_records

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def misbehaving_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "bad", "misbehaving.yaml")


def test_raise_abort_hang_are_contained(misbehaving_run):
    recs = {r.case: r for r in read_records(misbehaving_run / "results.jsonl")}
    assert (recs["raises"].status, recs["raises"].stage) == ("fail", "reference")
    assert "broken on purpose" in recs["raises"].error
    assert "Traceback" in open(recs["raises"].log).read()
    assert recs["aborts"].status == "crash" and "SIGABRT" in recs["aborts"].error
    assert recs["hangs"].status == "timeout"
    assert recs["conv_bn"].status == "pass"  # the run went on after all three
    meta = json.loads((misbehaving_run / "run.json").read_text())
    assert meta["finished"]
    assert list(meta["environments"].values())[0]["worker_restarts"] == 2


def test_interrupted_run_resumes_without_redoing_cells(misbehaving_run, tmp_path):
    # Simulate an interruption: copy the run, drop the last record and the finished flag.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(misbehaving_run, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    kept = [l for l in lines if '"case": "conv_bn"' not in l]
    (run / "results.jsonl").write_text("\n".join(kept) + "\n")
    meta = json.loads((run / "run.json").read_text())
    meta["finished"] = False
    (run / "run.json").write_text(json.dumps(meta))
    run_harness("matrix", "--config", str(TESTS / "matrices" / "misbehaving.yaml"), "--output", str(run),
                "--only", "case=conv_bn|raises")
    recs = read_records(run / "results.jsonl")
    assert [r.case for r in recs].count("conv_bn") == 1
    assert [r.case for r in recs].count("raises") == 1
    assert recs[-1].case == "conv_bn" and recs[-1].status == "pass"


def test_finished_run_is_immutable(misbehaving_run):
    proc = run_harness("matrix", "--config", str(TESTS / "matrices" / "misbehaving.yaml"),
                       "--output", str(misbehaving_run), check=False)
    assert proc.returncode != 0 and "immutable" in (proc.stderr + proc.stdout)
