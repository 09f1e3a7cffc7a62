"""Drives harness.worker.diagnose.divergence inside a torch environment (tests/run/test_blame.py): a small
dynamo export whose file is then changed at one known node (the weight of ``block.fc2``), as an
exporter that mistranslated that layer would leave it; prints the first diverging node as JSON.

    python tests/divergence_driver.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import onnx
import torch
from onnx import numpy_helper
from torch import nn

from harness.worker.diagnose.divergence import first_divergence
from harness.worker.inputs import CaseInputs


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return torch.softmax(self.block(x) * 2.0, dim=-1)


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(3, 8)
    path = out / "net.onnx"
    program = torch.onnx.export(model, (x,), str(path), dynamo=True, input_names=["input_0"], verbose=False)
    proto = onnx.load(str(path))
    changed = None
    for init in proto.graph.initializer:
        if "fc2" in init.name and "weight" in init.name:
            value = numpy_helper.to_array(init).copy()
            value[0, 0] += 1.0
            init.CopyFrom(numpy_helper.from_array(value, init.name))
            changed = init.name
    onnx.save(proto, str(path))
    inputs = CaseInputs((x,), model=model)
    ctx = SimpleNamespace(program=program, shapes=[inputs], feeds=[inputs.feeds()], onnx_path=path,
                          spec=SimpleNamespace(atol=1e-4, rtol=1e-3))
    rec = SimpleNamespace(exporter="dynamo", error="ParityError: example shape: output 0: ...")
    found = first_divergence(ctx, rec)
    torch_script = SimpleNamespace(**{**vars(ctx), "program": None})
    print(json.dumps({"changed": changed, "found": found,
                      "torchscript": first_divergence(torch_script, SimpleNamespace(exporter="torchscript", error=""))},
                     default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
