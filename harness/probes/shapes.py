"""Shape-arithmetic probes."""
from __future__ import annotations

import torch
from torch import nn


class _RepeatInterleave(nn.Module):
    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(x, repeats, dim=0) * 2.0


def repeat_interleave():
    """repeat_interleave with tensor repeats and a dynamic leading axis.

    Trap: with tensor-valued repeats the output length depends on the data; exporters emit a Loop
    or bake the example's repeat counts; with dynamic axes export fails or the graph is wrong at
    other shapes. Upstream: pytorch/pytorch#100429, #100438.
    """
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    repeats = torch.tensor([1, 2, 3, 1], dtype=torch.int64)
    return _RepeatInterleave().eval(), (x, repeats), {0: {0: "n"}, 1: {0: "n"}}
