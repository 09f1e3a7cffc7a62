"""The result record (schema v1): one JSON object per cell, appended to results.jsonl.

``Record`` is the one type every stage after the worker reads; it is created in exactly one
place, ``Record.for_cell``. Its ``parity`` and ``latency_ms`` parts are typed (``Parity``,
``Latency``) and serialise to the same JSON keys as before. Standard library only: the worker
imports this inside every environment.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness.core.cell import CellKey, ExportOptions
from harness.core.status import Status

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A results file this version cannot read."""


def _split(cls: type, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    known = {f.name for f in fields(cls)} - {"extra"}
    return ({k: v for k, v in data.items() if k in known},
            {k: v for k, v in data.items() if k not in known})


@dataclass
class Parity:
    """Worst errors against eager over every shape checked, and the per-shape details."""

    max_abs: float | None = None
    max_rel: float | None = None
    atol: float | None = None
    rtol: float | None = None
    shapes: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)   # keys written by other versions

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Parity":
        known, extra = _split(cls, dict(data or {}))
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v not in (None, [])}
        return dict(sorted({**out, **self.extra}.items()))  # stored order: results.jsonl sorts keys

    def __bool__(self) -> bool:
        return bool(self.to_dict())


@dataclass
class Latency:
    """Latency summary in milliseconds (see ``harness.run.latency``) with a bounded sample.

    ``ci_low``/``ci_high``: the confidence interval of the median (order statistics);
    ``stop``: why sampling ended ("converged", "time_cap", "max_runs"); ``floor_ms``: the
    runtime binding's own per-call median on an identity model. ``samples``: every value up to
    1,000 in time order, beyond that 1,000 evenly spaced order statistics; records written before
    these keys existed keep all their samples and lack the other keys.
    """

    median: float | None = None
    p90: float | None = None
    min: float | None = None
    mean: float | None = None
    iqr: float | None = None
    cv: float | None = None
    unstable: bool | None = None
    iterations: int | None = None
    threads: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    stop: str | None = None
    warmup_iterations: int | None = None
    warmup_stable: bool | None = None
    floor_ms: float | None = None
    samples: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Latency":
        known, extra = _split(cls, dict(data or {}))
        return cls(**known, extra=extra)

    def to_dict(self, samples: bool = True) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items()
               if k != "extra" and v is not None and (k != "samples" or (samples and v))}
        return dict(sorted({**out, **self.extra}.items()))  # stored order: results.jsonl sorts keys

    def __bool__(self) -> bool:
        return self.median is not None or bool(self.extra)

    @property
    def interval(self) -> tuple[float, float] | None:
        """The recorded confidence interval of the median, or None (records before it existed)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low, self.ci_high


@dataclass
class Record:
    run_id: str
    case: str
    torch: str
    exporter: str
    opset: int
    runtime: str
    status: Status
    stage: str | None = None
    error: str | None = None
    schema: int = SCHEMA_VERSION
    cell_id: str = ""
    env: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    opset_actual: int | None = None
    parity: Parity = field(default_factory=Parity)
    latency_ms: Latency = field(default_factory=Latency)
    versions: dict[str, Any] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)
    graph: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None
    hint: str | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    log: str | None = None
    bundle: str | None = None
    repro: str | None = None
    finished_at: float | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if isinstance(self.parity, dict):
            self.parity = Parity.from_dict(self.parity)
        if isinstance(self.latency_ms, dict):
            self.latency_ms = Latency.from_dict(self.latency_ms)

    @classmethod
    def for_cell(cls, run_id: str, key: CellKey, torch: str, env: str, status: Status,
                 cell_id: str | None = None, **kw: Any) -> "Record":
        """The one constructor of a new record: a cell's identity plus what happened to it."""
        return cls(run_id=run_id, case=key.case, torch=torch, exporter=key.exporter,
                   opset=key.opset, runtime=key.runtime, status=status,
                   cell_id=cell_id or key.cell_id(torch), env=env,
                   options=key.options.to_dict(), finished_at=time.time(), **kw)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["status"] = self.status.value
        out["parity"] = self.parity.to_dict()
        out["latency_ms"] = self.latency_ms.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Record":
        data = migrate(dict(data))
        known, extra = _split(cls, data)
        rec = cls(**known)
        if extra:
            rec.options = {**rec.options, **{f"x_{k}": v for k, v in extra.items()}}
        return rec

    @property
    def export_options(self) -> ExportOptions:
        return ExportOptions.from_dict(self.options)

    @property
    def key(self) -> CellKey:
        """Identity of the cell across runs: what the gate and the reports compare on."""
        return CellKey(self.case, self.exporter, int(self.opset), self.runtime, self.export_options)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record up to the current schema; refuse newer ones."""
    version = int(data.get("schema", 0))
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"record has schema {version} but this harness reads up to {SCHEMA_VERSION}: "
            "upgrade the harness to read these results"
        )
    if version == 0:
        # Schema 0 (pre-release): 'result' instead of 'status', 'latency' instead of 'latency_ms'.
        if "result" in data and "status" not in data:
            data["status"] = data.pop("result")
        if "latency" in data and "latency_ms" not in data:
            data["latency_ms"] = data.pop("latency")
        data["schema"] = 1
    return data


def append_record(path: Path, record: Record) -> None:
    """Append one record and make it durable before returning (an interrupted run keeps it)."""
    line = record.to_json() + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: Path) -> list[Record]:
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[Record]:
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                # A torn last line from a killed run: everything before it is intact.
                continue
            try:
                yield Record.from_dict(data)
            except SchemaError as exc:
                raise SchemaError(f"{path}:{lineno}: {exc}") from None


def count_by_status(records: Iterable[Record]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for rec in records:
        counts[rec.status.value] += 1
    return counts
