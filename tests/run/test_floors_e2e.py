"""Runtime floors with real ONNX Runtime wheels from the index: one run of tests/matrices/floors.yaml
(conv_bn, torch 2.13.0, both exporters) whose files are tried on onnxruntime 1.16.3 and 1.18.1 in
runtime-only environments, checked against the same wheels driven directly (no harness code).

The run is made by the product environment (tests/helpers.py: the project's declared
dependencies, no torch, onnx or runtime in the runner's process), as `nox -s matrix` makes it;
the gate reads it there too, with the deployed release the file was tried on and one it was not."""
from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from helpers import BOTH, FIXTURES, TESTS, product_python, run_harness, run_matrix

from harness.core.paths import envs_dir
from harness.core.record import read_records
from harness.envs.runtime_only import RuntimeRelease
from harness.matrix.config import load_matrix
from harness.store.runs import read_run_meta

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

pytestmark = pytest.mark.e2e


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
    assert dynamo.graph["runtime_versions"]["ort-cpu"]["1.18.1"]["status"] == "pass"
    assert not dynamo.passes_not_run and not script.passes_not_run
    # The deployed release: the runtime's own load error on the dynamo file, a pass on the other.
    assert dynamo.graph["deploy"]["ort-cpu"]["stage"] == "load"
    assert "Unsupported model IR version: 10, max supported IR version: 9" in dynamo.graph["deploy"]["ort-cpu"]["error"]
    assert script.graph["deploy"]["ort-cpu"]["status"] == "pass"
    md = (run / "matrix.md").read_text()
    assert "✅ ≥1.18.1 ✗1.16.3" in md and "## Runtime releases per file" in md
    html = (run / "matrix.html").read_text()
    assert 'id="releases"' in html and "≥1.18.1 ✗1.16.3" in html


def test_the_run_json_says_what_the_pass_did_and_the_product_environment_has_no_runtime(floors_run):
    run, _ = floors_run
    meta = read_run_meta(run)
    assert meta.extra["runtime_releases"]["cells"] == 2 and meta.extra["runtime_releases"]["files"] == 2
    assert meta.passes_not_run is None            # every pass ran: nothing listed
    assert meta.base_dir == str(TESTS / "matrices")
    # The runner that made it could not import what the tool does not declare.
    code = "import importlib.util as u; print([m for m in ('torch', 'onnx', 'onnxruntime', 'openvino', 'onnxscript') if u.find_spec(m)])"
    out = subprocess.run([str(product_python()), "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("deployed, code, says", [
    ("1.16.3", 1, "deployed runtime: needs onnxruntime >= 1.18.1: IR version 10 (1.16.3 reads up to 9); "
                  "you deploy onnxruntime 1.16.3"),
    ("1.18.1", 2, "onnxruntime 1.18.1 was not tried on the file"),
])
def test_the_gate_blocks_on_the_deployed_release_and_cannot_tell_without_it(floors_run, tmp_path, deployed, code, says):
    """Baseline: a stored run of torch 2.6.0 (no deploy facts); candidate: the floors run. Its
    files were tried on onnxruntime 1.16.3: deploying that blocks (the dynamo file needs 1.18.1);
    deploying 1.18.1, on which nothing was tried, is "cannot tell" (2), never "no regression"."""
    run, _ = floors_run
    config = tmp_path / "gate.yaml"
    config.write_text(MATRIX.read_text().replace('deploy: {ort-cpu: "1.16.3"}', f'deploy: {{ort-cpu: "{deployed}"}}'))
    proc = run_harness("gate", "--baseline", f"{FIXTURES / 'runs' / BOTH}@2.6.0", "--candidate", str(run),
                       "--config", str(config), "--output", str(tmp_path / "gate"), "--reports", str(tmp_path / "reports"),
                       check=False)
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    gate = json.loads((tmp_path / "gate" / "gate.json").read_text())
    details = [c["detail"] for c in gate["cells"] if c["candidate"] and c["candidate"]["run_id"] == read_run_meta(run).run_id]
    assert any(says in d for d in details) or says in proc.stdout + proc.stderr, details


def test_the_same_wheels_driven_directly_agree(floors_run, tmp_path):
    old, new = _python("1.16.3"), _python("1.18.1")
    out = lambda py, ir: subprocess.run([str(py), "-c", DIRECT, str(ir), str(tmp_path / f"m{ir}.onnx")],
                                        capture_output=True, text=True, check=True).stdout.strip()
    assert "Unsupported model IR version: 10, max supported IR version: 9" in out(old, 10)
    assert out(old, 9) == "loads" and out(new, 10) == "loads"
    # Runtime-only: the runtime, numpy and onnx; torch is not importable there.
    for py in (old, new):
        proc = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True)
        assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr
