"""The blame ladder's reference rung runs in a capped copy of the worker: its outcomes, its cap
and a copy that dies, each against what the ONNX reference evaluator says when called directly."""
from __future__ import annotations

import faulthandler
import os
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from harness.worker.diagnose import blame


@pytest.fixture()
def reshape_file(tmp_path):
    """y = reshape(x, [2, 6]): the file rejects any x without 12 elements."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [2, 6])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _feeds(*rows: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.arange(r * 4, dtype=np.float32).reshape(r, 4)} for r in rows]


def test_agrees_differs_and_fails_as_the_evaluator_does(reshape_file):
    feeds = _feeds(3)
    direct = ReferenceEvaluator(onnx.load(reshape_file)).run(None, feeds[0])
    agrees = blame.reference_rung(reshape_file, feeds, [direct], 1e-6, 1e-6)
    assert agrees["outcome"] == "agrees", agrees
    differs = blame.reference_rung(reshape_file, feeds, [[direct[0] + 1]], 1e-6, 1e-6)
    assert differs["outcome"] == "differs", differs
    # A second shape eager accepts and the file's fixed reshape cannot take.
    fails = blame.reference_rung(reshape_file, _feeds(3, 5), [direct, [np.zeros((4, 5), np.float32)]], 1e-6, 1e-6)
    assert fails["outcome"] == "fails" and fails["detail"].startswith("second shape: "), fails
    with pytest.raises(Exception) as direct_error:
        ReferenceEvaluator(onnx.load(reshape_file)).run(None, _feeds(5)[0])
    assert type(direct_error.value).__name__ in fails["detail"]


def test_a_reference_past_its_cap_is_no_reference(reshape_file, monkeypatch):
    monkeypatch.setenv(blame.REFERENCE_CAP_ENV, "0.000001")
    before = set(_children())   # what earlier tests in this process left (pool workers, a tracker)
    rung = blame.reference_rung(reshape_file, _feeds(3), [[np.zeros((2, 6), np.float32)]], 1e-6, 1e-6)
    assert (rung["outcome"], rung["detail"]) == ("no-reference", "the reference evaluator ran past 1e-06 s")
    left = [p for p in set(_children()) - before if _state(p) != "Z"]
    assert not left, f"the capped copy was left running: {left}"


def test_a_reference_copy_that_dies_is_no_reference_with_how(reshape_file, monkeypatch):
    def dies(folder):
        faulthandler.disable()   # pytest's handler would print the copy's stack on the test's stderr
        os.write(2, b"about to die\n")
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(blame, "_reference_main", dies)
    rung = blame.reference_rung(reshape_file, _feeds(3), [[np.zeros((2, 6), np.float32)]], 1e-6, 1e-6)
    assert rung["outcome"] == "no-reference", rung
    assert "killed by signal SIGSEGV" in rung["detail"] and "about to die" in rung["detail"], rung


def _children() -> list[int]:
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as fh:
        return [int(p) for p in fh.read().split()]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
