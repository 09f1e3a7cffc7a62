"""The ``torch.onnx.export`` call a cell made, as Python source a user can paste: the record's
``graph.export_call`` (the advisor shows it) and the heart of a bundle's ``repro.py``.

Worker side: standard library at module level; torch lazily.
"""
from __future__ import annotations

from typing import Any


class NotScriptable(ValueError):
    """An input or argument the script cannot write out as Python source."""


# ---- Python source for the call's arguments ----------------------------------------------------

class ArgumentSource:
    """Python source of a nested value whose tensors come from a loaded ``.npz`` (``var[name]``),
    whose torch.export Dims are shared per name (``DIMS``)."""

    def __init__(self, names: dict[int, str], var: str) -> None:
        self.names, self.var = names, var
        self.dims: dict[str, str] = {}

    def __call__(self, value: Any) -> str:
        import torch

        if isinstance(value, torch.Tensor):
            name = self.names.get(id(value))
            if name is None:
                raise NotScriptable("a tensor argument that is none of the case's inputs")
            return f"torch.from_numpy({self.var}[{name!r}])"
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            inner = ", ".join(self(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self(k)}: {self(v)}" for k, v in value.items()) + "}"
        dim = self._dim(value)
        if dim is not None:
            return dim
        raise NotScriptable(f"an argument of type {type(value).__name__}")

    def _dim(self, value: Any) -> str | None:
        from torch.export import Dim

        for hint in ("DYNAMIC", "AUTO", "STATIC"):
            if getattr(Dim, hint, object()) is value:
                return f"Dim.{hint}"
        name = getattr(value, "__name__", None)
        if name is None or not hasattr(value, "max") or not hasattr(value, "min"):
            return None
        args = [repr(name)]
        lo, hi = getattr(value, "min", None), getattr(value, "max", None)
        if isinstance(lo, int) and lo not in (0, 2):
            args.append(f"min={lo}")
        if isinstance(hi, int) and hi < 2**62:
            args.append(f"max={hi}")
        self.dims[name] = f"Dim({', '.join(args)})"
        return f"DIMS[{name!r}]"


def tensor_names(inputs: Any) -> dict[int, str]:
    return {id(leaf.value): leaf.name for leaf in inputs.tensor_leaves()}


def export_call_source(spec: Any, args: tuple, kwargs: dict[str, Any], var: str = "x") -> str:
    """The ``torch.onnx.export`` call a cell made, as Python source: ``model`` is the case's model,
    ``{var}`` its example inputs by name (``{var}["input_ids"]``, arrays as in ``inputs.npz``), and
    a ``DIMS`` line first where the call names torch.export Dims. Raises ``NotScriptable``."""
    src = ArgumentSource(tensor_names(spec.example), var)
    args_src = src(tuple(args))
    kwargs_src = ", ".join(f"{k}={src(v)}" for k, v in kwargs.items())
    head = ""
    if src.dims:
        head = ("from torch.export import Dim\nDIMS = {"
                + ", ".join(f"{k!r}: {v}" for k, v in sorted(src.dims.items())) + "}\n")
    elif "Dim." in kwargs_src:
        head = "from torch.export import Dim\n"
    return f"{head}torch.onnx.export(model, {args_src}, \"model.onnx\", {kwargs_src})"
