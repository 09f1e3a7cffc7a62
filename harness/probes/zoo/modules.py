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
        exec(f"def forward(self, {params}):\n    return self._call({params})\n", scope)  # noqa: S102
        # A per-instance subclass: its forward has the signature of these inputs.
        self.__class__ = type(f"{type(model).__name__}Export", (KeywordModel,), {"forward": scope["forward"]})

    def _call(self, *args: torch.Tensor) -> tuple:
        out = self.model(**dict(zip(self.keywords, args)))
        return tuple(_pick(out, key) for key in self.outputs)


def _pick(out: Any, key: str) -> Any:
    if isinstance(out, dict) or hasattr(out, "keys"):
        if key in out.keys():
            return out[key]
    value = getattr(out, key, None)
    if value is None:
        raise KeyError(f"model output has no {key!r} (has {list(out.keys()) if hasattr(out, 'keys') else type(out)})")
    return value
