"""Graph drift: what changed in one cell's exported file between two torch releases.

Compared from the graph facts a record carries (``harness.worker.export.graph_facts``): operators
added or removed (with counts), node count, file size, declared opset, input/output names, their
dynamic dims and element types. Records written before the facts held ``io`` have no drift: an
old run renders exactly as it did. The report shows drift across the torch versions of a run; the
gate shows it per cell and, with ``--block-on io``, counts an interface change as a regression.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.core.record import GraphFacts, Record

# A file whose size moves by less than this share changed only in metadata (producer version…).
SIZE_TOLERANCE = 0.05


def _fixed(dim: Any) -> int | None:
    if isinstance(dim, int):
        return dim
    return int(dim) if isinstance(dim, str) and dim.isdigit() else None


def dims_signature(shape: list[Any] | None) -> tuple | None:
    """What deployment code sees of a shape: its rank and which dims are fixed to which size
    (symbolic names such as 's0' / 's77' differ between releases and do not count)."""
    return None if shape is None else tuple(_fixed(d) for d in shape)


def show_shape(shape: list[Any] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass
class GraphDrift:
    before: str                                   # torch versions
    after: str
    ops_added: dict[str, int] = field(default_factory=dict)     # op → count on the later side
    ops_removed: dict[str, int] = field(default_factory=dict)   # op → count on the earlier side
    ops_count: dict[str, tuple[int, int]] = field(default_factory=dict)
    nodes: tuple[Any, Any] | None = None
    bytes: tuple[Any, Any] | None = None
    opset: tuple[Any, Any] | None = None
    # how torch captured the graph (dynamo: torch.export non-strict / strict / the jit-trace
    # fallback): a change there changes what the graph is made from, even when it looks alike
    capture: tuple[Any, Any] | None = None
    names: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # 'inputs' → (before, after)
    dims: list[tuple[str, Any, Any]] = field(default_factory=list)     # (tensor, shape before, after)
    dtypes: list[tuple[str, Any, Any]] = field(default_factory=list)
    # operators a pipeline step fused ('ort-fusion: Attention' → (before, after)), where they differ
    fusions: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def io_changed(self) -> bool:
        """Input/output names or dynamic dims changed: code that feeds the file by name breaks."""
        return bool(self.names or self.dims)

    @property
    def changed(self) -> bool:
        return bool(self.ops_added or self.ops_removed or self.ops_count or self.nodes or self.opset
                     or self.bytes or self.io_changed or self.dtypes or self.capture or self.fusions)

    def parts(self) -> list[str]:
        """One short phrase per kind of change, in a fixed order."""
        out = []
        ops = [f"+{op}×{n}" for op, n in self.ops_added.items()]
        ops += [f"−{op}×{n}" for op, n in self.ops_removed.items()]
        ops += [f"{op} {a}→{b}" for op, (a, b) in self.ops_count.items()]
        if ops:
            out.append("ops " + ", ".join(ops))
        if self.nodes:
            out.append(f"nodes {self.nodes[0]} → {self.nodes[1]}")
        if self.bytes:
            out.append(f"size {_size(self.bytes[0])} → {_size(self.bytes[1])}")
        if self.opset:
            out.append(f"opset {self.opset[0]} → {self.opset[1]}")
        if self.capture:
            out.append(f"captured with {self.capture[0] or 'unknown'} → {self.capture[1] or 'unknown'}")
        for kind, (a, b) in self.names.items():
            out.append(f"{kind} {a} → {b}")
        for name, a, b in self.dims:
            out.append(f"{name} dims {show_shape(a)} → {show_shape(b)}")
        for name, a, b in self.dtypes:
            out.append(f"{name} dtype {a} → {b}")
        if self.fusions:
            out.append("fused " + ", ".join(f"{k} {a}→{b}" for k, (a, b) in self.fusions.items()))
        return out

    def summary(self) -> str:
        return " · ".join(self.parts()) or "no change"

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "io_changed": self.io_changed,
                "ops_added": self.ops_added, "ops_removed": self.ops_removed,
                "ops_count": {k: list(v) for k, v in self.ops_count.items()},
                "nodes": list(self.nodes) if self.nodes else None,
                "bytes": list(self.bytes) if self.bytes else None,
                "opset": list(self.opset) if self.opset else None,
                "capture": list(self.capture) if self.capture else None,
                "names": {k: [a, b] for k, (a, b) in self.names.items()},
                "dims": [[n, a, b] for n, a, b in self.dims],
                "dtypes": [[n, a, b] for n, a, b in self.dtypes], "parts": self.parts(),
                **({"fusions": {k: list(v) for k, v in self.fusions.items()}} if self.fusions else {}),
                "summary": self.summary()}


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} kB" if n < 1024 ** 2 else f"{n / 1024 ** 2:.1f} MB"


def has_facts(graph: "GraphFacts | None") -> bool:
    return bool(graph) and isinstance(graph.get("io"), dict)


def graph_drift(before: "GraphFacts | None", after: "GraphFacts | None",
                before_torch: str = "", after_torch: str = "") -> GraphDrift | None:
    """The drift between two records' graph facts; None unless both carry the io facts."""
    if not (has_facts(before) and has_facts(after)):
        return None
    d = GraphDrift(before_torch, after_torch)
    a_ops, b_ops = before.get("ops") or {}, after.get("ops") or {}
    d.ops_added = {op: n for op, n in sorted(b_ops.items()) if op not in a_ops}
    d.ops_removed = {op: n for op, n in sorted(a_ops.items()) if op not in b_ops}
    d.ops_count = {op: (a_ops[op], b_ops[op]) for op in sorted(a_ops) if op in b_ops and a_ops[op] != b_ops[op]}
    for name in ("nodes", "opset"):
        if before.get(name) != after.get(name):
            setattr(d, name, (before.get(name), after.get(name)))
    # Only where both records say how the graph was captured (older records do not).
    a_cap, b_cap = before.get("capture_strategy"), after.get("capture_strategy")
    if a_cap and b_cap and a_cap != b_cap:
        d.capture = (a_cap, b_cap)
    a_size, b_size = before.get("bytes"), after.get("bytes")
    if a_size and b_size and abs(b_size - a_size) > SIZE_TOLERANCE * a_size:
        d.bytes = (a_size, b_size)
    for kind in ("inputs", "outputs"):
        a_io, b_io = before["io"].get(kind) or [], after["io"].get(kind) or []
        a_names, b_names = [s["name"] for s in a_io], [s["name"] for s in b_io]
        if a_names != b_names:
            d.names[kind] = (a_names, b_names)
        b_by_name = {s["name"]: s for s in b_io}
        for a in a_io:
            b = b_by_name.get(a["name"])
            if b is None:
                continue
            if dims_signature(a.get("shape")) != dims_signature(b.get("shape")):
                d.dims.append((a["name"], a.get("shape"), b.get("shape")))
            if a.get("dtype") != b.get("dtype"):
                d.dtypes.append((a["name"], a.get("dtype"), b.get("dtype")))
    a_fused, b_fused = fusions(before), fusions(after)
    d.fusions = {k: (a_fused.get(k, 0), b_fused.get(k, 0)) for k in sorted({*a_fused, *b_fused})
                 if a_fused.get(k, 0) != b_fused.get(k, 0)}
    return d


