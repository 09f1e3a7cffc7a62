"""Dynamic dims: how a case's ``dynamic_dims`` reach the dynamo exporter (the ``dim_policy``
axis), what the exported file says about its inputs and outputs, and which dims the case
declared dynamic that the exporter silently fixed.

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
    """The size of a dim the file fixes: an int, or a dim_param that is only digits ('6', as
    some exporters write a specialised dim)."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, str) and dim.isdigit():
        return int(dim)
    return None


# ---- silent specialisation ------------------------------------------------------------------

def specialised_dims(dims: dict[str, dict[int, str]], names: list[str], graph: dict[str, Any],
                     program: Any = None) -> list[dict[str, Any]]:
    """Dims the case declared dynamic that the export fixed to a number.

    Read from the file's inputs (a number where a name was asked for), else from the exported
    program torch.onnx returns (a placeholder dim that is an int, or a symbol whose range is one
    value: the file may keep a symbolic name while its Reshape targets are baked).
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
            note = f"{dim_name} was fixed to {value} by the exporter ({name} dim {axis}"
            if where == "exported program":
                kept = shape[axis] if axis < len(shape) else None
                note += f"; the file keeps the symbolic dim {kept!r}" if kept else ""
            found.append({"dim": dim_name, "input": name, "axis": axis, "value": value,
                          "where": where, "note": note + ")"})
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
                     program: Any = None) -> list[str]:
    """Record the fixed dims in ``graph['specialised']``; return their notes for the record."""
    found = specialised_dims(dims, names, graph, program)
    if found:
        graph["specialised"] = found
    return [f["note"] for f in found]
