"""How far ONNX Runtime and OpenVINO are from torch eager, in units of the model's own float32
noise (docs/report.md, "Tolerances", quotes its output). Run with an environment's python:

    PYTHONPATH=. .envs/<torch2.13.0 env>/bin/python tests/run/noise_measure.py

For each model (the probes mha, transformer_encoder, conv_bn, lstm; the decoding cases; a
6-layer, 128-wide encoder): eager float32 and the harness's floor (harness.worker.noise), one dynamo
export at opset 18, each runtime's worst difference from eager per output, and the ratio.
"""
from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cases"))
warnings.filterwarnings("ignore")

import decoding  # tests/cases, on the path from the line above

from harness.probes import attention, recurrent, vision
from harness.worker import noise
from harness.worker.inputs import CaseInputs
from harness.worker.outputs import output_leaves


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 6)

    def forward(self, x):
        return self.enc(x)


def encoder():
    torch.manual_seed(0)
    return Encoder().eval(), (torch.randn(2, 16, 128) * 2,), {}


CASES = {"mha": attention.mha, "transformer_encoder": attention.transformer_encoder, "conv_bn": vision.conv_bn,
         "lstm": recurrent.lstm, "empty_cache": decoding.empty_cache, "triu_mask": decoding.triu_mask,
         "position_ids": decoding.position_ids, "encoder_6x128": encoder}


def runtimes(path: str, feeds: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    import onnxruntime as ort
    import openvino as ov

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out = {"onnxruntime": sess.run(None, {i.name: f for i, f in zip(sess.get_inputs(), feeds)})}
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    result = compiled.create_infer_request().infer({p.get_any_name(): f for p, f in zip(compiled.inputs, feeds)})
    out["openvino"] = [np.asarray(result[o]) for o in compiled.outputs]
    return out


def main() -> None:
    ratios: dict[str, list[float]] = {"onnxruntime": [], "openvino": []}
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in CASES.items():
            model, inputs, *_ = fn()
            model.eval()
            case = CaseInputs(inputs if isinstance(inputs, tuple) else (), inputs if isinstance(inputs, dict) else {},
                              model=model)
            with torch.no_grad():
                refs = [a for _, a in output_leaves(case.call(model))]
            floors = noise.measure(model, [case], [refs])["floors"][0]
            path = str(Path(tmp) / f"{name}.onnx")
            with contextlib.redirect_stdout(io.StringIO()):
                torch.onnx.export(model, case.args, path, kwargs=case.kwargs or None, dynamo=True, opset_version=18)
            feeds = list(case.feeds().values())
            for runtime, outs in runtimes(path, feeds).items():
                for j, (ref, out, floor) in enumerate(zip(refs, outs, floors)):
                    if floor is None:
                        continue
                    diff = float(np.abs(np.asarray(out, np.float64) - ref).max())
                    ratios[runtime].append(diff / floor)
                    scale = float(np.abs(ref).max())
                    steps.append(floor / (np.finfo(np.float32).eps * scale) if scale else 1.0)
                    print(f"{name}[{j}] {runtime}: floor {floor:.3g}, difference {diff:.3g}, ratio {diff / floor:.2f}")
    for runtime, found in ratios.items():
        print(f"{runtime}: ratio {min(found):.2f} to {max(found):.2f} over {len(found)} outputs")
    print(f"floor: {min(steps):.1f} to {max(steps):.1f} float32 rounding steps of the output's largest value")


if __name__ == "__main__":
    main()
