"""torch modules the zoo cases wrap models in (imported lazily, inside workers)."""
from __future__ import annotations

from typing import Any

import torch


class KeywordModel(torch.nn.Module):
    """Positional tensors in (named as the model's keywords), the named outputs out as a tuple.

    What a user writes around a transformers model to hand ``torch.onnx.export`` plain tensors:
    ``forward`` gets one parameter per input (torch.export binds ``dynamic_shapes`` by parameter),
    calls the model with keywords and returns the outputs Optimum's ONNX config names.
    """

    def __init__(self, model: torch.nn.Module, keywords: list[str],
                 outputs: list[tuple[str, str]]) -> None:
        super().__init__()
        self.model = model
        self.keywords = list(keywords)
        self.outputs = [k for k, _ in outputs]
        params = ", ".join(keywords)
        scope: dict[str, Any] = {}
        exec(f"def forward(self, {params}):\n    return self._call({params})\n", scope)
        # A per-instance subclass: its forward has the signature of these inputs.
        self.__class__ = type(f"{type(model).__name__}Export", (KeywordModel,), {"forward": scope["forward"]})

    def _call(self, *args: torch.Tensor) -> tuple:
        out = self.model(**dict(zip(self.keywords, args)))
        if all(key in out.keys() for key in self.outputs):
            return tuple(out[key] for key in self.outputs)
        # The ONNX config names the tensors of a nested output (mgp-str: logits = (char, bpe,
        # wp)): the model's tensors in order, when there are as many as names.
        flat = [t for t in _tensors(out.to_tuple() if hasattr(out, "to_tuple") else out)]
        if len(flat) != len(self.outputs):
            raise KeyError(f"model output has {list(out.keys())}, not the ONNX config's {self.outputs}")
        return tuple(flat)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
