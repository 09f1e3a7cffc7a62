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



# Output structures and shape traps that user models commonly have.
class TwoOut(nn.Module):
    """Three outputs, one of them int64 computed from an int64 input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor):
        h = self.lin(x)
        return h, h.sum(-1), ids * 2


def two_out():
    torch.manual_seed(0)
    return TwoOut(), (torch.randn(2, 8), torch.randint(0, 10, (2, 3))), {0: {0: "b"}, 1: {0: "b"}}


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor):
        return {"logits": self.lin(x), "probs": self.lin(x).softmax(-1)}


def dict_out():
    torch.manual_seed(0)
    return DictOut(), (torch.randn(3, 8),), {0: {0: "b"}}


class BatchOne(nn.Module):
    """Example batch of 1: torch.export may specialise a size-1 dim (0/1 specialisation)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(1)


def batch_one():
    torch.manual_seed(0)
    return BatchOne(), (torch.randn(1, 4, 10),), {0: {0: "batch"}}


class ShapeBranch(nn.Module):
    """A Python branch on a dynamic size: both exporters keep only the traced branch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            return x * 2
        return x + 1


def shape_branch():
    return ShapeBranch(), (torch.randn(2, 4),), {0: {0: "b"}}
