"""Export a case with the TorchScript-based or the dynamo exporter, then check the file.

Runs inside worker environments: torch and onnx are imported lazily.
"""
from __future__ import annotations

import contextlib
import inspect
import re
from collections import Counter
from pathlib import Path
from typing import Any

from harness.core.cell import EXPORTERS
from harness.core.record import GraphFacts
from harness.worker.cases import CaseSpec
from harness.worker.dims import DimPolicyUnavailable, io_facts
from harness.worker.inputs import CaseInputs, Dims, Key, dims_by_name, signature_of

# How torch.onnx.export(dynamo=True) turns ``dynamic_axes`` into ``dynamic_shapes``, per release
# (read in each release's torch/onnx/_internal/exporter/_compat.py / _dynamic_shapes.py):
# 2.6 (and before): torch.export.Dim(name with non-letters removed, max=99999), one Dim per name,
# so dims sharing a name are one symbol (pytorch/pytorch#140488); 2.7: Dim.AUTO (#143158);
# 2.8 and later: Dim.DYNAMIC (#153065). The harness marks dynamic dims the same way by default.
DIM_NAMED, DIM_AUTO, DIM_DYNAMIC = "Dim(name, max=99999)", "Dim.AUTO", "Dim.DYNAMIC"
DYNAMIC_AXES = "dynamic_axes"
# The dim_policy axis (options.dim_policy) marks dims as a user would write it instead of as the
# release converts dynamic_axes: Dim.DYNAMIC, Dim.AUTO, or Dim("name") (one Dim per name).
DIM_USER_NAMED = "Dim(name)"
POLICY_MARKING = {"dynamic": DIM_DYNAMIC, "auto": DIM_AUTO, "named": DIM_USER_NAMED}


