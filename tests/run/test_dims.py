"""Dim policies, the file's input/output facts and silent specialisation, in process; real
exports with each policy, compared with a plain export, are in test_dims_e2e.py."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from harness.worker.dims import (
    digit_symbols,
    fixed_size,
    io_facts,
    note_specialised,
    specialised_dims,
)
from harness.worker.export import graph_facts


def test_markers_per_policy():
    from torch.export import Dim

    from harness.worker.export import DIM_DYNAMIC, dim_marker, dim_marking, policy_marking

    assert dim_marker(policy_marking("dynamic"))("seq") is Dim.DYNAMIC
    assert dim_marker(policy_marking("auto"))("seq") is Dim.AUTO
    assert dim_marking() == DIM_DYNAMIC   # what torch.onnx does with dynamic_axes on this release
    named = dim_marker(policy_marking("named"))
    assert named("seq") is named("seq") and named("seq").__name__ == "seq"
    assert named("batch") is not named("seq")
    assert dim_marker(policy_marking("named"))("my dim").__name__ == "my_dim"   # identifiers only
    with pytest.raises(KeyError):
        policy_marking("fixed")


def _model(path: Path, dims: list) -> Path:
    x = helper.make_tensor_value_info("input_0", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("output_0", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["input_0"], ["output_0"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_io_facts_keep_symbolic_names_sizes_and_unknowns(tmp_path):
    facts = graph_facts(_model(tmp_path / "m.onnx", ["batch", 6, None]))
    assert facts["io"]["inputs"] == [{"name": "input_0", "dtype": "float", "shape": ["batch", 6, None]}]
    assert facts["io"]["outputs"] == [{"name": "output_0", "dtype": "float", "shape": None}]
    assert facts["inputs"] == ["input_0"]     # the older key stays
    assert io_facts(onnx.load(str(tmp_path / "m.onnx")))["inputs"][0]["shape"][1] == 6
    # A dim_param is a symbol whatever its name: torch 2.6 names dynamic dims '2' (runs at any size).
    assert [fixed_size(d) for d in (6, "6", "s0", None)] == [6, None, None, None]


def test_fixed_dims_read_from_the_file_name_the_declared_dim(tmp_path):
    dims = {"input_0": {0: "batch", 1: "seq"}}
    graph = graph_facts(_model(tmp_path / "m.onnx", ["2", 6, 8]))   # batch named '2', seq a number
    found = specialised_dims(dims, ["input_0"], graph)
    assert [(f["dim"], f["axis"], f["value"]) for f in found] == [("seq", 1, 6)]
    assert found[0]["note"] == "seq was fixed to 6 by the exporter (input_0 dim 1)"
    assert specialised_dims(dims, ["input_0"], graph_facts(_model(tmp_path / "d.onnx", ["b", "s", 8]))) == []
    notes, pinned = note_specialised(graph, dims, ["input_0"])
    assert notes == [found[0]["note"]] and graph["specialised"] == found and pinned == []
    assert digit_symbols(dims, graph) == [
        ("batch is named '2' in the file (input_0 dim 0): a symbol, not a size (torch names it after the "
         "example's size when it ignores a guard); the file keeps it dynamic")]


def _program(shape: list, ranges: dict) -> SimpleNamespace:
    """What torch.onnx.export(dynamo=True) returns, as far as specialised_dims reads it."""
    sizes = [s if isinstance(s, int) else SimpleNamespace(node=SimpleNamespace(expr=s)) for s in shape]
    node = SimpleNamespace(op="placeholder", name="x", meta={"val": SimpleNamespace(shape=sizes)})
    ep = SimpleNamespace(graph=SimpleNamespace(nodes=[node]), range_constraints=ranges,
                         graph_signature=SimpleNamespace(user_inputs=["x"]))
    return SimpleNamespace(exported_program=ep)


def test_dims_only_the_exported_program_pins_are_candidates(tmp_path):
    """torch 2.13 with Dim.AUTO: the file keeps the symbol 's27' for seq, but the program's range
    for it is [6, 6]: a candidate for the second shape to confirm, never a note by itself."""
    dims = {"input_0": {0: "batch", 1: "seq"}}
    graph = graph_facts(_model(tmp_path / "m.onnx", ["s77", "s27", 8]))
    one_value = SimpleNamespace(lower=6, upper=6)
    open_range = SimpleNamespace(lower=2, upper=float("inf"))
    program = _program(["s77", "s27", 8], {"s77": open_range, "s27": one_value})
    found = specialised_dims(dims, ["input_0"], graph, program)
    assert [(f["dim"], f["value"], f["where"], f["symbol"]) for f in found] == [("seq", 6, "exported program", "s27")]
    notes, pinned = note_specialised(graph, dims, ["input_0"], program)
    assert notes == [] and "specialised" not in graph and pinned == found
    assert specialised_dims(dims, ["input_0"], graph, _program(["s77", "s27", 8], {})) == []
    # a program that does not look like one is ignored, never an error
    assert specialised_dims(dims, ["input_0"], graph, SimpleNamespace(exported_program=object())) == []
