"""Runtime floors with real ONNX Runtime wheels from the index: one run of tests/matrices/floors.yaml
(conv_bn, torch 2.13.0, both exporters) whose files are tried on onnxruntime 1.16.3 and 1.18.1 in
runtime-only environments, checked against the same wheels driven directly (no harness code)."""
from __future__ import annotations

import subprocess
import textwrap

import pytest
from helpers import TESTS, run_matrix

from harness.core.paths import envs_dir
from harness.core.record import read_records
from harness.envs.runtime_only import RuntimeRelease
from harness.matrix.config import load_matrix

MATRIX = TESTS / "matrices" / "floors.yaml"

# A one-node graph written with a given IR version, loaded with the runtime's own API.
DIRECT = textwrap.dedent("""
    import sys, onnx, onnxruntime
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = int(sys.argv[1])
    onnx.save(m, sys.argv[2])
    try:
        onnxruntime.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
        print("loads")
    except Exception as exc:
        print(exc)
""")


@pytest.fixture(scope="module")
def floors_run(tmp_path_factory):
    run = run_matrix(tmp_path_factory, "floors", "floors.yaml")
    return run, {r.exporter: r for r in read_records(run / "results.jsonl")}


def _python(version: str):
    spec = RuntimeRelease("ort-cpu", version).spec("3.11", load_matrix(MATRIX).install)
    return envs_dir() / spec.name / "bin" / "python"


def test_the_dynamo_file_needs_a_newer_onnxruntime_than_the_torchscript_one(floors_run):
    run, by_exporter = floors_run
    dynamo, script = by_exporter["dynamo"], by_exporter["torchscript"]
    assert dynamo.status.value == script.status.value == "pass"
    assert dynamo.graph["onnx_file"]["ir_version"] == 10
    assert script.graph["onnx_file"]["ir_version"] <= 9
    floor = dynamo.graph["runtime_floor"]["ort-cpu"]
    assert (floor["oldest_ok"], floor["first_bad"]) == ("1.18.1", "1.16.3")
    assert floor["reason"] == "needs onnxruntime >= 1.18.1: IR version 10 (1.16.3 reads up to 9)"
    assert script.graph["runtime_floor"]["ort-cpu"]["oldest_ok"] == "1.16.3"
    # The deployed release: the runtime's own load error on the dynamo file, a pass on the other.
    assert dynamo.graph["deploy"]["ort-cpu"]["stage"] == "load"
    assert "Unsupported model IR version: 10, max supported IR version: 9" in dynamo.graph["deploy"]["ort-cpu"]["error"]
    assert script.graph["deploy"]["ort-cpu"]["status"] == "pass"
    md = (run / "matrix.md").read_text()
    assert "✅ ≥1.18.1 ✗1.16.3" in md and "## Runtime releases per file" in md
    html = (run / "matrix.html").read_text()
    assert 'id="releases"' in html and "≥1.18.1 ✗1.16.3" in html


def test_the_same_wheels_driven_directly_agree(floors_run, tmp_path):
    old, new = _python("1.16.3"), _python("1.18.1")
    out = lambda py, ir: subprocess.run([str(py), "-c", DIRECT, str(ir), str(tmp_path / f"m{ir}.onnx")],  # noqa: E731
                                        capture_output=True, text=True, check=True).stdout.strip()
    assert "Unsupported model IR version: 10, max supported IR version: 9" in out(old, 10)
    assert out(old, 9) == "loads" and out(new, 10) == "loads"
    # Runtime-only: the runtime, numpy and onnx; torch is not importable there.
    for py in (old, new):
        proc = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True)
        assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr
