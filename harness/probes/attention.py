"""Attention probes: MultiheadAttention, TransformerEncoder, scaled_dot_product_attention."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


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


class _CrossAttention(nn.Module):
    def __init__(self, embed: int = 32, heads: int = 4) -> None:
        super().__init__()
        # kdim/vdim differ from embed: separate in-projections, the path #78060 broke.
        self.attn = nn.MultiheadAttention(embed, heads, kdim=24, vdim=16, batch_first=True)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        out, weights = self.attn(query, key, value, attn_mask=attn_mask,
                                 key_padding_mask=key_padding_mask, need_weights=True)
        return out + weights.sum()


def mha_kv():
    """Cross-attention where key != value, with a bool attn_mask and a bool key_padding_mask.

    Trap: key and value of different widths take the separate-projection path; the two masks are
    merged inside the exporter's MHA lowering, where dtype and broadcast mistakes appeared.
    Column 0 of both masks stays unmasked so that no row is fully masked (NaN in eager) at the
    example shape or at the second shape, which repeats the first positions.
    Upstream: pytorch/pytorch#78060.
    """
    torch.manual_seed(0)
    model = _CrossAttention().eval()
    query = torch.randn(2, 5, 32)
    key = torch.randn(2, 6, 24)
    value = torch.randn(2, 6, 16)
    attn_mask = torch.zeros(5, 6, dtype=torch.bool)
    attn_mask[:, 4:] = True  # True = not allowed to attend
    key_padding_mask = torch.zeros(2, 6, dtype=torch.bool)
    key_padding_mask[1, 3:] = True  # the second sequence is shorter
    dims = {0: {0: "batch", 1: "tgt"}, 1: {0: "batch", 1: "src"}, 2: {0: "batch", 1: "src"},
            3: {0: "tgt", 1: "src"}, 4: {0: "batch", 1: "src"}}
    return model, (query, key, value, attn_mask, key_padding_mask), dims


mha_kv.atol = 1e-4
mha_kv.rtol = 1e-3


class _Encoder(nn.Module):
    def __init__(self, embed: int = 32, heads: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(embed, heads, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        # No nested tensors: their fast path zeroes padded rows, which is not what export traces.
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.encoder(x, src_key_padding_mask=padding)


def transformer_encoder():
    """nn.TransformerEncoder (2 layers) with dynamic batch and sequence and a padding mask.

    Trap: the TorchScript exporter bakes Reshape targets (batch * heads, seq) from the dummy input,
    so the graph only runs at the export shape.
    Upstream: pytorch/pytorch#128610, #117209, #99701.
    """
    torch.manual_seed(0)
    model = _Encoder().eval()
    x = torch.randn(2, 7, 32)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 5:] = True
    return model, (x, padding), {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}


transformer_encoder.atol = 1e-4
transformer_encoder.rtol = 1e-3


class _Sdpa(nn.Module):
    def __init__(self, embed: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2).reshape(b, s, e)


def sdpa():
    """F.scaled_dot_product_attention with a bool attention mask.

    Trap: the TorchScript exporter has no SDPA symbolic below opset 14 (an export error at 13);
    the bool mask becomes a Where/-inf additive mask.
    Upstream: pytorch/pytorch#97262.
    """
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32)
    mask = torch.ones(2, 6, dtype=torch.bool)  # True = attend
    mask[1, 4:] = False
    return _Sdpa().eval(), (x, mask), {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}


sdpa.atol = 1e-4
sdpa.rtol = 1e-3
