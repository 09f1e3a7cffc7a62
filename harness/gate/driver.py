"""The gate driver: every gate (the torch gate, ``harness.gate.torch_gate``; the package gate,
``packages``; the gate between two environments, ``environments``) plans its two sides its own way
and hands them here: compare per cell, time the cells whose stored latencies differ interleaved
(``harness.gate.retime``: the verdict on latency comes from there, never from two stored
medians), then write markdown, JUnit XML and JSON. Exit 0: no regression; 1: at least one; 2: the
gate cannot tell (bad settings, too little compared).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from harness.console import console
from harness.gate.compare import CellComparison, Coverage, Settings, compare_sides, deploy_problem
from harness.gate.output import write_outputs
from harness.gate.retime import SideSource, retime
from harness.gate.sources import Side, check_environments
from harness.matrix.config import Matrix
from harness.matrix.rules import ConfigError
from harness.run.annotate import Annotator


@dataclass
class GateRequest:
    baseline: str
    candidate: str
    config: Path
    reports: Path
    output: Path | None = None
    provider: str = "venv"
    settings: Settings = Settings()
    # Interleaved timing of the cells the stored figures choose: at least this many fresh process
    # sets (harness.gate.retime); 0: none, the stored figures decide.
    remeasure: int = 4


def check_settings(settings: Settings, remeasure: int) -> None:
    if not settings.latency_threshold >= 1.0:
        raise ConfigError(f"--latency-threshold must be >= 1 (got {settings.latency_threshold})")
    if not 0 < settings.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1 (got {settings.alpha})")
    if remeasure < 0:
        raise ConfigError(f"--remeasure must be >= 0 (got {remeasure})")
    if not 0 < settings.confidence < 1:
        raise ConfigError(f"--confidence must be between 0 and 1 (got {settings.confidence})")
    if not settings.parity_factor >= 0:
        raise ConfigError(f"--parity-factor must be >= 0 (got {settings.parity_factor})")
    if not 0 <= settings.min_compared <= 1:
        raise ConfigError(f"--min-compared must be between 0 and 1 (got {settings.min_compared})")


def gate_folder(req: GateRequest) -> Path:
    """Where a gate writes its reports: ``--output``, else a new folder under the store's gates/."""
    return req.output or req.reports / "gates" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def judge(sides: dict[str, Side], matrices: dict[str, Matrix], matrix: Matrix, req: GateRequest, out: Path,
          current: dict) -> int:
    """Every gate once its two sides are planned and run (a torch gate, a package gate, a gate
    between two environments differ only in how they plan them): the environments checked, each
    cell compared (``matrix``'s known failures and deployed releases), the latencies that differ
    timed again interleaved in each side's own matrix, the reports written, the exit code."""
    check_environments(sides)
    base, cand = sides["baseline"], sides["candidate"]
    cells = compare_sides(base, cand, Annotator(matrix.xfail), req.settings, matrix.deploy)
    retime(cells, [SideSource(which, sides[which], matrices[which]) for which in ("baseline", "candidate")],
           req, out, current)
    return conclude(cells, base, cand, req.settings, out, current, req.remeasure)


def conclude(cells: list[CellComparison], base: Side, cand: Side, settings: Settings, out: Path,
             current: dict, remeasure: int = GateRequest.remeasure) -> int:
    """The gate's exit code, written out with its reports (a torch gate and a package gate alike)."""
    coverage = Coverage.of(cells)
    # A deployed release that was not tried on a passing file: whatever --min-compared allows.
    problem = coverage.problem(settings.min_compared) or deploy_problem(cells)
    # A regression among the compared cells is one whatever else is missing; without one, a gate
    # that compared too little cannot tell (2), never "no regression" (0).
    code = 1 if any(c.verdict.blocking for c in cells) else 2 if problem else 0
    md = write_outputs(out, base, cand, cells, settings, code, current, coverage, remeasure)
    print(md)
    print(f"gate reports: {out}")
    if problem:
        console.print(f"gate: cannot tell: {problem}", markup=False, highlight=False)
    return code
