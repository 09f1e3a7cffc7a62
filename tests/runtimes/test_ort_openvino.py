"""ONNX Runtime's OpenVINO EP: verdicts and node placement agree with a plain session's profile,
a fall-back to the CPU provider is refused, a graph mostly on the CPU provider gets a note."""
from __future__ import annotations

import json
import subprocess

import pytest
from edge_helpers import compare, direct_verdicts
from helpers import ROOT, env_python, run_matrix


@pytest.fixture(scope="module")
def ov_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "ort_openvino", "ort_openvino.yaml")


@pytest.fixture(scope="module")
def ov_records(ov_run):
    from harness.core.record import read_records

    return read_records(ov_run / "results.jsonl")


@pytest.fixture(scope="module")
def ov_python(ov_run):
    return env_python(json.loads((ov_run / "run.json").read_text()), "2.13.0", "ort-openvino")


@pytest.mark.e2e
def test_passes_ran_on_the_openvino_ep_with_placement(ov_records):
    assert {r.status.value for r in ov_records} == {"pass"}, [(r.case, r.error) for r in ov_records]
    for r in ov_records:
        facts = r.graph["runtime_facts"]
        assert facts["providers"][0] == "OpenVINOExecutionProvider"
        assert facts["placement"]["OpenVINOExecutionProvider"] >= 1
        assert r.versions["runtime"] == "1.24.1"
    sdpa = next(r for r in ov_records if r.case == "sdpa")
    assert sdpa.graph["runtime_facts"]["placement"].get("CPUExecutionProvider", 0) >= 1   # its IsNaN


@pytest.mark.e2e
def test_verdicts_and_placement_match_a_plain_profiled_session(ov_records, ov_python, tmp_path):
    direct = direct_verdicts(ov_records, "ort-openvino", ov_python, tmp_path)
    assert compare(ov_records, "ort-openvino", direct) == []
    for r in ov_records:
        assert r.graph["runtime_facts"]["placement"] == direct[(r.case, r.exporter, r.opset)]["placement"], r.case


SCRIPT = """
import json, sys
import numpy as np
from onnx import TensorProto, helper, save
from harness.runtimes.ort_openvino import OrtOpenVinoAdapter
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
nodes = [helper.make_node("IsNaN", ["x"], [f"y{i}"]) for i in range(3)] + [helper.make_node("Relu", ["x"], ["z"])]
outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.BOOL, [4]) for i in range(3)]
g = helper.make_graph(nodes, "g", [x], outs + [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
save(m, sys.argv[1])
a = OrtOpenVinoAdapter(sys.argv[1], threads=1)
a.activate(); a.infer({"x": np.array([1, np.nan, -1, 2], np.float32)}); a.deactivate()
try:
    OrtOpenVinoAdapter(sys.argv[1], threads=1, options={"device_type": "NPU"}).activate()
    refused = None
except Exception as e:
    refused = f"{type(e).__name__}: {e}"
print(json.dumps({"facts": a.facts, "refused": refused}))
"""


@pytest.mark.e2e
def test_cpu_fallback_is_refused_and_a_mostly_cpu_graph_gets_a_note(ov_python, tmp_path):
    out = subprocess.run([str(ov_python), "-c", SCRIPT, str(tmp_path / "isnan.onnx")], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT)}, timeout=300).stdout
    got = json.loads(out.splitlines()[-1])
    # No NPU here: ONNX Runtime drops the OpenVINO EP and runs the session on the CPU provider.
    assert got["refused"].startswith("ProviderFallbackError: ONNX Runtime did not activate OpenVINOExecutionProvider")
    assert got["facts"]["placement"] == {"CPUExecutionProvider": 3, "OpenVINOExecutionProvider": 1}
    assert "runs mostly on the fall-back CPUExecutionProvider: 3 of the file's 4 nodes" in got["facts"]["notes"][0]


def test_ep_errors_keep_openvinos_words_without_cpp_frames():
    from harness.runtimes.ort_openvino import summarise_error

    # as ONNX Runtime 1.24.1 / OpenVINO EP raised it for repeat_interleave (TorchScript, opset 18)
    text = ("[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: /onnxruntime/onnxruntime/core/providers/"
            "openvino/backends/basic_backend.cc:136 onnxruntime::openvino_ep::BasicBackend::BasicBackend(std::unique_ptr"
            "<onnx::ModelProto>&, onnxruntime::openvino_ep::SessionContext&) /onnxruntime/onnxruntime/core/providers/"
            "openvino/ov_interface.cc:28 auto onnxruntime::openvino_ep::OvExceptionBoundary(Func&&) [with bool typed = "
            "false] [OpenVINO-EP] Exception while Loading Network for graph OpenVINOExecutionProvider_OpenVINO-EP-"
            "subgraph_23_0: Exception from src/inference/src/cpp/core.cpp:114:\n"
            "Exception from src/inference/src/dev/plugin.cpp:53:\n"
            "Check '!shape.rank().is_dynamic()' failed at src/plugins/intel_cpu/src/node.cpp:106:\n"
            "Unexpected: CPU plug-in doesn't support Parameter operation with dynamic rank. Operation name: /SequenceAt_output_0\n")
    assert summarise_error(text) == (
        "[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: [OpenVINO-EP] Exception while Loading "
        "Network for graph OpenVINOExecutionProvider_OpenVINO-EP-subgraph_23_0: Unexpected: CPU plug-in doesn't "
        "support Parameter operation with dynamic rank. Operation name: /SequenceAt_output_0")
