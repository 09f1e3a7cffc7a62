"""Independent OpenVINO verdicts: plain torch.onnx.export (or a given file) + openvino.Core, no harness code.

Run inside an environment's python: ``python direct_openvino.py CELLS.json OUT.jsonl`` where each
item has {"target" ("module:function")} or {"case_file", "case_fn"}, "exporter", "opset", and
optionally "model" (an exported file to use instead of exporting, e.g. a failing cell's bundle).
One JSON verdict per line. Inputs, dims, the second shape and the judgement (atol / rtol and the
model's own float32 noise) are as in direct_verdict.py; each shape runs in a fresh infer request.
"""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import openvino as ov
import torch
from direct_verdict import (  # same folder: the plain-API helpers
    WORKDIR,
    export_failure,
    export_plain,
    flat,
    grow_structured,
    judge,
    leaves,
    load,
    main,
    noise_floors,
    read_case,
    resolve,
)

warnings.filterwarnings("ignore")


def case_function(item):
    if "case_file" in item:
        return load(item["case_file"], item["case_fn"])
    module, fn = item["target"].split(":")
    return getattr(importlib.import_module(module), fn)


def verdict(item) -> dict:
    model, args, kwargs, dims, second, params = read_case(case_function(item))
    keyed = resolve(dims, args, kwargs, params)
    tensors = [(n, k) for n, v, k in leaves(args, kwargs) if isinstance(v, torch.Tensor)]
    names = [n for n, _ in tensors]
    by_name = {n: keyed[k] for n, k in tensors if k in keyed}
    shapes = [(args, kwargs)]
    if second is not None:
        shapes.append(second)
    elif keyed:
        shapes.append(grow_structured(args, kwargs, keyed))
    with torch.no_grad():
        refs = [flat(model(*args, **kwargs))]
        if len(shapes) > 1:
            try:
                refs.append(flat(model(*shapes[1][0], **shapes[1][1])))
            except Exception:
                shapes = shapes[:1]   # eager refuses the second shape: the example decides
    path = item.get("model") or str(WORKDIR / "model.onnx")
    if not item.get("model"):
        try:
            export_plain(model, args, None, item["exporter"], item["opset"], path, kwargs=kwargs,
                         names=names, dims_by_name=by_name)
        except Exception as e:
            return export_failure(e)
    core = ov.Core()
    try:
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    except Exception as e:
        return {"stage": "load", "status": "fail", "error": str(e)[:300]}
    graph_inputs = [p.get_any_name() for p in compiled.inputs]
    outs = []
    for a, k in shapes:
        values = dict(zip(names, (v for _, v, _ in leaves(a, k) if isinstance(v, torch.Tensor))))
        if all(n in values for n in graph_inputs):
            feed = {n: values[n].numpy() for n in graph_inputs}
        else:
            feed = dict(zip(graph_inputs, (t.numpy() for t in values.values())))
        try:
            # A fresh request per shape: a reused one can hand back the previous shape's outputs.
            result = compiled.create_infer_request().infer(feed)
            outs.append([np.asarray(result[o]) for o in compiled.outputs])
        except Exception as e:
            return {"stage": "run", "status": "fail", "error": str(e)[:300]}
    floors = noise_floors(model, shapes, refs)
    for ref, out, shape_floors in zip(refs, outs, floors):
        try:
            assert len(ref) == len(out), "output count"
            for j, (r, o) in enumerate(zip(ref, out)):
                assert r.shape == o.shape, f"shape {o.shape} != eager {r.shape}"
                judge(o, r, item.get("atol", 1e-4), item.get("rtol", 1e-3), shape_floors[j] if shape_floors else None)
        except AssertionError as e:
            return {"stage": "parity", "status": "fail", "error": str(e)[:300]}
    return {"stage": None, "status": "pass", "error": None,
            "precision": str(compiled.get_property("INFERENCE_PRECISION_HINT"))}


if __name__ == "__main__":
    main(verdict)
