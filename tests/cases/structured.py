"""Cases with structured inputs and outputs, as real models have them (tests/matrices/structured.yaml).

Each is checked against a plain torch.onnx.export + runtime run that uses no harness code
(tests/direct_verdict.py).
"""
from __future__ import annotations

import torch
from torch import nn


class WordLM(nn.Module):
    """The word language model: embedding → LSTM with its state as a tuple → decoder."""

    def __init__(self, ntoken: int = 50, ninp: int = 16, nhid: int = 16, nlayers: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        out, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(out), hidden


def lstm_state():
    """model(tokens, (h0, c0)): three graph inputs; dims by path and by structure."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (6, 2))
    hidden = (torch.randn(2, 2, 16), torch.randn(2, 2, 16))
    dims = {"tokens": {0: "seq", 1: "batch"}, "hidden": ({1: "batch"}, {1: "batch"})}
    return WordLM().eval(), (tokens, hidden), dims


def lstm_state_seq():
    """The same model with only the sequence dynamic, in the old index form."""
    model, inputs, _ = lstm_state()
    return model, inputs, {0: {0: "seq"}}


class PackedRNN(nn.Module):
    """pack_padded_sequence with sorted lengths (enforce_sorted=True): lengths must stay sorted."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 12, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, (h, _) = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return out, h


def packed_lengths():
    """Dynamic batch and sequence; the second shape must keep the lengths sorted."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    lengths = torch.tensor([5, 4, 2])
    return PackedRNN().eval(), (x, lengths), {0: {0: "batch", 1: "seq"}, 1: {0: "batch"}}


def packed_given():
    """The same model with the case's own second inputs (a longest length below the padded size)."""
    model, inputs, dims = packed_lengths()
    return model, inputs, dims


def _packed_second():
    torch.manual_seed(1)
    return torch.randn(4, 7, 8), torch.tensor([7, 6, 3, 1])


packed_given.second_inputs = _packed_second


class Pairs(nn.Module):
    """Compares the two items of each pair: the batch must be even."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.reshape(-1, 2, x.shape[-1]).unbind(1)
        return (a - b).abs().sum(-1)


def eager_rejects_second():
    """A batch of 2 grown to 3 is no batch of pairs: eager refuses the generated second shape."""
    torch.manual_seed(0)
    return Pairs().eval(), (torch.randn(2, 3),), {0: {0: "batch"}}


class KeywordEncoder(nn.Module):
    """Hugging Face style: keyword inputs, positions computed inside, a dict of outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(100, 16)
        self.positions = nn.Embedding(64, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.tokens(input_ids) + self.positions(positions)
        mask = attention_mask[..., None].to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return {"last_hidden_state": h, "logits": self.head(pooled)}


def keyword_inputs():
    """Called as model(input_ids=..., attention_mask=...); a right-padded mask."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    dims = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return KeywordEncoder().eval(), {"attention_mask": mask, "input_ids": ids}, dims


class DictOutput(nn.Module):
    """Positional and keyword inputs; a nested dict of outputs with a tuple inside."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor, extras: dict | None = None):
        y = self.lin(x) * scale
        out = {"logits": y, "aux": {"probs": y.softmax(-1), "stats": (y.mean(-1), y.amax(-1))}}
        if extras is not None:
            out["aux"]["bias"] = y + extras["bias"][0]
        return out


def dict_output():
    """model(x, scale=s, extras={"bias": [b]}): a nested dict input and a nested dict output."""
    torch.manual_seed(0)
    x, scale, bias = torch.randn(3, 8), torch.tensor(2.0), torch.randn(3, 4)
    dims = ({0: "batch"}, None, {"bias": [{0: "batch"}]})
    return DictOutput().eval(), (x,), {"scale": scale, "extras": {"bias": [bias]}}, dims


class DictArgument(nn.Module):
    """A dict as the last positional argument (torch.onnx.export reads a trailing dict as keywords)."""

    def forward(self, x: torch.Tensor, feats: dict):
        return x @ feats["w"] + feats["b"]


def dict_argument():
    torch.manual_seed(0)
    x, feats = torch.randn(3, 4), {"w": torch.randn(4, 2), "b": torch.randn(2)}
    return DictArgument().eval(), (x, feats), {0: {0: "batch"}}