def _release(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def dim_marking(torch_version: str | None = None) -> str:
    """The Dim a dynamic_axes entry becomes under dynamo=True in this torch release."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    release = _release(torch_version)
    if release < (2, 7):
        return DIM_NAMED
    if release < (2, 8):
        return DIM_AUTO
    return DIM_DYNAMIC


def policy_marking(policy: str) -> str:
    """The marking a dim_policy asks for; DimPolicyUnavailable (a skip) where this torch lacks it."""
    from torch.export import Dim

    marking = POLICY_MARKING[policy]
    attr = {DIM_DYNAMIC: "DYNAMIC", DIM_AUTO: "AUTO"}.get(marking)
    if attr is not None and not hasattr(Dim, attr):
        import torch

        raise DimPolicyUnavailable(f"dim_policy {policy!r} needs torch.export.Dim.{attr}, which "
                                   f"torch {torch.__version__} does not have")
    return marking


def dim_marker(marking: str):
    """A function from a dim's name to what ``dynamic_shapes`` holds for it; a named marking
    gives one ``Dim`` object per name within one export (dims sharing a name are one symbol)."""
    from torch.export import Dim

    if marking == DIM_DYNAMIC:
        return lambda name: Dim.DYNAMIC
    if marking == DIM_AUTO:
        return lambda name: Dim.AUTO
    named: dict[str, Any] = {}
    if marking == DIM_USER_NAMED:
        return lambda name: named.setdefault(name, Dim(_identifier(name)))
    # torch 2.6's own rewrite of a dynamic_axes name: non-letters removed, max=99999
    return lambda name: named.setdefault(name, Dim(re.sub(r"[^A-Za-z_]", "", name), max=99999))


def _identifier(name: str) -> str:
    """torch.export.Dim names must be identifiers."""
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return text if text and not text[0].isdigit() else f"d_{text}"


def input_names(spec: CaseSpec) -> list[str]:
    return spec.example.input_names()


def _export_kwargs_supported() -> set[str]:
    import torch

    return set(inspect.signature(torch.onnx.export).parameters)


def _dynamic_axes(dims: dict[Key, Dims], inputs: CaseInputs, style: str) -> dict[str, Any]:
    """dynamic_axes as users write it: named dicts, or plain dim lists (auto-named by torch)."""
    named = dims_by_name(dims, inputs)
    if style == "list":
        return {n: sorted(d) for n, d in named.items()}
    return named


def _call_arguments(inputs: CaseInputs, exporter: str, supported: set[str]) -> tuple[tuple, dict]:
    """(args, extra export kwargs) carrying the example inputs to torch.onnx.export.

    torch.onnx.export reads a trailing dict in ``args`` as keyword inputs; a positional dict
    argument is therefore followed by an empty dict (TorchScript, as torch documents) or passed
    by its parameter name (dynamo, which has no such escape).
    """
    args, kwargs = inputs.args, dict(inputs.kwargs)
    if not kwargs and args and isinstance(args[-1], dict):
        params = inputs.params
        if exporter == "dynamo" and len(args) <= len(params):
            args, kwargs = args[:-1], {params[len(args) - 1]: args[-1]}
        else:
            args = args + ({},)
    if not kwargs:
        return args, {}
    if "kwargs" in supported:
        return args, {"kwargs": kwargs}
    return args + (kwargs,), {}


def export_model(spec: CaseSpec, exporter: str, opset: int, path: Path,
                 dynamic: bool = True, constant_folding: bool = True,
                 outputs: list[str] | None = None,
                 dim_policy: str | None = None,
                 log: Any = None, switches: dict[str, bool] | None = None,
                 capture: Any = None) -> tuple[str | None, Any, dict[str, Any] | None]:
    """Export exactly as a user calling torch.onnx.export would, for the installed torch.

    Returns how dynamic dims were marked (recorded as ``options["dim_marking"]``; None when
    static) and what torch.onnx.export returned (dynamo: the ONNXProgram, whose exported program
    tells which dims were fixed), plus facts for the record's graph (the optimum exporter's
    validation). ``dim_policy`` (dynamo only) marks dims as a user would write them instead of as
    the release converts ``dynamic_axes``. ``log`` (an ``harness.worker.export_log.ExportLog``)
    listens to what torch says while a dynamo export runs; it changes nothing in the export.
    ``switches``: the dynamo exporter's ``optimize`` / ``external_data`` where the cell sets them.
    ``capture`` (dynamo; a ``harness.worker.capture_reuse.Capture``): the exported program torch's
    capture made for this case, release and options in the family's process; the export goes on
    from it (``torch.onnx.export(exported_program, ...)``) instead of capturing again, and from its
    translation where that was made for a registry at this opset (``capture_reuse.continuing``).
    """
    import torch

    if exporter == "optimum":  # Optimum's own exporter: its facts go into the record's graph
        from harness.worker.export_optimum import export_optimum

        return None, None, export_optimum(spec, opset, path, dynamic=dynamic,
                                          constant_folding=constant_folding)
    if exporter not in ("torchscript", "dynamo"):
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")
    supported = _export_kwargs_supported()
    if exporter == "dynamo" and "dynamo" not in supported:
        dims = spec.dynamic_dims if dynamic else {}
        if dim_policy is not None:
            raise DimPolicyUnavailable(f"dim_policy {dim_policy!r} needs torch.onnx.export(dynamo=True)")
        _export_dynamo_legacy(spec, path, dynamic=bool(dims))
        return ("dynamic_shapes=True" if dims else None), None, None
    args, kwargs, marking = export_arguments(spec, exporter, opset, dynamic, constant_folding, outputs,
                                             dim_policy, supported, switches)
    call = _call_source(spec, args, kwargs)
    with (log.watching() if log is not None and exporter == "dynamo" else contextlib.nullcontext()):
        if capture is not None and exporter == "dynamo":
            from harness.worker.capture_reuse import continuing, export_kwargs

            with continuing(capture) as said:
                result = torch.onnx.export(capture.program, (), str(path), **export_kwargs(kwargs))
            capture.facts["translation"] = said.get("translation", "own")
        else:
            result = torch.onnx.export(spec.model, args, str(path), **kwargs)
    if exporter != "dynamo":
        return marking, None, call
    if not path.exists() and result is not None:  # very early dynamo=True releases
        result.save(str(path))
    strategy = capture_strategy(result)
    if capture is not None and capture.strategy:   # torch names no strategy for a program it was given
        strategy = CAPTURE_STRATEGY_NAMES.get(capture.strategy, capture.strategy)
    return marking, result, {**(call or {}), **({"capture_strategy": strategy} if strategy else {})}


def _call_source(spec: CaseSpec, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``{"export_call": source}``: the call as a user would write it (``export_source.export_call_source``),
    recorded in the record's graph for the advisor; None where the arguments cannot be written out."""
    from harness.worker.export_source import export_call_source

    try:
        return {"export_call": export_call_source(spec, args, kwargs)}
    except Exception:  # noqa: BLE001 - describing the call never decides the cell's verdict
        return None


