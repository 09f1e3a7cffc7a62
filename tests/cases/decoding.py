"""Decoding-step cases shaped like the models users export (tests/matrices/decoding.yaml).

- ``empty_cache``: one step of a causal self-attention layer with a KV cache whose past length
  is 0 in the example (the first decoding step), its mask built from ``arange`` comparisons.
- ``triu_mask``: the same layer with the causal mask built as ``triu(past + 1)``: torch.export
  reads the diagonal as a Python int and pins ``past`` to the example's 3.
- ``batch_one_step``: the same layer with a batch-1 example on the dynamic ``batch`` dim.
- ``position_ids``: Hugging Face style position ids from a left-padded attention mask
  (``cumsum(-1) - 1``, padding filled with 1).

Each is checked against a plain torch.onnx.export + runtime run that uses no harness code
(tests/direct_verdict.py).
"""
from __future__ import annotations

import math

import torch
from torch import nn

VOCAB, WIDTH, HEADS = 64, 32, 2


class DecoderStep(nn.Module):
    """Token ids and a (key, value) cache in; logits and the grown cache out."""

    def __init__(self, mask: str = "arange") -> None:
        super().__init__()
        self.mask = mask
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.head = nn.Linear(WIDTH, VOCAB)

    def causal_mask(self, seq: int, past: int) -> torch.Tensor:
        """Additive mask: query i (at position past + i) sees keys 0 .. past + i."""
        if self.mask == "triu":
            return torch.full((seq, past + seq), float("-inf")).triu(past + 1)
        keys = torch.arange(past + seq)
        queries = torch.arange(seq) + past
        return torch.zeros(seq, past + seq).masked_fill(keys[None, :] > queries[:, None], float("-inf"))

    def forward(self, input_ids: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor):
        batch, seq = input_ids.shape
        past = past_key.shape[2]
        x = self.embed(input_ids)
        q, k, v = (proj(x).view(batch, seq, HEADS, WIDTH // HEADS).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        k = torch.cat([past_key, k], dim=2)
        v = torch.cat([past_value, v], dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // HEADS) + self.causal_mask(seq, past)
        h = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, WIDTH)
        return self.head(h), k, v


DIMS = {"input_ids": {0: "batch", 1: "seq"}, "past_key": {0: "batch", 2: "past"},
        "past_value": {0: "batch", 2: "past"}}


def _step(mask: str, batch: int, seq: int, past: int):
    torch.manual_seed(0)
    model = DecoderStep(mask).eval()
    ids = torch.randint(0, VOCAB, (batch, seq))
    cache = [torch.randn(batch, HEADS, past, WIDTH // HEADS) for _ in range(2)]
    return model, (ids, *cache), DIMS


def empty_cache():
    """The first decoding step: a cache of past length 0."""
    return _step("arange", batch=2, seq=3, past=0)


def triu_mask():
    """A causal mask from ``triu(past + 1)`` with a cache of past length 3."""
    return _step("triu", batch=2, seq=3, past=3)


def batch_one_step():
    """A batch-1 example on the dynamic batch dim."""
    return _step("arange", batch=1, seq=3, past=2)


class PositionIds(nn.Module):
    """Position ids from the attention mask as Hugging Face decoders make them."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(32, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids = position_ids.masked_fill(attention_mask == 0, 1)
        h = self.tokens(input_ids) + self.positions(position_ids)
        return self.head(h * attention_mask[..., None].to(h.dtype))


def position_ids():
    """Left-padded batch: the first row starts with two padding tokens."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    dims = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return PositionIds().eval(), {"input_ids": ids, "attention_mask": mask}, dims
