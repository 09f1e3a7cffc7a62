"""The dim-policy axis end to end (tests/matrices/dim_policy.yaml on torch 2.6.0 and 2.13.0),
checked against a plain export with the same Dim markers and no harness code
(tests/direct_verdict.py): the verdicts of the issue's two models and the dims the exporter fixed.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, TESTS, env_python, run_matrix

from harness.core.record import read_records
from harness.store.runs import read_run_meta

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dim_run(tmp_path_factory):
    run_dir = run_matrix(tmp_path_factory, "dims", "dim_policy.yaml")
    return run_dir, read_records(run_dir / "results.jsonl")


def verdicts(run):
    return {(r.torch, r.case, r.exporter, r.key.options.dim_policy): (r.status.value, r.stage) for r in run[1]}


def test_the_policy_decides_the_verdict(dim_run):
    """The issue's findings: flatten_mean passes with Dim.DYNAMIC but not with Dim("seq") or
    Dim.AUTO; on torch 2.6.0 tensor_shape fails at export with Dim.DYNAMIC but exports (and fails
    at run) with Dim("batch"); torch 2.13.0 keeps batch dynamic with every policy."""
    v = verdicts(dim_run)
    for torch in ("2.6.0", "2.13.0"):
        assert v[(torch, "flatten_mean", "dynamo", "dynamic")] == ("pass", None)
        # The default is what that release makes of dynamic_axes: Dim(name, max=99999) on 2.6
        # (so it specialises like "named"), Dim.DYNAMIC on 2.13.
        default = ("fail", "run") if torch == "2.6.0" else ("pass", None)
        assert v[(torch, "flatten_mean", "dynamo", None)] == default
        assert v[(torch, "flatten_mean", "dynamo", "named")] == ("fail", "run")
        assert v[(torch, "flatten_mean", "dynamo", "auto")] == ("fail", "run")
    assert v[("2.6.0", "tensor_shape", "dynamo", "dynamic")] == ("fail", "export")
    assert v[("2.6.0", "tensor_shape", "dynamo", "named")] == ("fail", "run")
    assert all(v[("2.13.0", "tensor_shape", "dynamo", p)] == ("pass", None) for p in (None, "dynamic", "auto", "named"))
    assert sum(1 for k in v if k[2] == "torchscript") == 4      # one TorchScript cell per case and torch


def test_verdicts_and_fixed_dims_match_a_plain_export(dim_run, tmp_path):
    run_dir, records = dim_run
    meta = read_run_meta(run_dir)
    for torch in ("2.6.0", "2.13.0"):
        items = [{"case_file": str(TESTS / "cases" / "dim_policy.py"), "case_fn": r.case, "exporter": r.exporter,
                  "opset": r.opset, "dim_policy": r.key.options.dim_policy, "cell_id": r.cell_id}
                 for r in records if r.torch == torch]
        job, out = tmp_path / f"{torch}.json", tmp_path / f"{torch}.jsonl"
        job.write_text(json.dumps(items))
        proc = subprocess.run([str(env_python(meta, torch)), str(TESTS / "direct_verdict.py"), str(job), str(out)],
                              capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        direct = {d["cell_id"]: d for d in map(json.loads, out.read_text().splitlines())}
        assert len(direct) == len(items), proc.stderr[-3000:]
        for rec in (r for r in records if r.torch == torch):
            d = direct[rec.cell_id]
            assert (rec.status.value, rec.stage) == (d["status"], d["stage"]), (rec.cell_id, d["error"])
            names = {"flatten_mean": {0: "batch", 1: "seq"}, "tensor_shape": {0: "batch"}}[rec.case]
            expected = sorted(f"{names[int(axis)]} was fixed to {value} by the exporter"
                              for axis, value in (d.get("fixed") or {}).get("input_0", {}).items())
            noted = sorted(n.split(" (", 1)[0] for n in rec.notes if " was fixed to " in n)
            assert noted == expected, rec.cell_id
    fixed = {r.cell_id for r in records if r.graph.get("specialised")}
    assert "torch2.13.0-flatten_mean-dynamo-op18-dim-auto-ort-cpu" in fixed   # the file keeps 's..'
    assert "torch2.6.0-tensor_shape-dynamo-op18-dim-named-ort-cpu" in fixed


def test_report_lists_fixed_dims(dim_run):
    md = (dim_run[0] / "matrix.md").read_text(encoding="utf-8")
    assert "## Dims fixed by the exporter" in md
    assert "| flatten_mean · dynamo · op18 · dim-named | 2.13.0  | seq was fixed to 6 by the exporter (input_0 dim 1)" in md
    assert "## Graph changes between torch versions" in md
