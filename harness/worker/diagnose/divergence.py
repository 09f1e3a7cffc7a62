"""The first diverging node of a parity failure blamed on the exporter.

For a dynamo file, the ONNX value names are the exported program's FX node names (what
``torch.onnx.verification`` relies on): torch's value of every ``call_function`` node is taken
from an ``torch.fx.Interpreter`` over ``exported_program.module()``, the file's values of the same
names from the ONNX reference evaluator (every intermediate result) or, where it cannot judge,
ONNX Runtime with those values exposed as graph outputs and optimisations off. Walked in the FX
graph's order, the first value beyond the case's tolerance names the ONNX node and op, the aten
op, the module path and the source line (``nn_module_stack``, ``stack_trace``). A TorchScript file
keeps no link from its value names to torch tensors: that is said, not guessed.

Worker side: standard library at module level; torch, onnx and numpy lazily.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)')


def _last_frame(stack: str | None) -> str | None:
    """The innermost frame of the model's own code (else the innermost frame) of a stack trace."""
    from harness.worker.diagnose.onnx_reference import library_file as _library_file

    frames = _FRAME.findall(stack or "")
    if not frames:
        return None
    own = [f for f in frames if not _library_file(f[0])]
    path, line, fn, code = (own or frames)[-1]
    return f"{path}:{line} in {fn}: {code.strip()}"


def _module_path(meta: dict[str, Any]) -> str | None:
    stack = meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].rstrip("'>")
    return f"{path or '(root)'} ({name})"


def torch_values(program: Any, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any]]:
    """(call_function nodes in graph order, name → torch value) over the exported program."""
    import torch
    import torch.utils._pytree as pytree

    ep = program.exported_program
    module = ep.module()
    check = getattr(ep, "_get_flat_args_with_check", None)
    flat = check(args, kwargs)[0] if check is not None else pytree.tree_flatten((args, kwargs))[0]
    values: dict[str, Any] = {}
    nodes: list[Any] = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.op == "call_function" and isinstance(result, torch.Tensor):
                values[n.name] = result.detach().cpu().numpy()
                nodes.append(n)
            return result

    with torch.no_grad():
        Recorder(module).run(*flat)
    return nodes, values


def onnx_values(model_path: Path, feeds: dict[str, Any], names: set[str]) -> tuple[dict[str, Any], str]:
    """The file's values of ``names`` (those it has): reference evaluator, else ONNX Runtime."""
    import numpy as np
    import onnx

    from harness.runtimes.base import match_feeds
    from harness.worker.diagnose.onnx_reference import reference_gap

    model = onnx.load(str(model_path))
    if reference_gap(model_path) is None:
        try:
            from onnx.reference import ReferenceEvaluator

            ref = ReferenceEvaluator(model)
            results = ref.run(None, match_feeds(feeds, list(ref.input_names)), intermediate=True)
            return {k: np.asarray(v) for k, v in results.items() if k in names}, "onnx-reference"
        except Exception:  # noqa: BLE001 - fall back to ONNX Runtime
            pass
    import tempfile

    from harness.runtimes.base import LoadOptions
    from harness.runtimes.ort_cpu import OrtCpuAdapter

    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in inferred.graph.value_info}
    present = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for out in node.output:
            if out in names and out in typed and out not in present:
                model.graph.output.append(typed[out])
                present.add(out)
    with tempfile.TemporaryDirectory(prefix="harness-divergence-") as tmp:
        path = Path(tmp) / "exposed.onnx"
        onnx.save(model, str(path))
        # The graph as the exporter wrote it: ORT's fusions would hide the intermediate values.
        with OrtCpuAdapter(path, load=LoadOptions(graph_optimizations=False)) as adapter:
            got = adapter.infer(match_feeds(feeds, adapter.input_names()))
        outs = [o.name for o in model.graph.output]   # the session's outputs, in order
    return {n: np.asarray(v) for n, v in zip(outs, got) if n in names}, "ort-disable-all"


