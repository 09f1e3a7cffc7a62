"""Dynamic dims: how a case's ``dynamic_dims`` reach the dynamo exporter (the ``dim_policy``
axis), what the exported file says about its inputs and outputs, and which dims the case
declared dynamic that the exporter silently fixed.

What the file really does decides: a dim is fixed where the file's dim is a number, and kept
dynamic where it is a symbol, whatever the symbol's name (torch 2.6's dynamo exporter names some
dynamic dims by their example size, '2', after logging "Ignored guard s0 == 2"; such files run
at other sizes). A dim the exported program pins to one value while the file keeps a symbol is
only a candidate (``pinned``): the second shape confirms it or not (``harness.worker.second_shape``).

Worker side: standard library at module level; torch and onnx lazily.
"""
from __future__ import annotations

from typing import Any

from harness.runtimes.base import RuntimeUnavailable


class DimPolicyUnavailable(RuntimeUnavailable):
    """The installed torch cannot mark dims the way the policy asks: a skip, not a failure."""


# ---- what the file declares -----------------------------------------------------------------

def io_facts(model: Any) -> dict[str, list[dict[str, Any]]]:
    """Name, element type and shape of every graph input and output of an ONNX ``ModelProto``.

    A dim is its size (int), its symbolic name (str, e.g. 'batch' or 's0'), or None when the
    file says nothing about it; ``shape`` is None for a tensor of unknown rank.
    """
    import onnx

    def spec(value: Any) -> dict[str, Any]:
        kind = value.type.WhichOneof("value")
        tensor = getattr(value.type, kind) if kind in ("tensor_type", "sparse_tensor_type") else None
        dtype = (onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
                 if tensor is not None and tensor.elem_type else kind)
        shape = None
        if tensor is not None and tensor.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in tensor.shape.dim]
        return {"name": value.name, "dtype": dtype, "shape": shape}

    return {"inputs": [spec(v) for v in model.graph.input],
            "outputs": [spec(v) for v in model.graph.output]}


def fixed_size(dim: Any) -> int | None:
    """The size of a dim the file fixes: a number (``dim_value``). A ``dim_param`` is a symbol
    whatever its name, digits included ('2'): the runtime accepts any size there."""
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


# ---- silent specialisation ------------------------------------------------------------------

def specialised_dims(dims: dict[str, dict[int, str]], names: list[str], graph: dict[str, Any],
                     program: Any = None) -> list[dict[str, Any]]:
    """Dims the case declared dynamic that the export fixed to a number.

    Read from the file's inputs (a number where a name was asked for: ``where`` "graph input",
    certain), else from the exported program torch.onnx returns (a placeholder dim that is an
    int, or a symbol whose range is one value: ``where`` "exported program", with the file's
    ``symbol``). The latter is a candidate only: the file may keep the dim dynamic (torch 2.6)
    or have its Reshape targets baked (torch 2.13's Dim.AUTO); the second shape tells.
    """
    inputs = (graph.get("io") or {}).get("inputs") or []
    by_name = {s["name"]: s for s in inputs}
    program_sizes = _program_sizes(program, len(names))
    found = []
    for name, axes in sorted(dims.items()):
        position = names.index(name) if name in names else None
        spec = by_name.get(name) or (inputs[position] if position is not None and position < len(inputs) else None)
        for axis, dim_name in sorted(axes.items()):
            shape = (spec or {}).get("shape") or []
            in_file = fixed_size(shape[axis]) if axis < len(shape) else None
            value, where = in_file, "graph input"
            if value is None and position is not None and position < len(program_sizes):
                sizes = program_sizes[position]
                value = sizes[axis] if sizes is not None and axis < len(sizes) else None
                where = "exported program"
            if value is None:
                continue
            fact = {"dim": dim_name, "input": name, "axis": axis, "value": value, "where": where}
            if where == "exported program":
                fact["symbol"] = shape[axis] if axis < len(shape) else None
            else:
                fact["note"] = f"{dim_name} was fixed to {value} by the exporter ({name} dim {axis})"
            found.append(fact)
    return found


def _program_sizes(program: Any, count: int) -> list[list[int | None] | None]:
    """Per user input of the exported program behind ``program`` (a torch.onnx ONNXProgram):
    each dim's size when the program fixes it, else None. Empty when there is no such program."""
    ep = getattr(program, "exported_program", None)
    if ep is None:
        return []
    try:
        vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
        users = [vals.get(name) for name in ep.graph_signature.user_inputs]
        if len(users) != count:
            return []
        ranges = getattr(ep, "range_constraints", {}) or {}
        out: list[list[int | None] | None] = []
        for val in users:
            if not hasattr(val, "shape"):
                out.append(None)
                continue
            sizes: list[int | None] = []
            for size in val.shape:
                if isinstance(size, int):
                    sizes.append(size)
                    continue
                rng = ranges.get(getattr(getattr(size, "node", None), "expr", None))
                lower, upper = getattr(rng, "lower", None), getattr(rng, "upper", None)
                sizes.append(int(lower) if lower is not None and lower == upper else None)
            out.append(sizes)
        return out
    except Exception:  # noqa: BLE001 - a diagnosis only; never fails the cell
        return []


def note_specialised(graph: dict[str, Any], dims: dict[str, dict[int, str]], names: list[str],
                     program: Any = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Record the dims the file fixes in ``graph['specialised']``; return their notes for the
    record, and the dims only the exported program pins (for the second shape to confirm)."""
    found = specialised_dims(dims, names, graph, program)
    fixed = [f for f in found if f["where"] == "graph input"]
    if fixed:
        graph["specialised"] = fixed
    return [f["note"] for f in fixed], [f for f in found if f["where"] != "graph input"]


def digit_symbols(dims: dict[str, dict[int, str]], graph: dict[str, Any]) -> list[str]:
    """Notes on declared dims the file names with a digit-only symbol ('2'): a name, not a size."""
    inputs = {s["name"]: s for s in (graph.get("io") or {}).get("inputs") or []}
    named: dict[tuple[str, str], list[str]] = {}
    for name, axes in sorted(dims.items()):
        shape = (inputs.get(name) or {}).get("shape") or []
        for axis, dim_name in sorted(axes.items()):
            param = shape[axis] if axis < len(shape) else None
            if isinstance(param, str) and param.isdigit():
                named.setdefault((dim_name, param), []).append(f"{name} dim {axis}")
    return [f"{dim_name} is named {param!r} in the file ({', '.join(where)}): a symbol, not a size (torch "
            "names it after the example's size when it ignores a guard); the file keeps it dynamic"
            for (dim_name, param), where in sorted(named.items())]
