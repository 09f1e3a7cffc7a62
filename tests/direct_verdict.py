"""Independent verdicts: plain torch.onnx.export + onnx checker + ONNX Runtime, no harness code.

Run inside an environment's python: ``python direct_verdict.py CELLS.json OUT.jsonl`` where the file lists
{"case_file", "case_fn", "exporter", "opset"} items; writes one JSON verdict per line. Tests compare
these with the harness's records: a harness `pass` that this script fails is the bug we fear most.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

warnings.filterwarnings("ignore")


def load(path: str, fn: str):
    spec = importlib.util.spec_from_file_location("direct_case", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def grow(inputs, dims):
    sizes = {}
    for i, ds in dims.items():
        for d, name in ds.items():
            sizes.setdefault(name, inputs[i].shape[d] + 1)
    out = []
    for i, x in enumerate(inputs):
        for d, name in sorted(dims.get(i, {}).items()):
            extra = sizes[name] - x.shape[d]
            x = torch.cat([x, x.narrow(d, 0, extra)], d)
        out.append(x)
    return tuple(out)


def flat(o):
    if isinstance(o, torch.Tensor):
        return [o.detach().numpy()]
    if isinstance(o, dict):
        return [y for x in o.values() for y in flat(x)]
    if isinstance(o, (list, tuple)):
        return [y for x in o for y in flat(x)]
    return []


def export_plain(model, inputs, dims, exporter: str, opset: int, path: str, policy: str | None = None):
    """torch.onnx.export as a user calls it: dynamic_axes for TorchScript, Dim.DYNAMIC for dynamo
    (or, with a dim policy, Dim.AUTO / Dim("name"))."""
    names = [f"input_{i}" for i in range(len(inputs))]
    if exporter == "torchscript":
        return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=False, input_names=names,
                                 dynamic_axes={f"input_{i}": d for i, d in dims.items()} or None)
    from torch.export import Dim

    named = {}
    mark = {None: lambda n: Dim.DYNAMIC, "dynamic": lambda n: Dim.DYNAMIC, "auto": lambda n: Dim.AUTO,
            "named": lambda n: named.setdefault(n, Dim(n))}[policy]
    ds = tuple({d: mark(n) for d, n in dims[i].items()} if i in dims else None for i in range(len(inputs)))
    return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=True, input_names=names,
                             dynamic_shapes=ds if dims else None)


def fixed_dims(program, path: str, dims) -> dict:
    """Declared dynamic dims that are a number in the file's inputs or a one-value range in the
    exported program: {"input_0": {1: 6}}."""
    graph = onnx.load(path).graph
    ranges = getattr(getattr(program, "exported_program", None), "range_constraints", {}) or {}
    placeholders = []
    if getattr(program, "exported_program", None) is not None:
        placeholders = [n.meta["val"] for n in program.exported_program.graph.nodes if n.op == "placeholder"]
    out = {}
    for i, ds in dims.items():
        shape = graph.input[i].type.tensor_type.shape.dim
        for d in ds:
            dim = shape[d]
            value = dim.dim_value if dim.HasField("dim_value") else (
                int(dim.dim_param) if dim.dim_param.isdigit() else None)
            if value is None and i < len(placeholders):
                size = placeholders[i].shape[d]
                rng = ranges.get(getattr(getattr(size, "node", None), "expr", None))
                if isinstance(size, int):
                    value = size
                elif rng is not None and rng.lower == rng.upper:
                    value = int(rng.lower)
            if value is not None:
                out.setdefault(f"input_{i}", {})[d] = value
    return out


def verdict(item) -> dict:
    torch.manual_seed(0)
    res = load(item["case_file"], item["case_fn"])()
    model, inputs = res[0], tuple(res[1])
    dims = {int(k): {int(d): n for d, n in v.items()} for k, v in (res[2] if len(res) == 3 else {}).items()}
    model.eval()
    names = [f"input_{i}" for i in range(len(inputs))]
    path = "/tmp/direct_verdict.onnx"
    shapes = [inputs] + ([grow(inputs, dims)] if dims else [])
    with torch.no_grad():
        refs = [flat(model(*x)) for x in shapes]
    try:
        program = export_plain(model, inputs, dims, item["exporter"], item["opset"], path, item.get("dim_policy"))
    except Exception as e:
        return {"stage": "export", "status": "fail", "error": f"{type(e).__name__}: {e}"[:200]}
    fixed = fixed_dims(program, path, dims)
    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:
        return {"stage": "check", "status": "fail", "error": str(e)[:200], "fixed": fixed}
    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:
        return {"stage": "load", "status": "fail", "error": str(e)[:200], "fixed": fixed}
    graph_inputs = [i.name for i in sess.get_inputs()]
    outs = []
    for x in shapes:
        feed = {n: t.numpy() for n, t in zip(names, x) if n in graph_inputs}
        try:
            outs.append(sess.run(None, feed))
        except Exception as e:
            return {"stage": "run", "status": "fail", "error": str(e)[:200], "fixed": fixed}
    for ref, out in zip(refs, outs):
        try:
            assert len(ref) == len(out), "output count"
            for r, o in zip(ref, out):
                assert r.shape == o.shape and r.dtype == o.dtype, "shape/dtype"
                np.testing.assert_allclose(o, r, rtol=item.get("rtol", 1e-3), atol=item.get("atol", 1e-4))
        except AssertionError as e:
            return {"stage": "parity", "status": "fail", "error": str(e)[:200], "fixed": fixed}
    return {"stage": None, "status": "pass", "error": None, "fixed": fixed}


if __name__ == "__main__":
    with open(sys.argv[2], "w") as out:
        for item in json.load(open(sys.argv[1])):
            out.write(json.dumps({**item, **verdict(item)}) + "\n")
            out.flush()
