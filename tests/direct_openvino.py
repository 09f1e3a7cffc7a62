"""Independent OpenVINO verdicts: plain torch.onnx.export (or a given file) + openvino.Core, no harness code.

Run inside an environment's python: ``python direct_openvino.py CELLS.json OUT.jsonl`` where each
item has {"target" ("module:function"), "exporter", "opset"} and optionally "model" (an exported
file to use instead of exporting, e.g. a failing cell's bundle). One JSON verdict per line.
"""
from __future__ import annotations

import importlib
import json
import sys
import warnings

import numpy as np
import openvino as ov
import torch
from direct_verdict import (  # same folder: the plain-API helpers
    export_plain,
    flat,
    grow,
)

warnings.filterwarnings("ignore")


def export(model, inputs, dims, item, path):
    export_plain(model, inputs, dims, item["exporter"], item["opset"], path)


def verdict(item) -> dict:
    torch.manual_seed(0)
    module, fn = item["target"].split(":")
    res = getattr(importlib.import_module(module), fn)()
    model, inputs = res[0].eval(), tuple(res[1])
    dims = {int(k): {int(d): n for d, n in v.items()} for k, v in (res[2] if len(res) == 3 else {}).items()}
    shapes = [inputs] + ([grow(inputs, dims)] if dims else [])
    with torch.no_grad():
        refs = [flat(model(*x)) for x in shapes]
    path = item.get("model") or "/tmp/direct_openvino.onnx"
    if not item.get("model"):
        try:
            export(model, inputs, dims, item, path)
        except Exception as e:
            return {"stage": "export", "status": "fail", "error": f"{type(e).__name__}: {e}"[:200]}
    core = ov.Core()
    try:
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    except Exception as e:
        return {"stage": "load", "status": "fail", "error": str(e)[:300]}
    graph_inputs = [p.get_any_name() for p in compiled.inputs]
    outs = []
    for x in shapes:
        tensors = [t for t in x if isinstance(t, torch.Tensor)]
        feed = dict(zip(graph_inputs, (t.numpy() for t in tensors)))
        try:
            result = compiled(feed)
            outs.append([np.asarray(result[o]) for o in compiled.outputs])
        except Exception as e:
            return {"stage": "run", "status": "fail", "error": str(e)[:300]}
    for ref, out in zip(refs, outs):
        try:
            assert len(ref) == len(out), "output count"
            for r, o in zip(ref, out):
                assert r.shape == o.shape, f"shape {o.shape} != eager {r.shape}"
                np.testing.assert_allclose(o, r, rtol=item.get("rtol", 1e-3), atol=item.get("atol", 1e-4))
        except AssertionError as e:
            return {"stage": "parity", "status": "fail", "error": str(e)[:300]}
    return {"stage": None, "status": "pass", "error": None,
            "precision": str(compiled.get_property("INFERENCE_PRECISION_HINT"))}


if __name__ == "__main__":
    with open(sys.argv[2], "w") as out:
        for item in json.load(open(sys.argv[1])):
            out.write(json.dumps({**item, **verdict(item)}) + "\n")
            out.flush()
