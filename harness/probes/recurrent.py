"""Recurrent probes: LSTM and GRU with dynamic batch and sequence length."""
from __future__ import annotations

import torch
from torch import nn


class _Recurrent(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor):
        out, state = self.rnn(x)
        return out, state


def lstm():
    """2-layer nn.LSTM, batch_first, dynamic batch and sequence; returns output and (h, c).

    Trap: the exporters unroll or emit ONNX LSTM with weights re-ordered per gate (iofc vs
    ifgo); initial states built from the dummy batch size get baked.
    Upstream: general (pytorch/pytorch issues on LSTM export with dynamic axes).
    """
    torch.manual_seed(0)
    model = _Recurrent(nn.LSTM(16, 32, num_layers=2, batch_first=True)).eval()
    x = torch.randn(2, 9, 16)
    return model, (x,), {0: {0: "batch", 1: "seq"}}


lstm.atol = 1e-4
lstm.rtol = 1e-3


def gru():
    """Bidirectional nn.GRU, batch_first, dynamic batch and sequence; returns output and h.

    Trap: as for LSTM (gate order zrn vs rzn, linear_before_reset), plus the reverse direction.
    Upstream: general.
    """
    torch.manual_seed(0)
    model = _Recurrent(nn.GRU(16, 24, batch_first=True, bidirectional=True)).eval()
    x = torch.randn(2, 9, 16)
    return model, (x,), {0: {0: "batch", 1: "seq"}}


gru.atol = 1e-4
gru.rtol = 1e-3
