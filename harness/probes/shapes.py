"""Shape-arithmetic probes: values and shapes that must stay dynamic in the exported graph."""
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


repeat_interleave.atol = 1e-5
repeat_interleave.rtol = 1e-3


class _IntConcat(nn.Module):
    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Per-row valid length (int32, as tokenizers and TensorRT plugins hand it over) joined
        # with a length taken from the int64 Shape of x: eager promotes the cat to int64.
        positions = torch.arange(x.shape[1])  # int64, sized by Shape(x)
        bounds = torch.cat([lengths, positions[-1:] + 1])
        keep = positions[None, :] < bounds[:-1, None]
        return x * keep[..., None].to(x.dtype), bounds


def int_concat():
    """Concat of an int64 Shape output with an int32 tensor, used as a Reshape target.

    Trap: eager type-promotes int32 + int64 in torch.cat; an ONNX Concat requires one type, so
    a graph that keeps both fails the checker or ORT/TensorRT load.
    Upstream: NVIDIA/TensorRT#4268; pytorch/pytorch#52252.
    """
    torch.manual_seed(0)
    x = torch.randn(3, 4, 6)
    lengths = torch.tensor([4, 4, 3], dtype=torch.int32)
    return _IntConcat().eval(), (x, lengths), {0: {0: "batch"}, 1: {0: "batch"}}


int_concat.atol = 1e-5
int_concat.rtol = 1e-3


class _ReduceAxes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=(-2, -1), keepdim=True)
        peak = x.amax(dim=-1, keepdim=True)
        return (x - mean) / (peak - mean + 1.0) + x.sum(dim=1, keepdim=True)


def reduce_axes():
    """ReduceMean / ReduceMax / ReduceSum over fixed axes.

    Trap: from opset 18 (13 for ReduceSum) `axes` is an input instead of an attribute; ORT is
    fine, TensorRT rejects reduce axes that are not a constant initializer.
    Upstream: pytorch/pytorch#104190, #97344; NVIDIA/TensorRT#3467.
    """
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 6)
    return _ReduceAxes().eval(), (x,), {0: {0: "batch", 2: "h", 3: "w"}}


reduce_axes.atol = 1e-4
reduce_axes.rtol = 1e-3


class _ShapeFold(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x.shape[1] used as a value: with constant folding it can become a literal.
        positions = torch.arange(x.shape[1], dtype=x.dtype) / x.shape[1]
        return x * x.shape[0] + positions[None, :, None]


def shape_fold():
    """`x.shape[i]` used as a value (a scale, an arange length).

    Trap: constant folding of the traced graph replaces Shape->Gather with the dummy input's
    size, so outputs are wrong (or the graph rejects inputs) at other sizes.
    Upstream: pytorch/pytorch#69605.
    """
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4)
    return _ShapeFold().eval(), (x,), {0: {0: "batch", 1: "seq"}}


shape_fold.atol = 1e-5
shape_fold.rtol = 1e-3


class _DataDependentScale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x.mean() * 0.1) + x.std(dim=-1, keepdim=True)


def data_dependent_scale():
    """A scale computed from the input (`x.mean() * 0.1`) that must stay a graph computation.

    Trap: constant folding must not evaluate data-dependent values at the dummy input; the
    second shape carries different data, so a baked scale shows as a parity failure.
    Upstream: constant folding section of the torch.onnx export guide.
    """
    torch.manual_seed(0)
    x = torch.randn(3, 8) + 2.0
    return _DataDependentScale().eval(), (x,), {0: {0: "batch"}}


data_dependent_scale.atol = 1e-4
data_dependent_scale.rtol = 1e-3


class _ControlFlow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2.0
        return x - 1.0


def control_flow():
    """A Python `if` on a tensor value.

    Trap: tracing records only the branch the dummy input took (a TracerWarning, not an error);
    torch.export refuses the data-dependent branch. The example sums to < 0 while the second
    shape (rows wrapped: 0, 1, 0) sums to > 0, so a frozen branch shows up as a parity failure.
    Upstream: general (torch.onnx docs: "Avoid data-dependent control flow").
    """
    x = torch.stack([torch.full((4,), 0.75), torch.full((4,), -1.0)])
    return _ControlFlow().eval(), (x,), {0: {0: "batch"}}


control_flow.atol = 1e-5
control_flow.rtol = 1e-3


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) * attention_mask[..., None].to(torch.float32)
        return h.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1).to(torch.float32)


def dynamic_axes_names():
    """Two inputs sharing named dynamic axes, passed as `dynamic_axes` lists, not named dicts.

    Trap: `dynamic_axes={"input_0": [0, 1]}` (auto-named dims) vs `{0: "batch", 1: "seq"}`; the
    dynamo exporter converts dynamic_axes to dynamic_shapes and has failed to relate dims that
    two inputs share. This case asks export to pass the list form (`dynamic_axes_style`) and,
    for dynamo, `dynamic_axes` itself rather than dynamic_shapes, as a migrating user would.
    Upstream: pytorch/pytorch#165748; k2-fsa/icefall#2040.
    """
    torch.manual_seed(0)
    tokens = torch.randint(0, 100, (2, 7), dtype=torch.int64)
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    dims = {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}
    return _TwoInputs().eval(), (tokens, mask), dims


dynamic_axes_names.atol = 1e-4
dynamic_axes_names.rtol = 1e-3


dynamic_axes_names.dynamic_axes_style = "list"
