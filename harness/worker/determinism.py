"""Is an export deterministic? The same group exported twice, each time in a fresh process, and
the two files compared (matrix.yaml ``determinism: true``; the result is the graph fact
``determinism`` of every cell of the group).

Compared: the node list (operator, domain, inputs, outputs, attributes, in order), the
initializers (name, type, shape, values) and the graph's inputs and outputs. Files that agree on
all of these but differ in bytes differ in metadata only (producer, doc strings, metadata
properties, names of the graph), named as such.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _load(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=True)


def _nodes(graph) -> list[bytes]:
    out = []
    for node in graph.node:
        copy = type(node)()
        copy.CopyFrom(node)
        copy.ClearField("doc_string")
        if hasattr(copy, "metadata_props"):
            copy.ClearField("metadata_props")
        out.append(copy.SerializeToString(deterministic=True))
    return out


def _initializers(graph) -> dict[str, tuple]:
    from onnx import numpy_helper

    out = {}
    for init in graph.initializer:
        arr = numpy_helper.to_array(init)
        out[init.name] = (init.data_type, tuple(arr.shape), arr.tobytes())
    return out


def _io(graph) -> list[bytes]:
    return [v.SerializeToString(deterministic=True) for v in (*graph.input, *graph.output)]


def _metadata(model) -> dict[str, Any]:
    return {"producer_name": model.producer_name, "producer_version": model.producer_version,
            "domain": model.domain, "model_version": model.model_version, "doc_string": model.doc_string,
            "metadata_props": sorted((p.key, p.value) for p in model.metadata_props),
            "graph_name": model.graph.name, "graph_doc_string": model.graph.doc_string,
            "opset_import": sorted((o.domain, o.version) for o in model.opset_import)}


def compare_exports(first: Path, second: Path) -> dict[str, Any]:
    """``identical``: both files say the same in nodes, initializers and interface; ``differs``
    lists what differs ('nodes', 'initializers', 'io', or 'metadata' with the fields)."""
    a, b = _load(first), _load(second)
    differs: list[str] = []
    detail: dict[str, Any] = {}
    na, nb = _nodes(a.graph), _nodes(b.graph)
    if na != nb:
        differs.append("nodes")
        first_diff = next((i for i, (x, y) in enumerate(zip(na, nb)) if x != y), min(len(na), len(nb)))
        detail["nodes"] = {"count": [len(na), len(nb)], "first_difference": first_diff}
    ia, ib = _initializers(a.graph), _initializers(b.graph)
    if ia != ib:
        differs.append("initializers")
        names = sorted(set(ia) ^ set(ib)) + sorted(n for n in set(ia) & set(ib) if ia[n] != ib[n])
        detail["initializers"] = names[:10]
    if _io(a.graph) != _io(b.graph):
        differs.append("io")
    ma, mb = _metadata(a), _metadata(b)
    meta = sorted(k for k in ma if ma[k] != mb[k])
    if meta:
        detail["metadata"] = meta
    structural = bool(differs)
    if not structural and (meta or Path(first).read_bytes() != Path(second).read_bytes()):
        differs.append("metadata")
    return {"identical": not structural, "differs": differs, **({"detail": detail} if detail else {})}
