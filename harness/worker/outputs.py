"""A model's outputs as the exported file has them: the tree of torch outputs flattened in the
order both exporters flatten it, each leaf's path, and the ONNX output names made from the paths.

Standard library and numpy only at module level; torch lazily.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def output_leaves(obj: Any) -> list[tuple[tuple, np.ndarray]]:
    """Torch outputs → (path, numpy array) per tensor, in the order both exporters flatten them:
    tuples and lists by position, dicts and ModelOutputs by their (non-None) entries in order,
    dataclasses by field, other pytree nodes as torch.utils._pytree flattens them. None and
    non-tensor leaves are dropped (they are no graph outputs)."""
    import dataclasses
    from collections.abc import Mapping

    import torch

    out: list[tuple[tuple, np.ndarray]] = []

    def children(x: Any) -> list[tuple[Any, Any]]:
        if isinstance(x, Mapping):
            return [(k, v) for k, v in x.items() if v is not None]
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return list(zip(x._fields, x))
        if isinstance(x, (list, tuple)):
            return list(enumerate(x))
        if hasattr(x, "to_tuple"):
            return list(enumerate(x.to_tuple()))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x)]
        import torch.utils._pytree as pytree

        from harness.worker.inputs import component

        try:
            flat, _ = pytree.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
            if len(flat) == 1 and not flat[0][0]:
                return []
            return [(component(entries[0]), v) for entries, v in flat]
        except (ValueError, TypeError):  # a node registered without key paths
            leaves = pytree.tree_leaves(x)
            return [] if leaves == [x] else list(enumerate(leaves))

    def visit(x: Any, path: tuple) -> None:
        if isinstance(x, torch.Tensor):
            out.append((path, x.detach().cpu().resolve_conj().resolve_neg().numpy()))
        elif x is not None and not isinstance(x, (bool, int, float, complex, str, bytes)):
            for comp, child in children(x):
                visit(child, path + (comp,))

    visit(obj, ())
    return out


def flatten_outputs(obj: Any) -> list[np.ndarray]:
    """Torch outputs (tensor, tuple, list, dict, ModelOutput, dataclass) → flat list of arrays."""
    return [arr for _, arr in output_leaves(obj)]


def output_names(paths: list[tuple]) -> list[str]:
    """ONNX output names from output paths: 'output_0', 'output_1_0', 'output_logits'."""
    from harness.worker.inputs import valid_name

    names: list[str] = []
    for path in paths:
        base = valid_name("_".join(["output", *map(str, path or (0,))]))
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}_{n}"
        names.append(name)
    return names
