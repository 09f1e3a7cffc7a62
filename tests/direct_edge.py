"""Independent verdicts on the edge runtimes: plain torch.onnx.export (or a given file), then the
runtime's own API, no harness code. ``python direct_edge.py RUNTIME CELLS.json OUT.jsonl``.

RUNTIME is ``opencv-dnn`` (cv2.dnn), ``ort-openvino`` (onnxruntime with the OpenVINO execution
provider, refused unless that provider is the session's first) or ``ort-node`` / ``ort-web``
(tests/direct_node.mjs in plain Node.js; NODE_MODULES names the folder holding node_modules).
Items are as for direct_openvino.py; one JSON verdict per line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

try:
    import onnxruntime  # noqa: F401 - direct_verdict imports it; the helpers used here do not need it
    _stub = False
except ImportError:      # the Node.js environment has no Python ONNX Runtime: a stub for that import only
    import types

    sys.modules["onnxruntime"], _stub = types.ModuleType("onnxruntime"), True
from direct_verdict import WORKDIR, export_plain, flat, grow_structured, leaves, load, read_case, resolve

if _stub:
    del sys.modules["onnxruntime"]   # torch.onnx must not find it

warnings.filterwarnings("ignore")
HERE = Path(__file__).resolve().parent


def case_function(item):
    if "case_file" in item:
        return load(item["case_file"], item["case_fn"])
    module, fn = item["target"].split(":")
    return getattr(__import__(module, fromlist=[fn]), fn)


THREADS = int(os.environ.get("THREADS", "1"))   # as the matrices here run (threads: 1)
EXTRA: dict = {}   # what a runner reports beside the outputs (ort-openvino: nodes per provider)


class Refused(Exception):
    def __init__(self, stage, error):
        super().__init__(error)
        self.stage, self.error = stage, error


def graph_io(path):
    g = onnx.load(path, load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    return [i.name for i in g.input if i.name not in inits], [o.name for o in g.output]


def run_opencv(path, feeds_list):
    import cv2

    ins, outs = graph_io(path)
    try:
        net = cv2.dnn.readNetFromONNX(path)
    except cv2.error as e:
        raise Refused("load", str(e)) from None
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    results = []
    for feeds in feeds_list:
        try:
            for name in ins:
                net.setInput(feeds[name], name)
            results.append([np.array(o) for o in net.forward(outs)])
        except cv2.error as e:
            raise Refused("run", str(e)) from None
    return results


def run_ort_openvino(path, feeds_list):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.enable_profiling = True          # the first run's profile: which provider ran each node
    opts.profile_file_prefix = str(WORKDIR / "ovep")
    try:
        # the matrix's configuration: one thread (THREADS), fp32
        sess = ort.InferenceSession(path, opts, providers=[("OpenVINOExecutionProvider", {
            "device_type": "CPU", "precision": "FP32", "num_of_threads": THREADS}), "CPUExecutionProvider"])
    except Exception as e:
        raise Refused("load", str(e)) from None
    if sess.get_providers()[0] != "OpenVINOExecutionProvider":
        raise Refused("load", f"OpenVINO EP not active: {sess.get_providers()}")
    names = [i.name for i in sess.get_inputs()]
    out = []
    for feeds in feeds_list:
        try:
            out.append(sess.run(None, {n: feeds[n] for n in names}))
        except Exception as e:
            raise Refused("run", str(e)) from None
        if "placement" not in EXTRA:
            nodes = {}
            for e in json.loads(Path(sess.end_profiling()).read_text()):
                if e.get("cat") == "Node" and e.get("args", {}).get("provider"):
                    nodes.setdefault(e["args"]["provider"], set()).add(e["name"].replace("_kernel_time", ""))
            EXTRA["placement"] = {p: len(v) for p, v in nodes.items()}
    return out


def run_node(backend, path, feeds_list):
    ins, _ = graph_io(path)
    results = []
    for feeds in feeds_list:
        with tempfile.TemporaryDirectory() as tmp:
            meta = []
            for i, name in enumerate(ins):
                arr = np.ascontiguousarray(feeds[name])
                (Path(tmp) / f"in{i}.bin").write_bytes(arr.tobytes())
                meta.append({"name": name, "dtype": str(arr.dtype), "dims": list(arr.shape), "file": f"in{i}.bin"})
            (Path(tmp) / "inputs.json").write_text(json.dumps(meta))
            g = onnx.load(path, load_external_data=False).graph   # external data a page must hand over
            (Path(tmp) / "external.json").write_text(json.dumps(sorted(
                {e.value for i in g.initializer for e in i.external_data if e.key == "location"})))
            proc = subprocess.run(["node", str(HERE / "direct_node.mjs"), backend, os.environ["NODE_MODULES"],
                                   path, tmp], capture_output=True, text=True, timeout=300)
            reply = json.loads((Path(tmp) / "outputs.json").read_text()) if (Path(tmp) / "outputs.json").exists() \
                else {"stage": "run", "error": f"node exited {proc.returncode}: {proc.stderr[-300:]}"}
            if "error" in reply:
                raise Refused(reply["stage"], reply["error"])
            results.append([np.frombuffer((Path(tmp) / o["file"]).read_bytes(), dtype=o["dtype"]).reshape(o["dims"])
                            for o in reply["outputs"]])
    return results


RUNNERS = {"opencv-dnn": run_opencv, "ort-openvino": run_ort_openvino,
           "ort-node": lambda p, f: run_node("node", p, f), "ort-web": lambda p, f: run_node("web", p, f)}


def verdict(runtime, item) -> dict:
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
                shapes = shapes[:1]
    path = item.get("model") or str(WORKDIR / "model.onnx")
    if not item.get("model"):
        try:
            export_plain(model, args, None, item["exporter"], item["opset"], path, kwargs=kwargs,
                         names=names, dims_by_name=by_name)
        except Exception as e:
            return {"stage": "export", "status": "fail", "error": f"{type(e).__name__}: {e}"[:200]}
    graph_inputs, _ = graph_io(path)
    feeds_list = []
    for a, k in shapes:
        values = dict(zip(names, (v for _, v, _ in leaves(a, k) if isinstance(v, torch.Tensor))))
        if all(n in values for n in graph_inputs):
            feeds_list.append({n: values[n].numpy() for n in graph_inputs})
        else:
            feeds_list.append(dict(zip(graph_inputs, (t.numpy() for t in values.values()))))
    EXTRA.clear()
    try:
        outs = RUNNERS[runtime](path, feeds_list)
    except Refused as e:
        return {"stage": e.stage, "status": "fail", "error": e.error[:400]}
    for ref, out in zip(refs, outs):
        try:
            assert len(ref) == len(out), "output count"
            for r, o in zip(ref, out):
                assert r.shape == o.shape, f"shape {o.shape} != eager {r.shape}"
                np.testing.assert_allclose(o, r, rtol=item.get("rtol", 1e-3), atol=item.get("atol", 1e-4))
        except AssertionError as e:
            return {"stage": "parity", "status": "fail", "error": str(e)[:300]}
    return {"stage": None, "status": "pass", "error": None, "checked_shapes": len(outs), **EXTRA}


if __name__ == "__main__":
    runtime = sys.argv[1]
    with open(sys.argv[3], "w") as out:
        for item in json.load(open(sys.argv[2])):
            out.write(json.dumps({**item, **verdict(runtime, item)}) + "\n")
            out.flush()
