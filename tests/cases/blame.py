"""Cases for the blame ladder (tests/run/test_blame.py).

- ``floor_divide``: ``x // 3`` on int64. The TorchScript exporter writes ONNX ``Div``, which
  truncates towards zero where torch floors (-7 // 3 is -3 in torch, -2 in the file): the ONNX
  reference evaluator and ONNX Runtime both disagree with eager, an exporter bug. The dynamo
  exporter gets it right.
"""
from __future__ import annotations

import torch
from torch import nn


class FloorDivide(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x // 3


def floor_divide():
    return FloorDivide().eval(), (torch.arange(-7, 7).reshape(2, 7),)


def mlp():
    """Two Linear layers of 512 and 256 inputs: right at fp32, beyond the default tolerance at
    bf16 (OpenVINO's CPU plugin on a CPU with bf16 kernels): ``runtime-precision``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 64)).eval(), (torch.randn(4, 512),)
