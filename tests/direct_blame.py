"""The blame ladder's rungs by hand, with no harness code: a failing cell's bundle (model.onnx,
inputs*.npz, expected*.npz, tolerance.json) through plain onnx.reference and ONNX Runtime at
ORT_DISABLE_ALL and the default level. Prints one JSON object: per rung, 'agrees', 'differs',
'fails' or 'no-reference' (the reference's LSTM/GRU/RNN ignore sequence_lens).

    python tests/direct_blame.py BUNDLE_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator


def agree(expected, actual, atol, rtol) -> bool:
    return len(expected) == len(actual) and all(
        e.shape == np.asarray(a).shape and np.allclose(np.asarray(a), e, atol=atol, rtol=rtol)
        for e, a in zip(expected, actual))


def main(bundle: Path) -> dict:
    tol = json.loads((bundle / "tolerance.json").read_text())
    shapes = []
    for suffix in ("", "_shape2"):
        if (bundle / f"inputs{suffix}.npz").exists() and (bundle / f"expected{suffix}.npz").exists():
            exp = np.load(bundle / f"expected{suffix}.npz")
            shapes.append((dict(np.load(bundle / f"inputs{suffix}.npz")), [exp[k] for k in exp.files]))
    model = onnx.load(str(bundle / "model.onnx"))
    out = {}
    if any(n.op_type in ("LSTM", "GRU", "RNN") and len(n.input) > 4 and n.input[4] for n in model.graph.node):
        out["onnx-reference"] = "no-reference"
    else:
        ref = ReferenceEvaluator(model)
        out["onnx-reference"] = "agrees"
        for feeds, expected in shapes:
            try:
                if not agree(expected, ref.run(None, feeds), tol["atol"], tol["rtol"]):
                    out["onnx-reference"] = "differs"
                    break
            except Exception:
                out["onnx-reference"] = "fails"
                break
    for name, level in (("ort-disable-all", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                        ("ort-default", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 4
        out[name] = "agrees"
        try:
            sess = ort.InferenceSession(str(bundle / "model.onnx"), so, providers=["CPUExecutionProvider"])
            for feeds, expected in shapes:
                if not agree(expected, sess.run(None, feeds), tol["atol"], tol["rtol"]):
                    out[name] = "differs"
                    break
        except Exception:
            out[name] = "fails"
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
