"""Smallest failing graphs end to end: tests/matrices/reduce.yaml with `reduce: true` reduces its
failing cells inside their environment at the end of the run. Each reduced graph is checked with
no harness code: it still fails the same way on the same runtime, and it is much smaller."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import TESTS, env_python, run_harness, run_matrix

from harness.store.runs import load_run

pytestmark = pytest.mark.e2e

# Runs in the cell's environment: plain onnxruntime / openvino on reduced.onnx + reduced_inputs.npz.
DIRECT = r'''
import json, sys
import numpy as np
bundle, runtime = sys.argv[1], sys.argv[2]
feeds = dict(np.load(f"{bundle}/reduced_inputs.npz"))
try:
    if runtime == "ort-cpu":
        import onnxruntime as ort
        outs = ort.InferenceSession(f"{bundle}/reduced.onnx", providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        import openvino as ov
        # the settings the cell ran with (without them OpenVINO raises here instead of
        # returning a wrong result: the failure being reproduced is the silent one)
        compiled = ov.Core().compile_model(f"{bundle}/reduced.onnx", "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
        result = compiled(feeds)
        outs = [result[o] for o in compiled.outputs]
except Exception as exc:
    print(json.dumps({"raised": f"{type(exc).__name__}: {exc}"[:400]}))
    sys.exit(0)
print(json.dumps({"shapes": [list(np.asarray(o).shape) for o in outs],
                  "values": [np.asarray(o, dtype=np.float64).ravel()[:4096].tolist() for o in outs]}))
'''


@pytest.fixture(scope="module")
def reduced_run(tmp_path_factory):
    run_dir = run_matrix(tmp_path_factory, "reduce", "reduce.yaml")
    meta, records = load_run(run_dir)
    return run_dir, meta, {r.cell_id: r for r in records}


def direct(meta, bundle: str, runtime: str) -> dict:
    proc = subprocess.run([str(env_python(meta, "2.13.0")), "-c", DIRECT, bundle, runtime],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_run_failures_reduce_to_the_failing_node(reduced_run):
    run_dir, meta, recs = reduced_run
    for cell, op in (("torch2.13.0-mha-torchscript-op17-ort-cpu", "Reshape"),
                     ("torch2.13.0-flatten_mean-dynamo-op17-dim-named-ort-cpu", None)):
        rec = recs[cell]
        assert rec.stage == "run"
        red = rec.graph["reduced"]
        assert "budget ran out" not in (red.get("note") or ""), red     # a slow machine, not a finding
        assert red["nodes"] <= max(2, red["original_nodes"] // 10), red
        assert red["check"].startswith("fails at run")
        outcome = direct(meta, rec.bundle, "ort-cpu")
        assert "raised" in outcome, outcome
        # the same failure as the cell's: same ONNX Runtime error class, same operator
        kind = rec.error.split(": ")[-1].split(":")[0] if op is None else "Fail"
        assert outcome["raised"].split(":")[0] in rec.error and kind in outcome["raised"]
        if op:
            assert f"running {op} node" in outcome["raised"] and f"running {op} node" in rec.error


def test_parity_failure_reduces_and_still_differs_from_eager(reduced_run):
    import numpy as np

    run_dir, meta, recs = reduced_run
    rec = recs["torch2.13.0-mha-torchscript-op17-openvino"]
    assert rec.stage == "parity"
    red = rec.graph["reduced"]
    assert red["nodes"] < red["original_nodes"] // 2 and red["check"].startswith("fails at parity")
    outcome = direct(meta, rec.bundle, "openvino")
    assert "raised" not in outcome, outcome
    # its output is the model's output: compare with the eager output stored in the bundle
    with np.load(f"{rec.bundle}/expected_shape2.npz") as eager:
        ref = eager["output_0"]
    got = np.asarray(outcome["values"][0])
    differs = outcome["shapes"][0] != list(ref.shape) or not np.allclose(got, ref.ravel()[:got.size], atol=1e-4, rtol=1e-3)
    assert differs


def test_report_and_rerun(reduced_run):
    run_dir, meta, recs = reduced_run
    md = (run_dir / "matrix.md").read_text(encoding="utf-8")
    assert "## Smallest failing graphs" in md and "149 → " in md
    html = (run_dir / "matrix.html").read_text(encoding="utf-8")
    assert "reduced.onnx" in html and 'id="reduced"' in html
    # the subcommand on one cell, within a budget
    proc = run_harness("reduce", str(run_dir), "--cell", "torch2.13.0-flatten_mean-dynamo-op17-dim-named-ort-cpu",
                       "--timeout", "60")
    assert "1 cell(s) reduced" in proc.stdout
    bad = run_harness("reduce", str(run_dir), "--cell", "torch2.13.0-nope", check=False)
    assert bad.returncode == 2 and "no cell 'torch2.13.0-nope'" in bad.stderr
    assert (TESTS / "matrices" / "reduce.yaml").exists()
