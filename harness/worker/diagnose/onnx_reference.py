"""What blame and the first-diverging-node search share: whether onnx.reference can judge a file,
and which stack frames are library code rather than the model's own (worker side)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.core.record import SPEC_REPOSITORY

REFERENCE_MAX_NODES = 5000            # larger graphs: no reference (minutes in numpy)
REFERENCE_MAX_BYTES = 512 * 2**20     # file plus external data

# Operators whose onnx.reference implementation leaves an input unused: a graph feeding it is
# judged without the reference ("no reference"), naming the gap.
REFERENCE_GAPS = {("LSTM", 4): "sequence_lens", ("GRU", 4): "sequence_lens", ("RNN", 4): "sequence_lens"}


def torch_relative(path: str) -> bool:
    """A path torch prints relative to its own package (``_export/non_strict_utils.py``,
    ``_ops.py``, ``fx/experimental/symbolic_shapes.py``): a file of the installed torch."""
    norm = path.replace("\\", "/")
    if not norm or norm.startswith(("/", "<", ".")) or ":" in norm[:3]:
        return False
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", "") or "") if torch is not None else ""
    if root and os.path.exists(os.path.join(root, norm)):
        return True
    # Without torch at hand: torch's own top-level files and folders.
    return norm.split("/", 1)[0] in _TORCH_TOP


_TORCH_TOP = {"_export", "_ops.py", "fx", "_dynamo", "_subclasses", "export", "onnx", "_refs", "_decomp",
              "_prims", "_prims_common", "nn", "utils", "_higher_order_ops", "_functorch", "_inductor",
              "_library", "_tensor.py", "functional.py", "__init__.py", "_guards.py", "_logging", "jit"}


def library_file(path: str) -> bool:
    """Frames of torch, the harness or the interpreter: not the model's own code (torch's own
    paths count also where torch prints them relative to its package)."""
    norm = path.replace("\\", "/")
    return ("/torch/" in norm or "/harness/" in norm or norm.startswith("<")
            or "/onnxscript/" in norm or "/onnx/" in norm or "/python3." in norm and "site-packages" not in norm
            or torch_relative(norm))


def model_file(path: str) -> bool:
    """Frames of the model's own code: not a library's, where the built-in probes
    (``harness/probes/``) count as models (they stand for the user's)."""
    norm = path.replace("\\", "/")
    return "/harness/probes/" in norm or not library_file(norm)


def reference_gap(model_path: Path) -> str | None:
    """Why onnx.reference cannot judge this file (None: it can): too large, or an operator whose
    reference implementation ignores an input the graph feeds."""
    import onnx

    size = model_path.stat().st_size + sum(p.stat().st_size for p in model_path.parent.glob(model_path.name + ".data"))
    if size > REFERENCE_MAX_BYTES:
        return f"graph too large for the reference ({size / 2**20:.0f} MiB)"
    model = onnx.load(str(model_path), load_external_data=False)
    nodes = list(model.graph.node)
    if len(nodes) > REFERENCE_MAX_NODES:
        return f"graph too large for the reference ({len(nodes)} nodes)"
    for node in nodes:
        for (op, index), what in REFERENCE_GAPS.items():
            if node.op_type == op and len(node.input) > index and node.input[index]:
                return (f"onnx.reference's {op} ignores its {what} input, which node {node.name or op} "
                        f"feeds ({SPEC_REPOSITORY}: onnx/reference/ops/op_{op.lower()}.py)")
    return None
