"""Who owns a piece of the export stack, read from the installed packages and the file itself
(worker side): the owner of an ONNX translation (the dynamo exporter's registry, torch's
TorchScript symbolic registry), of a node of the exported file (its local function's domain,
the ``pkg.torch.onnx.*`` metadata torch writes on each node), and of a stack frame (the package
its file lies in). Standard library at module level; torch and onnx lazily.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

from harness.core.record import ONNXSCRIPT_REPOSITORY
from harness.worker.diagnose.onnx_reference import model_file, torch_relative

TORCH_REPOSITORY = "pytorch/pytorch"
# "No ONNX function found for <OpOverload(op='aten.repeat_interleave', overload='Tensor')>"
_NO_FUNCTION = re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>")
# "Exporting the operator 'aten::scaled_dot_product_attention' to ONNX opset version 13"
_TS_OPERATOR = re.compile(r"Exporting the operator '?([\w:]+)'? to ONNX opset version (\d+)")
# "(op_type:aten_getitem, node name: node_aten_getitem_20)" in the checker's message
_CHECKER_NODE = re.compile(r"op_type:([\w.]+), node name: ([^)]+)\)")


def package_of(path: str) -> str | None:
    """'onnxscript', 'onnx', 'torch', 'model' or None: whose file a frame is."""
    norm = path.replace("\\", "/")
    for pkg in ("onnxscript", "onnx_ir", "onnx", "torch"):
        if f"/{pkg}/" in norm:
            return {"onnx_ir": "onnxscript"}.get(pkg, pkg)
    if torch_relative(norm):
        return "torch"
    return "model" if model_file(norm) else None


def repository_of_package(pkg: str | None) -> str | None:
    return {"onnxscript": ONNXSCRIPT_REPOSITORY, "onnx": "onnx/onnx", "torch": TORCH_REPOSITORY}.get(pkg or "")


def missing_target(text: str) -> str | None:
    """The torch op a DispatchError names ('aten.repeat_interleave.Tensor'), or None."""
    m = _NO_FUNCTION.search(text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def torchscript_operator(text: str) -> tuple[str, int] | None:
    m = _TS_OPERATOR.search(text)
    return (m.group(1), int(m.group(2))) if m else None


def checker_node(text: str) -> tuple[str, str] | None:
    """(op_type, node name) the ONNX checker names in its message, or None."""
    m = _CHECKER_NODE.search(text)
    return (m.group(1), m.group(2).strip()) if m else None


def _module_of(fn: Any) -> str:
    inner = getattr(fn, "function", None) or getattr(fn, "_func", None) or fn
    return getattr(inner, "__module__", None) or getattr(inspect.getmodule(inner), "__name__", "") or ""


def _owner_of_module(module: str) -> str | None:
    if module.startswith("onnxscript"):
        return ONNXSCRIPT_REPOSITORY
    if module.startswith("torch"):
        return TORCH_REPOSITORY
    return None


@functools.lru_cache(maxsize=1)
def _dynamo_registry() -> Any:
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


def _resolve(target: str) -> Any:
    import operator

    import torch

    if target.startswith("operator."):
        return getattr(operator, target.split(".", 1)[1])
    ns, op, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def translation_owner(target: str) -> dict[str, Any]:
    """The owner of the dynamo exporter's translation of ``target`` ('aten.unbind.int'), read from
    the registry it dispatches from: ``{target, repository, modules, how}``. For a target with no
    translation: the owner of its other overloads' translations, else of the registry's
    translations of that namespace (where a translation would be added)."""
    registry = _dynamo_registry()
    try:
        op = _resolve(target)
    except (AttributeError, ValueError) as exc:
        return {"target": target, "repository": None, "how": f"no such op in this torch: {exc}"}
    modules = sorted({_module_of(d.onnx_function) for d in registry.get_decomps(op)})
    if modules:
        return {"target": target, "repository": _owner_of_module(modules[0]), "modules": modules,
                "how": "the registry's translation of the op"}
    packet = getattr(op, "_overloadpacket", None)
    siblings: set[str] = set()
    for name in (packet.overloads() if packet is not None else []):
        siblings |= {_module_of(d.onnx_function) for d in registry.get_decomps(getattr(packet, name))}
    if siblings:
        module = sorted(siblings)[0]
        return {"target": target, "repository": _owner_of_module(module), "modules": sorted(siblings),
                "how": "no translation of this overload; its other overloads' translations are in "
                       f"{module}"}
    counts: dict[str, int] = {}
    for decomps in registry.functions.values():
        for d in decomps:
            owner = _owner_of_module(_module_of(d.onnx_function)) or "?"
            counts[owner] = counts.get(owner, 0) + 1
    owner = max(counts, key=counts.get) if counts else None
    return {"target": target, "repository": owner, "how": "no translation of the op at all; the registry's "
            f"translations come from {counts} (the missing one belongs where most live)"}


def torchscript_symbolic_opsets(operator: str) -> list[int]:
    """The opsets in which torch's TorchScript exporter has a symbolic for ``aten::name`` (its
    registry fills as the ``symbolic_opsetN`` modules are imported: import them first)."""
    try:
        from torch.onnx._internal.torchscript_exporter import registration as ts_registration
        prefix = "torch.onnx._internal.torchscript_exporter.symbolic_opset"
    except ImportError:  # torch <= 2.8
        from torch.onnx._internal import registration as ts_registration
        prefix = "torch.onnx.symbolic_opset"
    for v in range(7, 26):
        try:
            importlib.import_module(f"{prefix}{v}")
        except ImportError:
            continue
    group = ts_registration.registry.get_function_group(operator)
    return sorted(group._functions) if group is not None else []


def node_owner(path: Path, name: str, op_type: str | None = None) -> dict[str, Any] | None:
    """Who wrote a node of the file: the domain of the model-local function it calls or lies in
    (``pkg.onnxscript.torch_lib`` → onnxscript's torch_lib), else the aten target torch recorded
    on it (``pkg.torch.onnx.class_hierarchy`` / ``fx_node``) looked up in the registry."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    functions = {(f.domain, f.name): f for f in model.functions}
    for fn in model.functions:   # a node inside a local function: the function's owner
        if "onnxscript" in fn.domain and any(n.name == name for n in fn.node):
            return {"node": name, "function": f"{fn.domain}::{fn.name}", "repository": ONNXSCRIPT_REPOSITORY,
                    "how": "the node lies in a model-local function of onnxscript's torch_lib"}
    for node in model.graph.node:
        if node.name != name and not (op_type and node.op_type == op_type and not name):
            continue
        meta = {p.key: p.value for p in node.metadata_props}
        fn = functions.get((node.domain, node.op_type))
        if fn is not None and "onnxscript" in fn.domain:
            return {"node": node.name, "function": f"{fn.domain}::{fn.name}", "repository": ONNXSCRIPT_REPOSITORY,
                    "how": "the node calls a model-local function of onnxscript's torch_lib"}
        hierarchy = meta.get("pkg.torch.onnx.class_hierarchy", "")
        target = re.findall(r"((?:aten|prims)\.\w+\.\w+)|<built-in function (\w+)>", hierarchy)
        if target:
            aten, builtin = target[-1]
            owner = translation_owner(aten or f"operator.{builtin}")
            return {"node": node.name, **owner}
        if node.domain.startswith("pkg.onnxscript"):
            return {"node": node.name, "function": node.op_type, "repository": ONNXSCRIPT_REPOSITORY,
                    "how": f"the node's domain is {node.domain}"}
        break
    # No owner on the node itself (an inlined file carries no metadata): the translation library
    # the file's opset imports name, where it names only one.
    libs = sorted({o.domain for o in model.opset_import if o.domain.startswith("pkg.")})
    if libs and all("onnxscript" in d for d in libs):
        return {"node": name, "function": None, "repository": ONNXSCRIPT_REPOSITORY,
                "how": f"the file's only translation library is {libs} (its opset imports)"}
    return None
