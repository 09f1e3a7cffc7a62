"""Vision probes."""
from __future__ import annotations

import torch
from torch import nn


def conv_bn():
    """A small CNN with BatchNorm in eval mode: the baseline that should pass everywhere.

    Trap: none intended; BatchNorm folding and Conv are the most-travelled export path, so a
    failure here points at the environment (companion pins) rather than the model.
    Upstream: general.
    """
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )
    # Non-trivial running statistics so that folding BatchNorm is actually exercised.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    return model, (x,), {0: {0: "batch"}}


conv_bn.atol = 1e-4
conv_bn.rtol = 1e-3
