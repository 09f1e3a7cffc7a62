"""User cases for the tests: a file-referenced model, and cases that misbehave on purpose."""
from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).softmax(-1)


def tiny_mlp():
    """A user model referenced as tests/cases/user_models.py:tiny_mlp."""
    torch.manual_seed(0)
    return TinyMLP(), (torch.randn(3, 12),), {0: {0: "batch"}}


class ShapeBaked(nn.Module):
    """Reshape target computed with Python ints under tracing: baked into the graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        return x.reshape(int(b) * int(s), int(h)).sum(-1)


def shape_baked():
    torch.manual_seed(0)
    return ShapeBaked(), (torch.randn(2, 5, 8),), {0: {0: "batch", 1: "seq"}}


def raises():
    raise RuntimeError("this case is broken on purpose")


def aborts():
    """Kills its own process, as a segfaulting extension would."""
    import os

    os.abort()


def hangs():
    import time

    time.sleep(3600)