def export_arguments(spec: CaseSpec, exporter: str, opset: int, dynamic: bool = True,
                     constant_folding: bool = True, outputs: list[str] | None = None,
                     dim_policy: str | None = None, supported: set[str] | None = None,
                     switches: dict[str, bool] | None = None) -> tuple[tuple, dict[str, Any], str | None]:
    """The ``args`` and keyword arguments of the ``torch.onnx.export`` call a cell makes (besides
    the model and the file), and how dynamic dims were marked (None when static): what the
    export does and what a failing cell's ``repro.py`` writes out."""
    inputs = spec.example
    names = inputs.input_names()
    dims = spec.dynamic_dims if dynamic else {}
    supported = supported if supported is not None else _export_kwargs_supported()
    kwargs: dict[str, Any] = {"opset_version": opset, "input_names": names}
    if outputs:
        kwargs["output_names"] = outputs
    args, call = _call_arguments(inputs, exporter, supported)
    if exporter == "torchscript":
        if "dynamo" in supported:
            kwargs["dynamo"] = False
        kwargs["do_constant_folding"] = constant_folding
        if dims:
            kwargs["dynamic_axes"] = _dynamic_axes(dims, inputs, spec.dynamic_axes_style)
        return args, {**call, **kwargs}, (DYNAMIC_AXES if dims else None)
    kwargs["dynamo"] = True
    marking = dim_marking() if dim_policy is None else policy_marking(dim_policy)
    if dims and spec.dynamic_axes_style == "list" and dim_policy is None:
        # The migrating user's call: dynamic_axes handed to dynamo, torch converts it.
        kwargs["dynamic_axes"] = _dynamic_axes(dims, inputs, "list")
        marking = f"{DYNAMIC_AXES} -> {marking}"
    elif dims:
        kwargs["dynamic_shapes"] = dynamic_shapes(inputs, dims, marking, spec.model)
    if "verbose" in supported:
        kwargs["verbose"] = False
    for name, value in (switches or {}).items():   # optimize=, external_data= (dynamo)
        if name not in supported:
            raise DimPolicyUnavailable(f"torch.onnx.export of this torch release has no {name}= argument")
        kwargs[name] = value
    return args, {**call, **kwargs}, (marking if dims else None)


# torch.onnx's names of the ways it captured the graph (torch/onnx/_internal/exporter/
# _capture_strategies.py): torch.export non-strict first, then strict, then (releases before 2.9)
# the jit-trace fallback, or draft_export where enabled.
CAPTURE_STRATEGY_NAMES = {
    "TorchExportNonStrictStrategy": "torch.export(strict=False)",
    "TorchExportStrictStrategy": "torch.export(strict=True)",
    "TorchExportStrategy": "torch.export(strict=True)",
    "JitTraceConvertStrategy": "jit.trace fallback",
    "LegacyDynamoStrategy": "legacy dynamo",
    "TorchExportDraftExportStrategy": "torch.export.draft_export",
}


def capture_strategy(program: Any) -> str | None:
    """Which capture strategy produced a dynamo export, as torch recorded it on the ONNXProgram
    (``_capture_strategy``, set by torch.onnx since 2.5); None where torch does not say."""
    name = getattr(program, "_capture_strategy", None)
    return CAPTURE_STRATEGY_NAMES.get(name, name) if isinstance(name, str) and name else None


def dynamic_shapes(inputs: CaseInputs, dims: dict[Key, Dims], marking: str, model: Any) -> tuple:
    """dynamic_shapes for torch.export: one entry per argument of ``forward`` that the inputs
    bind, in signature order (a ``*args`` parameter takes one tuple, ``**kwargs`` one dict), each
    shaped like its input, with ``{dim: Dim}`` at dynamic tensors and None elsewhere."""
    mark = dim_marker(marking)
    specs = inputs.mirror(lambda leaf: {d: mark(n) for d, n in dims[leaf.key].items()}
                          if leaf.key in dims else None)
    by_top = dict(zip([top for top, _ in inputs.tops()], specs))
    sig = signature_of(model)
    try:
        bound = sig.bind(*range(len(inputs.args)), **{k: k for k in inputs.kwargs}).arguments
    except (AttributeError, TypeError):  # no signature, or inputs that do not bind: as given
        return tuple(specs)
    out = []
    for pname, placeholder in bound.items():
        kind = sig.parameters[pname].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            out.append(tuple(by_top[i] for i in placeholder))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            out.append({k: by_top[v] for k, v in placeholder.items()})
        else:
            out.append(by_top[placeholder])
    return tuple(out)


def _export_dynamo_legacy(spec: CaseSpec, path: Path, dynamic: bool) -> None:
    """torch < 2.5: torch.onnx.dynamo_export (fixed opset 18)."""
    import torch

    options = torch.onnx.ExportOptions(dynamic_shapes=dynamic)
    torch.onnx.dynamo_export(spec.model, *spec.example.args, **spec.example.kwargs,
                             export_options=options).save(str(path))


def check_model(path: Path) -> None:
    """onnx checker with full check (strict shape inference); raises on an invalid graph."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)


def file_layout(path: Path) -> dict[str, Any]:
    """The files an export wrote: one file, or the file and its external data, with their sizes."""
    data = path.with_name(path.name + ".data")
    files = {"model.onnx": path.stat().st_size}
    if data.exists():
        files["model.onnx.data"] = data.stat().st_size
    return {"kind": "file + data" if data.exists() else "one file", "files": files}


def graph_facts(path: Path) -> GraphFacts:
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
        "io": io_facts(model),   # names, dtypes, shapes with symbolic dims: what drift compares
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
    }
