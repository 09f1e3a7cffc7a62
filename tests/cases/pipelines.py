"""Cases for the post-export pipeline tests: a BERT-style encoder (separate Q/K/V, additive mask,
Erf GELU: the pattern ONNX Runtime's BERT fusion matches in the TorchScript export and in the
dynamo export without its optimizer) and a small convolutional network."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class _Layer(nn.Module):
    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
        self.f1, self.f2 = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.h, self.d).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, hid = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).contiguous().view(b, s, hid)
        a = self.ln1(self.o(ctx) + x)
        return self.ln2(self.f2(F.gelu(self.f1(a))) + a)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word, self.pos = nn.Embedding(100, 64), nn.Embedding(64, 64)
        self.ln = nn.LayerNorm(64, eps=1e-12)
        self.layers = nn.ModuleList(_Layer() for _ in range(2))
        self.cls = nn.Linear(64, 10)
        self.register_buffer("position_ids", torch.arange(64).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.word(input_ids) + self.pos(self.position_ids[:, : input_ids.shape[1]]))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return self.cls(x[:, 0])


def bert_encoder():
    """Two BERT-style layers, a padding mask: ORT's BERT fusion makes Attention of each."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, 100, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    return Encoder().eval(), (ids, mask), {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def convnet():
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():
        bn = model.body[1]
        bn.running_mean.uniform_(-0.1, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(2, 3, 32, 32),), {0: {0: "batch"}}
