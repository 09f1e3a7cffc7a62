"""Export a case with the TorchScript-based or the dynamo exporter, then check the file.

Runs inside worker environments: torch and onnx are imported lazily.
"""
from __future__ import annotations

import inspect
from collections import Counter
from pathlib import Path
from typing import Any

from harness.run.cases import CaseSpec

EXPORTERS = ("torchscript", "dynamo", "optimum")


def input_names(spec: CaseSpec) -> list[str]:
    import torch

    if named := getattr(spec.model, "onnx_input_names", None):  # zoo cases: Optimum's names
        return list(named)
    return [f"input_{i}" for i, x in enumerate(spec.inputs) if isinstance(x, torch.Tensor)]


def _export_kwargs_supported() -> set[str]:
    import torch

    return set(inspect.signature(torch.onnx.export).parameters)


def output_names(count: int, spec: CaseSpec | None = None) -> list[str]:
    named = getattr(getattr(spec, "model", None), "onnx_output_names", None)
    if named and len(named) == count:
        return list(named)
    return [f"output_{i}" for i in range(count)]


def _dynamic_axes(dims: dict[int, dict[int, str]], style: str, names: list[str]) -> dict[str, Any]:
    """dynamic_axes as users write it: named dicts, or plain dim lists (auto-named by torch)."""
    if style == "list":
        return {names[i]: sorted(d) for i, d in dims.items()}
    return {names[i]: dict(d) for i, d in dims.items()}


def export_model(spec: CaseSpec, exporter: str, opset: int, path: Path,
                 dynamic: bool = True, constant_folding: bool = True,
                 outputs: list[str] | None = None) -> dict[str, Any] | None:
    """Export exactly as a user calling torch.onnx.export would, for the installed torch."""
    import torch

    if exporter == "optimum":  # Optimum's own exporter; returns facts for the record's graph
        from harness.run.export_optimum import export_optimum

        return export_optimum(spec, opset, path, dynamic=dynamic, constant_folding=constant_folding)

    names = input_names(spec)
    dims = spec.dynamic_dims if dynamic else {}
    supported = _export_kwargs_supported()
    kwargs: dict[str, Any] = {"opset_version": opset, "input_names": names}
    if outputs:
        kwargs["output_names"] = outputs
    if exporter == "torchscript":
        if "dynamo" in supported:
            kwargs["dynamo"] = False
        kwargs["do_constant_folding"] = constant_folding
        if dims:
            kwargs["dynamic_axes"] = _dynamic_axes(dims, spec.dynamic_axes_style, names)
        torch.onnx.export(spec.model, spec.inputs, str(path), **kwargs)
    elif exporter == "dynamo":
        if "dynamo" not in supported:
            _export_dynamo_legacy(spec, path, dynamic=bool(dims))
            return None
        kwargs["dynamo"] = True
        if dims and spec.dynamic_axes_style == "list":
            # The migrating user's call: dynamic_axes handed to dynamo, torch converts it.
            kwargs["dynamic_axes"] = _dynamic_axes(dims, "list", names)
        elif dims:
            kwargs["dynamic_shapes"] = _dynamic_shapes(spec, dims)
        if "verbose" in supported:
            kwargs["verbose"] = False
        result = torch.onnx.export(spec.model, spec.inputs, str(path), **kwargs)
        if not path.exists() and result is not None:  # very early dynamo=True releases
            result.save(str(path))
    else:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")


def _dynamic_shapes(spec: CaseSpec, dims: dict[int, dict[int, str]]) -> tuple:
    """dynamic_shapes for torch.export, marking dims the way torch.onnx converts dynamic_axes."""
    from torch.export import Dim

    def mark(name: str):
        return Dim.DYNAMIC if hasattr(Dim, "DYNAMIC") else Dim(name)

    return tuple(
        {d: mark(n) for d, n in dims[i].items()} if i in dims else None
        for i in range(len(spec.inputs))
    )


def _export_dynamo_legacy(spec: CaseSpec, path: Path, dynamic: bool) -> None:
    """torch < 2.5: torch.onnx.dynamo_export (fixed opset 18)."""
    import torch

    options = torch.onnx.ExportOptions(dynamic_shapes=dynamic)
    torch.onnx.dynamo_export(spec.model, *spec.inputs, export_options=options).save(str(path))


def check_model(path: Path) -> None:
    """onnx checker with full check (strict shape inference); raises on an invalid graph."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)


def graph_facts(path: Path) -> dict[str, Any]:
    """Facts about an exported graph that a later report can diff across upgrades."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = Counter(node.op_type for node in model.graph.node)
    for fn in model.functions:
        ops.update(f"{fn.name}/{node.op_type}" for node in fn.node)
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    size = path.stat().st_size
    data = path.with_name(path.name + ".data")
    if data.exists():
        size += data.stat().st_size
    return {
        "opset": default_opset,
        "opset_imports": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "nodes": len(model.graph.node),
        "ops": dict(sorted(ops.items())),
        "bytes": size,
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
    }
