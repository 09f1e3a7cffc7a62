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
import os
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


def keep_identity_model(path: Path) -> None:
    """Write the identity model at ``path`` unless it is there (written whole or not at all: a
    process beside this one may be reading or writing it). A process that has onnx imported
    writes it once for a run; the latency workers then read it (``identity_call(model=path)``)
    instead of importing onnx (about a second) to write their own."""
    if path.is_file():
        return
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        write_identity_model(partial)
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


@contextlib.contextmanager
def identity_call(adapter_cls: type, threads: int | None, model: Path | None = None) -> Iterator[Callable[[], Any]]:
    """The adapter's timed call on an identity model (active for the block): ``model`` where it
    is a file (``keep_identity_model``), else one written here."""
    with tempfile.TemporaryDirectory(prefix="harness-binding-overhead-") as tmp:
        path = model if model is not None and model.is_file() else write_identity_model(Path(tmp) / "identity.onnx")
        adapter = adapter_cls(path, threads=threads)
        adapter.prepare([{"x": (1,)}])
        with adapter:
            yield adapter.timed_call({"x": np.zeros((1,), dtype=np.float32)})
