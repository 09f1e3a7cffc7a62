"""Attention probes."""
from __future__ import annotations

import torch
from torch import nn


class _SelfAttention(nn.Module):
    def __init__(self, embed: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(embed, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def mha():
    """nn.MultiheadAttention self-attention with dynamic batch and sequence.

    Trap: the TorchScript exporter lowers it through scaled_dot_product_attention, which needs
    opset >= 14; under no_grad the fast path emits `_native_multi_head_attention`, which no opset
    has; dynamic batch/seq only works at the export shape with some exporters.
    Upstream: pytorch/pytorch#61277, #78060, #128610; onnx/onnx#6532.
    """
    torch.manual_seed(0)
    model = _SelfAttention().eval()
    x = torch.randn(2, 7, 32)
    return model, (x,), {0: {0: "batch", 1: "seq"}}


mha.atol = 1e-4
mha.rtol = 1e-3