def locate(nodes: list[Any], expected: dict[str, Any], actual: dict[str, Any], atol: float, rtol: float,
           onnx_nodes: dict[str, Any]) -> dict[str, Any]:
    """The first FX node (graph order) whose file value differs beyond tolerance."""
    import numpy as np

    compared = 0
    for n in nodes:
        if n.name not in actual:
            continue
        e, a = expected[n.name], actual[n.name]
        compared += 1
        if e.shape != a.shape:
            error = f"shape {list(a.shape)} != torch {list(e.shape)}"
            max_abs = None
        else:
            if e.dtype == np.bool_ or a.dtype == np.bool_:
                bad = e != a
                diff = bad.astype(float)
            else:
                ef, af = e.astype(np.float64), a.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    diff = np.where(np.isfinite(ef) & np.isfinite(af), np.abs(af - ef),
                                    np.where(np.isnan(ef) & np.isnan(af), 0.0, np.inf))
                bad = diff > atol + rtol * np.abs(np.nan_to_num(ef))
            if not bad.any():
                continue
            max_abs = float(diff.max())
            at = np.unravel_index(int(diff.argmax()), diff.shape) if diff.size else ()
            error = (f"{int(bad.sum())}/{bad.size} values beyond atol={atol:g} rtol={rtol:g}, max_abs={max_abs:.3g} "
                     f"at {[int(i) for i in at]} (torch {float(e[at]):.6g}, file {float(a[at]):.6g})")
        node = onnx_nodes.get(n.name)
        props = {p.key: p.value for p in node.metadata_props} if node is not None else {}
        return {"node": node.name if node is not None else n.name,
                "op": node.op_type if node is not None else None,
                "value": n.name, "aten": str(n.target), "module": _module_path(n.meta),
                "source": _last_frame(n.meta.get("stack_trace") or props.get("pkg.torch.onnx.stack_trace")),
                "max_abs": max_abs, "error": error, "compared": compared}
    return {"node": None, "compared": compared,
            "reason": f"every value torch and the file share agrees within tolerance ({compared} compared); "
                      "the divergence is in values the exporter's optimiser renamed or folded"}


def first_divergence(ctx: Any, rec: Any) -> dict[str, Any]:
    """The first diverging node of a parity failure, or why it cannot be named (never raises)."""
    # Once per file and shape: every runtime cell of the file shares it (harness.worker.evidence).
    memo = getattr(ctx, "divergences", None)
    which = _shape_index(ctx, rec)
    if isinstance(memo, dict) and which in memo:
        return {**memo[which], "shared": True}
    t0 = time.perf_counter()
    try:
        out = _first_divergence(ctx, rec)
    except Exception as exc:  # noqa: BLE001 - a diagnosis only
        out = {"node": None, "reason": f"the comparison failed: {type(exc).__name__}: {str(exc)[:200]}"}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if isinstance(memo, dict):
        memo[which] = dict(out)
    return out


def _shape_index(ctx: Any, rec: Any) -> int:
    """Which shape a parity failure is searched at: the second where the cell failed there."""
    return 1 if "second shape" in (rec.error or "") and len(getattr(ctx, "shapes", ())) > 1 else 0


def _first_divergence(ctx: Any, rec: Any) -> dict[str, Any]:
    import onnx

    program = getattr(ctx, "program", None)
    if program is None or getattr(program, "exported_program", None) is None:
        return {"node": None, "reason": f"no mapping: a {rec.exporter} file keeps no link from its value names "
                                        "to torch's tensors (only dynamo files keep the exported program's node names)"}
    shape = _shape_index(ctx, rec)
    inputs = ctx.shapes[shape]
    args, kwargs = inputs.args, dict(inputs.kwargs)
    nodes, expected = torch_values(program, args, kwargs)
    model = onnx.load(str(ctx.onnx_path), load_external_data=False)
    producers = {out: node for node in model.graph.node for out in node.output}
    shared = {n for n in expected if n in producers}
    if not shared:
        return {"node": None, "reason": "no mapping: none of the exported program's node names is a value of the file"}
    actual, by = onnx_values(ctx.onnx_path, ctx.feeds[shape], shared)
    found = locate(nodes, expected, actual, ctx.spec.atol, ctx.spec.rtol, producers)
    found.update({"shape": "second shape" if shape else "example shape", "onnx_values_from": by})
    return found
