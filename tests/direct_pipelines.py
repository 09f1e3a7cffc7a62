"""Independent pipeline verdicts: torch.onnx.export, each post-export step called straight from its
library, the ONNX checker and ONNX Runtime CPU, with no code of the matrix.

Two models that are not the matrix's probes live here as cases (``gpt_block``: causal
self-attention with a KV cache and a padding mask; ``mobile_net``: depthwise convolutions, SiLU,
squeeze-excite), so the matrix can run the same models (tests/matrices/pipelines_direct.yaml).
``python direct_pipelines.py OUT.json`` (in the environment's python) writes, per case and step,
whether the step ran (raised or not), the fusions ONNX Runtime reports, and the parity class on ONNX Runtime CPU:
``pass``, or the first stage that failed (``step``, ``load``, ``run``, ``parity``). Tolerances are
written out here as docs/pipelines.md states them: fp32 atol 1e-4 rtol 1e-3; fp16 1e-2 / 1e-2;
int8 0.25 / 0.1 and cosine >= 0.99 and top-1 agreement >= 0.9 with eager.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class GPTBlock(nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.head = nn.Linear(hidden, 50)

    def forward(self, x, past_key, past_value, attention_mask):
        b, s, hid = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(hid, dim=-1)
        q, k, v = (t.view(b, s, self.h, self.d).transpose(1, 2) for t in (q, k, v))
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        total = k.shape[2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        causal = torch.ones(s, total, dtype=torch.bool).tril(total - s)
        keep = causal[None, None] & attention_mask[:, None, None, :].bool()
        scores = scores.masked_fill(~keep, -1e4)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, hid)
        x = x + self.proj(y)
        x = x + self.mlp(self.ln2(x))
        return self.head(x), k, v


def gpt_block():
    torch.manual_seed(0)
    past, new = 3, 4
    x = torch.randn(2, new, 32)
    pk, pv = torch.randn(2, 4, past, 8), torch.randn(2, 4, past, 8)
    mask = torch.ones(2, past + new, dtype=torch.int64)
    mask[1, 0] = 0
    dims = {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 2: "past"}, 2: {0: "batch", 2: "past"},
            3: {0: "batch", 1: "total"}}
    return GPTBlock().eval(), (x, pk, pv, mask), dims


class MobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.SiLU())
        self.se1, self.se2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.pw = nn.Conv2d(16, 24, 1)
        self.fc = nn.Linear(24, 10)

    def forward(self, image):
        x = self.dw(self.stem(image))
        x = x * torch.sigmoid(self.se2(F.silu(self.se1(x.mean((2, 3), keepdim=True)))))
        return self.fc(self.pw(x).mean((2, 3)))


def mobile_net():
    torch.manual_seed(0)
    model = MobileNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(2, 3, 32, 32),), {0: {0: "batch"}}


CASES = {"gpt_block": gpt_block, "mobile_net": mobile_net}
JUDGE = {"fp32": (1e-4, 1e-3, None, None), "fp16": (1e-2, 1e-2, None, None), "int8": (0.25, 0.1, 0.99, 0.9)}
PRECISION = {"fp16": "fp16", "fp16-ort": "fp16", "quantize-dynamic": "int8", "quantize-static": "int8"}


def one_file(model, dst: Path) -> None:
    onnx.save(model, str(dst))


def apply(step: str, src: Path, dst: Path, feeds: dict) -> dict:
    """Each step exactly as its library documents it."""
    if step == "onnxscript-optimizer":
        import onnxscript.optimizer
        from onnxscript import ir

        model = onnxscript.optimizer.optimize(ir.load(str(src)))
        one_file(ir.serde.serialize_model(model), dst)
    elif step == "onnxslim":
        import onnxslim

        onnxslim.slim(str(src), output_model=str(dst))
    elif step == "onnxsim":
        import onnxsim

        model, ok = onnxsim.simplify(onnx.load(str(src)))
        assert ok, "onnxsim could not validate"
        one_file(model, dst)
    elif step == "ort-fusion":
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(src), model_type="bert", use_gpu=False)
        opt.save_model_to_file(str(dst))
        return {"fused": {k: int(v) for k, v in opt.get_fused_operator_statistics().items()}}
    elif step == "fp16":
        from onnxconverter_common import float16

        one_file(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), dst)
    elif step == "fp16-ort":
        from onnxruntime.transformers.onnx_model import OnnxModel

        model = OnnxModel(onnx.load(str(src)))
        model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(dst))
    elif step == "quantize-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    elif step == "quantize-static":
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.left = iter([feeds])

            def get_next(self):
                return next(self.left, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    elif step == "ort-offline":
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return {}


def verdict(path: Path, feeds: dict, expected: list, precision: str) -> tuple[str, str]:
    atol, rtol, cosine, top1 = JUDGE[precision]
    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return "load", str(exc)[:200]
    try:
        outs = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    except Exception as exc:
        return "run", str(exc)[:200]
    for e, a in zip(expected, outs):
        a = np.asarray(a, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        if e.shape != a.shape or not np.all(np.abs(a - e) <= atol + rtol * np.abs(e)):
            return "parity", "beyond atol/rtol"
        if cosine is not None:
            cos = float(e.ravel() @ a.ravel() / (np.linalg.norm(e) * np.linalg.norm(a)))
            if cos < cosine:
                return "parity", f"cosine {cos}"
            if e.ndim and e.shape[-1] >= 2 and float(np.mean(e.argmax(-1) == a.argmax(-1))) < top1:
                return "parity", "top-1"
    return "pass", ""


def main(out: Path) -> None:
    steps = ["onnxscript-optimizer", "onnxslim", "onnxsim", "ort-fusion", "fp16", "fp16-ort",
             "quantize-dynamic", "quantize-static", "ort-offline"]
    results = {}
    work = Path(tempfile.mkdtemp(prefix="direct-pipelines-"))
    for name, case in CASES.items():
        model, args, dims = case()
        names = list(inspect_params(model))[: len(args)]
        with torch.no_grad():
            expected = model(*args)
        expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
        raw = work / f"{name}.onnx"
        torch.onnx.export(model, args, str(raw), opset_version=18, dynamo=False, input_names=names,
                          dynamic_axes={names[i]: d for i, d in dims.items()})
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        for step in steps:
            dst = work / f"{name}.{step}.onnx"
            entry: dict = {}
            try:
                entry.update(apply(step, raw, dst, feeds))
                assert dst.exists(), "the step wrote no file"
            except Exception as exc:
                results[f"{name}/{step}"] = {"verdict": "step", "error": str(exc)[:200]}
                continue
            entry["verdict"], entry["why"] = verdict(dst, feeds, expected, PRECISION.get(step, "fp32"))
            results[f"{name}/{step}"] = entry
    out.write_text(json.dumps(results, indent=1))


def inspect_params(model):
    import inspect

    return inspect.signature(model.forward).parameters


if __name__ == "__main__":
    import onnx
    import onnxruntime as ort

    main(Path(sys.argv[1]))
