"""Bisect end to end over the two local releases (2.6.0 and 2.13.0, no download): conv_bn's
dynamo export at opset 13 fails the checker on 2.6.0 and passes on 2.13.0, a fix; the records
are ordinary stored runs, a second bisect reuses them, and the verdicts agree with a plain
export-and-run (tests/direct_verdict.py)."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, TESTS, env_python, run_harness

from harness.store.runs import list_runs, load_run

pytestmark = pytest.mark.e2e

CELL = "conv_bn-dynamo-op13-ort-cpu"


def bisect(store, *extra):
    return run_harness("--reports", str(store), "bisect", "--config", str(TESTS / "matrices" / "bisect.yaml"),
                       "--cell", CELL, "--releases", "2.6.0,2.13.0", *extra, check=False)


def test_bisect_a_fix_over_local_releases(tmp_path):
    store = tmp_path / "reports"
    proc = bisect(store, "--good", "2.13.0", "--bad", "2.6.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tried: 2.13.0 pass · 2.6.0 fail (check)" in proc.stdout
    assert "verdict changes between 2.6.0 and 2.13.0 (fail (check) → pass)" in proc.stdout
    assert "https://github.com/pytorch/pytorch/releases/tag/v2.13.0" in proc.stdout
    # the two environments also differ in companion pins: the boundary is tried once more, torch
    # 2.13.0 with 2.6.0's pins, and the answer names what flipped it (or why it cannot tell)
    assert "the two environments also differ in" in proc.stdout and "flipped it" in proc.stdout
    runs = list_runs(store)
    assert len(runs) == 3                                    # one run per release tried, one swapped
    records = {r.torch: r for run in runs for r in load_run(run)[1]}
    assert set(records) == {"2.6.0", "2.13.0"} and (store / "index.json").exists()
    # the verdicts are those of a plain export + checker + ONNX Runtime run, no harness code
    for torch, rec in records.items():
        item = {"case_file": str(ROOT / "harness" / "probes" / "vision.py"), "case_fn": "conv_bn",
                "exporter": "dynamo", "opset": 13, "cell_id": rec.cell_id}
        job, out = tmp_path / f"{torch}.json", tmp_path / f"{torch}.jsonl"
        job.write_text(json.dumps([item]))
        meta = load_run(next(run for run in runs if run.name == rec.run_id))[0]
        subprocess.run([str(env_python(meta, torch)), str(TESTS / "direct_verdict.py"), str(job), str(out)],
                       capture_output=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        direct = json.loads(out.read_text())
        assert (rec.status.value, rec.stage) == (direct["status"], direct["stage"])
    # asked the other way round (a regression from 2.13.0 to 2.6.0) it reuses the stored runs
    again = bisect(store, "--good", "2.6.0", "--bad", "2.13.0")
    assert "stored results reused" in again.stderr and len(list_runs(store)) == 3
    assert "verdict changes between 2.6.0 and 2.13.0 (fail (check) → pass)" in again.stdout


def test_nothing_to_bisect_and_bad_input(tmp_path):
    store = tmp_path / "reports"
    bad = bisect(store, "--good", "2.13.0", "--bad", "2.13.0")
    assert bad.returncode == 2 and "same release" in bad.stderr
    unknown = bisect(store, "--good", "2.13.0", "--bad", "2.6.0", "--cell", "nope")
    assert unknown.returncode == 2 and "no cell 'nope'" in unknown.stderr and not list_runs(store)
