"""The binding overhead: a runtime's per-call cost through its Python binding, measured as its
adapter running an identity model.

A sub-0.1 ms latency is mostly the binding's own cost (argument conversion, output allocation,
the call into C++); timing the same adapter call on a one-element Identity graph measures that
overhead, so a report can show a micro model's latency against it (not to be confused with a
*runtime floor*, the oldest runtime release that loads a file: ``harness.run.post.runtime_floors``).
onnx is imported lazily.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

IDENTITY_OPSET = 13
IDENTITY_IR = 7      # the oldest IR opset 13 allows: every runtime version in the matrix reads it


def write_identity_model(path: Path) -> Path:
    """A graph y = Identity(x) over float32[1]."""
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", IDENTITY_OPSET)])
    model.ir_version = IDENTITY_IR
    save(model, str(path))
    return Path(path)


@contextlib.contextmanager
def identity_call(adapter_cls: type, threads: int | None) -> Iterator[Callable[[], Any]]:
    """The adapter's timed call on an identity model (active for the block)."""
    with tempfile.TemporaryDirectory(prefix="harness-binding-overhead-") as tmp:
        adapter = adapter_cls(write_identity_model(Path(tmp) / "identity.onnx"), threads=threads)
        adapter.prepare([{"x": (1,)}])
        with adapter:
            yield adapter.timed_call({"x": np.zeros((1,), dtype=np.float32)})
