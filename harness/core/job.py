"""What the runner hands a worker: a ``Job`` of ``ExportGroup``s of ``CellJob``s, and the
``LatencyProtocol`` they are timed with. JSON round-trip (the job file, a bundle's cell.json).

An export group is one export (case, exporter, opset, options) shared by every runtime cell of
one environment. Standard library only: the worker imports this inside every environment.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.core.cell import CellKey, ExportOptions

# Job.phase: how a worker runs its groups (see ``Job``).
PHASE_ALL, PHASE_VERDICTS, PHASE_LATENCY = "all", "verdicts", "latency"
SPOOL_DIR = "spool"   # <run_dir>/spool/<gid>/: a group's exported file and feeds between phases


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class LatencyProtocol:
    """How a passing cell is timed (matrix.yaml's ``latency``; ``harness.worker.latency``).

    Warm-up ends on stability: once ``warmup_runs`` calls and ``warmup_s`` have passed and the
    medians of the last ``warmup_windows`` windows (each >= ``warmup_window_runs`` calls and
    >= ``warmup_window_s``) agree within ``warmup_tolerance``, or after ``warmup_max_s``. Sampling
    stops when the ``confidence`` interval of the median lies within ±``rel_ci`` of it after at
    least ``min_runs`` calls and ``min_time_s`` ("converged"), or before ``min_runs`` (from
    ``early_runs`` calls) when the stricter ``early_confidence`` interval does, or at
    ``max_time_s`` ("time_cap") or ``max_runs`` ("max_runs").

    ``confirm``: the latency phase times each cell once more in a second fresh process with a short
    protocol (``confirm_protocol``); where the two disagree it is timed in ``confirm_processes``
    more and stored with the median of all (``harness.run.confirm``).
    """

    enabled: bool = True
    warmup_runs: int = 10
    warmup_s: float = 0.05
    warmup_max_s: float = 2.0
    warmup_windows: int = 3
    warmup_window_runs: int = 10
    warmup_window_s: float = 0.01
    warmup_tolerance: float = 0.02
    min_runs: int = 200
    # Fewer calls where the spread allows: from ``early_runs`` calls on, sampling also stops once
    # the ``early_confidence`` interval of the median (wider than the ``confidence`` one, which
    # guards against stopping on a lucky early look) already lies within ±``rel_ci``.
    early_runs: int = 30
    early_confidence: float = 0.99
    # A floor on sampling time: the calls right after the warm-up still run slow (with no floor the
    # default matrix's medians sat 1.5 % above those sampled for 0.1 s); at 0.03 s within ±0.5 %
    # (``nox -s bench -- --part latency_protocol``).
    min_time_s: float = 0.03
    max_time_s: float = 10.0
    max_runs: int = 1_000_000
    rel_ci: float = 0.01
    confidence: float = 0.95
    unstable_spread: float = 0.05
    confirm: bool = True
    confirm_processes: int = 4

    def __post_init__(self) -> None:
        for name in ("warmup_runs", "warmup_s", "warmup_max_s", "warmup_window_s", "warmup_tolerance",
                     "min_time_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("min_runs", "early_runs", "warmup_windows", "warmup_window_runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_runs < self.min_runs:
            raise ValueError("max_runs must be >= min_runs")
        if self.max_time_s <= 0 or self.unstable_spread <= 0 or self.rel_ci <= 0:
            raise ValueError("max_time_s, rel_ci and unstable_spread must be > 0")
        if not 0 < self.confidence < 1:
            raise ValueError("confidence must be between 0 and 1")
        if self.confirm_processes < 2:
            raise ValueError("confirm_processes must be >= 2")

    def confirm_protocol(self) -> "LatencyProtocol":
        """The second process's protocol: the same checks, a tenth of the calls and time (at most
        1 s of sampling), no check of its own."""
        return LatencyProtocol(
            warmup_runs=self.warmup_runs, warmup_s=min(self.warmup_s, 0.02), warmup_max_s=min(self.warmup_max_s, 0.5),
            warmup_windows=2, warmup_window_runs=self.warmup_window_runs, warmup_window_s=self.warmup_window_s,
            warmup_tolerance=max(self.warmup_tolerance, 0.05), min_runs=max(1, min(self.min_runs, 50)),
            min_time_s=min(self.min_time_s, 0.03), max_time_s=min(self.max_time_s, 1.0),
            max_runs=max(self.max_runs // 10, max(1, min(self.min_runs, 50))), rel_ci=max(self.rel_ci, 0.02),
            confidence=self.confidence, unstable_spread=self.unstable_spread, confirm=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "LatencyProtocol":
        return cls(**_known(cls, data or {}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# pydantic validates this dataclass where matrix.yaml embeds it; unknown keys are errors there.
LatencyProtocol.__pydantic_config__ = {"extra": "forbid"}  # type: ignore[attr-defined]


@dataclass(frozen=True)
class CellJob:
    """One runtime cell of an export group."""

    cell_id: str
    runtime: str                 # label: 'ort-cpu' or 'ort-cpu@1.20.1'
    runtime_name: str            # registry name: 'ort-cpu'
    runtime_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CellJob":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ExportGroup:
    """One export of a case, and the runtime cells that load the exported file."""

    gid: str
    case: str
    case_ref: str
    exporter: str
    opset: int
    options: ExportOptions = ExportOptions()
    atol: float | None = None
    rtol: float | None = None
    cells: tuple[CellJob, ...] = ()
    data_files: tuple[str, ...] = ()   # files the case reads, declared in matrix.yaml (paths, globs)
    # The pipeline ``options.pipeline`` names: its steps in order, each {"step": name, "args": {...}}
    # (harness.worker.steps), and how its parity is judged ({"class": "fp16", "atol": ..., "cosine": ...};
    # None: the case's own atol / rtol, as without pipelines).
    steps: tuple[dict[str, Any], ...] = ()
    judge: dict[str, Any] | None = None

    def key(self, cell: CellJob) -> CellKey:
        return CellKey(self.case, self.exporter, int(self.opset), cell.runtime, self.options)

    def capture_key(self) -> tuple:
        """What a group shares its capture by (``harness.worker.capture_reuse``): the groups of
        one case, exporter and options that differ only in opset are one family."""
        return (self.case, self.case_ref, self.exporter, self.options, self.atol, self.rtol, self.data_files)

    def only(self, cell_id: str) -> "ExportGroup":
        """The same group restricted to one cell (a bundle reproduces one cell)."""
        return ExportGroup(**{**self.__dict__, "cells": tuple(c for c in self.cells if c.cell_id == cell_id)})

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "options": self.options.to_dict(), "cells": [asdict(c) for c in self.cells],
                "data_files": list(self.data_files), "steps": [dict(s) for s in self.steps]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExportGroup":
        known = _known(cls, data)
        known["options"] = ExportOptions.from_dict(data.get("options"))
        known["cells"] = tuple(CellJob.from_dict(c) for c in data.get("cells", []))
        known["opset"] = int(known["opset"])
        known["data_files"] = tuple(data.get("data_files") or ())
        known["steps"] = tuple(data.get("steps") or ())
        return cls(**known)


@dataclass(frozen=True)
class Job:
    """A worker's whole input: where to write, how to time, and the export groups to run."""

    run_id: str
    run_dir: str
    env: str
    groups: tuple[ExportGroup, ...]
    base_dir: str = "."           # folder relative case files are resolved against
    threads: int = 1
    latency: LatencyProtocol = LatencyProtocol()
    bundles: bool = True          # write a bundle for every failing cell
    # "all": every stage of each cell; "verdicts": every stage but latency, the exported file
    # and feeds of a group with a passing cell kept in <run_dir>/spool/<gid>/ for the latency
    # phase; "latency": time the spooled files of the groups' cells (nothing else runs then).
    phase: str = PHASE_ALL
    determinism: bool = False     # export each group twice, in two fresh processes, and compare
    # Keep each passing group's file, feeds and eager outputs in the spool also without latency:
    # runtime-only environments run them on other runtime releases (harness.run.post.runtime_floors).
    keep_spool: bool = False
    # Measure the runtime binding's overhead (``floor_ms``) beside each timing; the latency
    # phase's confirming workers do not: only their medians are read (``harness.run.confirm``).
    floor: bool = True
    # A folder the latency workers of one environment share for the models a runtime compiled
    # (``LoadOptions.compiled_cache``: OpenVINO's model cache), so that the confirming workers
    # load what the first one compiled; None: every worker compiles each file itself.
    compiled_cache: str | None = None

    @property
    def spool(self) -> Path:
        return Path(self.run_dir) / SPOOL_DIR

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "latency": self.latency.to_dict(), "groups": [g.to_dict() for g in self.groups]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Job":
        known = _known(cls, data)
        known["groups"] = tuple(ExportGroup.from_dict(g) for g in data.get("groups", []))
        known["latency"] = LatencyProtocol.from_dict(data.get("latency"))
        return cls(**known)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def read(cls, path: Path) -> "Job":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> Path:
        Path(path).write_text(self.to_json())
        return Path(path)

    def replace(self, **changes: Any) -> "Job":
        return Job(**{**self.__dict__, **changes})


def families(groups: "list[ExportGroup] | tuple[ExportGroup, ...]") -> list[list[ExportGroup]]:
    """Groups partitioned by ``capture_key``, each family where its first group was, in order."""
    out: dict[tuple, list[ExportGroup]] = {}
    for g in groups:
        out.setdefault(g.capture_key(), []).append(g)
    return list(out.values())
