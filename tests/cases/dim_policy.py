"""The two models of the dim-policy finding (issue "From it broke to why"): how dims are marked
for the dynamo exporter changes the verdict.

- ``flatten_mean``: ``int(x.shape[1])`` in the arithmetic. With ``Dim.DYNAMIC`` the export keeps
  ``seq`` dynamic and passes; with ``Dim("seq")`` or ``Dim.AUTO`` the exporter silently fixes
  ``seq`` to the example's 6, and the file fails at any other length.
- ``tensor_shape``: ``torch.tensor([x.shape[0]])`` in shape arithmetic. On torch 2.6.0 it fails
  at export with ``Dim.DYNAMIC`` but exports with ``Dim("batch")`` (batch fixed to 4), then fails
  at run; torch 2.13.0 keeps ``batch`` dynamic with every policy.
"""
from __future__ import annotations

import torch
from torch import nn


class FlattenMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        n = int(x.shape[1])
        y = x.reshape(b, n * x.shape[2])
        return y.sum(-1, keepdim=True) / n


def flatten_mean():
    torch.manual_seed(0)
    return FlattenMean().eval(), (torch.randn(2, 6, 8),), {0: {0: "batch", 1: "seq"}}


class TensorShape(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = torch.tensor([x.shape[0]])
        return x.reshape(b.item(), -1) * 2


def tensor_shape():
    torch.manual_seed(0)
    return TensorShape().eval(), (torch.randn(4, 6),), {0: {0: "batch"}}
