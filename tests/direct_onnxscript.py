"""Direct check for the onnxscript gate test, no harness code: export a conv+bn+relu with the
dynamo exporter (opset 18) and run it in ONNX Runtime; prints max_abs, or FAIL and the error."""
import sys

import numpy as np
import onnxruntime as ort
import onnxscript
import torch

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
x = torch.randn(2, 3, 16, 16)
print("onnxscript", onnxscript.__version__, "torch", torch.__version__)
try:
    torch.onnx.export(m, (x,), sys.argv[1], opset_version=18, dynamo=True)
    s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    out = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
    print("max_abs", float(np.abs(out - m(x).detach().numpy()).max()))
except Exception as e:
    print("FAIL", type(e).__name__, str(e).splitlines()[0][:300])
