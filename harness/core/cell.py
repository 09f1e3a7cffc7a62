"""A cell's identity: export options, the cell key, the cell id, and case references.

One definition each, used by the plan, the worker, records, reports, the gate and shards:
- ``ExportOptions``: the export switches a cell varies (its id suffix and its label);
- ``CellKey``: (case, exporter, opset, runtime, options), what a cell is across torch versions;
- ``CellKey.cell_id(torch)``: the file-system-safe id of one cell of one run;
- ``CaseRef``: the ``file.py:function`` / ``package.module:function`` reference syntax.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from harness.core.text import bounded_name

EXPORTERS = ("torchscript", "dynamo", "optimum")
PRECISIONS = ("fp32", "fp16", "bf16")
# How a case's dynamic dims reach the dynamo exporter: Dim.DYNAMIC, Dim.AUTO or Dim(name).
DIM_POLICIES = ("dynamic", "auto", "named")
# Every axis a rule (include, exclude, xfail, --only) may name.
AXES = ("torch", "exporter", "opset", "runtime", "case", "constant_folding", "dynamic", "precision",
        "dim_policy", "pipeline", "optimize", "external_data")
# The empty pipeline: the exported file as it is (harness.worker.steps; docs/pipelines.md).
RAW_PIPELINE = "raw"


@dataclass(frozen=True)
class ExportOptions:
    """The export switches of a cell; defaults are what ``torch.onnx.export`` does by default."""

    dynamic: bool = True
    constant_folding: bool = True
    precision: str = "fp32"
    # None: how torch.onnx itself converts dynamic_axes on the installed release (see
    # harness.worker.dims); a policy is only set where it changes the export (dynamo, dynamic dims).
    dim_policy: str | None = None
    # The post-export pipeline the file goes through before the runtimes load it (matrix.yaml's
    # ``pipelines``: a name; its steps travel in the export group).
    pipeline: str = RAW_PIPELINE
    # The dynamo exporter's ``optimize=`` and ``external_data=``; None: the release's default.
    optimize: bool | None = None
    external_data: bool | None = None

    def __post_init__(self) -> None:
        if self.dim_policy is not None and self.dim_policy not in DIM_POLICIES:
            raise ValueError(f"dim_policy {self.dim_policy!r}: expected one of {DIM_POLICIES} or None")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "ExportOptions":
        data = data or {}
        return cls(dynamic=data.get("dynamic") is not False,
                   constant_folding=data.get("constant_folding") is not False,
                   precision=str(data.get("precision") or "fp32"),
                   dim_policy=data.get("dim_policy") or None,
                   pipeline=str(data.get("pipeline") or RAW_PIPELINE),
                   optimize=data.get("optimize"), external_data=data.get("external_data"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"constant_folding": self.constant_folding, "dynamic": self.dynamic,
                               "precision": self.precision}
        if self.dim_policy is not None:   # absent by default: records and ids stay as they were
            out["dim_policy"] = self.dim_policy
        # Likewise absent at their defaults: a matrix without pipelines or exporter switches
        # writes the records and cell ids it always wrote.
        if self.pipeline != RAW_PIPELINE:
            out["pipeline"] = self.pipeline
        for name in ("optimize", "external_data"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def switches(self) -> dict[str, bool]:
        """The dynamo exporter's switches this cell sets (``optimize=``, ``external_data=``)."""
        return {k: v for k, v in (("optimize", self.optimize), ("external_data", self.external_data)) if v is not None}

    def _parts(self) -> list[str]:
        return [p for p, on in (("static", not self.dynamic), ("nofold", not self.constant_folding),
                                (self.precision, self.precision != "fp32"),
                                (f"dim-{self.dim_policy}", self.dim_policy is not None),
                                ("noopt" if self.optimize is False else "opt", self.optimize is not None),
                                ("extdata" if self.external_data else "onefile", self.external_data is not None),
                                (f"pipe-{self.pipeline}", self.pipeline != RAW_PIPELINE)) if on]

    @property
    def suffix(self) -> str:
        """Id suffix for non-default options: '-static-nofold-fp16', '-dim-auto' ('' for defaults)."""
        return "".join(f"-{p}" for p in self._parts())

    @property
    def label(self) -> str:
        """Short label for non-default options: 'static,nofold,fp16' ('' for defaults)."""
        return ",".join(self._parts())


@dataclass(frozen=True)
class CellKey:
    """What a cell is, independent of the torch version it ran on: the unit the gate compares
    and the report pivots (``case, exporter, opset, runtime, options``)."""

    case: str
    exporter: str
    opset: int
    runtime: str          # label: 'ort-cpu' or 'openvino@2026.3.1'
    options: ExportOptions = ExportOptions()

    def cell_id(self, torch: str) -> str:
        """The id of this cell on one torch version, safe as a file name (bounded: a long case
        name ends in a hash, see ``harness.core.text.bounded_name``)."""
        return bounded_name(f"torch{torch}-{self.case}-{self.exporter}-op{self.opset}"
                         f"{self.options.suffix}-{self.runtime}")

    def as_tuple(self) -> tuple[str, str, int, str, str]:
        """A sortable, hashable form with the options as their label."""
        return (self.case, self.exporter, self.opset, self.runtime, self.options.label)

    @property
    def name(self) -> str:
        label = self.options.label
        return (f"{self.case} · {self.exporter} · op{self.opset} · {self.runtime}"
                + (f" · {label}" if label else ""))

    @property
    def axes(self) -> dict[str, Any]:
        """The axis values rules match against (torch excluded)."""
        return {"exporter": self.exporter, "opset": self.opset, "runtime": self.runtime,
                "case": self.case, "pipeline": RAW_PIPELINE, **self.options.to_dict()}


# Column names of a cell's identity in tables (the report's frames): torch plus the key's fields.
KEY_FIELDS = tuple(f.name for f in fields(CellKey))
CELL_COLUMNS = ("torch", *KEY_FIELDS)


@dataclass(frozen=True)
class CaseRef:
    """A case reference: ``path/to/file.py:function`` or ``package.module:function``.

    Built-in probe names are mapped to such references by ``harness.probes.PROBES`` first.
    """

    target: str      # a .py file path or an importable module name
    function: str

    @classmethod
    def parse(cls, ref: str) -> "CaseRef":
        target, sep, function = ref.rpartition(":")
        if not sep or not target or not function.isidentifier():
            raise ValueError(f"case {ref!r} is neither a built-in probe nor 'file.py:function' / "
                             "'module:function'")
        return cls(target, function)

    @classmethod
    def try_parse(cls, ref: str) -> "CaseRef | None":
        try:
            return cls.parse(ref)
        except ValueError:
            return None

    @property
    def is_file(self) -> bool:
        return self.target.endswith(".py")

    def __str__(self) -> str:
        return f"{self.target}:{self.function}"