def fusions(graph: "GraphFacts | None") -> dict[str, int]:
    """Operators a record's pipeline steps fused, by step and operator ('ort-fusion: Attention')."""
    out: dict[str, int] = {}
    for entry in ((graph or {}).get("pipeline") or {}).get("steps") or []:
        for op, n in (entry.get("fused") or {}).items():
            key = f"{entry.get('step')}: {op}"
            out[key] = out.get(key, 0) + int(n or 0)
    return out


def export_key(rec: Record) -> tuple:
    """The export a record's file came from: the cells of every runtime share it."""
    k = rec.key
    return (k.case, k.exporter, k.opset, k.options.label)


def export_name(rec: Record) -> str:
    k = rec.key
    label = k.options.label
    return f"{k.case} · {k.exporter} · op{k.opset}" + (f" · {label}" if label else "")


def _torch_order(records: Iterable[Record]) -> list[str]:
    from packaging.version import InvalidVersion, Version

    def key(v: str):
        try:
            return (0, Version(v))
        except InvalidVersion:
            return (1, v)

    return sorted({r.torch for r in records}, key=key)


def facts_by_export(records: Iterable[Record]) -> dict[tuple, dict[str, Record]]:
    """Per export, per torch version, the first record whose graph carries the io facts."""
    out: dict[tuple, dict[str, Record]] = {}
    for rec in records:
        if has_facts(rec.graph):
            out.setdefault(export_key(rec), {}).setdefault(rec.torch, rec)
    return out


@dataclass
class ExportDrift:
    """One export's drift between two consecutive torch versions of a run."""
    name: str
    before: Record
    after: Record
    drift: GraphDrift


def run_drifts(records: list[Record]) -> list[ExportDrift]:
    """Every export with io facts on two consecutive torch versions of the run, in a stable order
    (changed or not: the caller decides whether "no change" is worth a line)."""
    torches = _torch_order(records)
    out = []
    for key, by_torch in sorted(facts_by_export(records).items(), key=lambda kv: tuple(map(str, kv[0]))):
        present = [t for t in torches if t in by_torch]
        for old, new in zip(present, present[1:]):
            a, b = by_torch[old], by_torch[new]
            drift = graph_drift(a.graph, b.graph, old, new)
            if drift is not None:
                out.append(ExportDrift(export_name(a), a, b, drift))
    return out


def previous_drift(records: list[Record]) -> dict[int, GraphDrift]:
    """For each record (by position), the drift from the torch version before it in the run."""
    torches = _torch_order(records)
    facts = facts_by_export(records)
    out: dict[int, GraphDrift] = {}
    for i, rec in enumerate(records):
        if not has_facts(rec.graph):
            continue
        by_torch = facts.get(export_key(rec), {})
        earlier = [t for t in torches if t in by_torch and torches.index(t) < torches.index(rec.torch)]
        if earlier:
            drift = graph_drift(by_torch[earlier[-1]].graph, rec.graph, earlier[-1], rec.torch)
            if drift is not None:
                out[i] = drift
    return out


def cell_drift(base: Record | None, cand: Record | None) -> GraphDrift | None:
    """The gate's view: the drift of one cell from the baseline to the candidate."""
    if base is None or cand is None:
        return None
    return graph_drift(base.graph, cand.graph, base.torch, cand.torch)
