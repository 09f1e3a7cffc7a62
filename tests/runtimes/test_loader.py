"""The adapters' loader (``LoadOptions`` → ``SessionLoader``) and their one way in and out
(``with adapter:`` / ``ActiveAdapters``), run in process on real ONNX Runtime and OpenVINO."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.runtimes.base import ActiveAdapters, LoadOptions, RuntimeAdapter, RuntimeUnavailable
from harness.runtimes.openvino import OpenVinoAdapter
from harness.runtimes.ort_cpu import OrtCpuAdapter
from harness.runtimes.ort_session import SessionLoader

A = np.array([1.0, 2.0, 3.0], dtype=np.float32)
B = np.array([10.0, 20.0, 30.0], dtype=np.float32)


def foldable(path: Path) -> Path:
    """y = Identity(x) + (a + b): ORT's default level folds a + b and drops the Identity, so the
    graph it runs has fewer nodes than the file when (and only when) its optimisations are on."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    nodes = [helper.make_node("Identity", ["x"], ["x1"]), helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Add", ["x1", "c"], ["y"])]
    graph = helper.make_graph(nodes, "foldable", [x], [y],
                              [numpy_helper.from_array(A, "a"), numpy_helper.from_array(B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("on", [True, False])
def test_the_optimisations_option_reaches_the_session_that_runs(tmp_path, on):
    model, written = foldable(tmp_path / "m.onnx"), tmp_path / "optimized.onnx"
    x = np.array([1.0, -1.0, 0.5], dtype=np.float32)
    with OrtCpuAdapter(model, load=LoadOptions(graph_optimizations=on, optimized_model=written)) as adapter:
        level = adapter.session.get_session_options().graph_optimization_level
        (y,) = adapter.infer({"x": x})
    assert level == (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if on else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    ran = [n.op_type for n in onnx.load(str(written)).graph.node]
    assert ran == (["Add"] if on else ["Identity", "Add", "Add"]), ran
    np.testing.assert_allclose(y, x + A + B)


def test_a_cell_runs_the_default_level_and_one_thread_per_operator_when_asked(tmp_path):
    loader = OrtCpuAdapter(foldable(tmp_path / "m.onnx"), threads=2).loader()
    opts = loader.session_options()
    assert (opts.graph_optimization_level, opts.intra_op_num_threads, opts.inter_op_num_threads) == \
        (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, 2, 1)
    assert loader.providers == ("CPUExecutionProvider",)


def test_a_runtime_without_the_loader_option_refuses_it(tmp_path):
    """OpenVINO compiles with its own passes: "optimisations off" is not something it can honour,
    so it says so instead of answering an optimised run."""
    adapter = OpenVinoAdapter(foldable(tmp_path / "m.onnx"), load=LoadOptions(graph_optimizations=False))
    with pytest.raises(RuntimeUnavailable, match="no loader option graph_optimizations"), adapter:
        pass
    assert not adapter.is_active
    with OpenVinoAdapter(tmp_path / "m.onnx") as plain:   # its default loader runs
        np.testing.assert_allclose(plain.infer({"x": np.zeros(3, np.float32)})[0], A + B)


def test_blames_optimisation_rungs_ask_the_loader_for_their_level(tmp_path, monkeypatch):
    from harness.worker.diagnose.blame import _ort_rung

    asked = []
    real = SessionLoader.__call__

    def spy(self):
        asked.append(self.graph_optimizations)
        return real(self)

    monkeypatch.setattr(SessionLoader, "__call__", spy)
    model, x = foldable(tmp_path / "m.onnx"), np.ones(3, dtype=np.float32)
    for name, level in (("ort-disable-all", "ORT_DISABLE_ALL"), ("ort-default", "ORT_ENABLE_ALL")):
        rung = _ort_rung(name, model, level, [{"x": x}], [[x + A + B]], 1e-5, 1e-5, 1)
        assert rung["outcome"] == "agrees", rung
        rung = _ort_rung(name, model, level, [{"x": x}], [[x + A]], 1e-5, 1e-5, 1)
        assert rung["outcome"] == "differs", rung
    assert asked == [False, False, True, True]


class _Closes(RuntimeAdapter):
    """An adapter whose session will not close (a runtime's own bug at teardown)."""
    name = "closes-badly"

    def activate_impl(self) -> None: ...
    def input_names_impl(self) -> list[str]: return []
    def infer_impl(self, feeds): return []
    def deactivate_impl(self) -> None: raise OSError("teardown failed")


def test_a_failed_close_is_logged_and_never_replaces_the_outcome(tmp_path, capsys):
    adapter = _Closes(tmp_path / "none.onnx")
    with pytest.raises(KeyError, match="the cell's own failure"), ActiveAdapters() as active:
        active.enter_context(adapter)
        raise KeyError("the cell's own failure")
    active = ActiveAdapters()
    active.enter_context(_Closes(tmp_path / "none.onnx"))
    active.close()   # nothing raised
    assert capsys.readouterr().out.count("did not deactivate: OSError: teardown failed") == 2


def test_divergence_reads_the_values_ort_would_fold_away(tmp_path, monkeypatch):
    """Without the reference evaluator, divergence asks ONNX Runtime with optimisations off: the
    Identity's and the folded constant's values are there to compare."""
    import harness.worker.diagnose.onnx_reference as onnx_reference
    from harness.worker.diagnose.divergence import onnx_values

    monkeypatch.setattr(onnx_reference, "reference_gap", lambda path: "an operator it lacks")
    x = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    values, source = onnx_values(foldable(tmp_path / "m.onnx"), {"x": x}, {"x1", "c", "y"})
    assert source == "ort-disable-all"
    np.testing.assert_allclose(values["x1"], x)
    np.testing.assert_allclose(values["c"], A + B)
    np.testing.assert_allclose(values["y"], x + A + B)
