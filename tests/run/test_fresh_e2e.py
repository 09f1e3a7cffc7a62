"""A verdict does not depend on the schedule: every export group runs in a fresh process forked
from the environment's warm worker. On torch 2.13.0 the dynamo export of the LSTM-with-state
models depends on what the same process exported before; the matrix (tests/matrices/schedule.yaml)
runs with one and two workers, groups in plan, reversed and shuffled order, and every cell's
(status, stage) is the same, and the same as a plain export in a new interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, TESTS, env_python

from harness.core.record import read_records
from harness.store.runs import read_run_meta

pytestmark = pytest.mark.e2e
CONFIG = TESTS / "matrices" / "schedule.yaml"
CASES = TESTS / "cases" / "structured.py"
SCHEDULES = {"plan-1": ("1", ""), "reverse-2": ("2", "reverse"), "shuffle-1": ("1", "shuffle:7")}


def run(reports: Path, jobs: str, order: str) -> Path:
    env = {**os.environ, "HARNESS_GROUP_ORDER": order}
    proc = subprocess.run([sys.executable, "-m", "harness", "--reports", str(reports), "matrix", "--config",
                           str(CONFIG), "--fresh", "--jobs", jobs], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("run directory")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reports = tmp_path_factory.mktemp("schedule") / "reports"
    return {name: run(reports, jobs, order) for name, (jobs, order) in SCHEDULES.items()}


def verdicts(run_dir: Path) -> dict[str, tuple]:
    return {r.cell_id: (r.status.value, r.stage) for r in read_records(run_dir / "results.jsonl")}


def test_every_schedule_gives_the_same_verdicts(runs):
    maps = {name: verdicts(d) for name, d in runs.items()}
    assert all(len(m) == 10 for m in maps.values())
    first = maps["plan-1"]
    assert {name: {c: v for c, v in m.items() if first[c] != v} for name, m in maps.items()} == \
        {name: {} for name in maps}


def test_the_lstm_state_cell_matches_an_export_in_a_new_interpreter(runs, tmp_path):
    # lstm_state: the model whose export on torch 2.13.0 depends on the exports before it in
    # the process. (lstm_state_seq gives its dims in the index form, which tests/direct_verdict.py
    # hands to torch as dynamic_axes and torch 2.13 fails to convert for the nested state, while
    # the harness marks them in dynamic_shapes: a difference of the dims' form, not of the schedule.)
    run_dir = runs["reverse-2"]
    meta = read_run_meta(run_dir)
    recs = [r for r in read_records(run_dir / "results.jsonl") if r.case == "lstm_state" and r.exporter == "dynamo"]
    assert len(recs) == 1
    for rec in recs:
        # One interpreter per cell: nothing exported before it in that process.
        job, out = tmp_path / f"{rec.case}.json", tmp_path / f"{rec.case}.jsonl"
        job.write_text(json.dumps([{"case_file": str(CASES), "case_fn": rec.case, "exporter": "dynamo",
                                    "opset": rec.opset, "cell_id": rec.cell_id}]))
        proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_verdict.py"), str(job), str(out)],
                              capture_output=True, text=True, cwd=TESTS, timeout=900,
                              env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
        assert out.exists(), proc.stderr[-3000:]
        direct = json.loads(out.read_text())
        assert (rec.status.value, rec.stage) == (direct["status"], direct["stage"]), (rec.error, direct["error"])


def test_a_dynamo_record_names_the_capture_strategy_torch_reported(runs):
    recs = [r for r in read_records(runs["plan-1"] / "results.jsonl")
            if r.exporter == "dynamo" and r.stage not in ("reference", "export")]
    assert recs
    for rec in recs:
        strict = {"torch.export(strict=False)": "False", "torch.export(strict=True)": "True"}[rec.graph["capture_strategy"]]
        # torch's own account of it, in the group's log: that strategy succeeded
        assert f"with `torch.export.export(..., strict={strict})`... ✅" in Path(rec.log).read_text()
